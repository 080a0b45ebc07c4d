"""The plugin guide's kit command: the kit alone wherever it is typed; run-time backends reach it.

``pytest --commlib-backend NAME`` typed in a checkout whose ``testpaths`` hold
a suite (this one's) runs the conformance kit alone, with its real count; a
backend added with ``commlib.register_backend`` (in a conftest.py, say)
reaches the ranks the kit starts.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import commlib
from commlib.testing import World
from commlib.testing.conformance import CHECKS, DEFAULT_WORLD_SIZES

ROOT = Path(__file__).resolve().parents[2]


def _pytest(args: list[str], cwd: Path, timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.mark.timeout(180)
def test_typed_in_this_checkout_the_command_collects_the_kit_alone():
    proc = _pytest(["--commlib-backend", "gloo", "--collect-only"], ROOT, 150)
    items = [line for line in proc.stdout.splitlines() if "::" in line]
    expected = sum(c.applies(n) for c in CHECKS.values() for n in DEFAULT_WORLD_SIZES)
    assert proc.returncode in (0, pytest.ExitCode.NO_TESTS_COLLECTED), proc.stdout[-3000:]
    assert items and all("conformance[gloo-world" in line for line in items), items[:5]
    assert len(items) == expected == 132  # the count docs/plugins.md gives


CONFTEST = """
import commlib
from commlib_backends.gloo import GlooBackend


class LoudGloo(GlooBackend):
    name = "loud-gloo"


commlib.register_backend(LoudGloo)
"""


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_backend_registered_in_a_conftest_reaches_the_kits_ranks(tmp_path):
    (tmp_path / "conftest.py").write_text(CONFTEST)
    args = ["--commlib-backend", "loud-gloo", "--commlib-world-sizes", "2", "-k", "all_reduce"]
    proc = _pytest(args, tmp_path, 280)
    last = proc.stdout.strip().splitlines()[-1]
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert " passed" in last and "failed" not in last, last


def test_a_run_time_backend_the_ranks_cannot_import_is_refused_saying_what_works():
    from commlib_backends.gloo import GlooBackend

    class Local(GlooBackend):  # defined in a function: no rank can import it
        name = "local-gloo-test"

    commlib.register_backend(Local)
    try:
        with pytest.raises(ValueError, match=r"cannot reach the ranks.*setup\(rank, size\)"):
            World(2, backend="local-gloo-test")
    finally:
        commlib.unregister_backend("local-gloo-test")
