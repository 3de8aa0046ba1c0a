"""The HCL evaluator and the IAM evaluator the policy proofs stand on."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("hcl2")

from tests.infra.hcl import Evaluator, Unsupported, load_module  # noqa: E402
from tests.infra.iam import Request, decide  # noqa: E402

MODULE = '''
variable "name" {
  type    = string
  default = "Launch"
}
variable "key" {
  type    = string
  default = null
}
variable "members" {
  type    = list(string)
  default = ["b", "a", "b"]
}
locals {
  lowered  = lower(var.name)
  arn      = "arn:aws:iam::1:user/$${aws:username}/${local.lowered}-*"
  keys     = var.key == null ? [] : [var.key]
  picked   = length(local.keys) > 0 ? aws_iam_role.maybe[0].arn : "none"
  map      = { "us-east-1" = "763", "eu-west-1" = "111" }
  looked   = lookup(local.map, "eu-west-1", "0")
  listed   = formatlist("repo:org/r:%s", ["ref:main", "env:prod"])
  hours    = 6 * 3600
  heredoc  = <<-EOT
    name = "${local.lowered}"
  EOT
}
resource "aws_iam_role" "maybe" {
  count = length(local.keys)
  name  = "r"
}
resource "aws_iam_role" "each" {
  for_each = toset(var.members)
  name     = "role-${each.value}"
}
data "aws_iam_policy_document" "doc" {
  statement {
    actions   = ["s3:GetObject"]
    resources = [local.arn]
  }
  dynamic "statement" {
    for_each = local.keys
    content {
      actions   = ["kms:Decrypt"]
      resources = [statement.value]
    }
  }
}
'''


@pytest.fixture
def module(tmp_path: Path) -> Path:
    (tmp_path / "main.tf").write_text(MODULE)
    return tmp_path


def test_templates_references_functions_and_short_circuit(module: Path) -> None:
    ev = Evaluator(load_module(module), {})
    assert ev.local("arn") == "arn:aws:iam::1:user/${aws:username}/launch-*"
    assert ev.local("picked") == "none"  # the branch indexing count = 0 is not taken
    assert ev.local("looked") == "111"
    assert ev.local("listed") == ["repo:org/r:ref:main", "repo:org/r:env:prod"]
    assert ev.local("hours") == 21600
    assert ev.local("heredoc") == 'name = "launch"\n'
    assert [a["name"] for a in ev.evaluated("resource", "aws_iam_role", "each")] == [
        "role-a", "role-b"]
    assert ev.evaluated("resource", "aws_iam_role", "maybe") == []
    assert len(ev.policy_document("doc")) == 1


def test_dynamic_blocks_and_counted_resources(module: Path) -> None:
    hook = {"aws_iam_role": lambda ev, body, scope: {"arn": "arn:aws:iam::1:role/r"}}
    ev = Evaluator(load_module(module), {"key": "arn:aws:kms:k"}, computed=hook)
    assert ev.local("picked") == "arn:aws:iam::1:role/r"
    statements = ev.policy_document("doc")
    assert statements[1] == {"actions": ["kms:Decrypt"], "resources": ["arn:aws:kms:k"]}


def test_unknown_language_is_refused_not_guessed(module: Path) -> None:
    ev = Evaluator(load_module(module), {})
    with pytest.raises(Unsupported):
        ev.value("${timestamp()}", {})
    with pytest.raises(Unsupported):
        ev.value("${[for x in var.members : upper(x)]}", {})
    with pytest.raises(KeyError):
        Evaluator(load_module(module), {"nope": 1})


def test_iam_evaluation() -> None:
    statements = [
        {"actions": ["s3:Get*"], "resources": ["arn:aws:s3:::b/${aws:username}/*"]},
        {"actions": ["iam:PassRole"], "resources": ["arn:aws:iam::1:role/r"],
         "condition": [{"test": "StringEquals", "variable": "iam:PassedToService",
                        "values": ["sagemaker.amazonaws.com"]}]},
        {"effect": "Deny", "actions": ["s3:*"], "resources": ["*"],
         "condition": [{"test": "Bool", "variable": "aws:SecureTransport",
                        "values": ["false"]}]},
    ]
    alice = {"aws:username": "alice", "aws:SecureTransport": "true"}
    assert decide(statements, Request("s3:GetObject", "arn:aws:s3:::b/alice/x", alice)) == \
        "allowed"
    assert decide(statements, Request("S3:getobject", "arn:aws:s3:::b/alice/x", alice)) == \
        "allowed"  # actions are case-insensitive
    assert decide(statements, Request("s3:GetObject", "arn:aws:s3:::b/bob/x", alice)) == \
        "implicitDeny"
    assert decide(statements, Request("s3:GetObject", "arn:aws:s3:::b/alice/x",
                                      {**alice, "aws:SecureTransport": "false"})) == \
        "explicitDeny"
    assert decide(statements, Request("iam:PassRole", "arn:aws:iam::1:role/r",
                                      {"iam:PassedToService": "sagemaker.amazonaws.com"})) == \
        "allowed"
    assert decide(statements, Request("iam:PassRole", "arn:aws:iam::1:role/r")) == \
        "implicitDeny"
