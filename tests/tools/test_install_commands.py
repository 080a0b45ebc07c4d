"""Every documented install of this project pins torch in the same pip command.

Unpinned, ``pip install -e '.[docs]'`` in a fresh environment resolved the
newest torch, a CUDA build of several GB with its nvidia packages and triton,
on a CPU-only machine (commlib only asks for ``torch>=2.4``). Pinned, pip keeps
or takes the CPU build the README's commands name.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# `pip install` of the checkout: `-e .`, `-e '.[extra]'`, `.`, `'.[extra]'`
_THIS_PROJECT = re.compile(r"""(?:^|\s)(?:-e\s+)?['"]?\.(?:\[[^\]]*\])?['"]?(?:\s|$)""")


def _unpinned(text: str) -> list[str]:
    """The lines installing this project with no ``torch==`` up to that install."""
    found = []
    for line in text.splitlines():
        seen = ""
        for part in re.split(r"&&|;", line.split("#")[0]):
            seen += part
            command = re.search(r"pip install\s+(.*)", part)
            if command and _THIS_PROJECT.search(command.group(1)) and "torch==" not in seen:
                found.append(line.strip())
    return found


def test_the_check_tells_pinned_from_unpinned():
    assert _unpinned("pip install -e '.[docs]' && mkdocs serve")
    assert _unpinned("$ pip install .")
    assert not _unpinned("pip install torch==2.13.0 && pip install -e .")
    assert not _unpinned("pip install torch==2.13.0 -e '.[plot]'")
    assert not _unpinned("pip install ./examples/commlib-traced")  # another package


def test_every_install_of_this_project_pins_torch():
    unpinned = [
        f"{page.relative_to(ROOT)}: {line}"
        for page in PAGES
        for line in _unpinned(page.read_text())
    ]
    assert not unpinned, unpinned
