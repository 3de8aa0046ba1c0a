# The launcher's identity: three custom roles holding exactly the permissions the launcher's API
# calls need, each granted where it applies (the project, the bucket, the jobs' service account).
# tests/infra/test_policies.py derives the calls from the launcher/providers/vertex/ package
# (the provider, its logs, _gcp.py and its doctor checks), maps them to permissions, and checks these grants both ways (nothing
# missing, nothing extra).

locals {
  role_prefix = replace(var.name, "-", "_")
  launcher_members = concat(
    var.launcher_members,
    local.ci ? ["serviceAccount:${local.ci_email}"] : [],
  )
}

# Custom jobs and their logs, project-wide (Vertex AI has no narrower resource for them).
# https://cloud.google.com/vertex-ai/docs/general/access-control
# https://cloud.google.com/logging/docs/access-control
resource "google_project_iam_custom_role" "launcher" {
  project     = var.project
  role_id     = "${local.role_prefix}_launcher"
  title       = "launch: Vertex AI custom jobs and their logs"
  description = "Create, read, list and cancel custom jobs; read log entries. Used by launch."
  permissions = [
    "aiplatform.customJobs.cancel",
    "aiplatform.customJobs.create",
    "aiplatform.customJobs.get",
    "aiplatform.customJobs.list",
    "logging.logEntries.list",
  ]
  depends_on = [google_project_service.this]
}

# Staging code, granted on the bucket only: find the bucket, look for an archive, upload it. No
# list, no delete, no overwrite: archives are content-addressed and uploaded with a create-only
# precondition (ifGenerationMatch=0), which needs storage.objects.create alone.
# https://cloud.google.com/storage/docs/access-control/iam-json
resource "google_project_iam_custom_role" "staging" {
  project     = var.project
  role_id     = "${local.role_prefix}_staging"
  title       = "launch: stage code in the launcher's bucket"
  description = "Find the bucket, check for and upload content-addressed code archives. Used by launch."
  permissions = [
    "storage.buckets.get",
    "storage.objects.create",
    "storage.objects.get",
  ]
  depends_on = [google_project_service.this]
}

# Start jobs that run as the jobs' service account, granted on that account only: the GCP side
# of SageMaker's iam:PassRole.
# https://cloud.google.com/vertex-ai/docs/general/custom-service-account
resource "google_project_iam_custom_role" "act_as" {
  project     = var.project
  role_id     = "${local.role_prefix}_act_as"
  title       = "launch: run jobs as the jobs' service account"
  description = "iam.serviceAccounts.actAs, granted on the jobs' service account only. Used by launch."
  permissions = ["iam.serviceAccounts.actAs"]
  depends_on  = [google_project_service.this]
}

resource "google_project_iam_member" "launcher" {
  for_each = toset(local.launcher_members)
  project  = var.project
  role     = google_project_iam_custom_role.launcher.name
  member   = each.value
}

resource "google_storage_bucket_iam_member" "launcher" {
  for_each = toset(local.launcher_members)
  bucket   = google_storage_bucket.staging.name
  role     = google_project_iam_custom_role.staging.name
  member   = each.value
}

resource "google_service_account_iam_member" "launcher" {
  for_each           = toset(local.launcher_members)
  service_account_id = google_service_account.jobs.name
  role               = google_project_iam_custom_role.act_as.name
  member             = each.value
}

# `launch doctor` shows the region's GPU quotas (Cloud Quotas API); read-only.
resource "google_project_iam_member" "quota_viewer" {
  for_each = var.quota_viewer ? toset(local.launcher_members) : toset([])
  project  = var.project
  role     = "roles/cloudquotas.viewer"
  member   = each.value
}
