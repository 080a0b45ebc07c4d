"""The shape of the code: the layering rules a reader relies on, checked.

* no import cycles among commlib's modules, counting every import (module
  level, under ``TYPE_CHECKING`` and inside functions): with no cycle, every
  arrow points down the layers;
* imports inside functions only in the entry points that must load light;
* no module uses another module's private names;
* only the communicator reaches into a communicator's internals;
* the core names no device or vendor: that knowledge lives in ``commlib_backends/``;
* what each collective is lives in one row of ``commlib/_catalog.py``: no other
  module keeps a set of collective names (``tests/tools/structure_counts.py``
  counts this and the other figures of the layout).
"""

from __future__ import annotations

import ast
import itertools
import re
from pathlib import Path

import commlib
from tests.tools import structure_counts

CORE = Path(commlib.__file__).parent
ROOT = CORE.parent


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in CORE.rglob("*.py")}


class _Import:
    """One import of a commlib module: where it stands and whether it runs later."""

    def __init__(self, target: str, line: int, in_function: bool):
        self.target, self.line, self.in_function = target, line, in_function


def _imports(path: Path, known: set[str]) -> list[_Import]:
    """Every import of a commlib module in ``path``: module level, under
    ``if TYPE_CHECKING:``, and inside functions alike."""
    tree = ast.parse(path.read_text())
    found: list[_Import] = []
    this = _module_name(path)
    package = this if path.name == "__init__.py" else this.rsplit(".", 1)[0]

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import):
                for alias in child.names:
                    if alias.name in known and alias.name != this:
                        found.append(_Import(alias.name, child.lineno, in_function))
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    parts = package.split(".")
                    base = ".".join(parts[: len(parts) - child.level + 1])
                    base = f"{base}.{child.module}" if child.module else base
                for alias in child.names:
                    sub = f"{base}.{alias.name}"
                    target = sub if sub in known else base
                    if target in known and target != this:
                        found.append(_Import(target, child.lineno, in_function))
            visit(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)))

    visit(tree, False)
    return found


def _graph() -> dict[str, list[_Import]]:
    modules = _modules()
    known = set(modules)
    return {name: _imports(path, known) for name, path in modules.items()}


def test_no_import_cycles_among_commlib_modules():
    # every import counts: one inside a function only runs later, and hiding a cycle
    # there leaves the layers tangled all the same
    graph = {name: sorted({i.target for i in imports}) for name, imports in _graph().items()}
    state: dict[str, int] = {}
    stack: list[str] = []

    def walk(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for dep in graph[node]:
            if state.get(dep) == 1:
                cycle = [*stack[stack.index(dep) :], dep]
                raise AssertionError("import cycle: " + " -> ".join(cycle))
            if dep not in state:
                walk(dep)
        stack.pop()
        state[node] = 2

    for name in sorted(graph):
        if name not in state:
            walk(name)


#: the modules that may import commlib modules inside functions, and why: each is an
#: entry point whose own import must stay light (a command line, a benchmark runner,
#: the pytest plugin pytest loads in every session), and imports only downward
_LAZY_IMPORTERS = {
    "commlib.cli": "`commlib --help` and `commlib trace` start without torch.distributed",
    "commlib.bench": "the runner imports a case's machinery only when it runs",
    "commlib.bench.options": "the backend list is read only when --backend is parsed",
    "commlib.bench.report": "the report builds what it prints on demand",
    "commlib.bench.dispatch_report": "imports commlib only when the dispatch table is built",
    "commlib.testing.pytest_plugin": "pytest loads it in every session: commlib stays unloaded",
    "commlib.testing.conformance": "the kit loads the backend under test when it runs",
    "commlib.testing.harness": "the rank processes import commlib after they start",
    "commlib.testing.checks.tensors": "checks import what they exercise when they run",
    "commlib.testing.samples": "hypothesis strategies only when a property test draws",
}


def test_imports_inside_functions_only_where_allowed():
    # anywhere else an import in a function has been a hidden cycle or an upward arrow
    offenders = [
        f"{name}:{i.line} imports {i.target}"
        for name, imports in sorted(_graph().items())
        for i in imports
        if i.in_function and name not in _LAZY_IMPORTERS
    ]
    assert not offenders, offenders


def test_no_module_uses_another_modules_private_names():
    # an internal module is imported whole (``from commlib import _guard``); what it
    # lends others is public inside it
    offenders = []
    for path in [*CORE.rglob("*.py"), *(ROOT / "commlib_backends").rglob("*.py")]:
        tree = ast.parse(path.read_text())
        modules: set[str] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("commlib"):
                for alias in node.names:
                    full = f"{node.module}.{alias.name}"
                    is_module = (ROOT / (full.replace(".", "/") + ".py")).exists() or (
                        ROOT / full.replace(".", "/")
                    ).is_dir()
                    if is_module:
                        modules.add(alias.asname or alias.name)
                    elif alias.name.startswith("_") and not alias.name.startswith("__"):
                        offenders.append(f"{path.relative_to(ROOT)}:{node.lineno} {alias.name}")
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id in modules
                and node.attr.startswith("_")
                and not node.attr.startswith("__")
            ):
                offenders.append(
                    f"{path.relative_to(ROOT)}:{node.lineno} {node.value.id}.{node.attr}"
                )
    assert not offenders, offenders


# what only the communicator may touch on a communicator
_INTERNALS = {"_engine", "_member", "_strict", "_distributed", "_collective", "_run", "_wait"}


def test_no_module_outside_the_communicator_reaches_into_it():
    offenders = []
    for path in [*CORE.rglob("*.py"), *(ROOT / "commlib_backends").rglob("*.py")]:
        if path.name == "communicator.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Attribute)
                and node.attr in _INTERNALS
                and not (isinstance(node.value, ast.Name) and node.value.id == "self")
            ):
                offenders.append(f"{path.relative_to(ROOT)}:{node.lineno} .{node.attr}")
    assert not offenders, offenders


# vendor and device names; "accelerator" as a word is generic, but torch's
# runtime for it (torch.accelerator) is a device probe and belongs to a plugin
_DEVICE_WORDS = re.compile(r"(?<![a-z])(cuda|npu|mlu|nccl|hccl|cncl|gloo)(?![a-z])")


def _code_strings_and_names(tree: ast.AST) -> list[tuple[int, str]]:
    """Identifiers, attributes and string constants of code (docstrings left out)."""
    docstrings = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                docstrings.add(id(body[0].value))
            # an attribute's docstring: the string right after its assignment
            for before, stmt in itertools.pairwise(body):
                if (
                    isinstance(before, (ast.Assign, ast.AnnAssign))
                    and isinstance(stmt, ast.Expr)
                    and isinstance(stmt.value, ast.Constant)
                ):
                    docstrings.add(id(stmt.value))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            out.append((node.lineno, node.id))
        elif isinstance(node, ast.Attribute):
            out.append((node.lineno, node.attr))
            if node.attr == "accelerator":
                out.append((node.lineno, "cuda: torch.accelerator is a device probe"))
        elif isinstance(node, ast.alias):
            out.append((node.lineno, node.name))
        elif (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and id(node) not in docstrings
        ):
            out.append((node.lineno, node.value))
    return out


def test_the_core_names_no_device_or_vendor():
    # commlib.testing simulates the accelerators, so it must name them
    core = [p for p in CORE.rglob("*.py") if "testing" not in p.relative_to(CORE).parts]
    offenders = []
    for path in core:
        for line, text in _code_strings_and_names(ast.parse(path.read_text())):
            if _DEVICE_WORDS.search(text.lower()):
                offenders.append(f"{path.relative_to(ROOT)}:{line} {text!r}")
    assert not offenders, offenders


def test_facts_about_collectives_live_in_the_catalog():
    # a set of names elsewhere drifts from the rows: a new collective is then
    # missing from it, as the 9 scattered sets of an earlier layout were
    assert structure_counts.collective_name_sets() == []


def test_every_public_collective_has_its_row():
    from commlib._catalog import ROWS

    # the Communicator's own methods and those of the collective families it derives from
    methods = {
        getattr(member, "__commlib_collective__", None)
        for cls in commlib.Communicator.__mro__
        for member in vars(cls).values()
    }
    assert methods - {None} == set(ROWS)
