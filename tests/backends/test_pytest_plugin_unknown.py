"""An unknown ``--commlib-backend`` name is one clear usage error, not a failure per check."""

from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.mark.timeout(180)
def test_an_unknown_backend_is_one_usage_error(tmp_path):
    (tmp_path / "test_trivial.py").write_text("def test_nothing():\n    pass\n")
    proc = subprocess.run(
        [
            *(sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q"),
            *("--commlib-backend", "no-such-backend", "--commlib-world-sizes", "1,2"),
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=150,
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == pytest.ExitCode.USAGE_ERROR, output[-3000:]
    assert output.count("unknown commlib backend 'no-such-backend'") == 1, output[-3000:]
    assert "registered: [" in output and "gloo" in output
    assert "failed" not in output and "conformance[" not in output
