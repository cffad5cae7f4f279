"""The package's layers, read from its own imports: no import cycle (imports inside functions
count; those under ``TYPE_CHECKING`` do not) and no import from a lower layer up. The
"Layout" section of docs/development.md draws the same picture."""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import hpccollect

ROOT = Path(hpccollect.__file__).parent

#: lowest first; a module may import its own layer and those below it
LAYERS = [
    {
        "_version",
        "_compat",
        "_checks",
        "_lazy",
        "_signals",
        "_exit",
        "_launchers",
        "errors",
        "protocol",
    },
    {"transport"},
    {"envs"},
    {"policy"},
    {"storage"},
    {"collectors"},
    {"launchers"},
    {"distributed"},
    {"app", "__main__"},
]
#: modules that only re-export names where users look for them
FACADES = {
    "hpccollect": "the public names",
    "hpccollect.collectors.distributed": "TorchRL's torchrl.collectors.distributed path",
    "hpccollect.collectors.distributed.default_configs": "TorchRL's default_configs path",
}


def _modules() -> dict[str, Path]:
    found = {}
    for path in ROOT.rglob("*.py"):
        parts = ("hpccollect", *path.relative_to(ROOT).with_suffix("").parts)
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


def _runtime_imports(path: Path, modules: dict[str, Path]) -> set[str]:
    tree = ast.parse(path.read_text())
    type_only = {
        id(node)
        for branch in ast.walk(tree)
        if isinstance(branch, ast.If) and "TYPE_CHECKING" in ast.unparse(branch.test)
        for node in ast.walk(branch)
    }
    found = set()
    for node in ast.walk(tree):
        if id(node) in type_only:
            continue
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [f"{node.module}.{alias.name}" for alias in node.names] + [node.module]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        else:
            continue
        for name in names:
            while name and name not in modules:
                name = name.rpartition(".")[0]
            if name:
                found.add(name)
                break
    return found


def _named_imports(path: Path, modules: dict[str, Path]) -> set[str]:
    """The modules of the package that ``path`` names as ``"module:attr"`` strings outside
    docstrings (registrations, lazy tables, targets): imports made later, by name."""
    tree = ast.parse(path.read_text())
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and node.body
        and isinstance(node.body[0], ast.Expr)
    }
    found = set()
    for node in ast.walk(tree):
        if id(node) in docstrings or not isinstance(node, ast.Constant):
            continue
        if isinstance(node.value, str) and _NAMED.match(node.value):
            name = node.value.partition(":")[0]
            while name and name not in modules:
                name = name.rpartition(".")[0]
            if name:
                found.add(name)
    return found


_NAMED = re.compile(r"^hpccollect(\.\w+)*:\w+$")


def _graph() -> dict[str, set[str]]:
    """Each module's imports: those it makes, and those it makes by name."""
    modules = _modules()
    return {
        name: (_runtime_imports(path, modules) | _named_imports(path, modules)) - {name}
        for name, path in modules.items()
    }


def _layer(module: str) -> int:
    parts = module.split(".")
    unit = parts[1] if len(parts) > 1 else parts[0]
    for index, layer in enumerate(LAYERS):
        if unit in layer:
            return index
    raise AssertionError(f"{module} is in no layer: add {unit!r} to LAYERS")


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in graph[node]:
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                other = stack.pop()
                on_stack.discard(other)
                component.append(other)
                if other == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in graph:
        if node not in index:
            visit(node)
    return found


def test_the_import_graph_has_no_cycle():
    graph = _graph()
    assert len(graph) > 50  # the whole package was read
    cycles = _cycles(graph)
    described = [
        [f"{a} -> {b}" for a in cycle for b in sorted(graph[a] & set(cycle))] for cycle in cycles
    ]
    assert not cycles, described


def test_no_module_imports_a_layer_above_its_own():
    upward = [
        f"{module} -> {imported}"
        for module, imports in _graph().items()
        if module not in FACADES
        for imported in imports
        if _layer(imported) > _layer(module)
    ]
    assert not upward, upward


def _registrations(source: str) -> list[str]:
    """The modules named by ``"module:attr"`` targets of the ``register_*(...)`` calls in
    ``source``: imports made later, by name, which ``_runtime_imports`` cannot see."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.Call) and ast.unparse(node.func).startswith("register_")):
            continue
        for arg in [*node.args, *(k.value for k in node.keywords)]:
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str) and ":" in arg.value:
                found.append(arg.value.partition(":")[0])
    return found


def _lazy_exports(module: str) -> list[str]:
    """The modules whose names ``module`` re-exports through ``lazy_exports``: imports made on
    first use, by name, likewise."""
    getattr_ = vars(importlib.import_module(module)).get("__getattr__")
    targets = getattr(getattr_, "targets", {})
    return [target.partition(":")[0] for target in targets.values()]


def test_what_is_registered_by_name_exists_and_is_not_above_who_registers_it():
    """A registration by name (``register_launcher``, ``register_execution``, ...) is an import
    made on first use: it names a module of the package that exists, in the registering
    module's layer or below (the public facade ties the layers together)."""
    modules = _modules()
    named = {
        module: _registrations(path.read_text())
        + (_lazy_exports(module) if "lazy_exports(" in path.read_text() else [])
        for module, path in modules.items()
        if "register_" in path.read_text() or "lazy_exports(" in path.read_text()
    }
    assert len(_lazy_exports("hpccollect.collectors")) > 20
    assert sum(len(targets) for targets in named.values()) >= 8  # launchers, execution, ...
    missing = [t for targets in named.values() for t in targets if t not in modules]
    assert not missing, missing
    upward = [
        f"{module} -> {target}"
        for module, targets in named.items()
        if module not in FACADES
        for target in targets
        if _layer(target) > _layer(module)
    ]
    assert not upward, upward


def test_a_package_whose_names_load_on_first_use_declares_them_for_type_checkers():
    """``lazy_exports`` packages import under ``TYPE_CHECKING`` exactly the names they load on
    first use (type checkers and editors read those), and list each in ``__all__``."""
    packages = [m for m, path in _modules().items() if "= lazy_exports(" in path.read_text()]
    assert {"hpccollect", "hpccollect.collectors", "hpccollect.launchers"} <= set(packages)
    for package in packages:
        tree = ast.parse(_modules()[package].read_text())
        declared = set()
        for branch in ast.walk(tree):
            if isinstance(branch, ast.If) and "TYPE_CHECKING" in ast.unparse(branch.test):
                for node in ast.walk(branch):
                    if isinstance(node, ast.ImportFrom):
                        declared |= {alias.asname or alias.name for alias in node.names}
                    elif isinstance(node, ast.Assign):
                        declared |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        module = importlib.import_module(package)
        lazy = set(vars(module)["__getattr__"].targets)
        assert declared == lazy, (package, declared ^ lazy)
        assert lazy <= set(module.__all__), (package, lazy - set(module.__all__))


def test_the_checks_see_a_cycle_and_an_upward_import():
    """The checks themselves can fail."""
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == [["a", "b", "c"]]
    assert _layer("hpccollect.transport.base") < _layer("hpccollect.collectors.workers.pool")
    assert _registrations('register_x("a", "m.n:A", defaults_from="m.o:B")') == ["m.n", "m.o"]


def test_an_import_by_name_counts_in_the_graph(tmp_path):
    """A ``"module:attr"`` string is an edge of the import graph (two cycles hid there: the
    execution registry with the collectors it named, and the gathered job's rank 0 with the
    gatherer's collector); a docstring that names one is not."""
    source = tmp_path / "a.py"
    source.write_text(
        '"""Names hpccollect.errors:ArgumentValueError."""\n'
        'TARGET = "hpccollect.storage.merge:merge_shards"\n'
        'register("x", "hpccollect.collectors.multi:MultiCollector")\n'
    )
    modules = _modules()
    found = _named_imports(source, modules)
    assert found == {"hpccollect.storage.merge", "hpccollect.collectors.multi"}
    assert "hpccollect.collectors.torchrl_api.execution" in _graph()["hpccollect"]


def test_the_transport_layer_knows_nothing_above_it():
    above = {
        f"{module} -> {imported}"
        for module, imports in _graph().items()
        if module.startswith("hpccollect.transport")
        for imported in imports
        if not imported.startswith("hpccollect.transport") and _layer(imported) > 0
    }
    assert not above, above


def _used_of(tree: ast.AST, holder: str) -> set[str]:
    """The attributes read through ``self.<holder>`` or a local ``<holder>`` in ``tree``."""
    used = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            value = node.value
            if isinstance(value, ast.Name) and value.id == holder:
                used.add(node.attr)
            if (
                isinstance(value, ast.Attribute)
                and value.attr == holder
                and isinstance(value.value, ast.Name)
                and value.value.id == "self"
            ):
                used.add(node.attr)
    return used


def test_a_gathering_uses_only_what_its_host_interface_declares():
    """The strategies read their collector through ``GatheringHost`` alone: a new use of the
    collector must be declared there (where the collector's side sees it)."""
    from hpccollect.collectors.workers.gathering import GatheringHost

    tree = ast.parse((ROOT / "collectors" / "workers" / "gathering.py").read_text())
    strategies = [n for n in tree.body if isinstance(n, ast.ClassDef) and "Gathering" in n.name]
    used = set().union(*(_used_of(cls, "c") for cls in strategies if cls.name != "GatheringHost"))
    declared = set(GatheringHost.__annotations__) | {
        name for name in vars(GatheringHost) if callable(getattr(GatheringHost, name))
    }
    assert used, "the check reads the strategies"
    assert used <= declared, sorted(used - declared)
    assert _used_of(ast.parse("self.c._secret\nc.other"), "c") == {"_secret", "other"}


def test_the_application_reaches_datasets_only_through_the_sink_contract():
    """No module of ``app/`` imports a format's own module or names its classes: a second
    format is one module in ``storage/`` plus ``register_format``."""
    format_names = {"HDF5Writer", "H5Dataset", "open_dataset", "merge_shards", "repair", "h5py"}
    found = []
    for path in (ROOT / "app").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                names = {a.name for a in node.names}
                if "hdf5" in node.module or (
                    node.module.startswith("hpccollect.storage") and names & format_names
                ):
                    found.append(f"{path.name}: from {node.module} import {sorted(names)}")
            elif isinstance(node, ast.Import):
                found += [f"{path.name}: import {a.name}" for a in node.names if a.name == "h5py"]
    assert not found, found
