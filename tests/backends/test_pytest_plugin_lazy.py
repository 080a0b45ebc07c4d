"""The pytest11 plugin costs an unrelated pytest session nothing: no torch until asked.

Each session runs in a subprocess in a temporary directory, outside this
repository, whose conftest imports commlib (and so torch) on its own.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from commlib.testing.conformance import CHECKS

TRIVIAL_TEST = """
import sys

def test_torch_is_not_imported():
    assert "torch" not in sys.modules, "imported by a pytest plugin"
    assert "commlib" not in sys.modules, "imported by a pytest plugin"
"""


def _pytest(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=150,
    )


def _lines(proc: subprocess.CompletedProcess) -> str:
    return proc.stdout[-3000:] + proc.stderr[-2000:]


@pytest.mark.timeout(180)
def test_a_session_without_the_option_does_not_import_torch(tmp_path):
    (tmp_path / "test_trivial.py").write_text(TRIVIAL_TEST)
    # --strict-markers: the marker is declared even though the kit is not loaded
    proc = _pytest(tmp_path, "--strict-markers", "-m", "not commlib_conformance")
    assert proc.returncode == 0, _lines(proc)
    assert proc.stdout.strip().splitlines()[-1].startswith("1 passed"), _lines(proc)


@pytest.mark.timeout(180)
def test_the_options_are_listed_without_the_kit(tmp_path):
    proc = _pytest(tmp_path, "--help")
    assert proc.returncode == 0, _lines(proc)
    for option in ("--commlib-backend", "--commlib-world-sizes", "--commlib-setup"):
        assert option in proc.stdout


@pytest.mark.timeout(180)
def test_the_option_still_collects_the_conformance_checks(tmp_path):
    (tmp_path / "test_trivial.py").write_text(TRIVIAL_TEST)
    proc = _pytest(
        tmp_path,
        "--collect-only",
        "--commlib-backend",
        "single",
        "--commlib-world-sizes",
        "1",
        "-m",
        "commlib_conformance",
    )
    assert proc.returncode == 0, _lines(proc)
    collected = {line for line in proc.stdout.splitlines() if "conformance[" in line}
    expected = {f"conformance[single-world1-{c.name}]" for c in CHECKS.values() if c.applies(1)}
    assert expected and {line.rpartition("::")[2] for line in collected} == expected
    assert "test_torch_is_not_imported" not in proc.stdout  # deselected by the marker
