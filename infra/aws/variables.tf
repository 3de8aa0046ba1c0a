variable "name" {
  description = "Prefix of every name this module creates (role, policy, bucket)."
  type        = string
  default     = "launch"

  validation {
    condition     = can(regex("^[a-z0-9][a-z0-9-]{0,30}$", var.name))
    error_message = "name: 1 to 31 lowercase letters, digits and hyphens."
  }
}

variable "bucket_name" {
  description = "Name of the S3 bucket for code, checkpoints and output. Default: <name>-<account id>-<region>, unique per account and region."
  type        = string
  default     = null
}

variable "s3_prefix" {
  description = "Folder of the bucket the launcher writes under: the launcher's `s3_prefix` setting. Both roles are limited to it."
  type        = string
  default     = "launch"

  validation {
    condition     = can(regex("^[A-Za-z0-9!_.*'()-]+(/[A-Za-z0-9!_.*'()-]+)*$", var.s3_prefix))
    error_message = "s3_prefix: an S3 key prefix without leading or trailing slash."
  }
}

variable "job_prefix" {
  description = "Start of every training job name the launcher creates: the launcher's `job_prefix` setting. The launcher may only create, describe and stop jobs whose names start with it."
  type        = string
  default     = "launch"

  validation {
    # The launcher's own rule (launcher/providers/sagemaker/settings.py: JOB_NAME, JOB_PREFIX_MAX).
    condition     = can(regex("^[a-zA-Z0-9](-*[a-zA-Z0-9]){0,19}$", var.job_prefix))
    error_message = "job_prefix: at most 20 letters, digits and hyphens, starting and ending with a letter or digit."
  }
}

variable "code_retention_days" {
  description = "Days after which staged code packages (<s3_prefix>/code/) are deleted. Each is content-addressed and uploaded again when needed."
  type        = number
  default     = 30
}

variable "noncurrent_retention_days" {
  description = "Days an overwritten or deleted object version is kept (versioning protects checkpoints from an accidental overwrite)."
  type        = number
  default     = 7
}

variable "kms_key_arn" {
  description = "A customer managed KMS key for the bucket. Null: SSE-S3 (AES-256). With a key, both roles get kms:Decrypt and kms:GenerateDataKey on it (the key policy must allow them)."
  type        = string
  default     = null
}

variable "data_read_arns" {
  description = "S3 ARNs the training jobs may read besides the launcher's folder (datasets): bucket ARNs and object ARNs such as arn:aws:s3:::my-data/*."
  type        = list(string)
  default     = []
}

variable "extra_image_repository_arns" {
  description = "ECR repositories of your own training images (the launcher's `image` setting). The AWS PyTorch and SMP v2 images of the region are always allowed."
  type        = list(string)
  default     = []
}

variable "github_repository" {
  description = "owner/name of a GitHub repository whose Actions may launch jobs with short-lived credentials (OIDC). Null: no CI role."
  type        = string
  default     = null
}

variable "github_subjects" {
  description = "Token subjects allowed to assume the CI role, relative to the repository (repo:<owner/name>:<subject>). Default: pushes to main, i.e. a merge. Pull requests need no role: `launch plan` needs no credentials."
  type        = list(string)
  default     = ["ref:refs/heads/main"]
}

variable "github_oidc_provider_arn" {
  description = "ARN of an existing IAM OIDC provider for token.actions.githubusercontent.com (an account has at most one). Null: this module creates it."
  type        = string
  default     = null
}

variable "force_destroy" {
  description = "Let `terraform destroy` delete the bucket with its checkpoints in it."
  type        = bool
  default     = false
}

variable "tags" {
  description = "Tags on every resource that takes them."
  type        = map(string)
  default     = {}
}

variable "launcher_group_names" {
  description = "IAM groups whose members run `launch` (the launcher policy is attached to them). Add people to a group rather than attaching policies to users."
  type        = list(string)
  default     = []
}

variable "launcher_role_names" {
  description = "IAM roles that run `launch` (an SSO permission set's role, a build role). The CI role of ci.tf gets the policy by itself."
  type        = list(string)
  default     = []
}

variable "ci_session_hours" {
  description = "Longest session of the CI role: `launch` follows the job it starts (and resubmits it after an out-of-memory failure) until it ends."
  type        = number
  default     = 6
}
