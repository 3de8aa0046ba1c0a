# Optional: a role GitHub Actions assumes with its OIDC token (no access keys stored anywhere).
# Only the subjects in var.github_subjects (default: pushes to main, that is merges) may assume
# it; pull requests run `launch plan`, which needs no credentials at all.

locals {
  ci          = var.github_repository != null
  create_oidc = local.ci && var.github_oidc_provider_arn == null
  ci_role_arns = local.ci ? [
    "arn:${local.partition}:iam::${local.account}:role/${var.name}-github-actions",
  ] : []
  github_oidc_provider_arn = var.github_oidc_provider_arn != null ? var.github_oidc_provider_arn : (
  local.create_oidc ? aws_iam_openid_connect_provider.github[0].arn : null)
}

resource "aws_iam_openid_connect_provider" "github" {
  count          = local.create_oidc ? 1 : 0
  url            = "https://token.actions.githubusercontent.com"
  client_id_list = ["sts.amazonaws.com"]
  # IAM trusts GitHub's certificate through its own root CAs; the provider API still takes a
  # thumbprint list (GitHub's published intermediates).
  thumbprint_list = [
    "6938fd4d98bab03faadb97b34396831e3780aea1",
    "1c58a3a8518e8759bf075b76b750d4f2df264fcd",
  ]
  tags = var.tags
}

data "aws_iam_policy_document" "github_trust" {
  count = local.ci ? 1 : 0
  statement {
    sid     = "GitHubActionsOfOneRepository"
    actions = ["sts:AssumeRoleWithWebIdentity"]
    principals {
      type        = "Federated"
      identifiers = [local.github_oidc_provider_arn]
    }
    condition {
      test     = "StringEquals"
      variable = "token.actions.githubusercontent.com:aud"
      values   = ["sts.amazonaws.com"]
    }
    condition {
      test     = "StringEquals"
      variable = "token.actions.githubusercontent.com:sub"
      values   = formatlist("repo:${var.github_repository}:%s", var.github_subjects)
    }
  }
}

resource "aws_iam_role" "github" {
  count                = local.ci ? 1 : 0
  name                 = "${var.name}-github-actions"
  description          = "GitHub Actions of ${var.github_repository}: runs launch with the launcher policy."
  assume_role_policy   = data.aws_iam_policy_document.github_trust[0].json
  max_session_duration = var.ci_session_hours * 3600
  tags                 = var.tags
}

resource "aws_iam_role_policy_attachment" "github" {
  count      = local.ci ? 1 : 0
  role       = aws_iam_role.github[0].name
  policy_arn = aws_iam_policy.launcher.arn
}
