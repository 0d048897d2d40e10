"""The package is layered: no import cycles, and imports go down the layers only.

Every ``import`` counts, at module level or inside a function (a deferred import is still a dependency), except
under ``if TYPE_CHECKING:``. Layers, bottom up: ``ops``/``reference``/``runtime`` → ``frontend`` → ``mlir`` (the
printer) → ``backends`` → ``api`` → the package ``__init__``; ``functional`` (the Pythonic face of the ops) sits on
``ops`` alone; ``metrics``/``models``/``demo`` sit beside.
"""

from __future__ import annotations

import ast
from pathlib import Path

import moe_mlir

PKG = Path(moe_mlir.__file__).parent
#: The helpers of the ops package (validation, autograd, the extension's loading and tables): the op modules import
#: them, they import no op module (each op family is one module beside them, imported by ``ops/__init__.py``).
OPS_HELPERS = {"moe_mlir.ops._checks", "moe_mlir.ops._autograd", "moe_mlir.ops.loading"}
#: What each layer may not import (by module-name prefix).
FORBIDDEN = {
    "moe_mlir.ops": ("moe_mlir.frontend", "moe_mlir.mlir", "moe_mlir.backends", "moe_mlir.api"),
    "moe_mlir.runtime": ("moe_mlir.frontend", "moe_mlir.mlir", "moe_mlir.backends", "moe_mlir.api"),
    "moe_mlir.frontend": ("moe_mlir.mlir", "moe_mlir.backends", "moe_mlir.api", "moe_mlir.runtime"),
    "moe_mlir.mlir": ("moe_mlir.backends", "moe_mlir.api"),
    "moe_mlir.backends": ("moe_mlir.api",),
    "moe_mlir.functional": ("moe_mlir.frontend", "moe_mlir.mlir", "moe_mlir.backends", "moe_mlir.api",
                            "moe_mlir.runtime"),
}


def _modules() -> dict[str, Path]:
    mods = {}
    for f in PKG.rglob("*.py"):
        parts = list(f.relative_to(PKG.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        mods[".".join(parts)] = f
    return mods


def _is_type_checking(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or (
        isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING")


def _imports(name: str, path: Path, mods: dict[str, Path]) -> set[str]:
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    out: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node):
            for n in node.orelse:
                visit(n)
            return
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.startswith("moe_mlir"))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.startswith("moe_mlir"):
                for a in node.names:  # `from .pkg import mod` imports the submodule
                    sub = f"{target}.{a.name}"
                    out.add(sub if sub in mods else target)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text()))
    out.discard(name)
    return {m for m in out if m in mods and m != "moe_mlir"}


def _graph() -> dict[str, set[str]]:
    mods = _modules()
    return {name: _imports(name, path, mods) for name, path in mods.items()}


def test_no_import_cycles():
    graph = _graph()
    state: dict[str, int] = {}
    stack: list[str] = []
    cycles = []

    def dfs(n: str) -> None:
        state[n] = 1
        stack.append(n)
        for m in sorted(graph.get(n, ())):
            if state.get(m) == 1:
                cycles.append(stack[stack.index(m):] + [m])
            elif m not in state:
                dfs(m)
        stack.pop()
        state[n] = 2

    for n in sorted(graph):
        if n not in state:
            dfs(n)
    assert cycles == [], "\n".join(" -> ".join(c) for c in cycles)


def test_imports_go_down_the_layers():
    graph = _graph()
    bad = []
    for mod, deps in graph.items():
        for dep in deps:
            if mod in OPS_HELPERS and dep.startswith("moe_mlir.ops.") and dep not in OPS_HELPERS:
                bad.append(f"{mod} (a helper of the ops package) imports the op module {dep}")
            if dep == "moe_mlir.ops" and mod.startswith("moe_mlir.ops."):
                bad.append(f"{mod} imports its package moe_mlir.ops (import the module that defines the name)")
            for layer, forbidden in FORBIDDEN.items():
                if (mod == layer or mod.startswith(layer + ".")) and dep.startswith(forbidden):
                    bad.append(f"{mod} ({layer}) imports {dep}")
    assert bad == [], "\n".join(sorted(bad))


def test_the_checker_sees_deferred_imports():
    """The graph includes imports inside functions (the old compiler <-> gpu cycle was made of those)."""
    graph = _graph()
    assert "moe_mlir.backends.whole_graph" in graph["moe_mlir.backends.dynamo"]  # a deferred import
    assert "moe_mlir.frontend.raising" in graph["moe_mlir.backends.dynamo"]
    assert "moe_mlir.mlir.importer" not in graph["moe_mlir.mlir.lowerings"]  # under TYPE_CHECKING only


def test_the_ops_package_is_split_by_concern():
    """Each op family is its own module, which the package imports; the helpers exist (the checker above sees them)."""
    graph = _graph()
    assert OPS_HELPERS <= set(graph)
    for family in ("topk", "mixing", "seed_routers", "fused", "routing"):
        assert f"moe_mlir.ops.{family}" in graph["moe_mlir.ops"], family


def test_one_compiler_driver():
    """The build tools run through moe_mlir.runtime.driver only (prebuild starts Python worker processes, and the
    demo fresh interpreters for its compile timings, not tools): one place that builds (the in-process compiler, moe-opt,
    mlir-runner), and one disk cache."""
    allowed = {"moe_mlir.runtime.driver", "moe_mlir.runtime.prebuild", "moe_mlir.demo"}
    users = set()
    for name, path in _modules().items():
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            if "subprocess" in names:
                users.add(name)
    assert users <= allowed, f"run the tools through moe_mlir.runtime.driver: {sorted(users - allowed)}"
    assert "moe_mlir.runtime.driver" in users
