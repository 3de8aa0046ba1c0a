# The jobs' service account and the staging bucket.

locals {
  bucket = coalesce(var.bucket_name, "${var.project}-${var.name}")
  ci     = var.github_repository != null
  services = concat(
    ["aiplatform.googleapis.com", "logging.googleapis.com", "storage.googleapis.com",
    "iam.googleapis.com", "cloudquotas.googleapis.com"],
    local.ci ? ["iamcredentials.googleapis.com", "sts.googleapis.com"] : [],
  )
  # Service account emails are known before the accounts exist, so they can key for_each.
  jobs_email = "${var.name}-jobs@${var.project}.iam.gserviceaccount.com"
  ci_email   = "${var.name}-ci@${var.project}.iam.gserviceaccount.com"
}

resource "google_project_service" "this" {
  for_each           = var.enable_apis ? toset(local.services) : toset([])
  project            = var.project
  service            = each.value
  disable_on_destroy = false
}

# What the jobs run as (the launcher's `service_account` setting): it reads the staged code and
# writes checkpoints through Cloud Storage FUSE (/gcs/BUCKET/...), in this bucket only.
resource "google_service_account" "jobs" {
  project      = var.project
  account_id   = "${var.name}-jobs"
  display_name = "Vertex AI custom jobs started by launch"
  depends_on   = [google_project_service.this]
}

resource "google_storage_bucket" "staging" {
  # checkov:skip=CKV_GCP_62:Usage logs need a second bucket to receive them; Cloud Audit Logs (Data Access) are the record of who read what, and the project decides on those.
  project                     = var.project
  name                        = local.bucket
  location                    = var.region
  uniform_bucket_level_access = true
  public_access_prevention    = "enforced"
  force_destroy               = var.force_destroy
  labels                      = var.labels

  versioning {
    enabled = true
  }

  # Staged code is content-addressed (PREFIX/staging/code-<sha>.tar.gz): an archive that expired
  # is staged again by the next launch that needs it.
  lifecycle_rule {
    condition {
      age            = var.staged_code_retention_days
      matches_prefix = ["${var.prefix}/staging/"]
    }
    action {
      type = "Delete"
    }
  }

  lifecycle_rule {
    condition {
      days_since_noncurrent_time = var.noncurrent_retention_days
      with_state                 = "ARCHIVED"
    }
    action {
      type = "Delete"
    }
  }

  dynamic "encryption" {
    for_each = var.kms_key_name == null ? [] : [var.kms_key_name]
    content {
      default_kms_key_name = encryption.value
    }
  }

  depends_on = [google_project_service.this]
}

# Read, write and rename (a copy and a delete on FUSE) in this bucket: what gcsfuse needs.
resource "google_storage_bucket_iam_member" "jobs" {
  bucket = google_storage_bucket.staging.name
  role   = "roles/storage.objectUser"
  member = "serviceAccount:${google_service_account.jobs.email}"
}
