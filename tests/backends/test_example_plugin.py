"""examples/commlib-traced, a real third-party plugin: installed, listed, conformant.

The distribution is installed with pip (no dependencies, no index) into a
temporary directory that goes on PYTHONPATH of subprocesses only, so this
test session's own plugin registry stays as it is.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from commlib.testing.conformance import CHECKS, DEFAULT_WORLD_SIZES
from tests.conftest import pip_install_into
from tests.tools.docs_blocks import ROOT, blocks, run_block

# slow: a pip install, then the whole kit in a pytest subprocess
pytestmark = pytest.mark.slow

EXAMPLE = Path(__file__).parents[2] / "examples" / "commlib-traced"


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """commlib-traced, pip-installed into a fresh directory."""
    target = pip_install_into(EXAMPLE, tmp_path_factory)
    assert list(target.glob("commlib_traced-0.1.0.dist-info"))
    return target


def _run(args: list[str], site: Path, cwd: Path, timeout: int) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), *sys.path])}
    return subprocess.run(
        [sys.executable, *args],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.mark.timeout(200)
def test_commlib_info_lists_the_installed_plugin(site, tmp_path):
    proc = _run(["-m", "commlib.cli", "info"], site, tmp_path, 120)
    assert proc.returncode == 0, proc.stderr
    rows = {line.split()[0]: line for line in proc.stdout.splitlines()[3:] if line.strip()}
    assert {"single", "gloo", "nccl", "hccl", "cncl", "traced"} <= set(rows)
    assert " yes " in rows["traced"] and "traced (commlib-traced 0.1.0)" in rows["traced"]


#: the kit's ranks forked from a server that imported torch once, as this suite's own
#: worlds are (tests/conftest.py); the kit's default, spawn, is what
#: tests/backends/test_kit_command.py and test_conformance.py's pytest runs start
FORKSERVER_CONFTEST = """
from commlib.testing import World

World.default_start_method = "forkserver"
"""


@pytest.mark.timeout(400)
def test_the_plugin_passes_the_conformance_kit(site, tmp_path):
    (tmp_path / "conftest.py").write_text(FORKSERVER_CONFTEST)
    proc = _run(
        ["-m", "pytest", "-p", "no:cacheprovider", "-q", "--commlib-backend", "traced"],
        site,
        tmp_path,
        380,
    )
    expected = sum(c.applies(n) for c in CHECKS.values() for n in DEFAULT_WORLD_SIZES)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert proc.stdout.strip().splitlines()[-1].startswith(f"{expected} passed")


SCRIPT = """
import torch, commlib_traced
from commlib.testing import World

def work(comm):
    commlib_traced.reset()
    comm.all_reduce(torch.ones(256))
    comm.all_gather_object({"rank": comm.rank})
    comm.barrier()
    return comm.backend, commlib_traced.summary()

if __name__ == "__main__":
    with World(2, backend="traced") as world:
        for backend, summary in world.run(work):
            print(backend, summary["all_reduce"]["calls"], summary["all_reduce"]["bytes"],
                  summary["barrier"]["calls"], "all_gather_into_tensor" in summary)
"""


@pytest.mark.timeout(200)
def test_the_plugin_records_collectives(site, tmp_path):
    (tmp_path / "traced_run.py").write_text(SCRIPT)
    proc = _run(["traced_run.py"], site, tmp_path, 180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split("\n")[:2] == ["traced 1 1024 1 True"] * 2


@pytest.mark.timeout(200)
def test_the_plugin_guide_runs_on_the_installed_plugin(site, tmp_path):
    """docs/plugins.md's blocks that name this file, on 2 ranks, the example installed."""
    mine = [
        block
        for block in blocks(ROOT / "docs" / "plugins.md")
        if block.mode == "run by" and block.argument == "tests/backends/test_example_plugin.py"
    ]
    assert mine, "docs/plugins.md names this file for none of its blocks"
    for block in mine:
        block.mode, block.argument = "run", "2 ranks"  # "under torchrun"
        output = run_block(block, tmp_path, sys_path=[str(site)])
        # each rank printed the summary of the all_reduce it made: one call, 4 KiB
        assert output.count("\nall_reduce                   1         4096") == 2, output
