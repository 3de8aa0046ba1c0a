# Every option on: what `terraform plan -var-file=example.tfvars` and checkov (tests/infra) see.
project           = "my-ml-project"
region            = "us-central1"
launcher_members  = ["group:ml-engineers@example.com"]
github_repository = "example-org/example-repo"
