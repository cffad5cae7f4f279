"""Nothing in the package reaches into another package: read from its own source, no module
assigns to another package's module attributes, reads another package's private names, or
touches ``sys.meta_path``.

What is still there is listed in ``REMAINING`` with the reason it is there: the test fails on
anything new, and on an entry that went (strike it from the list). Python's documented hooks
(``sys.excepthook``, ``warnings.showwarning``) and its public ``os._exit`` are not reaching in.
"""

from __future__ import annotations

import ast
from pathlib import Path

import hpccollect

ROOT = Path(hpccollect.__file__).parent

#: hooks Python documents as meant to be replaced, by the modules that replace them
HOOKS = {
    ("launchers/mpi.py", "sys.excepthook"): "an uncaught exception aborts the MPI job, as "
    "python -m mpi4py does",
    ("app/cli.py", "warnings.showwarning"): "warnings on one line",
    ("app/preflight.py", "warnings.showwarning"): "a worker's warnings reported as the job's",
}
#: names with a leading underscore that are public all the same
PUBLIC = {"_exit"}  # os._exit, documented

#: what still reaches in, by module, with why: where no public way exists, one module holds
#: the access and names the versions it was checked against, and a test of its own fails when
#: one breaks (tests/test_compat_private.py, tests/collectors/workers/test_fork_server.py)
REMAINING = {
    # every private name of torch, tensordict, gymnasium, TorchRL and multiprocessing the
    # package needs, each behind a name of its own (see the module's docstring)
    "_compat.py": {
        "import torch.utils.data._utils.collate.default_collate_fn_map",
        "import multiprocessing.resource_sharer",
        "read _new_unsafe",
        "read _foreach_copy_",
        "read _C",
        "read _storage_Use_Count",
        "read _cdata",
        "read _forward_hooks",
        "read _forward_pre_hooks",
        "read _env_obs",
        "read _autoreset_envs",
        "read _make_init_directory",
        "read _compilable",
        "read _init_lock",
        "read _init_event",
    },
    # a private fork server per job (its own environment, ended with the job): Python has
    # no public API for one
    "collectors/workers/fork_server.py": {
        "read _fds",
        "read _forkserver_pid",
        "read _forkserver_alive_fd",
        "read _forkserver_address",
    },
}


def _own_private_names(trees: dict[str, ast.AST]) -> set[str]:
    """The names with a leading underscore the package defines itself: functions, classes,
    module and class attributes, its objects' own attributes (``self._x = ...``), slots."""
    own = set()
    for tree in trees.values():
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                own.add(node.name)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                own.add(node.id)
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                own.add(node.target.id)
            elif isinstance(node, ast.arg):
                own.add(node.arg)
            elif isinstance(node, ast.alias):
                own.add(node.asname or node.name.split(".")[-1])
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                self_ = isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")
                if self_ or node.attr.startswith("_hpccollect"):  # a mark of its own
                    own.add(node.attr)
            elif isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "__slots__" for t in node.targets
            ):
                own |= {
                    c.value
                    for c in ast.walk(node.value)
                    if isinstance(c, ast.Constant) and isinstance(c.value, str)
                }
    return own


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__") and name not in PUBLIC


def _foreign_modules(tree: ast.AST) -> set[str]:
    """The local names bound to another package's modules or objects by ``tree``'s imports."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {
                a.asname or a.name.split(".")[0]
                for a in node.names
                if not a.name.startswith("hpccollect")
            }
        elif (
            isinstance(node, ast.ImportFrom)
            and node.level == 0
            and node.module
            and not node.module.startswith("hpccollect")
        ):
            names |= {a.asname or a.name for a in node.names}
    return names


def _reaching(tree: ast.AST, own: set[str]) -> set[str]:
    """What module ``tree`` does that reaches into another package (see the module)."""
    foreign = _foreign_modules(tree)
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            if node.attr == "meta_path":
                found.add("sys.meta_path")
            root = node.value
            while isinstance(root, ast.Attribute):
                root = root.value
            if (
                isinstance(node.ctx, ast.Store)
                and isinstance(root, ast.Name)
                and root.id in foreign
            ):
                found.add(f"assign {ast.unparse(node)}")
            elif _private(node.attr) and (
                node.attr not in own or (node.attr in NAMED and not _on_self(node))
            ):
                found.add(f"read {node.attr}")
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("getattr", "setattr", "hasattr")
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
            and isinstance(node.args[1].value, str)
            and _private(node.args[1].value)
            and not (isinstance(node.args[0], ast.Name) and node.args[0].id in ("self", "cls"))
        ):
            if node.args[1].value not in own:  # a private name read by its string
                found.add(f"read {node.args[1].value}")
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            modules = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [f"{node.module}.{a.name}" for a in node.names]
                if node.module and node.level == 0
                else []
            )
            for module in modules:
                if module.startswith("hpccollect"):
                    continue
                if any(_private(part) for part in module.split(".")) or module in UNDOCUMENTED:
                    found.add(f"import {module}")
    return found


#: other packages' private names seen here before, flagged on any object but the package's
#: own ``self``, whatever the package calls its own attributes
NAMED = {"_process", "_popen", "_Options", "_forkserver_pid", "_forkserver_alive_fd"}


def _on_self(node: ast.Attribute) -> bool:
    return isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")


#: stdlib modules with public names that Python does not document (private in practice)
UNDOCUMENTED = {"multiprocessing.resource_sharer", "multiprocessing.popen_fork"}


def _scan() -> dict[str, set[str]]:
    trees = {
        str(path.relative_to(ROOT)): ast.parse(path.read_text()) for path in ROOT.rglob("*.py")
    }
    own = _own_private_names(trees)
    found = {}
    for name, tree in trees.items():
        reaching = _reaching(tree, own)
        reaching -= {what.partition(" ")[2] for (module, what) in HOOKS if module == name} | {
            f"assign {what}" for (module, what) in HOOKS if module == name
        }
        if reaching:
            found[name] = reaching
    return found


def test_nothing_reaches_into_another_package_but_what_is_listed():
    found = _scan()
    assert len(list(ROOT.rglob("*.py"))) > 100  # the whole package was read
    new = {m: sorted(w - REMAINING.get(m, set())) for m, w in found.items()}
    new = {m: w for m, w in new.items() if w}
    assert not new, f"reaches into another package (use its public API): {new}"
    gone = {m: sorted(w - found.get(m, set())) for m, w in REMAINING.items()}
    gone = {m: w for m, w in gone.items() if w}
    assert not gone, f"no longer there: strike from REMAINING: {gone}"


def test_the_scan_sees_each_kind_of_reaching_in():
    """The checks themselves can fail."""
    source = (
        "import sys\n"
        "import torch\n"
        "from multiprocessing import forkserver, resource_sharer\n"
        "forkserver.connect_to_new_process = None\n"
        "torch.compiler.allow_in_graph = print\n"
        "sys.meta_path.insert(0, object())\n"
        "pid = server._forkserver_pid\n"
        "code = getattr(job, '_process_secret')\n"
        "self._process = job.job._process\n"
        "self._mine = 1\n"
        "hook._hpccollect_mark = True\n"
        "x = self._mine + os._exit + hook._hpccollect_mark\n"
    )
    tree = ast.parse(source)
    found = _reaching(tree, own=_own_private_names({"a.py": tree}))
    assert found == {
        "assign forkserver.connect_to_new_process",
        "assign torch.compiler.allow_in_graph",
        "sys.meta_path",
        "read _forkserver_pid",
        "read _process_secret",
        "read _process",
        "import multiprocessing.resource_sharer",
    }
