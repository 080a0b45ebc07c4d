"""Tensor collectives: values, return types, in-place semantics, the caller's device."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from commlib.testing.checks import (
    check,
    devices,
    every_rank,
    expect,
    expect_tensor,
    oracle,
    rank_tensor,
)

# op -> dtypes every backend must reduce (engines that lack one, as gloo lacks
# int16, supply it: see commlib_backends.engine_gaps)
REDUCE_MATRIX: dict[str, tuple[torch.dtype, ...]] = {
    "sum": (
        torch.float32,
        torch.float64,
        torch.float16,
        torch.bfloat16,
        torch.int8,
        torch.uint8,
        torch.int32,
        torch.int64,
        torch.int16,
        torch.bool,
        torch.complex64,
    ),
    "product": (torch.float32, torch.int64, torch.int32, torch.bool),
    "min": (
        torch.float32,
        torch.float64,
        torch.bfloat16,
        torch.int64,
        torch.int16,
        torch.uint8,
        torch.bool,
    ),
    "max": (
        torch.float32,
        torch.float64,
        torch.bfloat16,
        torch.int64,
        torch.int16,
        torch.uint8,
        torch.bool,
    ),
    "band": (torch.int64, torch.int32, torch.int16, torch.uint8, torch.bool),
    "bor": (torch.int64, torch.int32, torch.uint8, torch.bool),
    "bxor": (torch.int64, torch.int32, torch.uint8, torch.bool),
}

MOVE_DTYPES = (
    torch.float32,
    torch.float64,
    torch.float16,
    torch.bfloat16,
    torch.int8,
    torch.uint8,
    torch.int32,
    torch.int64,
    torch.bool,
    torch.complex64,
)


@check("identity")
def _identity(comm: Any, ctx: dict) -> None:
    """rank, world_size, device and group membership are consistent."""
    n = ctx["world_size"]
    expect(comm.world_size == n, f"world_size {comm.world_size} != {n}")
    expect(0 <= comm.rank < n, f"rank {comm.rank} out of range")
    expect(comm.is_member, "a world communicator must be a member")
    expect(isinstance(comm.device, torch.device), f"device {comm.device!r} is not a torch.device")
    expect(comm.device == comm.plugin.device(), "comm.device differs from the plugin's device()")
    expect(comm.ranks == list(range(n)), f"ranks {comm.ranks}")
    ranks = comm.all_gather(torch.tensor([comm.rank]))
    expect([int(r) for r in ranks] == list(range(n)), f"ranks seen by all_gather: {ranks}")


@check("all_reduce_ops")
def _all_reduce_ops(comm: Any, ctx: dict) -> None:
    """all_reduce: every op on every dtype it applies to, in place, on the caller's device."""
    for op, dtypes in REDUCE_MATRIX.items():
        for dtype in dtypes:
            want = oracle(every_rank(comm, dtype), op)
            for dev in devices(comm):
                t = rank_tensor(comm.rank, dtype, device=dev)
                ptr = t.data_ptr()
                out = comm.all_reduce(t, op)
                expect(out is None, f"all_reduce returned {out!r}; expected None")
                expect(t.data_ptr() == ptr, "all_reduce did not work in place")
                expect_tensor(t, want.to(dev), f"all_reduce {op} {dtype} on {dev}")


@check("all_reduce_mean")
def _all_reduce_mean(comm: Any, ctx: dict) -> None:
    """all_reduce mean: floats divide, integers are truncated; op names as mmengine accepts."""
    for dtype in (torch.float32, torch.float64, torch.bfloat16, torch.int64, torch.int32):
        want = oracle(every_rank(comm, dtype), "mean")
        for dev in devices(comm):
            t = rank_tensor(comm.rank, dtype, device=dev)
            comm.all_reduce(t, "mean")
            expect_tensor(t, want.to(dev), f"all_reduce mean {dtype} on {dev}", close=True)
    for name in ("SUM", "Sum", dist.ReduceOp.SUM):
        t = rank_tensor(comm.rank, torch.float32)
        comm.all_reduce(t, name)
        expect_tensor(t, oracle(every_rank(comm, torch.float32), "sum"), f"op {name!r}")


@check("all_reduce_layouts")
def _all_reduce_layouts(comm: Any, ctx: dict) -> None:
    """all_reduce of non-contiguous, 0-dim, 0-size and large tensors."""
    n = comm.world_size
    for dev in devices(comm):
        base = torch.zeros(4, 3, device=dev)
        view = base.t()  # (3, 4), not contiguous
        view.copy_(rank_tensor(comm.rank, torch.float32, (3, 4)))
        comm.all_reduce(view)
        want = oracle(every_rank(comm, torch.float32, (3, 4)), "sum").to(dev)
        expect_tensor(view, want, f"non-contiguous all_reduce on {dev}")
        expect_tensor(base.t(), want, f"non-contiguous all_reduce wrote its base on {dev}")
        scalar = torch.tensor(float(comm.rank + 1), device=dev)
        comm.all_reduce(scalar)
        expect_tensor(scalar, torch.tensor(n * (n + 1) / 2, device=dev), "0-dim all_reduce")
        empty = torch.empty(0, 5, device=dev)
        comm.all_reduce(empty)
        expect(empty.shape == (0, 5), "0-size all_reduce changed the shape")
        big = torch.full((1 << 18,), float(comm.rank), device=dev)
        comm.all_reduce(big, "max")
        expect(bool((big == n - 1).all()), "large all_reduce max")


@check("async_handles")
def _async_handles(comm: Any, ctx: dict) -> None:
    """async_op=True returns a handle whose wait() completes the call (and returns True)."""
    n = comm.world_size
    for dev in devices(comm):
        t = rank_tensor(comm.rank, torch.float32, device=dev)
        handles = [comm.all_reduce(t, "mean", async_op=True)]
        b = torch.full((3,), float(comm.rank), device=dev)
        handles.append(comm.broadcast(b, src=n - 1, async_op=True))
        out = torch.empty(2 * n, device=dev)
        handles.append(
            comm.all_gather_into_tensor(
                out, torch.full((2,), 1.0 + comm.rank, device=dev), async_op=True
            )
        )
        rs = torch.empty(2, device=dev)
        handles.append(comm.reduce_scatter(rs, torch.ones(2 * n, device=dev), async_op=True))
        handles.append(comm.barrier(async_op=True))
        for h in handles:
            expect(h is not None and hasattr(h, "wait"), f"async_op=True returned {h!r}")
            expect(h.wait() is True, "Handle.wait() must return True")
            expect(h.is_completed(), "is_completed() is False after wait()")
        expect_tensor(
            t, oracle(every_rank(comm, torch.float32), "mean").to(dev), "async mean", close=True
        )
        expect_tensor(b, torch.full((3,), float(n - 1), device=dev), "async broadcast")
        want = torch.arange(1.0, n + 1).repeat_interleave(2).to(dev)
        expect_tensor(out, want, "async all_gather_into_tensor")
        expect_tensor(rs, torch.full((2,), float(n), device=dev), "async reduce_scatter")


@check("all_gather")
def _all_gather(comm: Any, ctx: dict) -> None:
    """all_gather of equal shapes: a new list indexed by rank, on the caller's device."""
    n = comm.world_size
    for dtype in MOVE_DTYPES:
        for dev in devices(comm):
            mine = rank_tensor(comm.rank, dtype, device=dev)
            got = comm.all_gather(mine)
            expect(isinstance(got, list) and len(got) == n, f"all_gather returned {type(got)}")
            for r, t in enumerate(got):
                expect_tensor(t, rank_tensor(r, dtype, device=dev), f"all_gather[{r}] {dtype}")
            expect(got[comm.rank] is mine, "all_gather's own entry is not the input itself")


@check("all_gather_ragged")
def _all_gather_ragged(comm: Any, ctx: dict) -> None:
    """all_gather where ranks pass different shapes (also 0-size and 0-dim) gets true tensors."""
    n, r = comm.world_size, comm.rank
    for dev in devices(comm):
        got = comm.all_gather(torch.arange(r + 1, device=dev))
        for i, t in enumerate(got):
            expect_tensor(t, torch.arange(i + 1, device=dev), f"ragged dim 0, rank {i}")
        got = comm.all_gather(torch.full((2, r + 1), r, dtype=torch.int32, device=dev))
        for i, t in enumerate(got):
            want = torch.full((2, i + 1), i, dtype=torch.int32, device=dev)
            expect_tensor(t, want, f"ragged dim 1, rank {i}")
        got = comm.all_gather(torch.ones(r, 3, device=dev))  # rank 0: 0 rows
        for i, t in enumerate(got):
            expect_tensor(t, torch.ones(i, 3, device=dev), f"0-size on rank 0, rank {i}")
        got = comm.all_gather(torch.tensor(float(r), device=dev))
        expect_tensor(torch.stack(got), torch.arange(float(n), device=dev), "0-dim all_gather")


@check("all_gather_into_tensor")
def _all_gather_into_tensor(comm: Any, ctx: dict) -> None:
    """all_gather_into_tensor fills the given output in place, rank-major along dim 0."""
    n = comm.world_size
    for dtype in (torch.float32, torch.int64, torch.bool, torch.bfloat16, torch.float64):
        for dev in devices(comm):
            out = torch.empty(n * 2, 3, dtype=dtype, device=dev)
            ptr = out.data_ptr()
            ret = comm.all_gather_into_tensor(out, rank_tensor(comm.rank, dtype, device=dev))
            expect(ret is None, f"all_gather_into_tensor returned {ret!r}")
            expect(out.data_ptr() == ptr, "all_gather_into_tensor replaced its output")
            want = torch.cat(every_rank(comm, dtype)).to(dev)
            expect_tensor(out, want, f"all_gather_into_tensor {dtype} on {dev}")
    flat = torch.empty(n * 6)
    comm.all_gather_into_tensor(flat, rank_tensor(comm.rank, torch.float32))
    expect_tensor(
        flat, torch.cat([t.reshape(-1) for t in every_rank(comm, torch.float32)]), "flat output"
    )


@check("gather")
def _gather(comm: Any, ctx: dict) -> None:
    """gather to every dst in turn: dst gets the list, the others []."""
    n = comm.world_size
    for dst in range(n):
        for dtype in (torch.float32, torch.int64, torch.bool, torch.float64, torch.uint8):
            for dev in devices(comm):
                got = comm.gather(rank_tensor(comm.rank, dtype, device=dev), dst=dst)
                expect(isinstance(got, list), f"gather returned {type(got).__name__}")
                if comm.rank != dst:
                    expect(got == [], f"gather on a non-dst rank returned {got!r}")
                    continue
                expect(len(got) == n, f"gather returned {len(got)} tensors for {n} ranks")
                for r, t in enumerate(got):
                    expect_tensor(t, rank_tensor(r, dtype, device=dev), f"gather dst={dst}[{r}]")


@check("broadcast")
def _broadcast(comm: Any, ctx: dict) -> None:
    """broadcast from every src in turn, in place, into contiguous and strided tensors."""
    n = comm.world_size
    for src in range(n):
        for dtype in MOVE_DTYPES:
            for dev in devices(comm):
                t = rank_tensor(comm.rank, dtype, device=dev)
                ptr = t.data_ptr()
                ret = comm.broadcast(t, src=src)
                expect(ret is None, f"broadcast returned {ret!r}")
                expect(t.data_ptr() == ptr, "broadcast did not work in place")
                expect_tensor(
                    t, rank_tensor(src, dtype, device=dev), f"broadcast src={src} {dtype}"
                )
        base = torch.zeros(3, 2)
        view = base.t()
        view.copy_(rank_tensor(comm.rank, torch.float32))
        comm.broadcast(view, src=src)
        expect_tensor(base.t(), rank_tensor(src, torch.float32), "broadcast into a strided view")


@check("reduce_scatter")
def _reduce_scatter(comm: Any, ctx: dict) -> None:
    """reduce_scatter from one tensor or a list, for sum/min/max/product/mean."""
    n, r = comm.world_size, comm.rank
    for op in ("sum", "max", "min", "product", "mean"):
        for dtype in (torch.float32, torch.int64):
            chunks = [rank_tensor(r + k, dtype, (3,)) for k in range(n)]
            # every rank's chunk k, reduced, is what rank k keeps
            want = oracle([rank_tensor(q + r, dtype, (3,)) for q in range(n)], op)
            for dev in devices(comm):
                out = torch.empty(3, dtype=dtype, device=dev)
                ret = comm.reduce_scatter(out, torch.cat(chunks).to(dev), op)
                expect(ret is None, f"reduce_scatter returned {ret!r}")
                expect_tensor(
                    out,
                    want.to(dev),
                    f"reduce_scatter {op} {dtype} (tensor) on {dev}",
                    close=op == "mean",
                )
                out2 = torch.empty(3, dtype=dtype, device=dev)
                comm.reduce_scatter(out2, [c.to(dev) for c in chunks], op)
                expect_tensor(
                    out2,
                    want.to(dev),
                    f"reduce_scatter {op} {dtype} (list) on {dev}",
                    close=op == "mean",
                )
    out = torch.empty(2, 2)
    comm.reduce_scatter(out, torch.ones(2 * n, 2))
    expect_tensor(out, torch.full((2, 2), float(n)), "2-D reduce_scatter")


@check("barrier")
def _barrier(comm: Any, ctx: dict) -> None:
    """barrier returns None, again and again, and the world stays in step."""
    for _ in range(3):
        expect(comm.barrier() is None, "barrier returned something")
    t = torch.ones(1)
    comm.all_reduce(t)
    expect(float(t) == comm.world_size, "collective after barrier")


@check("p2p_exchange")
def _p2p_exchange(comm: Any, ctx: dict) -> None:
    """Backend.exchange: each rank sends to the next and receives from the previous."""
    n, r = comm.world_size, comm.rank
    dev = comm.plugin.device()
    if n == 1:
        comm.plugin.exchange([], [], comm.group)
        return
    for dtype in (torch.uint8, torch.float32, torch.int64):
        mine = rank_tensor(r, dtype, (1000,), device=dev)
        buf = torch.empty(1000, dtype=dtype, device=dev)
        back = torch.empty(1000, dtype=dtype, device=dev)
        comm.plugin.exchange(
            [(mine, (r + 1) % n), (mine, (r - 1) % n)],
            [(buf, (r - 1) % n), (back, (r + 1) % n)],
            comm.group,
        )
        expect_tensor(
            buf, rank_tensor((r - 1) % n, dtype, (1000,), device=dev), "p2p from previous"
        )
        expect_tensor(back, rank_tensor((r + 1) % n, dtype, (1000,), device=dev), "p2p from next")


@check("subgroups", min_world=2)
def _subgroups(comm: Any, ctx: dict) -> None:
    """new_group: members reduce among themselves; a non-member gets a clear error."""
    from commlib.errors import NotInGroupError

    n, r = comm.world_size, comm.rank
    members = list(range(n - 1))  # everyone but the last rank
    sub = comm.new_group(members)
    if r in members:
        expect(sub.is_member and sub.world_size == n - 1 and sub.rank == r, "subgroup identity")
        t = torch.ones(2)
        sub.all_reduce(t)
        expect_tensor(t, torch.full((2,), float(n - 1)), "subgroup all_reduce")
        objs = sub.all_gather_object({"r": r})
        expect(objs == [{"r": i} for i in members], f"subgroup all_gather_object: {objs}")
        sub.barrier()
    else:
        expect(not sub.is_member and sub.rank == -1, "non-member identity")
        try:
            sub.all_reduce(torch.ones(1))
        except NotInGroupError:
            pass
        else:
            raise AssertionError("a non-member's all_reduce did not raise NotInGroupError")
    pair = comm.new_group([0, n - 1])
    if r in (0, n - 1):
        got = pair.all_gather(torch.tensor([r]))
        expect([int(t) for t in got] == [0, n - 1], f"pair all_gather: {got}")
    comm.barrier()


@check("single_equivalence", max_world=1)
def _single_equivalence(comm: Any, ctx: dict) -> None:
    """In a world of one, every collective gives what the 'single' backend gives."""
    from commlib import Communicator

    def steps(c: Any) -> list:
        out: list = []
        t = rank_tensor(0, torch.float32)
        c.all_reduce(t, "mean")
        out.append(t)
        out.extend(c.all_gather(torch.arange(3)))
        out.extend(c.gather(torch.ones(2), dst=0))
        b = torch.arange(4)
        c.broadcast(b, src=0)
        out.append(b)
        g = torch.empty(4)
        c.all_gather_into_tensor(g, torch.arange(4.0))
        out.append(g)
        rs = torch.empty(3)
        c.reduce_scatter(rs, torch.arange(3.0), "max")
        out.append(rs)
        out.append(c.all_gather_object({"a": [1]}))
        out.append(c.gather_object(("x", 1), dst=0))
        objs = [{"k": 1}, None]
        c.broadcast_object_list(objs)
        out.append(objs)
        red = torch.arange(3.0)
        c.reduce(red, 0, "mean")
        out.append(red)
        sc = torch.empty(2)
        c.scatter(sc, [torch.ones(2)], 0)
        out.append(sc)
        a2a = [torch.empty(3)]
        c.all_to_all(a2a, [torch.arange(3.0)])
        out.extend(a2a)
        single = torch.empty(4)
        c.all_to_all_single(single, torch.arange(4.0), [4], [4])
        out.append(single)
        box = [None]
        c.scatter_object_list(box, [("s", 1)])
        out.append(box)
        return out

    for i, (a, b) in enumerate(zip(steps(comm), steps(Communicator(backend="single")))):
        if isinstance(a, torch.Tensor):
            expect_tensor(a, b, f"step {i} differs from the single backend")
        else:
            expect(a == b, f"step {i}: {a!r} != single backend's {b!r}")
