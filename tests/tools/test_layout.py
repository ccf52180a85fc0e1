"""The package's shape: no import cycles, an honest public surface, little module state."""

from __future__ import annotations

import ast
import re
import sys
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


_MUTABLE_CONSTRUCTORS = frozenset(
    {
        "dict",
        "list",
        "set",
        "bytearray",
        "deque",
        "defaultdict",
        "OrderedDict",
        "Counter",
        "ChainMap",
        "WeakKeyDictionary",
        "WeakValueDictionary",
        "WeakSet",
    }
)
_MUTATING_METHODS = frozenset(
    {
        "append",
        "appendleft",
        "add",
        "clear",
        "discard",
        "extend",
        "extendleft",
        "insert",
        "pop",
        "popitem",
        "popleft",
        "remove",
        "reverse",
        "rotate",
        "setdefault",
        "sort",
        "update",
        "difference_update",
        "intersection_update",
        "symmetric_difference_update",
        "move_to_end",
        "subtract",
    }
)


def _is_mutable_value(value: ast.expr | None) -> bool:
    """A literal or constructor call that makes a mutable container."""
    if isinstance(value, (ast.Dict, ast.List, ast.Set, ast.DictComp, ast.ListComp, ast.SetComp)):
        return True
    if isinstance(value, ast.Call):
        func = value.func
        name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)
        return name in _MUTABLE_CONSTRUCTORS
    return False


def _module_level_statements(body: list[ast.stmt]) -> list[ast.stmt]:
    """The module's own statements, those under a module-level if / try / with included."""
    out: list[ast.stmt] = []
    for node in body:
        out.append(node)
        if isinstance(node, (ast.If, ast.Try, ast.With)):
            nested = [*node.body, *getattr(node, "orelse", []), *getattr(node, "finalbody", [])]
            for handler in getattr(node, "handlers", []):
                nested += handler.body
            out += _module_level_statements(nested)
    return out


def _mutable_module_names(tree: ast.Module) -> dict[str, int]:
    """Module-level names bound to a mutable container, and the line binding each."""
    names: dict[str, int] = {}
    for node in _module_level_statements(tree.body):
        if isinstance(node, ast.Assign) and _is_mutable_value(node.value):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    names.setdefault(target.id, node.lineno)
        elif (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and _is_mutable_value(node.value)
        ):
            names.setdefault(node.target.id, node.lineno)
    return names


def _aliases(
    tree: ast.Module, module: str, containers: dict[str, dict[str, int]]
) -> tuple[dict[str, str], dict[str, str]]:
    """The names by which ``module`` reaches a module-level container, its own or imported.

    Returns:
        Local name -> ``module.NAME`` of a container (its own, ``from m import NAME``), and
        local name -> module (``import m``, ``import m as x``, ``from package import m``).
    """
    names = {name: f"{module}.{name}" for name in containers[module]}
    modules: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in containers and alias.asname:
                    modules[alias.asname] = alias.name
        elif isinstance(node, ast.ImportFrom) and node.module:
            for alias in node.names:
                local = alias.asname or alias.name
                if alias.name in containers.get(node.module, {}):
                    names[local] = f"{node.module}.{alias.name}"
                elif f"{node.module}.{alias.name}" in containers:
                    modules[local] = f"{node.module}.{alias.name}"
    return names, modules


def _in_place_mutations(
    tree: ast.Module, names: dict[str, str], modules: dict[str, str], containers: set[str]
) -> list[tuple[str, int, str]]:
    """Every (container, line, how) in the module that changes a container in place.

    A mutating method call (on the container or an item of it), an item assigned or
    deleted, and an augmented assignment to the container or an item of it; the container
    reached by a name from :func:`_aliases` (``NAME``, ``module.NAME``).
    """
    found: list[tuple[str, int, str]] = []

    def container(node: ast.expr) -> str | None:
        while isinstance(node, ast.Subscript):  # NAME[k][j] changes NAME
            node = node.value
        if isinstance(node, ast.Name):
            return names.get(node.id)
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            qualified = f"{modules.get(node.value.id)}.{node.attr}"
            return qualified if qualified in containers else None
        return None

    def note(target: ast.expr, line: int, how: str, item_only: bool = False) -> None:
        if item_only and not isinstance(target, ast.Subscript):
            return  # binding a name is not changing what it was bound to
        name = container(target)
        if name is not None:
            found.append((name, line, how))

    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if node.func.attr in _MUTATING_METHODS:
                note(node.func.value, node.lineno, f".{node.func.attr}()")
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                for each in target.elts if isinstance(target, ast.Tuple) else [target]:
                    note(each, node.lineno, "item assigned", item_only=True)
        elif isinstance(node, ast.AnnAssign):
            note(node.target, node.lineno, "item assigned", item_only=True)
        elif isinstance(node, ast.AugAssign):
            note(node.target, node.lineno, "augmented assignment")
        elif isinstance(node, ast.Delete):
            for target in node.targets:
                note(target, node.lineno, "item deleted", item_only=True)
    return found


def _mutated_module_state() -> dict[str, list[str]]:
    """Per module-level container changed in place anywhere: where (``path:line how``).

    A local variable named like a module-level container of its module counts too (the
    check reads names, not scopes): name module state apart, as `_UPPER` names are.
    """
    trees = {_module_name(p): (p, ast.parse(p.read_text())) for p in PACKAGE.rglob("*.py")}
    containers = {module: _mutable_module_names(tree) for module, (_, tree) in trees.items()}
    qualified = {f"{module}.{name}" for module, names in containers.items() for name in names}
    mutated: dict[str, list[str]] = {}
    for module, (path, tree) in sorted(trees.items()):
        names, modules = _aliases(tree, module, containers)
        for name, line, how in _in_place_mutations(tree, names, modules, qualified):
            where = f"{path.relative_to(PACKAGE.parent)}:{line} {how}"
            mutated.setdefault(name, []).append(where)
    return mutated


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
        "async_tee._handoff.caller._QUEUE",
        "async_tee._handoff.caller._SNAPSHOT_KEYS",
        "async_tee._handoff.caller._WHOLE_UP_TO",
        "async_tee._session.lifecycle._ACTIVE",
        "async_tee._session.lifecycle._LAST",
        "async_tee._session.lifecycle._LIFECYCLE",
        "async_tee._session.lifecycle._EXIT_HOOK_INSTALLED",
        "async_tee._reporting._WARNED",
        "async_tee._reporting._SATURATED",
        "async_tee._tables.registry._BY_METER",
        "async_tee._tables.registry._BY_METER_LOCK",
        "async_tee._worker.gil._BUDGET",
    }
    assert mutable <= set(state)
    global_statements: set[str] = set()
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Global):
                global_statements.update(f"{_module_name(path)}.{n}" for n in node.names)
    assert global_statements <= mutable, global_statements - mutable
    # Module state changed in place needs no `global`: a module-level dict, list, set,
    # deque... that any function mutates is state too, and needs its reason as well.
    mutated = _mutated_module_state()
    unlisted = {name: where for name, where in mutated.items() if name not in mutable}
    assert not unlisted, f"module-level state mutated in place, not in `mutable`: {unlisted}"


def test_the_in_place_check_sees_each_kind_of_mutation():
    source = """
import collections
from async_tee import _reporting
from async_tee._reporting import _WARNED as warned

_LIST: list[int] = []
_MAP = collections.defaultdict(list)
_FROZEN = frozenset()
if True:
    _NESTED = {}


def change() -> None:
    _LIST.append(1)
    _MAP["k"].extend([1])
    _MAP["k"] = []
    _MAP["a"]["b"] += 1
    del _MAP["k"]
    _NESTED.setdefault("k", 0)
    warned.add("x")
    _reporting._WARNED.clear()
    _LIST.copy()  # reads, does not change
    _FROZEN.union({1})
"""
    tree = ast.parse(source)
    own = _mutable_module_names(tree)
    assert set(own) == {"_LIST", "_MAP", "_NESTED"}
    containers = {"m": own, "async_tee._reporting": {"_WARNED": 1}, "async_tee": {}}
    names, modules = _aliases(tree, "m", containers)
    qualified = {"m._LIST", "m._MAP", "m._NESTED", "async_tee._reporting._WARNED"}
    found = [(name, how) for name, _, how in _in_place_mutations(tree, names, modules, qualified)]
    assert sorted(found) == sorted(
        [
            ("m._LIST", ".append()"),
            ("m._MAP", ".extend()"),
            ("m._MAP", "item assigned"),
            ("m._MAP", "augmented assignment"),
            ("m._MAP", "item deleted"),
            ("m._NESTED", ".setdefault()"),
            ("async_tee._reporting._WARNED", ".add()"),
            ("async_tee._reporting._WARNED", ".clear()"),
        ]
    )


STAGES = ("_declare", "_handoff", "_worker", "_tables", "_export", "_session")
"""The stages, folders of the package, in the order a dict meets them."""

SHARED = {"async_tee._reporting", "async_tee._settings", "async_tee._version"}
"""Modules any stage may import: warn once and redact, the frozen configuration, the version."""

FACES = {"async_tee.vocabulary": "_declare", "async_tee.registry": "_tables"}
"""Public modules that are a stage's own API: the declaring functions, the registry."""


def _stage(module: str) -> str | None:
    """The stage ``module`` belongs to (by folder, or as a stage's public face), or None."""
    if module in FACES:
        return FACES[module]
    parts = module.split(".")
    return parts[1] if len(parts) > 2 and parts[1] in STAGES else None


def test_every_private_module_is_in_a_stage_or_shared():
    loose = [
        m
        for m in _imports()
        if m.count(".") == 1
        and m.split(".")[1].startswith("_")
        and m.split(".")[1] != "__main__"
        and m.split(".")[1] not in STAGES
        and m not in SHARED
    ]
    assert not loose, f"private modules outside the stages: {loose}"


def test_no_stage_imports_a_later_stage_or_the_session():
    later = []
    for module, targets in _imports().items():
        stage = _stage(module)
        if stage is None:
            continue
        for target in targets:
            to = _stage(target)
            if to is not None and STAGES.index(to) > STAGES.index(stage):
                later.append(f"{module} -> {target}")
    assert not later, later


def test_the_handoff_imports_only_the_standard_library_declare_and_reporting():
    allowed = {"async_tee._reporting", "async_tee._handoff"}
    found: set[str] = set()
    for path in (PACKAGE / "_handoff").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                found.add(node.module)
    outside = {
        name
        for name in found
        if name.split(".")[0] not in sys.stdlib_module_names
        and name not in allowed
        and not name.startswith(("async_tee._declare", "async_tee._handoff"))
    }
    assert not outside, outside


def test_the_session_assembles_in_few_lines_from_few_modules():
    session = PACKAGE / "_session" / "session.py"
    assert len(session.read_text().splitlines()) <= 300
    imported = _imports()["async_tee._session.session"]
    # A module counts once whichever of its names are imported.
    modules = {name for name in imported if name.replace(".", "/") + ".py" in _PATHS}
    assert len(modules) <= 10, sorted(modules)


_PATHS = {str(p.relative_to(PACKAGE.parent)) for p in PACKAGE.rglob("*.py")}


def test_every_test_module_has_a_name_of_its_own():
    """pytest imports test modules by basename (no packages under tests/): two modules of one
    name make it collect one and error on the other, and the other's tests never run."""
    tests = Path(__file__).resolve().parents[1]
    names = sorted(path.name for path in tests.rglob("test_*.py"))
    assert len(names) == len(set(names)), sorted({n for n in names if names.count(n) > 1})
