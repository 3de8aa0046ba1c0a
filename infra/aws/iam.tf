# Two identities: the role SageMaker runs the training jobs as (the launcher's `role` setting),
# and the policy of whoever runs `launch` (a person, or the CI role in ci.tf).
#
# What each statement allows is what the launcher/providers/sagemaker/ package calls (its
# doctor checks included), no more: tests/infra/test_policies.py reads the provider code, works out every AWS action it
# needs and the resource it needs it on, and evaluates these documents against them (and fails
# on an action granted here that no code needs).

# -- the execution role -----------------------------------------------------------------------

data "aws_iam_policy_document" "execution_trust" {
  statement {
    sid     = "SageMakerInThisAccount"
    actions = ["sts:AssumeRole"]
    principals {
      type        = "Service"
      identifiers = ["sagemaker.amazonaws.com"]
    }
    # Confused-deputy protection: only SageMaker acting for this account and region.
    # https://docs.aws.amazon.com/sagemaker/latest/dg/security-confused-deputy-prevention.html
    condition {
      test     = "StringEquals"
      variable = "aws:SourceAccount"
      values   = [local.account]
    }
    condition {
      test     = "ArnLike"
      variable = "aws:SourceArn"
      values   = ["arn:${local.partition}:sagemaker:${local.region}:${local.account}:*"]
    }
  }
}

resource "aws_iam_role" "execution" {
  name               = "${var.name}-sagemaker-execution"
  description        = "SageMaker training jobs started by launch: the launcher's folder of the bucket, the training log group, the training images."
  assume_role_policy = data.aws_iam_policy_document.execution_trust.json
  tags               = var.tags
}

# The two actions of a training job that have no resource type (IAM accepts only "*" for them),
# apart, so that checkov's skip covers them and nothing else.
data "aws_iam_policy_document" "execution_unscoped" {
  # checkov:skip=CKV_AWS_356:PutMetricData and GetAuthorizationToken have no resource type (only "*"). The namespace condition limits the metrics to SageMaker's training namespace; the ECR token alone pulls nothing (PullTheTrainingImages names the repositories).

  # The request's MetricDefinitions (loss, samples/s, peak memory) become CloudWatch metrics.
  statement {
    sid       = "PublishTrainingMetrics"
    actions   = ["cloudwatch:PutMetricData"]
    resources = ["*"]
    condition {
      test     = "StringEquals"
      variable = "cloudwatch:namespace"
      values   = ["/aws/sagemaker/TrainingJobs"]
    }
  }

  statement {
    sid       = "LogInToEcr"
    actions   = ["ecr:GetAuthorizationToken"]
    resources = ["*"]
  }
}

# What a training job does (https://docs.aws.amazon.com/sagemaker/latest/dg/sagemaker-roles.html,
# "CreateTrainingJob API: Execution Role Permissions"), narrowed to the launcher's resources.
data "aws_iam_policy_document" "execution" {
  source_policy_documents = [data.aws_iam_policy_document.execution_unscoped.json]

  # The code channel (<prefix>/code/<sha>/), the checkpoints SageMaker syncs both ways and the
  # output archive (<prefix>/<run>/...).
  statement {
    sid       = "ReadWriteTheLauncherFolder"
    actions   = ["s3:GetObject", "s3:PutObject"]
    resources = [local.folder_arn]
  }

  # SageMaker lists the channel and the checkpoint prefix before it downloads them.
  statement {
    sid       = "ListTheLauncherFolder"
    actions   = ["s3:ListBucket"]
    resources = [local.bucket_arn]
    condition {
      test     = "StringLike"
      variable = "s3:prefix"
      values   = [var.s3_prefix, "${var.s3_prefix}/*"]
    }
  }

  dynamic "statement" {
    for_each = length(var.data_read_arns) > 0 ? [var.data_read_arns] : []
    content {
      sid       = "ReadTrainingData"
      actions   = ["s3:GetObject", "s3:ListBucket"]
      resources = statement.value
    }
  }

  # SageMaker writes each host's output to /aws/sagemaker/TrainingJobs, stream <job>/algo-N-...
  statement {
    sid       = "CreateAndFindTheTrainingLogGroup"
    actions   = ["logs:CreateLogGroup", "logs:DescribeLogStreams"]
    resources = [local.log_group_arn, "${local.log_group_arn}:*"]
  }

  statement {
    sid       = "WriteTrainingLogs"
    actions   = ["logs:CreateLogStream", "logs:PutLogEvents"]
    resources = ["${local.log_group_arn}:log-stream:*"]
  }

  statement {
    sid       = "PullTheTrainingImages"
    actions   = ["ecr:BatchCheckLayerAvailability", "ecr:GetDownloadUrlForLayer", "ecr:BatchGetImage"]
    resources = local.image_repository_arns
  }

  dynamic "statement" {
    for_each = local.kms_key_arns
    content {
      sid       = "UseTheBucketKey"
      actions   = ["kms:Decrypt", "kms:GenerateDataKey"]
      resources = [statement.value]
    }
  }
}

resource "aws_iam_role_policy" "execution" {
  name   = "training-job"
  role   = aws_iam_role.execution.id
  policy = data.aws_iam_policy_document.execution.json
}

# -- the launcher -----------------------------------------------------------------------------

# `launch doctor` reads the SageMaker training quotas; ListServiceQuotas has no resource type.
data "aws_iam_policy_document" "launcher_unscoped" {
  # checkov:skip=CKV_AWS_356:ListServiceQuotas has no resource type (only "*"); it reads quota values and nothing else.
  statement {
    sid       = "DoctorReadsTrainingQuotas"
    actions   = ["servicequotas:ListServiceQuotas"]
    resources = ["*"]
  }
}

data "aws_iam_policy_document" "launcher" {
  source_policy_documents = [data.aws_iam_policy_document.launcher_unscoped.json]

  # Only jobs named <job_prefix>-...: the launcher cannot touch anyone else's training jobs.
  # AddTags: CreateTrainingJob with Tags needs it (the launcher tags each job with its run).
  statement {
    sid = "TrainingJobsWithTheLauncherPrefix"
    actions = [
      "sagemaker:CreateTrainingJob",
      "sagemaker:DescribeTrainingJob",
      "sagemaker:StopTrainingJob",
      "sagemaker:AddTags",
    ]
    resources = [local.job_arn]
  }

  # The one role, and only to SageMaker: the launcher cannot hand the role to another service,
  # nor any other role to SageMaker.
  statement {
    sid       = "PassTheExecutionRoleToSageMaker"
    actions   = ["iam:PassRole"]
    resources = [aws_iam_role.execution.arn]
    condition {
      test     = "StringEquals"
      variable = "iam:PassedToService"
      values   = ["sagemaker.amazonaws.com"]
    }
  }

  # A role that does not exist is reported before anything is uploaded; `launch doctor` reads
  # its trust policy.
  statement {
    sid       = "ReadTheExecutionRole"
    actions   = ["iam:GetRole"]
    resources = [aws_iam_role.execution.arn]
  }

  statement {
    sid       = "ReadTrainingLogs"
    actions   = ["logs:DescribeLogStreams", "logs:GetLogEvents", "logs:FilterLogEvents"]
    resources = [local.log_group_arn, "${local.log_group_arn}:*"]
  }

  # HeadBucket, and HeadObject answering 404 rather than 403 for a code package not uploaded
  # yet: both need s3:ListBucket on the bucket (no prefix condition: HeadObject has no s3:prefix).
  statement {
    sid       = "FindObjectsInTheBucket"
    actions   = ["s3:ListBucket"]
    resources = [local.bucket_arn]
  }

  statement {
    sid       = "StageCodeInTheLauncherFolder"
    actions   = ["s3:GetObject", "s3:PutObject"]
    resources = [local.folder_arn]
  }

  statement {
    sid       = "DoctorRemovesItsProbe"
    actions   = ["s3:DeleteObject"]
    resources = [local.probe_arn]
  }

  # `launch doctor` asks IAM whether the caller may do all of the above. Each IAM user may
  # simulate itself (and the CI role itself), nobody else.
  statement {
    sid       = "DoctorSimulatesTheCaller"
    actions   = ["iam:SimulatePrincipalPolicy"]
    resources = concat(["arn:${local.partition}:iam::${local.account}:user/$${aws:username}"], local.ci_role_arns)
  }

  dynamic "statement" {
    for_each = local.kms_key_arns
    content {
      sid       = "UseTheBucketKey"
      actions   = ["kms:Decrypt", "kms:GenerateDataKey"]
      resources = [statement.value]
    }
  }
}

resource "aws_iam_policy" "launcher" {
  name        = "${var.name}-launcher"
  description = "launch: create, follow and stop SageMaker training jobs named ${var.job_prefix}-*, with the ${aws_iam_role.execution.name} role and the ${local.bucket} bucket."
  policy      = data.aws_iam_policy_document.launcher.json
  tags        = var.tags
}

resource "aws_iam_group_policy_attachment" "launcher" {
  for_each   = toset(var.launcher_group_names)
  group      = each.value
  policy_arn = aws_iam_policy.launcher.arn
}

resource "aws_iam_role_policy_attachment" "launcher" {
  for_each   = toset(var.launcher_role_names)
  role       = each.value
  policy_arn = aws_iam_policy.launcher.arn
}
