"""gloo's composed paths give the results of gloo's own collectives.

The gloo plugin sends small gathers, all_reduces and reduces through gloo's
all_to_all or gather with a local reduction in rank order, and every
reduce_scatter through one all_to_all (``small_exchange_bytes``,
``reduce_scatter_by_all_to_all``). Each is compared here with torch's own
call, for every op and the dtypes gloo moves, below and above the threshold,
blocking and async. The checks are off (``strict=False``), so the data
reaches the plugin instead of completing in the argument check's round.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as tdist

from commlib import Communicator

_TORCH_OPS = {
    "sum": tdist.ReduceOp.SUM,
    "product": tdist.ReduceOp.PRODUCT,
    "min": tdist.ReduceOp.MIN,
    "max": tdist.ReduceOp.MAX,
    "band": tdist.ReduceOp.BAND,
    "bor": tdist.ReduceOp.BOR,
    "bxor": tdist.ReduceOp.BXOR,
}
_reduce_scatter_single = (
    getattr(tdist, "reduce_scatter_single", None) or tdist.reduce_scatter_tensor
)

DTYPES = [torch.float32, torch.float64, torch.int64, torch.uint8, torch.bfloat16]
# 5 and 3000 elements go through the composed paths; 400_000 (over 1 MiB gathered) not
SIZES = [5, 3000, 400_000]


def _ops(dtype: torch.dtype) -> list[str]:
    ops = ["sum", "min", "max"]
    if dtype.is_floating_point:
        return [*ops, "product"]
    return [*ops, "band", "bor", "bxor"]


def _value(rank: int, n: int, dtype: torch.dtype, salt: int = 0) -> torch.Tensor:
    base = (torch.arange(n, dtype=torch.int64) * 7 + 3 * rank + salt) % 5 + 1
    return base.to(dtype)


def _same(got: torch.Tensor, want: torch.Tensor) -> bool:
    if got.dtype.is_floating_point:
        # rank order here, gloo's own order there: floating sums may round apart
        return torch.allclose(got.double(), want.double(), rtol=1e-2)
    return torch.equal(got, want)


def _on_against_torch(comm, dtype: torch.dtype, n: int) -> list[str]:
    c = Communicator(timeout=60, strict=False)
    world, me = c.world_size, c.rank
    wrong = []
    for op in _ops(dtype):
        torch_op = _TORCH_OPS[op]
        for async_op in (False, True):
            x, ref = _value(me, n, dtype), _value(me, n, dtype)
            handle = c.all_reduce(x, op=op, async_op=async_op)
            if handle is not None:
                handle.wait()
            tdist.all_reduce(ref, op=torch_op)
            if not _same(x, ref):
                wrong.append(f"all_reduce {op} async={async_op}")

            whole = _value(me, n * world, dtype, salt=1)
            out, ref = torch.empty(n, dtype=dtype), torch.empty(n, dtype=dtype)
            handle = c.reduce_scatter(out, whole, op=op, async_op=async_op)
            if handle is not None:
                handle.wait()
            _reduce_scatter_single(ref, whole.clone(), op=torch_op)
            if not _same(out, ref):
                wrong.append(f"reduce_scatter {op} async={async_op}")

            dst = world - 1
            x, ref = _value(me, n, dtype, salt=2), _value(me, n, dtype, salt=2)
            handle = c.reduce(x, dst=dst, op=op, async_op=async_op)
            if handle is not None:
                handle.wait()
            tdist.reduce(ref, dst=dst, op=torch_op)
            if me == dst and not _same(x, ref):
                wrong.append(f"reduce {op} async={async_op}")
            if me != dst and not torch.equal(x, _value(me, n, dtype, salt=2)):
                wrong.append(f"reduce {op} async={async_op} changed a non-dst tensor")
    x = _value(me, n, dtype, salt=3)
    out = torch.empty(world * n, dtype=dtype)
    handle = c.all_gather_into_tensor(out, x, async_op=True)
    handle.wait()
    if not torch.equal(out, torch.cat([_value(r, n, dtype, salt=3) for r in range(world)])):
        wrong.append("all_gather_into_tensor async")
    got = c.all_gather(x)
    if not all(torch.equal(g, _value(r, n, dtype, salt=3)) for r, g in enumerate(got)):
        wrong.append("all_gather")
    return wrong


@pytest.mark.parametrize("n", SIZES, ids=lambda n: f"n{n}")
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_composed_paths_equal_torch(world, dtype, n):
    if n == SIZES[-1] and dtype not in (torch.float32, torch.int64):
        pytest.skip("the large size checks gloo's own path: two dtypes are enough")
    for wrong in world.run(_on_against_torch, dtype, n, timeout=120):
        assert wrong == []


def _on_non_wire_dtype(comm) -> list[str]:
    # int16 is not a dtype gloo moves: it travels as bytes and is reduced here
    c = Communicator(timeout=60, strict=False)
    world, me = c.world_size, c.rank
    x = torch.full((10,), me + 1, dtype=torch.int16)
    c.all_reduce(x, op="max")
    whole = torch.arange(world * 3, dtype=torch.int16) + me
    out = torch.empty(3, dtype=torch.int16)
    c.reduce_scatter(out, whole)
    expect = sum(torch.arange(world * 3, dtype=torch.int64) + r for r in range(world))
    wrong = []
    if not torch.equal(x, torch.full((10,), world, dtype=torch.int16)):
        wrong.append(f"all_reduce max: {x}")
    if not torch.equal(out.long(), expect[me * 3 : me * 3 + 3]):
        wrong.append(f"reduce_scatter: {out}")
    return wrong


def test_a_dtype_gloo_cannot_move(world):
    for wrong in world.run(_on_non_wire_dtype):
        assert wrong == []


def _on_all_gather_slots(comm) -> list[str]:
    from commlib.backend import Backend

    c = Communicator(timeout=60, strict=False)
    world, me = c.world_size, c.rank
    gloo, group = c.plugin, tdist.group.WORLD
    wrong = []
    # 16 bytes a slot: gloo's all_to_all of the rows as they are, or (one row)
    # its gather by all_to_all; 600 KiB: over small_exchange_bytes at every world
    # size, gloo's own gather
    for n, copies in ((16, world), (16, 1), (600 << 10, world), (600 << 10, 1)):
        slot = (torch.arange(n, dtype=torch.int64) * 5 + me).to(torch.uint8)
        for plugin, name in ((gloo, "gloo"), (Backend(), "default")):
            slots = slot.expand(copies, n).contiguous()
            out = torch.full((world * n,), 7, dtype=torch.uint8)
            work = plugin.all_gather_slots(out, slots, group, async_op=True)
            if work is not None:
                work.wait()
            want = [
                (torch.arange(n, dtype=torch.int64) * 5 + r).to(torch.uint8) for r in range(world)
            ]
            if not torch.equal(out, torch.cat(want)):
                wrong.append(f"{name} all_gather_slots of {n} bytes x {copies}")
            if not torch.equal(slots, slot.expand(copies, n)):
                wrong.append(f"{name} all_gather_slots of {n} bytes changed its input")
    return wrong


def test_all_gather_slots_gives_every_ranks_slot_in_rank_order(world):
    for wrong in world.run(_on_all_gather_slots):
        assert wrong == []


def _on_slot_rows_apart(comm) -> list[str]:
    from commlib.backend import Backend

    c = Communicator(timeout=30)
    world, me = c.world_size, c.rank
    gloo, group = c.plugin, tdist.group.WORLD

    class OwnGather(type(gloo)):  # type: ignore[misc]
        def all_gather_slots(self, output, slots, group, async_op=False):
            return Backend.all_gather_slots(self, output, slots, group, async_op)

    wrong = []
    if Backend().sends_slot_rows_apart(world, 16) or OwnGather().sends_slot_rows_apart(world, 16):
        wrong.append("a default or overridden all_gather_slots claims rows apart")
    if gloo.sends_slot_rows_apart(world, 600 << 10 if world > 1 else 2 << 20):
        wrong.append("gloo claims rows apart past small_exchange_bytes")
    if not gloo.sends_slot_rows_apart(world, 16):
        wrong.append("gloo does not send small rows apart")
        return wrong
    # row j for rank j: rank r's row j is 10 * r + j, 16 times
    rows = torch.tensor([[10 * me + j] * 16 for j in range(world)], dtype=torch.uint8)
    out = torch.zeros(world * 16, dtype=torch.uint8)
    work = gloo.all_gather_slots(out, rows, group, async_op=True)
    if work is not None:
        work.wait()
    want = torch.tensor([[10 * r + me] * 16 for r in range(world)], dtype=torch.uint8)
    if not torch.equal(out.view(world, 16), want):
        wrong.append(f"rank {me} got {out.view(world, 16)[:, 0].tolist()}")
    return wrong


def test_gloo_sends_each_slot_row_to_its_rank(world):
    # what lets a scatter's pieces and an all_to_all_single's chunks ride in the check
    for wrong in world.run(_on_slot_rows_apart):
        assert wrong == []
