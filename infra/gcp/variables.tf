variable "project" {
  description = "Google Cloud project ID the jobs run in."
  type        = string
}

variable "region" {
  description = "Vertex AI region of the jobs (the bucket is created there too: the nodes read the code and write checkpoints through it)."
  type        = string
}

variable "name" {
  description = "Prefix of every name this module creates (service accounts, custom roles, identity pool)."
  type        = string
  default     = "launch"

  validation {
    condition     = can(regex("^[a-z][a-z0-9-]{2,14}$", var.name))
    error_message = "name: 3 to 15 lowercase letters, digits and hyphens, starting with a letter (service account IDs have 6 to 30 characters)."
  }
}

variable "bucket_name" {
  description = "Name of the staging bucket. Default: <project>-<name> (bucket names are global; project IDs are unique)."
  type        = string
  default     = null
}

variable "prefix" {
  description = "Folder of the bucket the launcher works under (gs://BUCKET/PREFIX): code in PREFIX/staging/, runs in PREFIX/runs/."
  type        = string
  default     = "launch"

  validation {
    condition     = can(regex("^[A-Za-z0-9._-]+(/[A-Za-z0-9._-]+)*$", var.prefix))
    error_message = "prefix: an object name prefix without leading or trailing slash."
  }
}

variable "staged_code_retention_days" {
  description = "Days after which staged code archives (PREFIX/staging/) are deleted. They are content-addressed and staged again when needed."
  type        = number
  default     = 30
}

variable "noncurrent_retention_days" {
  description = "Days an overwritten or deleted object version is kept (versioning protects checkpoints from an accidental overwrite)."
  type        = number
  default     = 7
}

variable "kms_key_name" {
  description = "A Cloud KMS key for the bucket (projects/.../cryptoKeys/...). Null: Google-managed encryption. The Cloud Storage service agent needs Encrypter/Decrypter on the key."
  type        = string
  default     = null
}

variable "launcher_members" {
  description = "Who runs `launch`, as IAM members (\"user:me@example.com\", \"group:ml@example.com\"). They get the launcher's custom roles and nothing else."
  type        = list(string)
  default     = []
}

variable "enable_apis" {
  description = "Enable the APIs the launcher uses (Vertex AI, Cloud Logging, Cloud Storage, IAM, Cloud Quotas; STS and IAM Credentials for CI). Never disabled on destroy."
  type        = bool
  default     = true
}

variable "quota_viewer" {
  description = "Let the launcher's identities read quotas (roles/cloudquotas.viewer), so that `launch doctor` can show the GPU quota of the region."
  type        = bool
  default     = true
}

variable "github_repository" {
  description = "owner/name of a GitHub repository whose Actions may launch jobs through Workload Identity Federation (no key files). Null: no CI identity."
  type        = string
  default     = null
}

variable "github_subject" {
  description = "The token subject, after repo:<owner/name>:, of the workflows that may impersonate the CI service account. Default: pushes to main, i.e. merges (a job with `environment: NAME` has the subject environment:NAME). Pull requests run `launch plan`, which needs no credentials."
  type        = string
  default     = "ref:refs/heads/main"
}

variable "force_destroy" {
  description = "Let `terraform destroy` delete the bucket with its checkpoints in it."
  type        = bool
  default     = false
}

variable "labels" {
  description = "Labels on the bucket."
  type        = map(string)
  default     = {}
}
