"""The package's shape: no import cycles, an honest public surface, little module state."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import async_tee

PACKAGE = Path(async_tee.__file__).parent
README = (PACKAGE.parent / "README.md").read_text()


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports() -> dict[str, set[str]]:
    """Every async_tee module and the async_tee modules it imports anywhere in its body."""
    modules = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module:
                found.add(node.module)
                found.update(f"{node.module}.{alias.name}" for alias in node.names)
        graph[name] = {m for m in found if m in modules and m != name}
    return graph


def test_no_import_cycles_not_even_type_only_or_lazy_ones():
    graph = _imports()
    # "from async_tee import x" names the package; only its submodule counts as an edge.
    for name, targets in graph.items():
        if name != "async_tee":
            targets.discard("async_tee")
    visiting: list[str] = []
    done: set[str] = set()

    def visit(node: str) -> None:
        if node in done:
            return
        assert node not in visiting, " -> ".join([*visiting[visiting.index(node) :], node])
        visiting.append(node)
        for target in sorted(graph[node]):
            visit(target)
        visiting.pop()
        done.add(node)

    for module in sorted(graph):
        visit(module)


def test_every_top_level_name_is_on_the_readmes_journey():
    missing = [name for name in async_tee.__all__ if not re.search(rf"\b{name}\b", README)]
    assert not missing, f"in async_tee.__all__ but not in the README: {missing}"


def test_every_async_tee_name_the_readme_uses_is_exported():
    used = set(re.findall(r"\basync_tee\.([A-Za-z_]\w*)\(", README))
    assert used <= set(async_tee.__all__), used - set(async_tee.__all__)


def test_module_state_is_a_handful_of_names():
    state = []
    node: ast.AST
    for path in PACKAGE.rglob("*.py"):
        for node in ast.parse(path.read_text()).body:
            targets = []
            if isinstance(node, ast.Assign):
                targets = [t.id for t in node.targets if isinstance(t, ast.Name)]
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                targets = [node.target.id]
            state += [f"{_module_name(path)}.{t}" for t in targets if re.fullmatch(r"_[A-Z_]+", t)]
    # Mutable module state only: each of these has a one-line reason where it is defined.
    mutable = {
        "async_tee._caller._QUEUE",
        "async_tee._caller._READ_KEYS",
        "async_tee._telemetry._ACTIVE",
        "async_tee._telemetry._LAST",
        "async_tee._telemetry._LIFECYCLE",
        "async_tee._telemetry._HOOKS_INSTALLED",
        "async_tee._reporting._WARNED",
        "async_tee._reporting._SATURATED",
        "async_tee.registry._BY_METER",
        "async_tee.registry._BY_METER_LOCK",
        "async_tee._gil._BUDGET",
    }
    assert mutable <= set(state)
    global_statements: set[str] = set()
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Global):
                global_statements.update(f"{_module_name(path)}.{n}" for n in node.names)
    assert global_statements <= mutable, global_statements - mutable
