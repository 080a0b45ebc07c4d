"""reduce, scatter, all_to_all and all_to_all_single: values, in-place semantics, devices.

Every rank runs the same code; expected values come from :func:`rank_tensor`
of each rank, so a rank checks what it received without asking the others.
"""

from __future__ import annotations

from typing import Any

import torch

import commlib.functional as F
from commlib.testing.checks import (
    check,
    devices,
    every_rank,
    expect,
    expect_tensor,
    oracle,
    rank_tensor,
)

# op -> dtypes reduce must handle (engines that lack one supply it)
REDUCE_DTYPES: dict[str, tuple[torch.dtype, ...]] = {
    "sum": (torch.float32, torch.float64, torch.bfloat16, torch.int64, torch.int16, torch.bool),
    "product": (torch.float32, torch.int32),
    "min": (torch.float32, torch.int64, torch.uint8),
    "max": (torch.float32, torch.int16, torch.bool),
    "band": (torch.int64, torch.uint8, torch.bool),
    "bor": (torch.int32, torch.bool),
    "bxor": (torch.int64,),
    "mean": (torch.float32, torch.float64, torch.int64),
}

MOVE_DTYPES = (
    torch.float32,
    torch.float64,
    torch.bfloat16,
    torch.int64,
    torch.uint8,
    torch.bool,
    torch.int16,
    torch.uint16,
    torch.complex64,
)


@check("reduce")
def _reduce(comm: Any, ctx: dict) -> None:
    """reduce: every op and dst; the result in place on dst, the others' tensors untouched."""
    n, r = comm.world_size, comm.rank
    for op, dtypes in REDUCE_DTYPES.items():
        for dtype in dtypes:
            want = oracle(every_rank(comm, dtype), op)
            for dst in range(n):
                for dev in devices(comm):
                    t = rank_tensor(r, dtype, device=dev)
                    ptr = t.data_ptr()
                    ret = comm.reduce(t, dst=dst, op=op)
                    expect(ret is None, f"reduce returned {ret!r}")
                    expect(t.data_ptr() == ptr, "reduce did not work in place")
                    what = f"reduce {op} {dtype} dst={dst} on {dev}"
                    if r == dst:
                        expect_tensor(t, want.to(dev), what, close=op == "mean")
                    else:
                        expect_tensor(t, rank_tensor(r, dtype, device=dev), f"{what}: not dst")
    base = torch.zeros(4, 3)
    view = base.t()  # not contiguous
    view.copy_(rank_tensor(r, torch.float32, (3, 4)))
    comm.reduce(view, dst=n - 1)
    if r == n - 1:
        want = oracle(every_rank(comm, torch.float32, (3, 4)), "sum")
        expect_tensor(base.t(), want, "reduce into a strided view")
    h = comm.reduce(t := rank_tensor(r, torch.float32), dst=0, op="max", async_op=True)
    expect(h is not None and h.wait() is True, "async reduce: wait() must return True")
    if r == 0:
        expect_tensor(t, oracle(every_rank(comm, torch.float32), "max"), "async reduce")


@check("scatter")
def _scatter(comm: Any, ctx: dict) -> None:
    """scatter from every src: rank i gets src's scatter_list[i], on the caller's device."""
    n, r = comm.world_size, comm.rank
    for src in range(n):
        for dtype in MOVE_DTYPES:
            for dev in devices(comm):
                out = torch.zeros((2, 3), dtype=dtype, device=dev)
                parts = [rank_tensor(10 * src + i, dtype, device=dev) for i in range(n)]
                ptr = out.data_ptr()
                ret = comm.scatter(out, parts if r == src else None, src=src)
                expect(ret is None, f"scatter returned {ret!r}")
                expect(out.data_ptr() == ptr, "scatter did not fill its tensor in place")
                want = rank_tensor(10 * src + r, dtype, device=dev)
                expect_tensor(out, want, f"scatter {dtype} src={src} on {dev}")
    # every rank may pass the list: only src's is read
    out = torch.zeros(3)
    h = comm.scatter(out, [torch.full((3,), float(i)) for i in range(n)], src=0, async_op=True)
    expect(h is not None and h.wait() is True, "async scatter")
    expect_tensor(out, torch.full((3,), float(r)), "async scatter")


@check("all_to_all")
def _all_to_all(comm: Any, ctx: dict) -> None:
    """all_to_all: outputs[j] is rank j's inputs[me], equal and unequal shapes, devices."""
    n, r = comm.world_size, comm.rank
    for dtype in MOVE_DTYPES:
        for dev in devices(comm):
            ins = [rank_tensor(10 * r + j, dtype, device=dev) for j in range(n)]
            outs = [torch.zeros((2, 3), dtype=dtype, device=dev) for _ in range(n)]
            ret = comm.all_to_all(outs, ins)
            expect(ret is None, f"all_to_all returned {ret!r}")
            for j, o in enumerate(outs):
                want = rank_tensor(10 * j + r, dtype, device=dev)
                expect_tensor(o, want, f"all_to_all {dtype} from {j} on {dev}")
    # unequal shapes: rank j sends j + 1 rows to everyone, so this rank gets j + 1 from j
    for dev in devices(comm):
        ins = [torch.full((r + 1, 2), float(10 * r + j), device=dev) for j in range(n)]
        outs = [torch.zeros((j + 1, 2), device=dev) for j in range(n)]
        h = comm.all_to_all(outs, ins, async_op=True)
        expect(h is not None and h.wait() is True, "async all_to_all")
        for j, o in enumerate(outs):
            expect_tensor(o, torch.full((j + 1, 2), float(10 * j + r), device=dev), "uneven")


def _rows(sender: int, receiver: int, count: int, dtype: torch.dtype) -> torch.Tensor:
    """The ``count`` rows (of 2) that ``sender`` sends ``receiver`` in the uneven check."""
    return (torch.arange(count * 2).reshape(count, 2) % 5 + sender + 3 * receiver).to(dtype)


@check("all_to_all_single")
def _all_to_all_single(comm: Any, ctx: dict) -> None:
    """all_to_all_single: even splits, uneven splits (zero rows too), dtypes, async."""
    n, r = comm.world_size, comm.rank
    for dtype in MOVE_DTYPES:
        for dev in devices(comm):
            inp = torch.cat([rank_tensor(10 * r + j, dtype, (2,)) for j in range(n)]).to(dev)
            out = torch.zeros(2 * n, dtype=dtype, device=dev)
            ret = comm.all_to_all_single(out, inp)
            expect(ret is None, f"all_to_all_single returned {ret!r}")
            want = torch.cat([rank_tensor(10 * j + r, dtype, (2,)) for j in range(n)]).to(dev)
            expect_tensor(out, want, f"all_to_all_single even {dtype} on {dev}")
            # uneven: sender s sends (s + d) % 3 rows to rank d; zero rows happen
            counts_in = [(r + d) % 3 for d in range(n)]
            counts_out = [(s + r) % 3 for s in range(n)]
            inp = torch.cat([_rows(r, d, c, dtype) for d, c in enumerate(counts_in)]).to(dev)
            out = torch.zeros((sum(counts_out), 2), dtype=dtype, device=dev)
            h = comm.all_to_all_single(out, inp, counts_out, counts_in, async_op=True)
            expect(h is not None and h.wait() is True, "async all_to_all_single")
            want = torch.cat([_rows(s, r, c, dtype) for s, c in enumerate(counts_out)]).to(dev)
            expect_tensor(out, want, f"all_to_all_single uneven {dtype} on {dev}")


@check("functional_collectives")
def _functional_collectives(comm: Any, ctx: dict) -> None:
    """The module-level reduce, scatter, all_to_all(_single) on the backend's group."""
    n, r = comm.world_size, comm.rank
    t = rank_tensor(r, torch.float32)
    F.reduce(t, group_dst=n - 1, op="mean", group=comm)
    if r == n - 1:
        expect_tensor(t, oracle(every_rank(comm, torch.float32), "mean"), "F.reduce", close=True)
    out = torch.zeros(2)
    F.scatter(out, [torch.full((2,), float(i)) for i in range(n)], group=comm)
    expect_tensor(out, torch.full((2,), float(r)), "F.scatter")
    outs = [torch.zeros(1) for _ in range(n)]
    F.all_to_all(outs, [torch.tensor([float(r)]) for _ in range(n)], group=comm)
    expect_tensor(torch.cat(outs), torch.arange(float(n)), "F.all_to_all")
    single = torch.zeros(n)
    F.all_to_all_single(single, torch.full((n,), float(r)), group=comm)
    expect_tensor(single, torch.arange(float(n)), "F.all_to_all_single")
    h = F.barrier(group=comm, async_op=True)
    expect(h is not None and h.wait() is True, "F.barrier(async_op=True)")


@check("all_gather_keeps_own_tensor")
def _all_gather_keeps_own_tensor(comm: Any, ctx: dict) -> None:
    """all_gather: this rank's entry is its input itself, so autograd flows through it."""
    for dev in devices(comm):
        mine = rank_tensor(comm.rank, torch.float32, device=dev).requires_grad_()
        got = comm.all_gather(mine)
        expect(got[comm.rank] is mine, "all_gather's own entry is not the input tensor")
        torch.stack(got).sum().backward()
        expect(mine.grad is not None, "no gradient reached the input through all_gather")
        expect_tensor(mine.grad, torch.ones_like(mine), "all_gather gradient")


@check("subgroup_collectives", min_world=2)
def _subgroup_collectives(comm: Any, ctx: dict) -> None:
    """The new collectives in subgroups that are not a prefix: ranks are group ranks."""
    n, r = comm.world_size, comm.rank
    for members in (list(range(1, n)), [0, n - 1]):
        sub = comm.new_group(members)
        if not sub.is_member:
            continue
        k, g = sub.world_size, sub.rank
        t = torch.tensor([float(members[g])])
        sub.reduce(t, dst=k - 1)
        if g == k - 1:
            expect_tensor(t, torch.tensor([float(sum(members))]), f"reduce in {members}")
        out = torch.zeros(1)
        sub.scatter(out, [torch.tensor([float(m)]) for m in members], src=k - 1)
        expect_tensor(out, torch.tensor([float(members[g])]), f"scatter in {members}")
        single = torch.zeros(k)
        sub.all_to_all_single(single, torch.full((k,), float(members[g])))
        expect_tensor(single, torch.tensor([float(m) for m in members]), f"a2a in {members}")
        # the functional API with the torch group: dst is a world rank
        t = torch.tensor([1.0])
        F.reduce(t, dst=members[0], group=sub.group)
        if g == 0:
            expect_tensor(t, torch.tensor([float(k)]), f"F.reduce world dst in {members}")
        if k > 1:
            peer = members[(g + 1) % k]
            box = [None]
            if g == 0:
                F.send_object_list([{"from": r}], dst=peer, group=sub.group)
            elif g == 1:
                got = F.recv_object_list(box, src=members[0], group=sub.group)
                expect(got == members[0] and box == [{"from": members[0]}], f"p2p in {members}")
    comm.barrier()
