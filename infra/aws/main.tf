# The S3 bucket: code packages, checkpoints and job output, under one folder (var.s3_prefix).

data "aws_caller_identity" "current" {}
data "aws_region" "current" {}
data "aws_partition" "current" {}

locals {
  account   = data.aws_caller_identity.current.account_id
  region    = data.aws_region.current.name
  partition = data.aws_partition.current.partition

  bucket     = coalesce(var.bucket_name, "${var.name}-${local.account}-${local.region}")
  bucket_arn = "arn:${local.partition}:s3:::${local.bucket}"
  # Everything the launcher and its jobs read and write lives under this folder.
  folder_arn = "${local.bucket_arn}/${var.s3_prefix}/*"
  # `launch doctor` writes and deletes one probe object here, and nowhere else.
  probe_arn = "${local.bucket_arn}/${var.s3_prefix}/.launch-doctor/*"

  # SageMaker puts the job name into the training-job ARN in lowercase.
  job_arn       = "arn:${local.partition}:sagemaker:${local.region}:${local.account}:training-job/${lower(var.job_prefix)}-*"
  log_group_arn = "arn:${local.partition}:logs:${local.region}:${local.account}:log-group:/aws/sagemaker/TrainingJobs"

  kms_key_arns = var.kms_key_arn == null ? [] : [var.kms_key_arn]

  # Where the AWS Deep Learning Containers the launcher runs are published, per region: the
  # PyTorch training image, and the SageMaker model parallelism (SMP v2) image for smp_v2 plans.
  # The launcher asks the SageMaker SDK (sagemaker-core's image_uris: PyTorch 2.8.0 training and
  # SMP v2 for PyTorch 2.5.1) for the image URIs; Terraform cannot, so this is a copy of the SDK's
  # data, and tests/infra/test_policies.py fails when the two disagree.
  pytorch_registries = {
    "af-south-1"     = "626614931356"
    "ap-east-1"      = "871362719292"
    "ap-east-2"      = "975050140332"
    "ap-northeast-1" = "763104351884"
    "ap-northeast-2" = "763104351884"
    "ap-northeast-3" = "364406365360"
    "ap-south-1"     = "763104351884"
    "ap-south-2"     = "772153158452"
    "ap-southeast-1" = "763104351884"
    "ap-southeast-2" = "763104351884"
    "ap-southeast-3" = "907027046896"
    "ap-southeast-4" = "457447274322"
    "ap-southeast-5" = "550225433462"
    "ap-southeast-6" = "633930458069"
    "ap-southeast-7" = "590183813437"
    "ca-central-1"   = "763104351884"
    "ca-west-1"      = "204538143572"
    "cn-north-1"     = "727897471807"
    "cn-northwest-1" = "727897471807"
    "eu-central-1"   = "763104351884"
    "eu-central-2"   = "380420809688"
    "eu-north-1"     = "763104351884"
    "eu-south-1"     = "692866216735"
    "eu-south-2"     = "503227376785"
    "eu-west-1"      = "763104351884"
    "eu-west-2"      = "763104351884"
    "eu-west-3"      = "763104351884"
    "il-central-1"   = "780543022126"
    "me-central-1"   = "914824155844"
    "me-south-1"     = "217643126080"
    "me-west-1"      = "124382933778"
    "mx-central-1"   = "637423239942"
    "sa-east-1"      = "763104351884"
    "us-east-1"      = "763104351884"
    "us-east-2"      = "763104351884"
    "us-gov-east-1"  = "446045086412"
    "us-gov-west-1"  = "442386744353"
    "us-west-1"      = "763104351884"
    "us-west-2"      = "763104351884"
  }
  smp_registry = "658645717510"
  smp_regions = [
    "ap-northeast-1", "ap-northeast-2", "ap-northeast-3", "ap-south-1", "ap-southeast-1",
    "ap-southeast-2", "ca-central-1", "eu-central-1", "eu-north-1", "eu-west-1", "eu-west-2",
    "eu-west-3", "sa-east-1", "us-east-1", "us-east-2", "us-west-1", "us-west-2",
  ]
  pytorch_repository_arns = contains(keys(local.pytorch_registries), local.region) ? [
    "arn:${local.partition}:ecr:${local.region}:${lookup(local.pytorch_registries, local.region, "")}:repository/pytorch-training",
  ] : []
  smp_repository_arns = contains(local.smp_regions, local.region) ? [
    "arn:${local.partition}:ecr:${local.region}:${local.smp_registry}:repository/smdistributed-modelparallel",
  ] : []
  image_repository_arns = concat(local.pytorch_repository_arns, local.smp_repository_arns,
  var.extra_image_repository_arns)
}

resource "aws_s3_bucket" "this" {
  # checkov:skip=CKV_AWS_18:Server access logs need a second bucket to receive them; CloudTrail data events are the better record of who read what, and the account decides on those.
  # checkov:skip=CKV_AWS_144:Cross-region replication doubles the storage of checkpoints that a rerun re-creates; training data and results of value belong in their own buckets.
  # checkov:skip=CKV2_AWS_62:Nothing consumes bucket events; the launcher follows jobs through the SageMaker API.
  # checkov:skip=CKV_AWS_145:SSE-S3 by default (encrypted at rest, no per-request KMS cost, no key policy to get right on day one); pass kms_key_arn for a customer managed key.
  bucket        = local.bucket
  force_destroy = var.force_destroy
  tags          = var.tags
}

resource "aws_s3_bucket_public_access_block" "this" {
  bucket                  = aws_s3_bucket.this.id
  block_public_acls       = true
  block_public_policy     = true
  ignore_public_acls      = true
  restrict_public_buckets = true
}

# ACLs off: the bucket owner owns every object, access is decided by IAM alone.
resource "aws_s3_bucket_ownership_controls" "this" {
  bucket = aws_s3_bucket.this.id
  rule {
    object_ownership = "BucketOwnerEnforced"
  }
}

resource "aws_s3_bucket_server_side_encryption_configuration" "this" {
  bucket = aws_s3_bucket.this.id
  rule {
    apply_server_side_encryption_by_default {
      sse_algorithm     = var.kms_key_arn == null ? "AES256" : "aws:kms"
      kms_master_key_id = var.kms_key_arn
    }
    bucket_key_enabled = var.kms_key_arn != null
  }
}

# Versioning: a checkpoint overwritten by mistake can be restored for noncurrent_retention_days.
resource "aws_s3_bucket_versioning" "this" {
  bucket = aws_s3_bucket.this.id
  versioning_configuration {
    status = "Enabled"
  }
}

resource "aws_s3_bucket_lifecycle_configuration" "this" {
  bucket     = aws_s3_bucket.this.id
  depends_on = [aws_s3_bucket_versioning.this]

  # Staged code packages are content-addressed: one that expired is uploaded again by the next
  # launch that needs it.
  rule {
    id     = "staged-code"
    status = "Enabled"
    filter {
      prefix = "${var.s3_prefix}/code/"
    }
    expiration {
      days = var.code_retention_days
    }
  }

  rule {
    id     = "old-versions-and-uploads"
    status = "Enabled"
    filter {}
    expiration {
      expired_object_delete_marker = true
    }
    noncurrent_version_expiration {
      noncurrent_days = var.noncurrent_retention_days
    }
    abort_incomplete_multipart_upload {
      days_after_initiation = 7
    }
  }
}

data "aws_iam_policy_document" "bucket" {
  statement {
    sid       = "DenyInsecureTransport"
    effect    = "Deny"
    actions   = ["s3:*"]
    resources = [local.bucket_arn, "${local.bucket_arn}/*"]
    principals {
      type        = "*"
      identifiers = ["*"]
    }
    condition {
      test     = "Bool"
      variable = "aws:SecureTransport"
      values   = ["false"]
    }
  }
}

resource "aws_s3_bucket_policy" "this" {
  bucket     = aws_s3_bucket.this.id
  policy     = data.aws_iam_policy_document.bucket.json
  depends_on = [aws_s3_bucket_public_access_block.this]
}
