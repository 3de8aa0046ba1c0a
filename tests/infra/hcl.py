"""Read a Terraform module with python-hcl2 and evaluate the parts the policy tests need.

There is no Terraform binary here (nor in CI), so this evaluates the small subset of the language
the modules in ``infra/`` use: literals, string templates, references to variables, locals, data
sources and resources (with ``count`` and ``for_each``), ``dynamic`` blocks, the conditional
operator, comparison and boolean operators, ``*``, and the functions ``coalesce concat contains
format formatlist keys length lookup lower replace toset upper``. Anything else raises
:class:`Unsupported` rather than guessing, so a module that grows beyond the subset fails the tests
loudly instead of being checked wrongly.

Computed attributes (an ARN, an email, a role's full name) come from ``computed`` hooks per
resource type, built from the resource's own arguments and the ``facts`` a test gives (account,
partition, project number): the same strings the providers' APIs return.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import hcl2

BLOCK = "__is_block__"


class Unsupported(Exception):
    """The module uses HCL this evaluator does not know."""


# -- loading -----------------------------------------------------------------------------------


def _unquote_key(key: str) -> str:
    return key[1:-1] if len(key) >= 2 and key[0] == key[-1] == '"' else key


def _normalize(value: Any) -> Any:
    """hcl2's output without quoted keys and block markers (values stay raw expressions)."""
    if isinstance(value, dict):
        return {_unquote_key(k): _normalize(v) for k, v in value.items()
                if not k.startswith("__")}  # block markers, comments
    if isinstance(value, list):
        return [_normalize(v) for v in value]
    return value


@dataclass
class Module:
    """The blocks of every ``*.tf`` file of one folder."""

    path: Path
    variables: dict[str, dict[str, Any]] = field(default_factory=dict)
    locals: dict[str, Any] = field(default_factory=dict)
    resources: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    data: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    outputs: dict[str, dict[str, Any]] = field(default_factory=dict)
    sources: dict[str, str] = field(default_factory=dict)  # file name -> text


@cache
def load_module(path: Path) -> Module:
    """Parsed once per folder (lark takes about a second per module); treat it as read-only."""
    module = Module(path)
    for tf in sorted(path.glob("*.tf")):
        text = tf.read_text(encoding="utf-8")
        module.sources[tf.name] = text
        parsed = _normalize(hcl2.loads(text))
        for block in parsed.get("variable", []):
            module.variables.update(block)
        for block in parsed.get("locals", []):
            for name, value in block.items():
                if name in module.locals:
                    raise Unsupported(f"local.{name} defined twice")
                module.locals[name] = value
        for kind, target in (("resource", module.resources), ("data", module.data)):
            for block in parsed.get(kind, []):
                for rtype, named in block.items():
                    for name, body in named.items():
                        target[(rtype, name)] = body
        for block in parsed.get("output", []):
            module.outputs.update(block)
    return module


@cache
def _tfvars(path: Path) -> dict[str, Any]:
    return _normalize(hcl2.loads(path.read_text(encoding="utf-8")))


def load_tfvars(path: Path) -> dict[str, Any]:
    """A ``.tfvars`` file's values (literals only)."""
    raw = _tfvars(path)
    evaluator = Evaluator(Module(path.parent), {})
    return {k: evaluator.value(v, {}) for k, v in raw.items()}


# -- expressions -------------------------------------------------------------------------------

_TOKEN = re.compile(r"""
    (?P<space>\s+)
  | (?P<number>\d+(?:\.\d+)?)
  | (?P<string>")
  | (?P<op>==|!=|>=|<=|&&|\|\||[-+*/%<>!?:()\[\]{},.=])
  | (?P<name>[A-Za-z_][A-Za-z0-9_-]*)
""", re.VERBOSE)


def _string_end(text: str, start: int) -> int:
    """Index just past the closing quote of the string literal starting at ``text[start]``,
    skipping escapes and nested ``${...}``."""
    i = start + 1
    while i < len(text):
        ch = text[i]
        if ch == "\\":
            i += 2
            continue
        if ch == '"':
            return i + 1
        if text.startswith("${", i):
            i = _interpolation_end(text, i + 2)
            continue
        i += 1
    raise Unsupported(f"unterminated string in {text!r}")


def _interpolation_end(text: str, start: int) -> int:
    """Index just past the ``}`` that closes an interpolation whose body starts at ``start``."""
    depth = 1
    i = start
    while i < len(text):
        ch = text[i]
        if ch == '"':
            i = _string_end(text, i)
            continue
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    raise Unsupported(f"unterminated interpolation in {text!r}")


def _tokens(text: str) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    i = 0
    while i < len(text):
        match = _TOKEN.match(text, i)
        if match is None:
            raise Unsupported(f"cannot read {text[i:i + 30]!r} in {text!r}")
        kind = match.lastgroup or ""
        if kind == "string":
            end = _string_end(text, i)
            out.append(("string", text[i:end]))
            i = end
            continue
        if kind != "space":
            out.append((kind, match.group()))
        i = match.end()
    return out


_FUNCTIONS: dict[str, Callable[..., Any]] = {
    "lower": lambda s: s.lower(),
    "upper": lambda s: s.upper(),
    "coalesce": lambda *xs: next(x for x in xs if x is not None and x != ""),
    "concat": lambda *xs: [item for x in xs for item in x],
    "contains": lambda xs, x: x in xs,
    "keys": lambda m: sorted(m),
    "length": len,
    "lookup": lambda m, k, default=None: m.get(k, default),
    "toset": lambda xs: sorted(set(xs), key=str),
    "format": lambda f, *xs: _format(f, xs),
    "formatlist": lambda f, *xs: _formatlist(f, xs),
    "replace": lambda s, old, new: s.replace(old, new),
}


def _format(spec: str, values: Any) -> str:
    if re.search(r"%[^sd%]", spec):
        raise Unsupported(f"format verb in {spec!r}")
    return spec.replace("%d", "%s") % tuple(values)


def _formatlist(spec: str, values: tuple[Any, ...]) -> list[str]:
    """Terraform's formatlist: lists are zipped (same length), scalars repeat."""
    lengths = {len(v) for v in values if isinstance(v, list)}
    if len(lengths) != 1:
        raise Unsupported(f"formatlist({spec!r}) needs lists of one length")
    rows = [[v[i] if isinstance(v, list) else v for v in values] for i in range(lengths.pop())]
    return [_format(spec, row) for row in rows]


class _Parser:
    """Recursive descent over one expression; evaluates as it parses, short-circuiting the
    conditional (a branch not taken may index a resource whose count is 0, as in Terraform)."""

    def __init__(self, evaluator: Evaluator, text: str, scope: dict[str, Any]):
        self.ev = evaluator
        self.text = text
        self.tokens = _tokens(text)
        self.pos = 0
        self.scope = scope
        self.skip = 0  # > 0 while parsing a branch that is not taken

    def peek(self, value: str | None = None) -> bool:
        if self.pos >= len(self.tokens):
            return False
        return value is None or self.tokens[self.pos][1] == value

    def take(self, value: str | None = None) -> tuple[str, str]:
        if self.pos >= len(self.tokens):
            raise Unsupported(f"unexpected end of {self.text!r}")
        token = self.tokens[self.pos]
        if value is not None and token[1] != value:
            raise Unsupported(f"expected {value!r}, found {token[1]!r} in {self.text!r}")
        self.pos += 1
        return token

    def parse(self) -> Any:
        value = self.conditional()
        if self.pos != len(self.tokens):
            raise Unsupported(f"unexpected {self.tokens[self.pos][1]!r} in {self.text!r}")
        return value

    def conditional(self) -> Any:
        condition = self.binary(0)
        if not self.peek("?"):
            return condition
        self.take("?")
        chosen = bool(condition) if not self.skip else True
        if not chosen:
            self.skip += 1
        yes = self.conditional()
        if not chosen:
            self.skip -= 1
        self.take(":")
        if chosen:
            self.skip += 1
        no = self.conditional()
        if chosen:
            self.skip -= 1
        return yes if chosen else no

    _LEVELS: tuple[tuple[str, ...], ...] = (("||",), ("&&",), ("==", "!="),
                                            (">", "<", ">=", "<="), ("+", "-"), ("*", "/", "%"))

    def binary(self, level: int) -> Any:
        if level == len(self._LEVELS):
            return self.unary()
        left = self.binary(level + 1)
        while self.pos < len(self.tokens) and self.tokens[self.pos][1] in self._LEVELS[level] \
                and self.tokens[self.pos][0] == "op":
            op = self.take()[1]
            right = self.binary(level + 1)
            if self.skip:
                continue
            left = {
                "||": lambda a, b: bool(a) or bool(b), "&&": lambda a, b: bool(a) and bool(b),
                "==": lambda a, b: a == b, "!=": lambda a, b: a != b,
                ">": lambda a, b: a > b, "<": lambda a, b: a < b,
                ">=": lambda a, b: a >= b, "<=": lambda a, b: a <= b,
                "+": lambda a, b: a + b, "-": lambda a, b: a - b,
                "*": lambda a, b: a * b, "/": lambda a, b: a / b, "%": lambda a, b: a % b,
            }[op](left, right)
        return left

    def unary(self) -> Any:
        if self.peek("!"):
            self.take()
            value = self.unary()
            return None if self.skip else not value
        if self.peek("-"):
            self.take()
            value = self.unary()
            return None if self.skip else -value
        return self.postfix()

    def postfix(self) -> Any:
        kind, text = self.take()
        if kind == "number":
            return float(text) if "." in text else int(text)
        if kind == "string":
            return None if self.skip else self.ev.template(text, self.scope)
        if text == "(":
            value = self.conditional()
            self.take(")")
            return value
        if text == "[":
            items = []
            while not self.peek("]"):
                items.append(self.conditional())
                if not self.peek("]"):
                    self.take(",")
            self.take("]")
            return items
        if text == "{":
            obj: dict[str, Any] = {}
            while not self.peek("}"):
                key = self.take()
                name = key[1] if key[0] == "name" else self.ev.template(key[1], self.scope)
                if self.peek("="):
                    self.take("=")
                else:
                    self.take(":")
                obj[name] = self.conditional()
                if self.peek(","):
                    self.take(",")
            self.take("}")
            return obj
        if kind != "name":
            raise Unsupported(f"unexpected {text!r} in {self.text!r}")
        if text in ("true", "false"):
            return text == "true"
        if text == "null":
            return None
        if self.peek("("):
            self.take("(")
            args = []
            while not self.peek(")"):
                args.append(self.conditional())
                if not self.peek(")"):
                    self.take(",")
            self.take(")")
            if text not in _FUNCTIONS:
                raise Unsupported(f"function {text}() in {self.text!r}")
            return None if self.skip else _FUNCTIONS[text](*args)
        # A reference: name(.attr | [index])*
        path: list[Any] = [text]
        while self.peek(".") or self.peek("["):
            if self.take()[1] == ".":
                path.append(self.take()[1])
            else:
                path.append(self.conditional())
                self.take("]")
        return None if self.skip else self.ev.reference(path, self.scope)


# -- evaluation --------------------------------------------------------------------------------

#: Computed attributes per resource type: (evaluator, type, name, instance scope) -> attrs.
Hook = Callable[["Evaluator", dict[str, Any], dict[str, Any]], dict[str, Any]]


@dataclass(frozen=True)
class PolicyDocumentRef:
    """``data.aws_iam_policy_document.NAME.json``: resolved to the document's statements."""

    name: str


class Evaluator:
    """Values of one module for given variables and facts."""

    def __init__(self, module: Module, variables: dict[str, Any],
                 facts: dict[str, Any] | None = None,
                 computed: dict[str, Hook] | None = None):
        self.module = module
        self.facts = dict(facts or {})
        self.computed = dict(computed or {})
        self.variables: dict[str, Any] = {}
        for name, spec in module.variables.items():
            if name in variables:
                self.variables[name] = variables[name]
            elif "default" in spec:
                self.variables[name] = self.value(spec["default"], {})
            else:
                raise KeyError(f"variable {name} has no default and no value")
        unknown = set(variables) - set(module.variables)
        if unknown:
            raise KeyError(f"no such variables: {sorted(unknown)}")
        self._locals: dict[str, Any] = {}

    # -- values

    def value(self, raw: Any, scope: dict[str, Any]) -> Any:
        if isinstance(raw, dict):
            return {k: self.value(v, scope) for k, v in raw.items()}
        if isinstance(raw, list):
            return [self.value(v, scope) for v in raw]
        if not isinstance(raw, str):
            return raw
        if raw.startswith("${") and _interpolation_end(raw, 2) == len(raw):
            return _Parser(self, raw[2:-1], scope).parse()
        if raw.startswith('"') and raw.endswith('"'):
            return self.template(raw, scope)
        raise Unsupported(f"cannot evaluate {raw!r}")

    def template(self, quoted: str, scope: dict[str, Any]) -> Any:
        """A quoted string with ``${...}`` interpolations; ``$${`` is a literal ``${``. A
        template that is one interpolation and nothing else keeps the value's type."""
        body = quoted[1:-1]
        if body.startswith("<<"):
            body = _heredoc(body)
        parts: list[Any] = []
        i = 0
        text = ""
        while i < len(body):
            if body.startswith("$${", i):
                text += "${"
                i += 3
            elif body.startswith("${", i):
                end = _interpolation_end(body, i + 2)
                if text:
                    parts.append(text)
                    text = ""
                parts.append(_Parser(self, body[i + 2:end - 1], scope).parse())
                i = end
            elif body[i] == "\\" and i + 1 < len(body):
                text += {"n": "\n", "t": "\t", '"': '"', "\\": "\\"}.get(body[i + 1], body[i + 1])
                i += 2
            else:
                text += body[i]
                i += 1
        if text:
            parts.append(text)
        if len(parts) == 1 and not isinstance(parts[0], str):
            return parts[0]
        return "".join("null" if p is None else str(p) for p in parts)

    def reference(self, path: list[Any], scope: dict[str, Any]) -> Any:
        head = path[0]
        if head in scope:  # each, count, a dynamic block's iterator
            return _walk(scope[head], path[1:])
        if head == "var":
            return _walk(self.variables[path[1]], path[2:])
        if head == "local":
            return _walk(self.local(path[1]), path[2:])
        if head == "data":
            return self.attribute("data", path[1], path[2], path[3:])
        if len(path) >= 2 and (head, path[1]) in self.module.resources:
            return self.attribute("resource", head, path[1], path[2:])
        raise Unsupported(f"reference {'.'.join(map(str, path))}")

    def local(self, name: str) -> Any:
        if name not in self._locals:
            if name not in self.module.locals:
                raise KeyError(f"local.{name}")
            self._locals[name] = self.value(self.module.locals[name], {})
        return self._locals[name]

    # -- resources and data sources

    def instances(self, kind: str, rtype: str, name: str) -> list[dict[str, Any]]:
        """The scopes of each instance of a block: ``[{}]`` for a plain one, one per index for
        ``count``, one per element for ``for_each`` (``each.key``/``each.value``)."""
        body = (self.module.resources if kind == "resource" else self.module.data)[(rtype, name)]
        if "count" in body:
            return [{"count": {"index": i}} for i in range(int(self.value(body["count"], {})))]
        if "for_each" in body:
            items = self.value(body["for_each"], {})
            pairs = items.items() if isinstance(items, dict) else ((x, x) for x in items)
            return [{"each": {"key": k, "value": v}} for k, v in pairs]
        return [{}]

    def body(self, kind: str, rtype: str, name: str) -> dict[str, Any]:
        return (self.module.resources if kind == "resource" else self.module.data)[(rtype, name)]

    def evaluated(self, kind: str, rtype: str, name: str) -> list[dict[str, Any]]:
        """Each instance's arguments, evaluated (nested blocks as lists of dicts)."""
        body = self.body(kind, rtype, name)
        out = []
        for scope in self.instances(kind, rtype, name):
            out.append(self.arguments(body, scope))
        return out

    def arguments(self, body: dict[str, Any], scope: dict[str, Any]) -> dict[str, Any]:
        skip = {"count", "for_each", "depends_on", "lifecycle", "dynamic", "provider"}
        values: dict[str, Any] = {}
        for key, raw in body.items():
            if key in skip:
                continue
            if isinstance(raw, list) and raw and all(isinstance(b, dict) for b in raw):
                values[key] = [self.arguments(b, scope) for b in raw]
            else:
                values[key] = self.value(raw, scope)
        for dynamic in body.get("dynamic", []):
            for block_name, spec in dynamic.items():
                items = self.value(spec["for_each"], scope)
                iterator = self.value(spec["iterator"], scope) if "iterator" in spec else \
                    block_name
                pairs = items.items() if isinstance(items, dict) else enumerate(items)
                for k, v in pairs:
                    inner = {**scope, iterator: {"key": k, "value": v}}
                    for content in spec["content"]:
                        values.setdefault(block_name, []).append(self.arguments(content, inner))
        return values

    def attribute(self, kind: str, rtype: str, name: str, rest: list[Any]) -> Any:
        prefix = "data." if kind == "data" else ""
        key = f"{prefix}{rtype}.{name}"
        if (kind == "data" and (rtype, name) not in self.module.data) or (
                kind == "resource" and (rtype, name) not in self.module.resources):
            raise Unsupported(f"no block {key}")
        body = self.body(kind, rtype, name)
        scope: dict[str, Any] = {}
        if "count" in body or "for_each" in body:
            if not rest:
                raise Unsupported(f"{key} without an index")
            index, rest = rest[0], rest[1:]
            scopes = self.instances(kind, rtype, name)
            if "count" in body:
                if not isinstance(index, int) or index >= len(scopes):
                    raise Unsupported(f"{key}[{index}] does not exist (count {len(scopes)})")
                scope = scopes[index]
            else:
                matching = [s for s in scopes if s["each"]["key"] == index]
                if not matching:
                    raise Unsupported(f"{key}[{index!r}] does not exist")
                scope = matching[0]
        if not rest:
            raise Unsupported(f"{key} without an attribute")
        attr, rest = rest[0], rest[1:]
        fact = self.facts.get(f"{key}.{attr}")
        if fact is not None:
            return _walk(fact, rest)
        if kind == "data" and rtype == "aws_iam_policy_document" and attr == "json":
            return PolicyDocumentRef(name)
        hook = self.computed.get(rtype)
        if hook is not None:
            attrs = hook(self, body, scope)
            if attr in attrs:
                return _walk(attrs[attr], rest)
        if attr in body:
            return _walk(self.value(body[attr], scope), rest)
        raise Unsupported(f"{key}.{attr} is computed and no hook knows it")

    # -- AWS policy documents

    def policy_document(self, name: str, scope: dict[str, Any] | None = None
                        ) -> list[dict[str, Any]]:
        """The statements of ``data.aws_iam_policy_document.NAME``, with its source documents',
        each as evaluated arguments (``sid effect actions not_actions resources not_resources
        principals condition``)."""
        body = self.module.data[("aws_iam_policy_document", name)]
        scopes = [scope] if scope is not None else self.instances(
            "data", "aws_iam_policy_document", name)
        statements: list[dict[str, Any]] = []
        for instance in scopes:
            values = self.arguments(body, instance)
            for ref in values.get("source_policy_documents", []):
                if not isinstance(ref, PolicyDocumentRef):
                    raise Unsupported(f"source_policy_documents of {name}: {ref!r}")
                statements += self.policy_document(ref.name)
            statements += values.get("statement", [])
        return statements


def _heredoc(body: str) -> str:
    """The text of ``<<EOT`` / ``<<-EOT`` (indented: the common indentation removed)."""
    import textwrap

    marker, _, rest = body.partition("\n")
    lines = rest.split("\n")
    if lines and lines[-1].strip() == marker.lstrip("<-").strip():
        lines = lines[:-1]
    text = "\n".join(lines) + "\n"
    return textwrap.dedent(text) if marker.startswith("<<-") else text


def _walk(value: Any, rest: list[Any]) -> Any:
    for step in rest:
        if isinstance(value, PolicyDocumentRef):
            raise Unsupported("attribute of a policy document")
        value = value[step]
    return value
