"""DDP on ``commlib-gloo`` when a rank fails: a hang is a timeout ``commlib trace`` explains,
a dead rank an error that names it. A world of 3 of its own, with the flight recorder on.
"""

from __future__ import annotations

import datetime
import functools
import os
import signal
import threading
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from commlib import cli
from commlib.observe import diagnosis
from commlib.testing import RankDied, World
from tests.torch_programs.ddp_checks import model

# slow: a world of its own, and faults that wait for their timeouts
pytestmark = pytest.mark.slow


def _trace_into(directory: str, rank: int, size: int) -> None:
    os.environ["COMMLIB_TRACE_DIR"] = directory


@pytest.fixture(scope="module")
def traced(tmp_path_factory):
    directory = tmp_path_factory.mktemp("trace")
    world = World(
        3, timeout=120, pg_timeout=60, setup=functools.partial(_trace_into, str(directory))
    )
    world.start()
    yield world, directory
    world.kill()


def _line(marker: str) -> str:
    """``test_ddp_faults.py:LINE (function)``: where the line ending in ``# marker`` is."""
    lines = Path(__file__).read_text().splitlines()
    (number,) = [i for i, text in enumerate(lines, 1) if text.endswith(f"# {marker}")]
    function = next(
        t.split("def ")[1].split("(")[0] for t in reversed(lines[:number]) if t.startswith("def ")
    )
    return f"{Path(__file__).name}:{number} ({function})"


def _ddp(seconds: float) -> tuple[DDP, torch.optim.Optimizer]:
    group = dist.new_group(backend="commlib-gloo", timeout=datetime.timedelta(seconds=seconds))
    net = DDP(model(), process_group=group)
    return net, torch.optim.SGD(net.parameters(), lr=0.1)


def _one_rank_elsewhere(comm, directory: str) -> str:
    ddp, opt = _ddp(5.0)
    for _ in range(2):  # steps every rank takes (DDP orders its buckets after the first)
        ddp(torch.randn(4, 8)).sum().backward()
        opt.step()
    gave_up = [Path(directory, f"gave-up-{r}") for r in (0, 1)]
    if dist.get_rank() == 2:
        # away until ranks 0 and 1 gave up, then a second more: their errors come up once
        # this rank wrote its file for them (or their patience ran out), and its watcher
        # answers within a poll (0.5 s). Not a fixed sleep: as long as needed, no longer
        deadline, leave = time.monotonic() + 90, None
        while time.monotonic() < (leave or deadline):
            if leave is None and all(p.exists() for p in gave_up):
                leave = time.monotonic() + 1.0
            time.sleep(0.05)  # rank 2 is elsewhere
        return "slept"
    try:
        ddp(torch.randn(4, 8)).sum().backward()  # the step rank 2 misses
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    finally:
        gave_up[dist.get_rank()].touch()
    return "no error"


def test_trace_of_a_hung_ddp_step_names_the_bucket_all_reduce_and_where_the_rank_is(
    traced, capsys
):
    world, directory = traced
    results = world.run(_one_rank_elsewhere, str(directory), timeout=120)
    assert results[2] == "slept"
    for text in results[:2]:
        assert "CommTimeoutError" in text and "all_reduce" in text and "rank 2" in text, text
    deadline = time.monotonic() + 30
    while (
        len(list(directory.glob("commlib_trace_rank*.json"))) < 3 and time.monotonic() < deadline
    ):
        time.sleep(0.1)
    found = diagnosis.diagnose(directory)
    (verdict,) = [v for v in found["verdict"] if "all_reduce" in v]
    # the bucket's all_reduce where the program called backward, and rank 2's own line
    assert verdict.startswith("ranks 0, 1 wait in all_reduce #"), verdict
    assert f"at {_line('the step rank 2 misses')}" in verdict, verdict
    assert f"rank 2 is in {_line('rank 2 is elsewhere')}" in verdict, verdict
    assert cli.main(["trace", str(directory)]) in (0, 1, None)
    out = capsys.readouterr().out
    assert "all_reduce" in out and _line("rank 2 is elsewhere") in out, out


def _one_rank_dies(comm) -> str:
    ddp, opt = _ddp(30.0)
    if dist.get_rank() == 2:
        threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGKILL)).start()
    start = time.monotonic()
    try:
        while time.monotonic() - start < 60:
            ddp(torch.randn(64, 8)).square().mean().backward()  # training
            opt.step()
            opt.zero_grad()
    except Exception as exc:
        return f"{type(exc).__name__}: {exc} (after {time.monotonic() - start:.1f} s)"
    return "no error"


def test_a_rank_dying_mid_step_is_named_by_the_survivors(traced):
    world, _ = traced
    outcomes = world.outcomes(_one_rank_dies, timeout=120)
    assert isinstance(outcomes[2].error, RankDied), outcomes[2]
    for o in outcomes[:2]:
        assert o.ok and "rank 2" in o.value, o
        assert "Timeout" not in o.value, o.value  # the death itself, not a wait that ran out
