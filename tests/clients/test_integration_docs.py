"""docs/integrations.md: each client's example is a whole script that runs as it is.

The four run in one fresh process (a world of one; the Fabric one last, since
it starts a process group), from the page itself, so the page cannot drift
from the code. Under ``torchrun --nproc-per-node 2`` they run the same way;
the ignite one is also run as torchrun runs it, at 1 and 2 ranks.
"""

from __future__ import annotations

import dataclasses
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.tools import docs_blocks

for _client in ("lightning_fabric", "torchmetrics", "mmengine", "ignite"):
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
    assert len(blocks) == 4, "one example per client"
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
    assert done.stdout.count("ran ") == 4
    assert "{'eval/accuracy': 0.5}" in done.stdout
    assert "commlib single 1 ['rank0'] runs/42 1\naccuracy 0.7000 loss 0.8857" in done.stdout


def test_the_ignite_example_runs_as_under_torchrun(tmp_path):
    (example,) = [b for b in docs_blocks.blocks(PAGE) if "commlib.integrations.ignite" in b.code]
    for ranks, first in (
        (1, "commlib gloo 1 ['rank0'] runs/42 1"),
        (2, "commlib gloo 3 ['rank0', 'rank1'] runs/42 2"),
    ):
        launched = dataclasses.replace(example, mode="run", argument=f"{ranks} ranks")
        output = docs_blocks.run_block(launched, tmp_path, timeout=120)
        # rank 0 reports: every sample counted, whatever the number of ranks
        assert f"{first}\naccuracy 0.7000 loss 0.8857" in output, output
