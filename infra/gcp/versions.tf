# No provider block: every resource names var.project, and credentials come from the caller
# (application-default credentials when run on its own).
terraform {
  required_version = ">= 1.5"

  required_providers {
    google = {
      source  = "hashicorp/google"
      version = ">= 5.30, < 8.0"
    }
  }
}
