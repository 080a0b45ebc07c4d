"""Every collective on a communicator, each result checked: the proof a (new) communicator works.

Shared by ``tests/reliability/test_shrink.py`` and the multi-host ranks
(``tests/reliability/multihost_rank.py``), which import it as a plain module.
"""

from __future__ import annotations

import numpy as np
import torch

import commlib
from commlib import Communicator


def check_every_collective(comm: Communicator) -> None:
    """Run every collective on ``comm`` and check each result (raises AssertionError)."""
    r, w = comm.rank, comm.world_size
    total = w * (w + 1) / 2  # sum of rank + 1
    x = torch.tensor([1.0, 2.0]) * (r + 1)
    comm.all_reduce(x)
    assert x.tolist() == [total, 2 * total], x
    x = torch.tensor([1.0, 2.0]) * (r + 1)
    comm.all_reduce(x, op="mean")
    assert torch.allclose(x, torch.tensor([total / w, 2 * total / w])), x
    m = torch.tensor([r])
    comm.all_reduce(m, op="max")
    assert m.item() == w - 1
    big = torch.full((100_000,), float(r + 1))  # larger than a slot: the engine's own all_reduce
    comm.all_reduce(big)
    assert big[0].item() == total and big[-1].item() == total
    handle = comm.all_reduce(torch.ones(3), async_op=True)
    assert handle is not None and handle.wait()
    ragged = comm.all_gather(torch.arange(r + 1))
    assert [t.tolist() for t in ragged] == [list(range(q + 1)) for q in range(w)]
    out = torch.empty(2 * w)
    comm.all_gather_into_tensor(out, torch.tensor([r, r + 0.5]))
    assert out.tolist() == [v for q in range(w) for v in (q, q + 0.5)]
    gathered = comm.gather(torch.tensor([r * 10]), dst=w - 1)
    assert [t.item() for t in gathered] == ([q * 10 for q in range(w)] if r == w - 1 else [])
    b = torch.arange(4.0) if r == 0 else torch.zeros(4)
    comm.broadcast(b, src=0)
    assert b.tolist() == [0.0, 1.0, 2.0, 3.0]
    bb = torch.full((50_000,), 7.0) if r == w - 1 else torch.zeros(50_000)
    comm.broadcast(bb, src=w - 1)
    assert bb.min().item() == 7.0
    rs = torch.empty(2)
    comm.reduce_scatter(rs, torch.arange(2.0 * w))
    assert rs.tolist() == [2.0 * r * w, (2.0 * r + 1) * w]
    comm.barrier()
    objs = comm.all_gather_object({"rank": r})
    assert objs == [{"rank": q} for q in range(w)]
    blob = np.full(1 << 20, r, dtype=np.uint8)  # round two of the object protocol
    arrays = comm.all_gather_object(blob)
    assert [int(a[0]) for a in arrays] == list(range(w))
    got = comm.gather_object(r, dst=0)
    assert got == (list(range(w)) if r == 0 else None)
    items = [{"from": 0}, "text", 3] if r == 0 else [None, None, None]
    comm.broadcast_object_list(items, src=0)
    assert items == [{"from": 0}, "text", 3]
    assert comm.broadcast_object("hello" if r == w - 1 else None, src=w - 1) == "hello"
    d = {"loss": torch.tensor(float(r)), "n": torch.tensor([r + 1])}
    commlib.all_reduce_dict(d, op="sum", group=comm)
    assert d["loss"].item() == total - w and d["n"].item() == total
