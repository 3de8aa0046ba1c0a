"""The package's import structure: no import circles, no reaching into another module's privates.

Both are read from the source with ``ast`` (nothing is imported), so a circle that only closes
inside a function, at run time, is found as well as one between module tops: a function-level
import is still a dependency, and a circle through one is what makes a module impossible to
read, move or test on its own. Imports under ``if TYPE_CHECKING:`` count too (a circle of types
is still a circle), and so do those in the body of ``if __name__ == "__main__":`` (there the
file runs as the module ``__main__``, so Python would not loop; a reader following the imports
still would: ``_trace_dist``'s rank entry point imported ``_measure``, which imports it, until
the entry point moved to ``_measure``, issue 26).
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "launcher"

#: Imports that close a circle, each dropped from the graph with why it is there and what would
#: remove it (none now: the last two went with script_info.py and options.py).
#: ``test_the_allowlists_are_still_needed`` fails once an entry is no longer needed.
CIRCLE_EDGES: dict[tuple[str, str], str] = {}

#: Cross-package imports of a private module (``launcher.a._m`` from outside ``launcher.a``), each
#: with why it stays. A private module may always be imported from inside its own package (the
#: trace child's modules import each other; a provider imports ``_aws``): that is what the
#: underscore means here, "this package's business".
PRIVATE_MODULE_IMPORTS: dict[tuple[str, str], str] = {
    # The recipe probe's child (python -m launcher.recipe) counts training FLOPs on fake tensors
    # with the same depth scaling as the memory trace: one home for "which blocks are a stack".
    ("launcher.recipe", "launcher.estimate._blocks"):
        "the probe child counts FLOPs with the tracer's depth scaling",
    # The framework child reads a real step's CPU allocator events as the trace child's
    # reference measurement does (one reader of torch's profiler tree).
    ("launcher.capture.child.measure", "launcher.estimate.child._measure"):
        "the framework child's real step reads the allocator as measure() does",
}

#: Private names of another module still imported. Debt, not design: the function should be
#: made public by its module's owner.
PRIVATE_NAME_IMPORTS: dict[tuple[str, str], str] = {}


@dataclass(frozen=True)
class Import:
    """One import statement's target, as a module of the package and where it is written."""

    importer: str
    module: str  # the launcher module imported (or imported from)
    names: tuple[str, ...]  # for ``from m import a, b``: a, b; for ``import m``: ()
    line: int


def _modules() -> dict[str, Path]:
    """Every module of the package by dotted name (a package by its own name)."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


MODULES = _modules()


def _is_package(name: str) -> bool:
    return MODULES[name].name == "__init__.py"


def _walk(tree: ast.AST, main_block: bool = False) -> Iterator[ast.AST]:
    """Every node of the module, leaving out ``if __name__ == "__main__":`` bodies unless asked."""
    for node in ast.iter_child_nodes(tree):
        if not main_block and isinstance(node, ast.If) and _is_main_guard(node.test):
            yield from (n for stmt in node.orelse for n in ast.walk(stmt))
            continue
        yield node
        yield from _walk(node, main_block)


def _is_main_guard(test: ast.expr) -> bool:
    return (isinstance(test, ast.Compare) and isinstance(test.left, ast.Name)
            and test.left.id == "__name__" and len(test.comparators) == 1
            and isinstance(test.comparators[0], ast.Constant)
            and test.comparators[0].value == "__main__")


@functools.cache
def _tree(name: str) -> ast.Module:
    return ast.parse(MODULES[name].read_text(encoding="utf-8"))


@functools.cache
def _imports(name: str, main_block: bool = False) -> list[Import]:
    tree = _tree(name)
    package = name if _is_package(name) else name.rpartition(".")[0]
    out = []
    for node in _walk(tree, main_block):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "launcher":
                    out.append(Import(name, _module_of(alias.name), (), node.lineno))
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            if base.split(".")[0] == "launcher":
                out.append(Import(name, _module_of(base), tuple(a.name for a in node.names),
                                  node.lineno))
    return out


def _module_of(dotted: str) -> str:
    """The longest prefix of ``dotted`` that is a module of the package."""
    parts = dotted.split(".")
    while parts and ".".join(parts) not in MODULES:
        parts.pop()
    return ".".join(parts)


def _edges() -> dict[str, dict[str, int]]:
    """module -> {module it imports: the first line that does}. ``from pkg import sub`` is an
    edge to ``pkg.sub``; the implicit import of parent packages is not an edge."""
    graph: dict[str, dict[str, int]] = {name: {} for name in MODULES}
    for name in MODULES:
        for imp in _imports(name, main_block=True):
            targets = [f"{imp.module}.{n}" for n in imp.names if f"{imp.module}.{n}" in MODULES]
            if len(targets) < len(imp.names) or not imp.names:
                targets.append(imp.module)  # names defined in the module itself
            for target in targets:
                if target != name:
                    graph[name].setdefault(target, imp.line)
    return graph


def _graph_without_allowed() -> dict[str, dict[str, int]]:
    graph = _edges()
    for importer, imported in CIRCLE_EDGES:
        graph[importer].pop(imported, None)
    return graph


def _cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_graph_sees_function_level_imports() -> None:
    """The walk must see an import inside a function (where most of the package's are)."""
    graph = _edges()
    assert "launcher.estimate.allocator" in graph["launcher.estimate._answer"]  # in a function
    assert "launcher.plan.plan" in graph["launcher.estimate.traced"]  # at the top


def test_no_import_circles() -> None:
    graph = _graph_without_allowed()
    problems = []
    for component in _cycles(graph):
        members = set(component)
        edges = [f"  {a} -> {b} ({MODULES[a].relative_to(PACKAGE.parent)}:{line})"
                 for a in component for b, line in sorted(graph[a].items()) if b in members]
        problems.append("circle: " + " <-> ".join(component) + "\n" + "\n".join(edges))
    assert not problems, "\n".join(problems)


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _private_module_outside(importer: str, module: str) -> bool:
    """Is ``module`` private to a package that ``importer`` is not in?"""
    parts = module.split(".")
    for i, part in enumerate(parts):
        if _private(part):
            owner = ".".join(parts[:i])  # the package the private module belongs to
            return not (importer == owner or importer.startswith(owner + "."))
    return False


def _violations() -> list[str]:
    found = []
    for name, path in MODULES.items():
        where = path.relative_to(PACKAGE.parent)
        bound: dict[str, str] = {}  # local name -> the launcher module it is bound to
        for imp in _imports(name, main_block=True):
            modules = [imp.module]
            for n in imp.names:
                sub = f"{imp.module}.{n}"
                if sub in MODULES:
                    modules.append(sub)
                    bound[n] = sub
                elif (_private(n) and imp.module != name
                      and (name, sub) not in PRIVATE_NAME_IMPORTS):
                    found.append(f"{where}:{imp.line}: imports {imp.module}.{n}, a private name")
            if not imp.names:
                bound[imp.module.split(".")[0]] = imp.module.split(".")[0]
            for module in modules:
                if (_private_module_outside(name, module)
                        and (name, module) not in PRIVATE_MODULE_IMPORTS):
                    found.append(f"{where}:{imp.line}: imports {module}, private to its package")
        for node in ast.walk(_tree(name)):
            if not (isinstance(node, ast.Attribute) and _private(node.attr)):
                continue
            dotted = _dotted(node.value)
            if dotted is None or dotted.split(".")[0] not in bound:
                continue
            target = ".".join([bound[dotted.split(".")[0]], *dotted.split(".")[1:]])
            if target in MODULES and target != name and f"{target}.{node.attr}" not in MODULES:
                found.append(f"{where}:{node.lineno}: reads {target}.{node.attr}, a private name")
    return found


def _dotted(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        inner = _dotted(node.value)
        return None if inner is None else f"{inner}.{node.attr}"
    return None


def test_no_module_reaches_into_another_modules_private_names() -> None:
    found = _violations()
    assert not found, "\n".join(found)


def test_the_allowlists_are_still_needed() -> None:
    """An allowlisted import that is gone must leave its list, so that the lists stay honest."""
    graph = _edges()
    gone = [edge for edge in CIRCLE_EDGES if edge[1] not in graph[edge[0]]]
    assert not gone, f"no longer imported, remove from CIRCLE_EDGES: {gone}"
    for edge in CIRCLE_EDGES:  # and each still closes a circle (else it is no exception)
        assert any(set(edge) <= set(c) for c in _cycles(graph)), f"closes no circle: {edge}"
    used = {(name, imp.module) for name in MODULES for imp in _imports(name, main_block=True)}
    used |= {(name, f"{imp.module}.{n}") for name in MODULES
             for imp in _imports(name, main_block=True) for n in imp.names}
    for allowlist in (PRIVATE_MODULE_IMPORTS, PRIVATE_NAME_IMPORTS):
        assert not set(allowlist) - used, f"no longer imported: {set(allowlist) - used}"


#: Private attributes of PyTorch's own objects that the estimator reads (torch has no public name
#: for them): a module's parameter and buffer dicts, an op's schema and packet, a tensor's view
#: flag, the SDPA kernels' aten ops. Checked by name, since the objects are function arguments.
TORCH_PRIVATE_ATTRIBUTES = ("_parameters", "_buffers", "_is_view", "_schema", "_overloadpacket",
                            "_opname", "_scaled_dot_product_", "_has_symbolic_sizes_strides")


def _own_private_names(tree: ast.Module) -> set[str]:
    """Private names a module defines itself: functions, classes, variables, and attributes it
    sets on ``self`` or ``cls`` (its own objects' state) or on a function it defines."""
    names: set[str] = set()
    defined = {node.name for node in ast.walk(tree)
               if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif (isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store)
              and isinstance(node.value, ast.Name)
              and node.value.id in ("self", "cls", *defined)):
            names.add(node.attr)  # its own objects' state, or a marker on its own function
    return names


def _third_party_names(tree: ast.Module) -> set[str]:
    """Names a module binds by importing something outside the package (torch, boto3 ...)."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names
                      if a.name.split(".")[0] != "launcher"}
        elif (isinstance(node, ast.ImportFrom) and not node.level
              and (node.module or "").split(".")[0] != "launcher"):
            names |= {a.asname or a.name for a in node.names}
    return names


def _reach_ins(tree: ast.Module, where: str) -> list[str]:
    """``obj._name`` where ``_name`` is nobody's business in this module: not defined here, not
    set on its own ``self``, not read off a third-party import or PyTorch's own objects."""
    found = []
    own, foreign = _own_private_names(tree), _third_party_names(tree)
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Attribute) and _private(node.attr)) or node.attr in own:
            continue
        if node.attr.startswith(TORCH_PRIVATE_ATTRIBUTES):
            continue
        root = node.value
        while isinstance(root, (ast.Attribute, ast.Call, ast.Subscript)):
            root = root.func if isinstance(root, ast.Call) else root.value
        if isinstance(root, ast.Name) and (root.id in ("self", "cls") or root.id in foreign):
            continue
        found.append(f"{where}:{node.lineno}: {ast.unparse(node)} (a private attribute of "
                     "another module's object)")
    return found


def test_no_module_reads_or_writes_another_modules_private_attributes() -> None:
    """``doctor`` once set ``provider._credentials`` and called ``provider._storage_client()``:
    a private attribute is its class's business. Found from the source: an ``x._name`` whose
    ``_name`` this module neither defines nor sets on its own ``self``."""
    found = [line for name, path in MODULES.items()
             for line in _reach_ins(_tree(name), str(path.relative_to(PACKAGE.parent)))]
    assert not found, "\n".join(found)


def test_the_private_attribute_check_finds_a_reach_in() -> None:
    """The check itself: an assignment to and a call of another object's privates are found;
    a module's own object state and a third-party private are not."""
    source = ("import torch\n"
              "class Own:\n"
              "    def __init__(self):\n"
              "        self._cache = {}\n"
              "    def get(self, other: 'Own'):\n"
              "        return other._cache, torch._C\n"
              "def check(provider, credentials):\n"
              "    provider._credentials = credentials\n"
              "    return provider._storage_client()\n")
    found = _reach_ins(ast.parse(source), "m.py")
    assert [line.split(": ")[1].split(" (")[0] for line in found] == [
        "provider._credentials", "provider._storage_client"]


#: Lines over which a module must say at its top why it is one unit ("Over 600 lines on
#: purpose: ..."): past this a module is usually doing several jobs.
MODULE_LINES = 600


def test_a_long_module_says_why_it_is_one_unit() -> None:
    long = []
    for name, path in MODULES.items():
        lines = path.read_text(encoding="utf-8").count("\n")
        doc = ast.get_docstring(_tree(name)) or ""
        if lines > MODULE_LINES and f"Over {MODULE_LINES} lines on purpose" not in doc:
            long.append(f"{path.relative_to(PACKAGE.parent)}: {lines} lines, and its docstring "
                        f"does not say why (\"Over {MODULE_LINES} lines on purpose: ...\")")
    assert not long, "\n".join(long)


def test_the_estimators_api_never_imports_the_trace_child() -> None:
    """``launcher.estimate`` is two programs: the API the planner calls and the trace child
    (``estimate/child/``), which runs in a process of its own. The API side starts the child by
    its module name and reads its answers; it imports none of its modules, at any level (so
    torch and the user's code never load in the CLI). Outside ``estimate/`` only the framework
    child's real step reads the allocator as the trace child's reference does."""
    child = "launcher.estimate.child"
    found = []
    for name, path in MODULES.items():
        if name == child or name.startswith(child + "."):
            continue
        for node in _walk(ast.parse(path.read_text(encoding="utf-8")), main_block=True):
            targets = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                       [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            if any(t == child or t.startswith(child + ".") for t in targets):
                found.append(name)
    assert sorted(set(found)) == ["launcher.capture.child.measure"], found

