# Every option on: what `terraform plan -var-file=example.tfvars` and checkov (tests/infra) see.
kms_key_arn          = "arn:aws:kms:us-east-1:123456789012:key/00000000-0000-0000-0000-000000000000"
data_read_arns       = ["arn:aws:s3:::my-datasets", "arn:aws:s3:::my-datasets/*"]
launcher_group_names = ["ml-engineers"]
github_repository    = "example-org/example-repo"
