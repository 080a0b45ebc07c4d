"""Nested structures and Python values in the collectives, on the backend's devices.

Every rank builds every rank's structure from :func:`rank_tensor`, so it
checks what it received without asking the others.
"""

from __future__ import annotations

from typing import Any

import torch

from commlib.testing.checks import (
    check,
    devices,
    every_rank,
    expect,
    expect_tensor,
    oracle,
    rank_tensor,
)


def _structure(rank: int, device: Any, rows: int = 2) -> dict:
    return {
        "f": rank_tensor(rank, torch.float32, (rows, 3), device),
        "nested": [(rank_tensor(rank, torch.int64, (rows,), device),)],
    }


@check("structures")
def _structures(comm: Any, ctx: dict) -> None:
    """all_reduce, broadcast, all_gather, all_gather_cat of nested structures, on every device."""
    n, r = comm.world_size, comm.rank
    for dev in devices(comm):
        mine = _structure(r, dev)
        f = mine["f"]
        out = comm.all_reduce(mine, "sum")
        want_f = oracle(every_rank(comm, torch.float32, (2, 3)), "sum").to(dev)
        expect(out["f"] is f, "all_reduce of a structure must reduce its tensors in place")
        expect_tensor(f, want_f, "all_reduce structure ['f']")
        want_i = oracle([rank_tensor(q, torch.int64, (2,)) for q in range(n)], "sum").to(dev)
        expect_tensor(out["nested"][0][0], want_i, "all_reduce structure ['nested'][0][0]")
        src = n - 1
        mine = _structure(r, dev)
        comm.broadcast(mine, src)
        expect_tensor(mine["f"], rank_tensor(src, torch.float32, (2, 3), dev), "broadcast ['f']")
        # uneven rows: rank q holds q + 1
        mine = _structure(r, dev, rows=r + 1)
        every = comm.all_gather(mine)
        joined = comm.all_gather_cat(mine)
        for q in range(n):
            theirs = _structure(q, dev, rows=q + 1)
            expect_tensor(every[q]["f"], theirs["f"], f"all_gather structure from rank {q}")
        want = torch.cat([_structure(q, dev, rows=q + 1)["f"] for q in range(n)])
        expect_tensor(joined["f"], want, "all_gather_cat ['f']")
    expect(comm.all_reduce(r + 1) == n * (n + 1) // 2, "all_reduce of an int")
    expect(comm.all_gather(f"r{r}") == [f"r{q}" for q in range(n)], "all_gather of a str")
    expect(comm.broadcast(f"r{r}", n - 1) == f"r{n - 1}", "broadcast of a str")


@check("uneven_gather_reduce_scatter")
def _uneven(comm: Any, ctx: dict) -> None:
    """gather of a different shape per rank, reduce_scatter of per-rank sizes, small and large."""
    n, r = comm.world_size, comm.rank
    for rows in (1, 700):  # inline with the shapes, and past the slot
        for dev in devices(comm):
            shape = (rows * (r + 1), 2)
            got = comm.gather(rank_tensor(r, torch.float32, shape, dev), dst=n - 1)
            if r != n - 1:
                expect(got == [], f"gather on a non-dst rank returned {got!r}")
            else:
                for q, t in enumerate(got):
                    want = rank_tensor(q, torch.float32, (rows * (q + 1), 2), dev)
                    expect_tensor(t, want, f"uneven gather [{q}] rows={rows}")
            sizes = [rows * (q + 1) for q in range(n)]
            chunks = [rank_tensor(r, torch.int64, (s,), dev) for s in sizes]
            out = torch.empty(sizes[r], dtype=torch.int64, device=dev)
            comm.reduce_scatter(out, chunks, "sum")
            want = oracle([rank_tensor(q, torch.int64, (sizes[r],)) for q in range(n)], "sum")
            expect_tensor(out, want.to(dev), f"reduce_scatter with per-rank sizes rows={rows}")
