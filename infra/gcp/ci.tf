# Optional: Workload Identity Federation for GitHub Actions. A workflow of var.github_repository
# whose token has the subject var.github_subject exchanges it for a short-lived token of the CI
# service account, which holds the launcher's roles (iam.tf) and nothing else. No key file.

locals {
  github_sub = "repo:${var.github_repository}:${var.github_subject}"
}

resource "google_iam_workload_identity_pool" "github" {
  count                     = local.ci ? 1 : 0
  project                   = var.project
  workload_identity_pool_id = "${var.name}-github"
  display_name              = "GitHub Actions (launch)"
  depends_on                = [google_project_service.this]
}

resource "google_iam_workload_identity_pool_provider" "github" {
  count                              = local.ci ? 1 : 0
  project                            = var.project
  workload_identity_pool_id          = google_iam_workload_identity_pool.github[0].workload_identity_pool_id
  workload_identity_pool_provider_id = "github"
  display_name                       = "GitHub Actions OIDC"
  attribute_mapping = {
    "google.subject"       = "assertion.sub"
    "attribute.repository" = "assertion.repository"
    "attribute.ref"        = "assertion.ref"
  }
  # Tokens of other repositories, and of this one for other refs (pull requests) or
  # environments, are refused before any role is looked at. (No spaces around ==: checkov
  # leaves strings that contain " == " unrendered and then cannot check the subject.)
  attribute_condition = "assertion.sub=='${local.github_sub}'"
  oidc {
    issuer_uri = "https://token.actions.githubusercontent.com"
  }
}

resource "google_service_account" "ci" {
  count        = local.ci ? 1 : 0
  project      = var.project
  account_id   = "${var.name}-ci"
  display_name = "GitHub Actions of ${var.github_repository} (launch)"
  depends_on   = [google_project_service.this]
}

resource "google_service_account_iam_member" "ci_federation" {
  count              = local.ci ? 1 : 0
  service_account_id = google_service_account.ci[0].name
  role               = "roles/iam.workloadIdentityUser"
  member             = "principalSet://iam.googleapis.com/${google_iam_workload_identity_pool.github[0].name}/attribute.repository/${var.github_repository}"
}
