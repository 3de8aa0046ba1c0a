# Outputs named after the launcher's settings (launch.toml keys, --flags, LAUNCH_* variables)
# carry exactly that setting's value; `launch_toml` is all of them as a file.

output "project" {
  description = "launch.toml `project` (--project, LAUNCH_PROJECT)."
  value       = var.project
}

output "region" {
  description = "launch.toml `region` (--region, LAUNCH_REGION)."
  value       = var.region
}

output "bucket" {
  description = "launch.toml `bucket` (--bucket, LAUNCH_BUCKET): gs://BUCKET/PREFIX."
  value       = "gs://${google_storage_bucket.staging.name}/${var.prefix}"
}

output "service_account" {
  description = "launch.toml `service_account` (--service-account, LAUNCH_SERVICE_ACCOUNT): what the jobs run as."
  value       = google_service_account.jobs.email
}

output "launch_toml" {
  description = "The settings above as a launch.toml: `terraform output -raw launch_toml > launch.toml`."
  value       = <<-EOT
    provider = "vertex"
    project = "${var.project}"
    region = "${var.region}"
    bucket = "gs://${google_storage_bucket.staging.name}/${var.prefix}"
    service_account = "${google_service_account.jobs.email}"
  EOT
}

output "launcher_roles" {
  description = "The custom roles the launcher's identities hold (grant them to more members as needed)."
  value = {
    project         = google_project_iam_custom_role.launcher.name
    bucket          = google_project_iam_custom_role.staging.name
    service_account = google_project_iam_custom_role.act_as.name
  }
}

output "workload_identity_provider" {
  description = "workload_identity_provider for google-github-actions/auth (null without github_repository)."
  value       = local.ci ? google_iam_workload_identity_pool_provider.github[0].name : null
}

output "ci_service_account" {
  description = "service_account for google-github-actions/auth (null without github_repository)."
  value       = local.ci ? google_service_account.ci[0].email : null
}
