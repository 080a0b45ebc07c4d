"""Soak: 10,000 mixed collectives at world size 2; memory flat, nothing leaked.

Resident memory is read after a warm-up and at the end; threads, open file
descriptors and temporary directories must be back where they started. The
growth is printed (``pytest -s``) for the reliability report.
"""

from __future__ import annotations

import os
import tempfile
import threading

import numpy as np
import pytest
import torch

import commlib as dist

# slow: 10,000 collectives
pytestmark = pytest.mark.slow

TOTAL = 10_000
WARMUP = 1_000


def _rss_kib() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def _snapshot(cwd: str) -> dict:
    return {
        "threads": threading.active_count(),
        "tasks": len(os.listdir("/proc/self/task")),
        "fds": len(os.listdir("/proc/self/fd")),
        "cwd": sorted(os.listdir(cwd)),
    }


def _step(i: int, rank: int) -> None:
    kind = i % 10
    if kind == 0:
        x = torch.full((64,), float(rank))
        dist.all_reduce(x, "mean")
    elif kind == 1:
        dist.all_gather(torch.ones(rank + 1 + i % 3))
    elif kind == 2:
        dist.broadcast(torch.zeros(16), src=i % 2)
    elif kind == 3:
        dist.all_gather_object({"i": i, "rank": rank, "tag": "x" * (i % 50)})
    elif kind == 4:
        dist.gather_object([rank] * (i % 7), dst=1)
    elif kind == 5:
        box = [{"step": i}] if rank == 0 else [None]
        dist.broadcast_object_list(box)
    elif kind == 6:
        dist.all_reduce_dict({"loss": torch.tensor(1.0), "n": torch.tensor([rank])}, "sum")
    elif kind == 7:
        # an object that overflows the first round every 100 steps
        arr = np.ones(200_000 if i % 100 == 7 else 10, dtype=np.float32)
        dist.all_gather_object(arr)
    elif kind == 8:
        dist.all_reduce_params([torch.ones(3), torch.ones(2, 2)], bucket_size_mb=1)
    elif i % 500 == 9:
        dist.collect_results([rank, rank], 4, device="cpu")
    else:
        dist.barrier()


def _on_soak(comm):
    with tempfile.TemporaryDirectory() as cwd:
        old = os.getcwd()
        os.chdir(cwd)
        try:
            for i in range(WARMUP):
                _step(i, comm.rank)
            before, rss0 = _snapshot(cwd), _rss_kib()
            for i in range(WARMUP, TOTAL):
                _step(i, comm.rank)
            after, rss1 = _snapshot(cwd), _rss_kib()
        finally:
            os.chdir(old)
    return before, after, rss0, rss1


def test_soak_ten_thousand_mixed_collectives(world2):
    results = world2.run(_on_soak, timeout=600)
    for rank, (before, after, rss0, rss1) in enumerate(results):
        growth = (rss1 - rss0) / 1024
        print(
            f"\n[soak] rank {rank}: {TOTAL} collectives, RSS {rss0 / 1024:.1f} -> "
            f"{rss1 / 1024:.1f} MiB (growth {growth:+.1f} MiB after warm-up), "
            f"threads {before['threads']}->{after['threads']}, fds {before['fds']}->"
            f"{after['fds']}"
        )
        assert after == before, (before, after)
        # flat: far below what even one leaked payload per step would cost
        assert growth < 32, f"rank {rank} RSS grew {growth:.1f} MiB"
