"""The shape of the code: the layering rules a reader relies on, checked.

* no import cycles among commlib's modules (imports at module level, those
  under ``TYPE_CHECKING`` included; an import inside a function runs later
  and is allowed);
* only the communicator reaches into a communicator's internals;
* the core names no device or vendor: that knowledge lives in ``backends/``.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import commlib

CORE = Path(commlib.__file__).parent
ROOT = CORE.parent


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in CORE.rglob("*.py")}


def _top_level_imports(path: Path, known: set[str]) -> set[str]:
    """commlib modules imported at module level (also under ``if TYPE_CHECKING:``)."""
    tree = ast.parse(path.read_text())
    found: set[str] = set()
    this = _module_name(path)
    package = this if path.name == "__init__.py" else this.rsplit(".", 1)[0]

    def visit(stmts: list[ast.stmt]) -> None:
        for node in stmts:
            if isinstance(node, ast.If):
                visit(node.body)
                visit(node.orelse)
            elif isinstance(node, ast.Try):
                visit(node.body)
            elif isinstance(node, ast.Import):
                found.update(a.name for a in node.names if a.name in known)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1])
                    base = f"{base}.{node.module}" if node.module else base
                for alias in node.names:
                    sub = f"{base}.{alias.name}"
                    found.add(sub if sub in known else base)

    visit(tree.body)
    return {m for m in found if m in known and m != this}


def test_no_import_cycles_among_commlib_modules():
    modules = _modules()
    known = set(modules)
    graph = {name: _top_level_imports(path, known) for name, path in modules.items()}
    state: dict[str, int] = {}
    stack: list[str] = []

    def walk(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for dep in sorted(graph[node]):
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


# what only the communicator may touch on a communicator
_INTERNALS = {"_engine", "_member", "_strict", "_distributed", "_collective", "_run", "_wait"}


def test_no_module_outside_the_communicator_reaches_into_it():
    offenders = []
    for path in [*CORE.rglob("*.py"), *(ROOT / "backends").rglob("*.py")]:
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
