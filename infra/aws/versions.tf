# No provider block here: the module takes the AWS provider (and with it the region and the
# account) from its caller, so that it can be used with count/for_each and in any region. Run on
# its own (`terraform apply` in this folder), the provider reads AWS_REGION / AWS_PROFILE.
terraform {
  required_version = ">= 1.5"

  required_providers {
    aws = {
      source  = "hashicorp/aws"
      version = ">= 5.40, < 7.0"
    }
  }
}
