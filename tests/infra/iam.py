"""A small evaluator of AWS identity policies, for the statements the Terraform in infra/aws
writes: Allow and Deny, Action and NotAction with wildcards, Resource with wildcards and policy
variables (``${aws:username}``), and the condition operators those statements use.

It follows the documented evaluation logic for one identity policy (no SCPs, boundaries or
sessions): an explicit Deny wins, otherwise an Allow whose action, resource and every condition
match allows, otherwise the request is implicitly denied.
https://docs.aws.amazon.com/IAM/latest/UserGuide/reference_policies_evaluation-logic.html
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any


class UnsupportedCondition(Exception):
    pass


@dataclass(frozen=True)
class Request:
    """One API call the launcher (or a job) makes: the action, the resource ARN it acts on, and
    the request context keys that conditions may look at."""

    action: str
    resource: str
    context: Mapping[str, str] = field(default_factory=dict)
    why: str = ""

    def __str__(self) -> str:
        extra = f" with {dict(self.context)}" if self.context else ""
        return f"{self.action} on {self.resource}{extra}"


def _glob(pattern: str, value: str, *, case: bool) -> bool:
    """IAM wildcards: ``*`` any run of characters, ``?`` any one (no character classes)."""
    regex = "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern)
    return re.fullmatch(regex, value, 0 if case else re.IGNORECASE) is not None


def _substitute(pattern: str, context: Mapping[str, str]) -> str | None:
    """Replace policy variables; None when one is not in the context (the statement then does
    not match, as IAM does for a missing variable)."""
    missing = False

    def value(match: re.Match[str]) -> str:
        nonlocal missing
        key = match.group(1)
        if key in context:
            return context[key]
        missing = True
        return ""

    text = re.sub(r"\$\{([^}]+)\}", value, pattern)
    return None if missing else text


def _as_list(value: Any) -> list[str]:
    if value is None:
        return []
    return [value] if isinstance(value, str) else list(value)


def _condition(block: Mapping[str, Any], context: Mapping[str, str]) -> bool:
    test = block["test"]
    key = block["variable"]
    values = _as_list(block["values"])
    if_exists = test.endswith("IfExists")
    operator = test.removesuffix("IfExists")
    if key not in context:
        return if_exists or operator.startswith(("StringNot", "ArnNot"))
    have = context[key]
    if operator in ("StringEquals", "ArnEquals"):
        return have in values
    if operator == "StringEqualsIgnoreCase":
        return have.lower() in (v.lower() for v in values)
    if operator in ("StringLike", "ArnLike"):
        return any(_glob(v, have, case=True) for v in values)
    if operator == "StringNotEquals":
        return have not in values
    if operator in ("StringNotLike", "ArnNotLike"):
        return not any(_glob(v, have, case=True) for v in values)
    if operator == "Bool":
        return have.lower() in (v.lower() for v in values)
    raise UnsupportedCondition(test)


def _matches(statement: Mapping[str, Any], request: Request) -> bool:
    actions = _as_list(statement.get("actions"))
    not_actions = _as_list(statement.get("not_actions"))
    if actions:
        if not any(_glob(a, request.action, case=False) for a in actions):
            return False
    elif not_actions:
        if any(_glob(a, request.action, case=False) for a in not_actions):
            return False
    else:
        return False
    resources = _as_list(statement.get("resources"))
    not_resources = _as_list(statement.get("not_resources"))
    patterns = [_substitute(r, request.context) for r in (resources or not_resources)]
    hit = any(p is not None and _glob(p, request.resource, case=True) for p in patterns)
    if (resources and not hit) or (not_resources and hit) or not (resources or not_resources):
        return False
    return all(_condition(c, request.context) for c in statement.get("condition", []))


def decide(statements: Iterable[Mapping[str, Any]], request: Request) -> str:
    """``allowed``, ``explicitDeny`` or ``implicitDeny`` (IAM's own words)."""
    allowed = False
    for statement in statements:
        if not _matches(statement, request):
            continue
        if statement.get("effect", "Allow") == "Deny":
            return "explicitDeny"
        allowed = True
    return "allowed" if allowed else "implicitDeny"


def granted_actions(statements: Iterable[Mapping[str, Any]]) -> set[str]:
    """Every action an Allow statement names (wildcards as written)."""
    return {a for s in statements if s.get("effect", "Allow") == "Allow"
            for a in _as_list(s.get("actions"))}


def action_matches(pattern: str, action: str) -> bool:
    return _glob(pattern, action, case=False)
