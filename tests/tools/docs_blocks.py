"""The code blocks of the README and the docs pages, and a runner for them.

Every fenced block says, in an HTML comment right above it (blank lines
between are fine), what becomes of it::

    <!-- run: 2 ranks -->                   each of 2 processes runs it as a script,
                                            with the variables torchrun sets
    <!-- run: 1 process -->                 one plain process runs it (no launcher)
    <!-- run: 2 ranks
    given: import torch; loss = torch.ones(2)
    then: assert loss.item() == 2.0
    -->                                     code run before / after it, in its namespace
    <!-- run by: tests/clients/test_integration_docs.py -->   that file runs it
    <!-- not run: needs an NPU -->          shown only, with the reason

A page whose first line is ``<!-- Generated, do not edit: COMMAND -->`` is the
output of COMMAND: its blocks are not run (``test_docs_links.py`` checks the
page is what its generator makes).

Ranks are forked from a server that imported torch once (``forkserver``), so a
block costs a process group, not an interpreter start; each block gets fresh
processes and a fresh store, as a new torchrun would.

Examples:
    >>> [b.mode for b in blocks(ROOT / "docs" / "usage.md")][:2]   # doctest: +SKIP
    ['run', 'run']
"""

from __future__ import annotations

import datetime
import multiprocessing
import os
import re
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GENERATED = "<!-- Generated, do not edit:"
_FENCE = re.compile(r"^(```+|~~~+)(\S*)\s*$")
_RUN = re.compile(r"(?:(\d+) ranks|(1) process)\Z")
# what torchrun sets for its workers; the ranks of a block get the same
_LAUNCH_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK")


def pages() -> list[Path]:
    """The README and every page under docs/, in a fixed order."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("**/*.md"))]


@dataclass
class Block:
    """One fenced code block of a page and what its marker says."""

    page: Path
    line: int  # 1-based line of the opening fence
    lang: str
    code: str
    mode: str  # "run", "run by", "not run", "generated" or "" (no marker)
    argument: str = ""  # "2 ranks", a path, or the reason
    given: str = ""
    then: str = ""

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"

    @property
    def ranks(self) -> int:
        """How many processes run it (``run`` blocks only)."""
        match = _RUN.match(self.argument)
        if not match:
            raise ValueError(
                f"{self.where}: 'run: {self.argument}' is not 'N ranks' or '1 process'"
            )
        return int(match.group(1) or match.group(2))

    @property
    def launched(self) -> bool:
        """Whether its processes get a launcher's variables (``N ranks``), or none."""
        return self.argument.endswith("ranks")


def _parse_marker(block: Block, comment: str) -> None:
    head, *rest = comment.strip().split("\n")
    key, _, value = head.partition(":")
    if key.strip() not in ("run", "run by", "not run"):
        return
    block.mode, block.argument = key.strip(), value.strip()
    section = None
    for line in rest:
        if section is None and not line.strip():
            continue
        for name in ("given", "then"):
            if line.startswith(f"{name}:"):
                section, line = name, line[len(name) + 1 :]
        if section is None:
            raise ValueError(f"{block.where}: marker line {line!r} is not 'given:' or 'then:'")
        setattr(block, section, getattr(block, section) + line.strip() + "\n")


def blocks(page: Path) -> list[Block]:
    """Every fenced block of ``page`` with its marker.

    Examples:
        >>> [b.lang for b in blocks(ROOT / "README.md")][:2]   # doctest: +SKIP
        ['bash', 'python']
    """
    lines = page.read_text().splitlines()
    generated = bool(lines) and lines[0].startswith(GENERATED)
    found: list[Block] = []
    i = 0
    while i < len(lines):
        match = _FENCE.match(lines[i])
        if not match:
            i += 1
            continue
        fence, start = match.group(1), i
        i += 1
        while i < len(lines) and lines[i].strip() != fence:
            i += 1
        block = Block(page, start + 1, match.group(2), "\n".join(lines[start + 1 : i]) + "\n", "")
        if generated:
            block.mode, block.argument = "generated", lines[0]
        else:
            above = "\n".join(lines[:start]).rstrip()
            if above.endswith("-->"):
                _parse_marker(block, above[above.rfind("<!--") + 4 : -3])
        found.append(block)
        i += 1
    return found


def _rank_main(
    block: Block, rank: int, size: int, port: int, log: str, sys_path: list[str]
) -> None:
    """One rank of a block: the launcher's variables, then the block as ``__main__``."""
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    for name in (*_LAUNCH_VARS, "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_USE_AGENT_STORE"):
        os.environ.pop(name, None)
    if port:
        os.environ.update(
            RANK=str(rank),
            LOCAL_RANK=str(rank),
            ROLE_RANK=str(rank),
            GROUP_RANK="0",
            WORLD_SIZE=str(size),
            LOCAL_WORLD_SIZE=str(size),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            # the store is the test's, as torchrun's workers use the agent's
            TORCHELASTIC_USE_AGENT_STORE="True",
        )
    os.environ["OMP_NUM_THREADS"] = "1"
    sys.path[:0] = sys_path
    os.chdir(ROOT)
    namespace = {"__name__": "__main__"}
    code = 0
    try:
        # padded so that a traceback's line numbers are the page's
        source = "\n" * block.line + block.code
        if block.given:
            exec(compile(block.given, f"{block.where} (given)", "exec"), namespace)
        exec(compile(source, str(block.page.relative_to(ROOT)), "exec"), namespace)
        if block.then:
            exec(compile(block.then, f"{block.where} (then)", "exec"), namespace)
    except BaseException:
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def run_block(block: Block, logs: Path, sys_path: list[str] = (), timeout: float = 60.0) -> str:
    """Run a ``run`` block on its ranks; what they printed, or AssertionError with it.

    Examples:
        >>> run_block(blocks(ROOT / "README.md")[1], tmp_path)   # doctest: +SKIP
        ''
    """
    import torch.distributed as dist

    size = block.ranks
    store = None
    if block.launched:
        store = dist.TCPStore(
            "127.0.0.1",
            0,
            None,
            True,
            timeout=datetime.timedelta(seconds=timeout),
            wait_for_workers=False,
        )
    context = multiprocessing.get_context("forkserver")
    # the server imports torch once; commlib is imported afresh by each block
    context.set_forkserver_preload(["torch"])
    paths = [logs / f"{block.line}-rank{rank}.log" for rank in range(size)]
    procs = [
        context.Process(
            target=_rank_main,
            args=(block, rank, size, store.port if store else 0, str(path), list(sys_path)),
            daemon=True,
        )
        for rank, path in enumerate(paths)
    ]
    for proc in procs:
        proc.start()
    deadline = time.monotonic() + timeout
    for proc in procs:
        proc.join(max(0.1, deadline - time.monotonic()))
    hung = [rank for rank, proc in enumerate(procs) if proc.is_alive()]
    for proc in procs:
        if proc.is_alive():
            proc.kill()
            proc.join(5)
    output = "".join(f"--- rank {r}\n{p.read_text()}" for r, p in enumerate(paths) if p.exists())
    failed = {rank: proc.exitcode for rank, proc in enumerate(procs) if proc.exitcode != 0}
    if hung:
        raise AssertionError(
            f"{block.where}: ranks {hung} did not finish in {timeout:g}s\n{output}"
        )
    if failed:
        raise AssertionError(f"{block.where}: ranks failed (rank: exit code) {failed}\n{output}")
    return output
