"""The rendered scripts read top to bottom: a docstring saying what the script is and how it is
laid out, the settings, then ``main()``/``train()`` (setup and the loop) near the top, then the
helpers they call, and the ``__main__`` guard last."""

from __future__ import annotations

import ast
import builtins

import pytest

from launcher.render import available_strategies, render_framework_script, render_script

#: What a strategy script defines before its entry point: the settings it reads (plan.json).
SETTINGS = {"load_plan"}
#: The entry point and the loop, in the order they are defined.
ENTRY = ("main", "train", "optimizer_step")


def top_level_functions(tree: ast.Module) -> dict[str, ast.FunctionDef]:
    return {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}


def module_names(tree: ast.Module) -> set[str]:
    """Every name the module binds at its top level: definitions, assignments, imports
    (also those inside a top-level try, as the fsdp scripts' fallback import is)."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node in tree.body:
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else (
            [node.target] if isinstance(node, ast.AnnAssign) else [])
        names.update(t.id for t in targets if isinstance(t, ast.Name))
    return names


def called_names(function: ast.FunctionDef) -> set[str]:
    """The plain names ``function`` calls (``f(...)``, not ``x.f(...)``), less its own locals."""
    local = {a.arg for a in ast.walk(function) if isinstance(a, ast.arg)}  # nested ones too
    for node in ast.walk(function):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            local.add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node is not function:
            local.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            local.update((a.asname or a.name).split(".")[0] for a in node.names)
    called = {n.func.id for n in ast.walk(function)
              if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
    return called - local - set(dir(builtins))


def reachable(functions: dict[str, ast.FunctionDef], start: str) -> list[str]:
    """The module's functions ``start`` calls, directly or through others, in first-call order."""
    seen, order = {start}, []
    queue = [start]
    while queue:
        name = queue.pop(0)
        order.append(name)
        calls = sorted(called_names(functions[name]) & functions.keys(),
                       key=lambda n: functions[n].lineno)
        for callee in calls:
            if callee not in seen:
                seen.add(callee)
                queue.append(callee)
    return order


def assert_ends_with_the_main_guard(tree: ast.Module) -> None:
    last = tree.body[-1]
    assert isinstance(last, ast.If), ast.unparse(last)
    assert ast.unparse(last.test) == "__name__ == '__main__'"
    assert [ast.unparse(s) for s in last.body] == ["main()"]


@pytest.fixture(scope="module", params=available_strategies())
def script(request: pytest.FixtureRequest) -> tuple[str, str]:
    return request.param, render_script(request.param)


def test_the_docstring_says_what_the_script_is_and_how_it_is_laid_out(script) -> None:
    strategy, source = script
    docstring = ast.get_docstring(ast.parse(source))
    assert docstring and docstring.startswith("Train a recipe")
    assert f"trainer_templates/{strategy}.py.j2" in docstring
    assert "The file reads top to bottom" in docstring


def test_settings_then_the_entry_point_near_the_top(script) -> None:
    strategy, source = script
    tree = ast.parse(source)
    functions = top_level_functions(tree)
    defined = [n.name for n in tree.body if isinstance(n, ast.FunctionDef)]
    first_entry = defined.index(ENTRY[0])
    assert set(defined[:first_entry]) == SETTINGS, defined[:first_entry]
    assert tuple(defined[first_entry:first_entry + len(ENTRY)]) == ENTRY
    # Near the top: the loop starts within the first quarter of the file.
    lines = source.count("\n")
    assert functions["train"].lineno < lines // 4, (functions["train"].lineno, lines)
    # Before every helper the entry point calls, the settings aside.
    helpers = set(reachable(functions, "main")) - SETTINGS - set(ENTRY)
    assert helpers
    assert all(functions[h].lineno > functions["optimizer_step"].end_lineno for h in helpers)


def test_the_module_ends_with_the_main_guard(script) -> None:
    assert_ends_with_the_main_guard(ast.parse(script[1]))


def test_every_helper_the_entry_point_calls_is_defined(script) -> None:
    """Defined below is fine (Python looks names up when the call runs), undefined is not: a name
    the entry point reaches must be bound at the module's top level."""
    tree = ast.parse(script[1])
    functions, bound = top_level_functions(tree), module_names(tree)
    for name in reachable(functions, "main"):
        missing = called_names(functions[name]) - bound
        assert not missing, f"{name} calls undefined {sorted(missing)}"
    # The hooks every strategy supplies to the loop, and what the estimator imports.
    for hook in ("setup_runtime", "wrap_model", "gradient_sync", "clip_gradients",
                 "load_checkpoint", "build_model", "build_optimizer", "synthetic_stream",
                 "seed_all", "param_dtype", "Runtime", "Progress"):
        assert hook in bound, hook


def test_the_framework_shim_reads_top_to_bottom_too() -> None:
    source = render_framework_script()
    tree = ast.parse(source)
    functions = top_level_functions(tree)
    assert functions["main"].lineno < source.count("\n") // 4
    assert_ends_with_the_main_guard(tree)
    bound = module_names(tree)
    for name in reachable(functions, "main"):
        missing = called_names(functions[name]) - bound
        assert not missing, f"{name} calls undefined {sorted(missing)}"
