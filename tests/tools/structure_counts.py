"""The structure's figures, counted from the code: ``python tests/tools/structure_counts.py``.

What issue 41's "done when" measures, so anyone can check it against the bars:

* lines and code lines of the central modules (code lines leave out blank and
  comment lines, docstrings and ``@overload`` stubs);
* the code lines of the 11 tensor collectives' bodies (``communicator.py`` and
  the rooms of the collective families it derives from);
* every other module under ``commlib/`` over 700 lines;
* import circles (every import counts), collective-name sets outside
  ``commlib/_catalog.py``, and ``engine.plugin.X`` sites outside the engine.

It prints a table with each figure beside its bar and exits 1 when one is over
(``--report`` only prints). ``tests/tools/test_structure.py`` keeps the bars
that hold.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CORE = ROOT / "commlib"

#: the tensor collectives whose bodies are counted (``barrier`` among them)
TENSOR_COLLECTIVES = (
    "all_reduce",
    "all_gather",
    "all_gather_into_tensor",
    "gather",
    "broadcast",
    "reduce_scatter",
    "barrier",
    "reduce",
    "scatter",
    "all_to_all",
    "all_to_all_single",
)


def _is_overload(node: ast.AST) -> bool:
    decorators = getattr(node, "decorator_list", [])
    return any(
        (isinstance(d, ast.Name) and d.id == "overload")
        or (isinstance(d, ast.Attribute) and d.attr == "overload")
        for d in decorators
    )


def _left_out(tree: ast.AST) -> set[int]:
    """Lines of docstrings and of ``@overload`` stubs (decorators included)."""
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            first = body[0] if body else None
            if (
                isinstance(first, ast.Expr)
                and isinstance(first.value, ast.Constant)
                and isinstance(first.value.value, str)
            ):
                skip.update(range(first.lineno, (first.end_lineno or first.lineno) + 1))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and _is_overload(node):
            start = min(d.lineno for d in node.decorator_list)
            skip.update(range(start, (node.end_lineno or node.lineno) + 1))
    return skip


def code_lines(source: str, first: int = 1, last: int | None = None) -> int:
    """Lines of code in ``source`` (from ``first`` to ``last``, 1-based, inclusive).

    Examples:
        >>> code_lines('def f():\\n    \"\"\"Doc.\"\"\"\\n\\n    # why\\n    return 1\\n')
        2
    """
    lines = source.splitlines()
    skip = _left_out(ast.parse(source))
    last = len(lines) if last is None else last
    return sum(
        1
        for i in range(first, last + 1)
        if i not in skip and lines[i - 1].strip() and not lines[i - 1].strip().startswith("#")
    )


#: where the Communicator's methods are written: its module and its families' rooms
COMMUNICATOR_ROOMS = (
    "communicator.py",
    "_reducing_collectives.py",
    "_gathering_collectives.py",
    "_distributing_collectives.py",
    "_point_to_point.py",
    "_object_collectives.py",
)


def bodies(path: Path, names: tuple[str, ...]) -> dict[str, int]:
    """Code lines of each named method's body (its signature and decorators left out)."""
    source = path.read_text()
    found = {}
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef) and node.name in names and not _is_overload(node):
            found[node.name] = code_lines(source, node.body[0].lineno, node.end_lineno)
    return found


def tensor_collective_bodies() -> dict[str, int]:
    """Code lines of each tensor collective's body, wherever in the rooms it is written."""
    found: dict[str, int] = {}
    for name in COMMUNICATOR_ROOMS:
        found.update(bodies(CORE / name, TENSOR_COLLECTIVES))
    return found


def collective_name_sets() -> list[str]:
    """Facts about collectives kept outside the catalog: sets naming two collectives or more.

    A set literal, a ``set(...)`` / ``frozenset(...)`` of a literal, or a dict
    keyed by collective names whose values are constants (a fact per name);
    a dict of functions is a table of calls (commlib bench's), not a fact.
    """
    sys.path.insert(0, str(ROOT))
    from commlib._catalog import ROWS

    def named(items: list[ast.expr | None]) -> set[str]:
        return {
            e.value
            for e in items
            if isinstance(e, ast.Constant) and isinstance(e.value, str) and e.value in ROWS
        }

    found = []
    for path in sorted(CORE.rglob("*.py")):
        if path.name == "_catalog.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names: set[str] = set()
            if isinstance(node, ast.Set):
                names = named(list(node.elts))
            elif (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id in ("set", "frozenset")
                and node.args
                and isinstance(node.args[0], (ast.List, ast.Tuple))
            ):
                names = named(list(node.args[0].elts))
            elif isinstance(node, ast.Dict) and all(
                isinstance(v, ast.Constant) for v in node.values
            ):
                names = named(list(node.keys))
            if len(names) >= 2:
                found.append(f"{path.relative_to(ROOT)}:{node.lineno} {sorted(names)}")
    return found


def engine_plugin_sites() -> list[str]:
    """``engine.plugin.X`` outside ``commlib/_engine.py`` (the protocols call the engine)."""
    found = []
    for path in sorted([*CORE.rglob("*.py"), *(ROOT / "commlib_backends").rglob("*.py")]):
        if path == CORE / "_engine.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Attribute)
                and node.value.attr == "plugin"
                and isinstance(node.value.value, (ast.Name, ast.Attribute))
                and (
                    getattr(node.value.value, "id", None) == "engine"
                    or getattr(node.value.value, "attr", None) == "engine"
                )
            ):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno} engine.plugin.{node.attr}")
    return found


def figures() -> list[tuple[str, int, int]]:
    """(what, figure, bar) for every bar of the issue."""
    comm = CORE / "communicator.py"
    text = comm.read_text()
    sizes = tensor_collective_bodies()
    rows = [
        ("communicator.py lines", len(text.splitlines()), 1900),
        ("communicator.py code lines", code_lines(text), 1100),
        ("11 tensor-collective bodies, code lines", sum(sizes.values()), 470),
        ("largest tensor-collective body", max(sizes.values()), 70),
        ("all_reduce body", sizes["all_reduce"], 36),
    ]
    for name, bar in (("_engine.py", 800), ("backend.py", 1050), ("functional.py", 1050)):
        rows.append((f"{name} lines", len((CORE / name).read_text().splitlines()), bar))
    central = {"communicator.py", "_engine.py", "backend.py", "functional.py"}
    for path in sorted(CORE.rglob("*.py")):
        if path.name not in central or path.parent != CORE:
            n = len(path.read_text().splitlines())
            if n > 700:
                rows.append((f"{path.relative_to(ROOT)} lines", n, 700))
    rows.append(("collective-name sets outside the catalog", len(collective_name_sets()), 0))
    rows.append(("engine.plugin. sites outside the engine", len(engine_plugin_sites()), 0))
    return rows


def main(argv: list[str]) -> int:
    over = 0
    for name, n in tensor_collective_bodies().items():
        print(f"    {name:<28} {n:5d}")
    for what, figure, bar in figures():
        mark = "ok" if figure <= bar else "OVER"
        over += figure > bar
        print(f"{what:<48} {figure:6d}  (bar {bar}) {mark}")
    if "-v" in argv:
        print(*collective_name_sets(), *engine_plugin_sites(), sep="\n")
    return 1 if over and "--report" not in argv else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
