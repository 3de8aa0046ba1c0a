# Outputs named after the launcher's settings (launch.toml keys, --flags, LAUNCH_* variables)
# carry exactly that setting's value; `launch_toml` is all of them as a file.

output "region" {
  description = "launch.toml `region` (--region, LAUNCH_REGION)."
  value       = local.region
}

output "bucket" {
  description = "launch.toml `bucket` (--bucket, LAUNCH_BUCKET)."
  value       = aws_s3_bucket.this.bucket
}

output "role" {
  description = "launch.toml `role` (--role, LAUNCH_ROLE): the execution role the jobs run as."
  value       = aws_iam_role.execution.arn
}

output "s3_prefix" {
  description = "launch.toml `s3_prefix`: the folder of the bucket both roles are limited to."
  value       = var.s3_prefix
}

output "job_prefix" {
  description = "launch.toml `job_prefix`: the launcher may only touch training jobs named <job_prefix>-*."
  value       = var.job_prefix
}

output "launch_toml" {
  description = "The settings above as a launch.toml: `terraform output -raw launch_toml > launch.toml`."
  value       = <<-EOT
    provider = "sagemaker"
    region = "${local.region}"
    bucket = "${aws_s3_bucket.this.bucket}"
    role = "${aws_iam_role.execution.arn}"
    s3_prefix = "${var.s3_prefix}"
    job_prefix = "${var.job_prefix}"
  EOT
}

output "launcher_policy_arn" {
  description = "Attach to whoever runs launch (launcher_group_names / launcher_role_names do it here)."
  value       = aws_iam_policy.launcher.arn
}

output "github_actions_role_arn" {
  description = "role-to-assume for aws-actions/configure-aws-credentials (null without github_repository)."
  value       = local.ci ? aws_iam_role.github[0].arn : null
}
