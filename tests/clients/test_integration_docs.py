"""docs/integrations.md: each client's example is a whole script that runs as it is.

The three run in one fresh process (a world of one; the Fabric one last, since
it starts a process group), from the page itself, so the page cannot drift
from the code. Under ``torchrun --nproc-per-node 2`` they run the same way.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

for _client in ("lightning_fabric", "torchmetrics", "mmengine"):
    pytest.importorskip(
        _client, reason=f"{_client} is not installed (pip install -e '.[integrations]')"
    )

PAGE = Path(__file__).resolve().parents[2] / "docs" / "integrations.md"
RUNNER = """
import runpy, sys
for path in sys.argv[1:]:
    runpy.run_path(path, run_name="__main__")
    print("ran", path, flush=True)
"""


def test_the_examples_run_as_scripts(tmp_path):
    blocks = re.findall(r"^```python\n(.*?)^```", PAGE.read_text(), re.S | re.M)
    assert len(blocks) == 3, "one example per client"
    scripts = []
    for i, block in enumerate(blocks):
        path = tmp_path / f"example{i}.py"
        path.write_text(block)
        scripts.append(path)
    fabric_last = sorted(scripts, key=lambda p: "lightning_fabric" in p.read_text())
    done = subprocess.run(
        [sys.executable, "-c", RUNNER, *map(str, fabric_last)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert done.stdout.count("ran ") == 3
    assert "{'eval/accuracy': 0.5}" in done.stdout
