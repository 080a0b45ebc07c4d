"""The argument check under default settings: mismatched arguments never abort a process.

On gloo, ranks calling the same collective with different sizes end the
process from gloo's own thread. Under default settings commlib checks the
tensor collectives' arguments in their first round instead, so every rank
raises the same :class:`RemoteArgumentError` and the world stays usable. The
check must also be invisible when the ranks agree: the same results as
unchecked, small tensors in one round.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from typing import Any

import pytest
import torch

import commlib
from commlib import Communicator, _shared_rows, helpers, results
from commlib._settings import strict_from_env
from commlib.errors import RemoteArgumentError

TIMEOUT = 30.0


def _mismatch(c: Communicator, what: str) -> None:
    last = c.rank == c.world_size - 1
    w = c.world_size
    if what == "shape":
        c.all_reduce(torch.ones(3 if last else 4))
    elif what == "shape-large":  # beyond the slot: the engine's collective would have run
        c.all_reduce(torch.ones(5000 if last else 4000))
    elif what == "dtype":
        c.all_reduce(torch.ones(4, dtype=torch.float64 if last else torch.float32))
    elif what == "dtype-same-size":  # no abort in gloo, but wrong results
        c.all_reduce(torch.ones(4, dtype=torch.int32 if last else torch.float32))
    elif what == "op":
        c.all_reduce(torch.ones(4), op="max" if last else "sum")
    elif what == "src":
        c.broadcast(torch.ones(4), src=w - 1 if c.rank == 0 else 0)
    elif what == "broadcast-shape":
        c.broadcast(torch.ones(3 if last else 4), src=0)
    elif what == "collective":
        if last:
            c.broadcast(torch.ones(4), src=0)
        else:
            c.all_reduce(torch.ones(4))
    elif what == "gather-dst":
        c.gather(torch.ones(2), dst=1 if last else 0)
    elif what == "all_gather_into_tensor":
        n = 3 if last else 2
        c.all_gather_into_tensor(torch.empty(n * w), torch.ones(n))
    elif what == "reduce_scatter":
        n = 3 if last else 2
        c.reduce_scatter(torch.empty(n), torch.ones(n * w))
    elif what == "reduce-shape":
        c.reduce(torch.ones(3 if last else 4), dst=0)
    elif what == "scatter-shape":
        parts = [torch.ones(4)] * w if c.rank == 0 else None
        c.scatter(torch.empty(3 if last else 4), parts, src=0)
    elif what == "scatter-dtype-same-size":  # src's pieces ride: read as the wrong dtype
        parts = [torch.ones(4)] * w if c.rank == 0 else None
        c.scatter(torch.empty(4, dtype=torch.int32 if last else torch.float32), parts, src=0)
    elif what == "scatter-shape-large":  # past the slot: the engine's scatter would run
        parts = [torch.ones(5000)] * w if c.rank == 0 else None
        c.scatter(torch.empty(4000 if last else 5000), parts, src=0)
    elif what == "all_to_all_single-splits":
        # the last rank sends rank 0 two rows; rank 0 expects one
        sends = [2] + [1] * (w - 1) if last else [1] * w
        c.all_to_all_single(torch.empty(w), torch.ones(sum(sends)), None, sends)
    elif what == "all_to_all_single-self":
        # only the last rank's own pair disagrees: a local error would part the ranks
        sends = [1] * (w - 1) + [2] if last else [1] * w
        c.all_to_all_single(torch.empty(w), torch.ones(sum(sends)), [1] * w, sends)
    elif what == "all_to_all_single-splits-large":  # past the slot: the table still rides
        sends = [3001] + [3000] * (w - 1) if last else [3000] * w
        c.all_to_all_single(torch.empty(3000 * w), torch.ones(sum(sends)), None, sends)
    elif what == "all_to_all_single-even":
        # even splits: the last rank's rows are larger; the shapes must agree
        rows = 2 * w if last else w
        c.all_to_all_single(torch.empty(rows), torch.ones(rows))
    elif what == "all_to_all_single-even-rows":
        # the same bytes to every rank, in rows of another shape: the chunks ride
        shape = (w, 2) if last else (2 * w,)
        c.all_to_all_single(torch.empty(shape), torch.ones(shape))
    elif what == "all_to_all_single-even-large":  # beyond the slot: checked, not carried
        rows = 4000 * w if last else 3000 * w
        c.all_to_all_single(torch.empty(rows), torch.ones(rows))
    elif what == "all_to_all-sizes":
        ins = [torch.ones(2 if last and j == 0 else 1) for j in range(w)]
        c.all_to_all([torch.empty(1) for _ in range(w)], ins)
    else:
        raise AssertionError(what)


def _on_mismatch(comm, what: str) -> tuple[str, str, float]:
    c = Communicator(timeout=TIMEOUT)  # default settings
    try:
        _mismatch(c, what)
    except RemoteArgumentError as exc:
        error = str(exc)
    else:
        error = "no error"
    # nothing broke: the same communicator goes on
    x = torch.ones(2)
    c.all_reduce(x)
    return c.checks, error, x[0].item()


MISMATCHES = [
    "shape",
    "shape-large",
    "dtype",
    "dtype-same-size",
    "op",
    "src",
    "broadcast-shape",
    "collective",
    "gather-dst",
    "all_gather_into_tensor",
    "reduce_scatter",
    "reduce-shape",
    "scatter-shape",
    "scatter-dtype-same-size",
    "scatter-shape-large",
    "all_to_all_single-splits",
    "all_to_all_single-self",
    "all_to_all_single-splits-large",
    "all_to_all_single-even",
    "all_to_all_single-even-rows",
    "all_to_all_single-even-large",
    "all_to_all-sizes",
]


@pytest.mark.parametrize("what", MISMATCHES)
def test_mismatched_arguments_raise_the_same_error_on_every_rank(multi_world, what):
    results = multi_world.run(_on_mismatch, what, timeout=120)
    checks, errors, after = zip(*results)
    assert set(checks) == {"guard"}
    assert len(set(errors)) == 1, errors  # every rank raised, the same error
    if what == "all_to_all_single-self":
        last = multi_world.size - 1
        assert f"rank {last} sends rank {last} 2 elements, rank {last} expects 1" in errors[0]
    elif what.startswith("all_to_all_single-even"):  # the shapes say it all
        assert "ranks passed different arguments" in errors[0], errors[0]
        assert "even splits" in errors[0], errors[0]
    elif what == "all_to_all_single-splits-large":
        last = multi_world.size - 1
        assert f"rank {last} sends rank 0 3001 elements, rank 0 expects 3000" in errors[0]
    elif what.startswith("all_to_all"):  # sizes that must match pair by pair
        assert (
            f"rank {multi_world.size - 1} sends rank 0 2 elements, rank 0 expects 1" in (errors[0])
        ), errors[0]
    else:
        assert "ranks passed different arguments" in errors[0], errors[0]
    assert f"rank {multi_world.size - 1}: " in errors[0]
    assert set(after) == {float(multi_world.size)}


def _every_tensor_collective(c: Communicator, dtype: torch.dtype, n: int) -> list:
    """Results of each tensor collective on integer-valued data (exact in any order)."""
    r, w = c.rank, c.world_size
    base = (torch.arange(n) % 5 + r).to(dtype)
    out: list = []
    ops = ["sum", "max", "min"] if dtype != torch.bool else ["sum", "max"]
    if dtype.is_complex:
        ops = ["sum"]
    for op in ops:
        x = base.clone()
        c.all_reduce(x, op=op)
        out.append(x)
    x = base.clone()
    handle = c.all_reduce(x, async_op=True)
    assert handle is not None and handle.wait()
    out.append(x)
    y = base.clone() if r == w - 1 else torch.zeros_like(base)
    c.broadcast(y, src=w - 1)
    out.append(y)
    flat = torch.empty(n * w, dtype=dtype)
    c.all_gather_into_tensor(flat, base)
    out.append(flat)
    out.append(c.gather(base, dst=0))
    if dtype != torch.bool:
        chunk = torch.empty(n, dtype=dtype)
        c.reduce_scatter(chunk, torch.cat([base] * w))
        out.append(chunk)
    x = base.clone()
    c.reduce(x, dst=w - 1, op="max" if dtype != torch.bool else "sum")
    out.append(x)
    got = torch.zeros_like(base)
    c.scatter(
        got,
        [base + i for i in range(w)]
        if r == 0 and dtype != torch.bool
        else ([base] * w if r == 0 else None),
        src=0,
    )
    out.append(got)
    mixed = torch.empty(n * w, dtype=dtype)
    c.all_to_all_single(mixed, torch.cat([base] * w))
    out.append(mixed)
    outs = [torch.empty(n, dtype=dtype) for _ in range(w)]
    c.all_to_all(outs, [base] * w)
    out.append(outs)
    return out


def _on_same_results(comm, dtype: torch.dtype, n: int) -> bool:
    checked = Communicator(timeout=TIMEOUT)
    unchecked = Communicator(timeout=TIMEOUT, strict=False)
    a = _every_tensor_collective(checked, dtype, n)
    b = _every_tensor_collective(unchecked, dtype, n)
    for got, want in zip(a, b):
        if isinstance(got, list):
            assert len(got) == len(want) and all(torch.equal(g, v) for g, v in zip(got, want))
        else:
            assert got.dtype == want.dtype and torch.equal(got, want), (got, want)
    return True


@pytest.mark.parametrize(
    "dtype",
    [torch.float32, torch.float64, torch.bfloat16, torch.int64, torch.uint8, torch.bool],
    ids=str,
)
@pytest.mark.parametrize("n", [5, 3000], ids=["in-the-slot", "after-the-check"])
def test_checked_collectives_give_the_unchecked_results(world, dtype, n):
    assert world.run(_on_same_results, dtype, n, timeout=120) == [True] * world.size


def _on_reduce_scatter_chunks(comm) -> bool:
    # each rank's chunks differ by rank and by chunk: the chunk that rides to rank j is
    # input chunk j, reduced in rank order (the same bits as the unchecked call)
    checked = Communicator(timeout=TIMEOUT)
    unchecked = Communicator(timeout=TIMEOUT, strict=False)
    w, r = checked.world_size, checked.rank
    for dtype in (torch.float32, torch.int64, torch.float16):
        for op in ("sum", "mean", "max", "product"):
            if dtype == torch.float16 and op == "product":
                continue
            flat = (torch.arange(3.0 * w) * 0.37 + r * 1.1).to(dtype)
            got, want = torch.empty(3, dtype=dtype), torch.empty(3, dtype=dtype)
            checked.reduce_scatter(got, flat, op)
            unchecked.reduce_scatter(want, flat, op)
            assert torch.equal(got, want), (dtype, op, got, want)
    flat = torch.arange(6.0 * w) + r
    rows = torch.empty(2, 3)
    handle = checked.reduce_scatter(rows.t(), flat.view(w * 3, 2), async_op=True)
    assert handle is not None and handle.wait()
    mine = torch.stack([(torch.arange(6.0 * w) + q).view(w, 3, 2)[r] for q in range(w)])
    assert torch.equal(rows.t(), mine.sum(0))
    return True


def test_checked_reduce_scatter_takes_each_ranks_own_chunk(multi_world):
    assert multi_world.run(_on_reduce_scatter_chunks) == [True] * multi_world.size


def _on_scatter_shapes(comm) -> bool:
    # src's list travels in its slot of the check: scalars, empty and
    # non-contiguous tensors come out as the engine's scatter would give them
    c = Communicator(timeout=TIMEOUT)
    w, r = c.world_size, c.rank
    for shape in [(), (0,), (3, 2)]:
        for dtype in (torch.float32, torch.bool, torch.complex64):
            ins = [torch.full(shape, i + 1).to(dtype) for i in range(w)] if r == w - 1 else None
            out = torch.zeros(shape, dtype=dtype)
            c.scatter(out, ins, src=w - 1)
            assert torch.equal(out, torch.full(shape, r + 1).to(dtype)), (shape, dtype)
    base = torch.arange(12.0).view(3, 4)
    out = torch.zeros(3, 4).t()
    c.scatter(out, [base.t() + i for i in range(w)] if r == 0 else None, src=0)
    assert torch.equal(out, base.t() + r)
    return True


def test_scatter_in_the_check_keeps_shapes(multi_world):
    assert multi_world.run(_on_scatter_shapes) == [True] * multi_world.size


def _on_rounds(comm, shared: bool) -> dict:
    # the engine numbers each call it makes: how many rounds each collective took
    out = {}
    for name, strict in (("checked", None), ("unchecked", False), ("strict", True)):
        # a group of its own: the slot a group learns starts empty
        if not shared:  # the engine's rounds (on every rank: each turns it off)
            os.environ[_shared_rows.ENV] = "0"
        try:
            c = Communicator(timeout=TIMEOUT, strict=strict).new_group(range(comm.world_size))
        finally:
            os.environ.pop(_shared_rows.ENV, None)
        assert (c._engine.kept.get("shared") is not None) is shared
        w = comm.world_size
        for label, splits in (("even", None), ("uneven", [1] * w)):
            before = c._engine.seq
            c.all_to_all_single(torch.empty(w), torch.ones(w), splits, splits)
            out[f"{name} small {label} all_to_all_single"] = c._engine.seq - before
        for label, n in (("small", 8), ("large", 100_000)):
            before = c._engine.seq
            ins = [torch.ones(n)] * w if c.rank == 0 else None
            c.scatter(torch.empty(n), ins, src=0)
            out[f"{name} {label} scatter"] = c._engine.seq - before
        for label in ("large", "large again"):  # a broadcast does not grow the slot
            before = c._engine.seq
            c.broadcast(torch.ones(100_000), src=0)
            out[f"{name} {label} broadcast"] = c._engine.seq - before
        sizes = (("small", 8), ("large", 100_000), ("large again", 100_000), ("huge", 1 << 20))
        for label, n in sizes:
            before = c._engine.seq
            c.all_reduce(torch.ones(n))
            out[f"{name} {label} all_reduce"] = c._engine.seq - before
        before = c._engine.seq
        c.barrier()
        out[f"{name} barrier"] = c._engine.seq - before
    return out


@pytest.mark.parametrize("shared", [False, True], ids=["on the engine", "shared"])
def test_a_small_checked_collective_is_one_round(multi_world, shared):
    rounds = multi_world.run(_on_rounds, shared)[0]
    expected = {
        "checked small even all_to_all_single": 1,  # the input travelled with the check
        "checked small uneven all_to_all_single": 1,  # the chunks rode with the sizes
        "checked small scatter": 1,  # src's list travelled in its slot
        "checked large scatter": 2,
        "checked large broadcast": 2,
        "checked large again broadcast": 2,  # would send every rank's slot to every rank
        "checked small all_reduce": 1,  # the data travelled with the check
        "checked large all_reduce": 2,  # the check, then the engine's all_reduce
        "checked large again all_reduce": 1,  # the slot learnt the size
        "checked huge all_reduce": 2,  # 4 MiB: past what a slot learns
        "checked barrier": 1,  # no sizes to mismatch: unchecked by default
        "unchecked small even all_to_all_single": 1,
        "unchecked small uneven all_to_all_single": 1,
        "unchecked small scatter": 1,
        "unchecked large scatter": 1,
        "unchecked large broadcast": 1,
        "unchecked large again broadcast": 1,
        "unchecked small all_reduce": 1,
        "unchecked large all_reduce": 1,
        "unchecked large again all_reduce": 1,
        "unchecked huge all_reduce": 1,
        "unchecked barrier": 1,
        "strict small even all_to_all_single": 1,
        "strict small uneven all_to_all_single": 1,
        "strict small scatter": 1,
        "strict large scatter": 2,
        "strict large broadcast": 2,
        "strict large again broadcast": 2,
        "strict small all_reduce": 1,
        "strict large all_reduce": 2,
        "strict large again all_reduce": 1,
        "strict huge all_reduce": 2,
        "strict barrier": 2,
    }
    if shared:
        # through shared memory a slot pads nothing: the large scatter teaches it its
        # 400 KB, and the large broadcasts and all_reduces ride from then on
        for name in ("checked", "strict"):
            for label in ("large broadcast", "large again broadcast", "large all_reduce"):
                expected[f"{name} {label}"] = 1
    assert rounds == expected


def _on_shrinking(comm) -> list[int]:
    from commlib._rooms import SHRINK_AFTER, rooms_of

    c = Communicator(timeout=TIMEOUT).new_group(range(comm.world_size))
    rooms = rooms_of(c._engine)
    c.all_reduce(torch.ones(100_000))  # the slot learns 400 KB
    slots = [rooms.slot_bytes(c.slot_size)]
    w = c.world_size
    for _ in range(SHRINK_AFTER):  # checked, 16 bytes a rank travel with the check
        c.scatter(torch.empty(4), [torch.ones(4)] * w if c.rank == 0 else None, src=0)
    slots.append(rooms.slot_bytes(c.slot_size))
    return slots


def test_calls_without_data_shrink_a_learnt_slot(multi_world):
    # otherwise every later scatter's check paid the 400 KB slot of one all_reduce
    for learnt, after in multi_world.run(_on_shrinking):
        assert learnt > 400_000 and after == 4096


def test_strict_settings(monkeypatch):
    monkeypatch.delenv("COMMLIB_STRICT", raising=False)
    assert strict_from_env() is None
    monkeypatch.setenv("COMMLIB_STRICT", "0")
    assert strict_from_env() is False and Communicator().strict is False
    monkeypatch.setenv("COMMLIB_STRICT", "1")
    assert strict_from_env() is True and Communicator().strict is True
    monkeypatch.setenv("COMMLIB_STRICT", "maybe")
    with pytest.raises(ValueError, match="COMMLIB_STRICT"):
        strict_from_env()
    monkeypatch.delenv("COMMLIB_STRICT")
    assert Communicator(strict=False).new_group([0]).strict is False  # subgroups keep it
    assert Communicator(strict=True).new_group([0]).strict is True
    assert Communicator().checks == "off"  # a world of one has nothing to mismatch with


_KINDS = {
    "all_reduce": lambda c: c.all_reduce(torch.ones(4)),
    "broadcast": lambda c: c.broadcast(torch.ones(4), src=0),
    "all_gather": lambda c: c.all_gather(torch.ones(4)),
    "all_gather_object": lambda c: c.all_gather_object({"a": 1}),
    "broadcast_object_list": lambda c: c.broadcast_object_list([{"a": 1}], src=0),
    "scatter": lambda c: c.scatter(
        torch.empty(4), [torch.ones(4)] * c.world_size if c.rank == 0 else None, src=0
    ),
    "all_to_all_single": lambda c: c.all_to_all_single(
        torch.empty(4 * c.world_size), torch.ones(4 * c.world_size)
    ),
}


def _on_different_protocols(
    comm, first: str, others: str, steady: bool = False
) -> tuple[str, float]:
    import time

    c = Communicator(timeout=TIMEOUT)
    # a learnt slot first: every protocol's first round must still be the same size
    c.all_reduce(torch.ones(20_000))
    c.all_reduce(torch.ones(20_000))
    for _ in range(3 if steady else 0):  # rank 0's call has its round prepared
        _KINDS[first](c)
    started = time.monotonic()
    try:
        _KINDS[first if c.rank == 0 else others](c)
    except RemoteArgumentError:
        error = "RemoteArgumentError"
    else:
        error = "no error"
    waited = time.monotonic() - started
    x = torch.ones(2)
    c.all_reduce(x)  # the group goes on
    return error, waited, x[0].item()


def _on_strict_set_later(comm) -> tuple[list[str], str, float]:
    c = Communicator(timeout=TIMEOUT, strict=False)
    modes = [c.checks]
    c.strict = True  # a public setting: the check follows it from the next call
    modes.append(c.checks)
    try:
        c.all_reduce(torch.ones(4), op="max" if c.rank == c.world_size - 1 else "sum")
        kind = "no error"
    except RemoteArgumentError as exc:
        kind = type(exc).__name__
    c.strict = False
    modes.append(c.checks)
    y = torch.ones(2)
    c.all_reduce(y)
    return modes, kind, y[0].item()


def test_strict_set_after_construction_takes_effect(multi_world):
    for modes, kind, after in multi_world.run(_on_strict_set_later):
        assert modes == ["off", "strict", "off"]
        assert kind == "RemoteArgumentError"
        assert after == multi_world.size


@pytest.mark.parametrize(
    "first, others",
    [
        ("all_reduce", "all_gather_object"),
        ("broadcast", "broadcast_object_list"),
        ("all_reduce", "all_gather"),
        ("all_gather", "all_gather_object"),
        ("scatter", "all_gather"),
        ("all_to_all_single", "all_gather_object"),
        ("all_to_all_single", "scatter"),
    ],
)
@pytest.mark.parametrize("steady", [False, True], ids=["first-call", "steady"])
def test_ranks_in_different_protocols_all_raise_at_once(multi_world, first, others, steady):
    # the checked ranks must not start a second round the others never join
    for error, waited, after in multi_world.run(_on_different_protocols, first, others, steady):
        assert error == "RemoteArgumentError"
        assert waited < TIMEOUT / 2
        assert after == multi_world.size


_BAD_SCATTER_LISTS = {
    "too many": lambda x, n: [x] * (n + 1),
    "none": lambda x, n: None,
    "wrong shape": lambda x, n: [torch.ones(3)] * n,
    "wrong dtype": lambda x, n: [x.long()] * n,
}


def _bad_scatter_list(make: Callable[[torch.Tensor, int], Any], large: bool) -> Callable:
    def call(c: Communicator, bad: int) -> None:
        x = torch.ones(300_000 if large else 4)  # large: past the slot, the data-less check
        c.scatter(x, make(x, c.world_size) if bad else None, src=c.world_size - 1)

    return call


# arguments only one rank reads: what the last rank passes (bad=1), the others (bad=0)
_ONE_RANKS_MISTAKES: dict[str, Callable[[Communicator, int], object]] = {
    **{
        f"scatter list {name}, {'past' if large else 'in'} the slot": _bad_scatter_list(
            make, large
        )
        for name, make in _BAD_SCATTER_LISTS.items()
        for large in (False, True)
    },
    "all_to_all list length": lambda c, bad: c.all_to_all(
        [torch.empty(2) for _ in range(c.world_size + bad)],
        [torch.ones(2) for _ in range(c.world_size)],
    ),
    "all_to_all dtypes": lambda c, bad: c.all_to_all(
        [torch.empty(2) for _ in range(c.world_size)],
        [torch.ones(2, dtype=torch.int64 if bad else torch.float32) for _ in range(c.world_size)],
    ),
    "all_to_all_single splits": lambda c, bad: c.all_to_all_single(
        torch.empty(2 * c.world_size),
        torch.ones(2 * c.world_size),
        [2] * (c.world_size + bad),
        [2] * c.world_size,
    ),
    "all_to_all_single rows": lambda c, bad: c.all_to_all_single(
        torch.empty(c.world_size, 2 + bad), torch.ones(c.world_size, 2)
    ),
}


def _on_one_ranks_mistake(comm, case: str, strict: bool = True) -> tuple[str, str, float, float]:
    import time

    c = Communicator(timeout=TIMEOUT, strict=strict)
    started = time.monotonic()
    kind, text = "no error", ""
    last = c.rank == c.world_size - 1
    if strict or last:  # unchecked, the others would wait for the last rank
        try:
            _ONE_RANKS_MISTAKES[case](c, int(last))
        except (ValueError, TypeError) as exc:
            kind, text = type(exc).__name__, str(exc)
    waited = time.monotonic() - started
    y = torch.ones(2)
    c.all_reduce(y)  # the group goes on
    return kind, text, waited, y[0].item()


@pytest.mark.parametrize("case", list(_ONE_RANKS_MISTAKES))
def test_a_mistake_in_one_ranks_own_arguments_fails_every_rank_at_once(multi_world, case):
    n = multi_world.size
    for rank, (kind, text, waited, after) in enumerate(
        multi_world.run(_on_one_ranks_mistake, case)
    ):
        assert kind == "RemoteArgumentError", (rank, kind, text)
        assert f"rank {n - 1}: " in text and "refused" in text, text
        if case.startswith("scatter"):
            assert "scatter_list" in text, text
        assert waited < TIMEOUT / 2
        assert after == n


# arguments every rank reads, wrong on the last rank alone (bad=1): it used to raise
# alone, and its next call paired with the others' call (results silently mixed)
_ONE_RANK_ALONE: dict[str, Callable[[Communicator, int], object]] = {
    "all_reduce op": lambda c, bad: c.all_reduce(torch.ones(2), op="avg" if bad else "sum"),
    "broadcast src": lambda c, bad: c.broadcast(torch.ones(2), src=c.world_size + 5 * bad - 1),
    "reduce dst type": lambda c, bad: c.reduce(torch.ones(2), dst="0" if bad else 0),
    "all_reduce not a tensor": lambda c, bad: c.all_reduce([1.0] if bad else torch.ones(1)),
    "all_reduce timeout": lambda c, bad: c.all_reduce(torch.ones(2), timeout="x" if bad else 30),
    "all_gather_object timeout": lambda c, bad: c.all_gather_object(1, timeout=-1 if bad else 30),
    "broadcast_object src": lambda c, bad: c.broadcast_object(1, src=99 if bad else 0),
    "gather_object dst": lambda c, bad: c.gather_object(1, dst=-3 if bad else 0),
    # the ragged first round (all_gather is not checked by default), and helpers whose
    # own checks come before their first collective
    "all_gather not a tensor": lambda c, bad: c.all_gather([1.0] if bad else torch.ones(2)),
    "all_gather_shapes not a tensor": lambda c, bad: c.all_gather_shapes(
        3 if bad else torch.ones(2)
    ),
    "pad_to_largest_tensor 0-dim": lambda c, bad: helpers.pad_to_largest_tensor(
        c, torch.tensor(1.0) if bad else torch.ones(2)
    ),
    "all_reduce_dict float value": lambda c, bad: helpers.all_reduce_dict(
        c, {"loss": 1.0 if bad else torch.tensor(1.0)}
    ),
    "new_group duplicate ranks": lambda c, bad: c.new_group([0, 0] if bad else [0]),
    # mistakes in the call itself (the method's own TypeError): the collectives' wrappers
    # are written with each method's parameters, and pass these on to the method
    "all_reduce unknown keyword": lambda c, bad: c.all_reduce(
        torch.ones(2), **({"opp": "sum"} if bad else {})
    ),
    "broadcast one argument too many": lambda c, bad: c.broadcast(
        torch.ones(2), 0, *((False, None, 1) if bad else ())
    ),
    "all_gather_into_tensor missing tensor": lambda c, bad: c.all_gather_into_tensor(
        torch.ones(2 * c.world_size), *(() if bad else (torch.ones(2),))
    ),
    "functional broadcast src": lambda c, bad: commlib.broadcast(
        torch.ones(2), src=99 if bad else 0, group=c
    ),
    "functional gather_object dst": lambda c, bad: commlib.gather_object(
        1, dst=-1 if bad else 0, group=c
    ),
    "collect_results gpu tuple part": lambda c, bad: results.collect_results_gpu(
        c, (1,) if bad else [1], 2
    ),
    "collect_results cpu size": lambda c, bad: results.collect_results_cpu(
        c, [1], -1 if bad else 2
    ),
}


def _on_one_rank_alone(comm, case: str) -> tuple[str, str, float, list[float]]:
    import time

    c = Communicator(timeout=TIMEOUT)  # the default checks
    started = time.monotonic()
    kind, text = "no error", ""
    try:
        _ONE_RANK_ALONE[case](c, int(c.rank == c.world_size - 1))
    except (ValueError, TypeError) as exc:
        kind, text = type(exc).__name__, str(exc)
    waited = time.monotonic() - started
    y = torch.full((2,), float(c.rank))
    c.all_reduce(y)  # pairs with the others' all_reduce, not with anything earlier
    return kind, text, waited, y.tolist()


@pytest.mark.parametrize("case", list(_ONE_RANK_ALONE))
def test_a_mistake_only_one_rank_makes_reaches_every_rank(multi_world, case):
    n = multi_world.size
    for rank, (kind, text, waited, after) in enumerate(multi_world.run(_on_one_rank_alone, case)):
        assert kind == "RemoteArgumentError", (rank, kind, text)
        assert f"rank {n - 1}" in text, text
        assert waited < TIMEOUT / 2
        assert after == [float(sum(range(n)))] * 2


def test_unchecked_a_bad_scatter_list_is_refused_on_src_before_sending(world2):
    results = world2.run(_on_one_ranks_mistake, "scatter list too many, in the slot", False)
    assert results[0][0] == "no error"  # rank 0 did not call: nothing to wait for
    kind, text, _, after = results[1]
    assert kind == "ValueError" and "scatter_list on src needs 2 tensors" in text
    assert after == 2


def _a2a_input(w: int, r: int, chunk: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    # rank r's chunk for rank j holds r * 1000 + j * 100 + its index: each one traceable
    n = w * chunk[0]
    rows = torch.arange(n * max(1, int(torch.tensor(chunk[1:]).prod())), dtype=torch.float64)
    data = (rows % 97 + 100 * (rows // (rows.numel() // w)) + 1000 * r).to(dtype)
    return data.view(n, *chunk[1:])


def _riding_rounds(c: Communicator, dtype: torch.dtype, chunk: tuple[int, ...]) -> list[object]:
    """Rounds and results of a scatter and an even all_to_all_single of ``chunk``s."""
    w, r = c.world_size, c.rank
    out: list[object] = []
    pieces = [(_a2a_input(w, j, chunk, torch.float64)[: chunk[0]]).to(dtype) for j in range(w)]
    got = torch.zeros(chunk, dtype=dtype)
    before = c._engine.seq
    c.scatter(got, pieces if r == w - 1 else None, src=w - 1)
    out += [c._engine.seq - before, got]
    x = _a2a_input(w, r, chunk, dtype)
    mixed = torch.zeros(w * chunk[0], *chunk[1:], dtype=dtype)
    before = c._engine.seq
    c.all_to_all_single(mixed, x)
    out += [c._engine.seq - before, mixed]
    return out


# (dtype, chunk shape, what the slot holds): 4096-byte slots, one chunk per row
_RIDING = {
    "float32 in the slot": (torch.float32, (3, 5), "in"),
    "bool in the slot": (torch.bool, (7,), "in"),
    "bfloat16 in the slot": (torch.bfloat16, (2, 3), "in"),
    "complex128 in the slot": (torch.complex128, (4,), "in"),
    "float64 past the slot, learnt": (torch.float64, (1000,), "learnt"),
    "float32 past what a scatter learns": (torch.float32, (40_000,), "scatter past"),
    "uint8 past what goes apart": (torch.uint8, (600_000,), "past"),
}


def _fresh_checked_group(comm, shared: bool) -> Communicator:
    """A new checked group of the world (nothing learnt), its rounds shared or the engine's."""
    if not shared:  # the engine's rounds (on every rank: each turns it off)
        os.environ[_shared_rows.ENV] = "0"
    try:
        return Communicator(timeout=TIMEOUT).new_group(range(comm.world_size))
    finally:
        os.environ.pop(_shared_rows.ENV, None)


def _on_riding(comm, case: str, shared: bool) -> list[object]:
    dtype, chunk, _ = _RIDING[case]
    checked = _fresh_checked_group(comm, shared)
    assert (checked._engine.kept.get("shared") is not None) is shared or comm.world_size == 1
    unchecked = Communicator(timeout=TIMEOUT, strict=False).new_group(range(comm.world_size))
    first, again = _riding_rounds(checked, dtype, chunk), _riding_rounds(checked, dtype, chunk)
    want = _riding_rounds(unchecked, dtype, chunk)
    for got in (first, again):
        for part, expected in zip(got[1::2], want[1::2]):
            assert isinstance(part, torch.Tensor) and isinstance(expected, torch.Tensor)
            assert part.dtype == expected.dtype and torch.equal(part, expected), (part, expected)
    w, r = comm.world_size, comm.rank
    # what rank r got: the last rank's piece r, and chunk r of every rank
    assert torch.equal(want[1], _a2a_input(w, r, chunk, torch.float64)[: chunk[0]].to(dtype))
    every = [_a2a_input(w, j, chunk, dtype).view(w, *chunk)[r] for j in range(w)]
    assert torch.equal(want[3], torch.cat(every))
    return [first[0], first[2], again[0], again[2]]


_PAST = ["float32 past what a scatter learns", "uint8 past what goes apart"]


@pytest.mark.parametrize(
    ("case", "shared"),
    [(case, True) for case in _RIDING] + [(case, False) for case in _PAST],
    ids=[*_RIDING, *(f"{case}, on the engine" for case in _PAST)],
)
def test_scatter_and_all_to_all_single_parts_ride_in_the_check(world, case, shared):
    # each rank's part travels in the check's row that goes to it: one round when it
    # fits, the same bits as unchecked whatever the dtype and shape
    rounds = world.run(_on_riding, case, shared, timeout=120)
    where = _RIDING[case][2]
    if world.size == 1:  # nothing to check in a world of one
        return
    expected = {
        "in": [1, 1, 1, 1],
        # the check, then the engine's scatter; the slot learnt its size: the rest fit
        "learnt": [2, 1, 1, 1],
        # a scatter's other rows are padding: it learns only up to PAD_UP_TO (so the
        # all_to_all_single takes two rounds), an all_to_all_single up to its cap
        "scatter past": [2, 2, 1, 1],
        # world x slot past gloo's small_exchange_bytes: the rows would not go apart
        "past": [2, 2, 2, 2],
    }[where]
    if shared and where in ("scatter past", "past"):
        # through shared memory a scatter learns up to the segment's room and rows of
        # any size go apart: after the first scatter, everything rides
        expected = [2, 1, 1, 1]
    assert rounds == [expected] * world.size


# -- all_to_all's lists: parts of one shape ride in the check's rows ------------------
_LISTS = {
    "float32 in the slot": (torch.float32, (3, 5), [1, 1]),
    "float64 past the slot, learnt": (torch.float64, (1000,), [2, 1]),
    "uint8 past what goes apart": (torch.uint8, (600_000,), [2, 2]),
}


def _lists_rounds(c: Communicator, dtype: torch.dtype, chunk: tuple[int, ...]):
    w, r = c.world_size, c.rank
    ins = list(_a2a_input(w, r, chunk, dtype).view(w, *chunk).unbind(0))
    outs = [torch.zeros(chunk, dtype=dtype) for _ in range(w)]
    before = c._engine.seq
    c.all_to_all(outs, ins)
    return c._engine.seq - before, outs


def _on_lists(comm, case: str, shared: bool):
    dtype, chunk, _ = _LISTS[case]
    checked = _fresh_checked_group(comm, shared)
    unchecked = Communicator(timeout=TIMEOUT, strict=False).new_group(range(comm.world_size))
    (first, got), (again, got_again) = (_lists_rounds(checked, dtype, chunk) for _ in range(2))
    _, want = _lists_rounds(unchecked, dtype, chunk)
    for parts in (got, got_again):
        assert all(torch.equal(p, q) for p, q in zip(parts, want)), (parts, want)
    # what rank r got from rank j: j's part r
    w, r = comm.world_size, comm.rank
    every = [_a2a_input(w, j, chunk, dtype).view(w, *chunk)[r] for j in range(w)]
    assert all(torch.equal(p, q) for p, q in zip(want, every))
    return [first, again]


@pytest.mark.parametrize(
    ("case", "shared"),
    [(case, True) for case in _LISTS] + [("uint8 past what goes apart", False)],
    ids=[*_LISTS, "uint8 past what goes apart, on the engine"],
)
def test_all_to_all_lists_of_one_shape_ride_in_the_check(world, case, shared):
    rounds = world.run(_on_lists, case, shared, timeout=120)
    expected = _LISTS[case][2]
    if shared and case == "uint8 past what goes apart":
        # through shared memory the slot learns up to the segment's room (4 MiB a rank),
        # and rows of any size that fit it go apart
        expected = [2, 1]
    if world.size > 1:
        assert rounds == [expected] * world.size


def _on_lists_of_kinds(comm, kind: str):
    """A rank whose lists are of one shape meets ranks whose lists are not."""
    w, r = comm.world_size, comm.rank
    if kind == "pairs match":  # pairs with rank 0 hold 2 elements, the others 3
        size = [2 if 0 in (r, j) else 3 for j in range(w)]
        sends, expects = size, size
    elif kind == "one shape each, not the same":  # rank r sends and expects r + 1 each
        sends, expects = [r + 1] * w, [r + 1] * w
    else:  # "self pair": only the last rank's pair with itself disagrees
        sends = [2] * w
        expects = [2] * (w - 1) + [3 if r == w - 1 else 2]
    ins = [torch.full((n,), float(10 * r + j)) for j, n in enumerate(sends)]
    outs = [torch.zeros(n) for n in expects]
    try:
        comm.all_to_all(outs, ins)
    except RemoteArgumentError as exc:
        return "error", str(exc)
    return "ok", [t.tolist() for t in outs]


def test_all_to_all_lists_of_one_shape_meet_uneven_lists(multi_world):
    w = multi_world.size
    for r, (kind, got) in enumerate(multi_world.run(_on_lists_of_kinds, "pairs match")):
        assert kind == "ok", got
        assert got == [[float(10 * j + r)] * (2 if 0 in (r, j) else 3) for j in range(w)]
    for kind, text in multi_world.run(_on_lists_of_kinds, "one shape each, not the same"):
        assert kind == "error" and "sizes do not match" in text, text
    for kind, text in multi_world.run(_on_lists_of_kinds, "self pair"):
        assert kind == "error" and "sizes do not match" in text, text


def _on_none_meets_splits(comm, kind: str, strict: bool):
    """Rank 0 passes ``None`` splits (even); the others pass explicit ones (torch takes both)."""
    c = Communicator(timeout=TIMEOUT, strict=strict)
    w, r = c.world_size, c.rank
    if kind == "equal splits":  # every rank sends and expects 2 rows each way
        size = [2] * w
    elif kind == "pairs match":  # pairs with rank 0 hold 2 rows, the others 3
        size = [2 if 0 in (r, j) else 3 for j in range(w)]
    else:  # "pairs differ": the last rank expects 3 rows from rank 0, which sends 2
        size = [2 if 0 in (r, j) else 3 for j in range(w)]
    expects = list(size)
    if kind == "pairs differ" and r == w - 1:
        expects[0] = 3
    ins = torch.cat([torch.full((n, 2), float(10 * r + j)) for j, n in enumerate(size)])
    out = torch.zeros(sum(expects), 2)
    explicit = r != 0
    try:
        c.all_to_all_single(out, ins, expects if explicit else None, size if explicit else None)
    except RemoteArgumentError as exc:
        return "error", str(exc)
    return "ok", out[:, 0].tolist()


@pytest.mark.parametrize("strict", [None, True], ids=["default", "strict"])
def test_all_to_all_single_none_splits_meet_explicit_splits(multi_world, strict):
    w = multi_world.size
    for kind in ("equal splits", "pairs match"):
        got = multi_world.run(_on_none_meets_splits, kind, strict)
        for r, (status, values) in enumerate(got):
            assert status == "ok", (kind, values)
            want = [float(10 * j + r) for j in range(w) for _ in range(2 if 0 in (r, j) else 3)]
            assert values == (
                want
                if kind == "pairs match"
                else [float(10 * j + r) for j in range(w) for _ in range(2)]
            ), kind
    for status, text in multi_world.run(_on_none_meets_splits, "pairs differ", strict):
        assert status == "error" and "sizes do not match" in text, text


# -- all_to_all_single with uneven splits: the sizes ride with the chunks ----------------
# (dtype, rows of, the most rows a rank sends one rank, rounds of the first and second call)
_UNEVEN = {
    "float32 in the slot": (torch.float32, (), 7, [1, 1]),
    "int16 rows of (3,) in the slot": (torch.int16, (3,), 5, [1, 1]),
    "complex128 in the slot": (torch.complex128, (), 9, [1, 1]),
    "bool in the slot": (torch.bool, (2,), 11, [1, 1]),
    "float64 past the slot, learnt": (torch.float64, (), 700, [2, 1]),
    "uint8 past what goes apart": (torch.uint8, (), 600_000, [2, 2]),
}


def _uneven_sizes(w: int, r: int, j: int, most: int) -> int:
    # rows rank r sends rank j: odd, different for every pair, some none
    return (r * 7 + j * 3 + 1) % (most + 1) if (r + j) % 3 else most


def _uneven_call(c: Communicator, dtype: torch.dtype, rows_of: tuple[int, ...], most: int):
    w, r = c.world_size, c.rank
    sends = [_uneven_sizes(w, r, j, most) for j in range(w)]
    expects = [_uneven_sizes(w, j, r, most) for j in range(w)]
    n = sum(sends)
    values = torch.arange(n * max(1, math.prod(rows_of)), dtype=torch.float64) + 1000 * r
    x = (values % 251).to(dtype).view(n, *rows_of)
    out = torch.zeros(sum(expects), *rows_of, dtype=dtype)
    before = c._engine.seq
    c.all_to_all_single(out, x, expects, sends)
    return c._engine.seq - before, out


def _on_uneven(comm, case: str):
    dtype, rows_of, most, _ = _UNEVEN[case]
    w = comm.world_size
    checked = Communicator(timeout=TIMEOUT).new_group(range(w))  # nothing learnt
    unchecked = Communicator(timeout=TIMEOUT, strict=False).new_group(range(w))
    (first, got), (again, got_again) = (_uneven_call(checked, dtype, rows_of, most) for _ in "12")
    _, want = _uneven_call(unchecked, dtype, rows_of, most)
    assert got.dtype == want.dtype and torch.equal(got, want), (got, want)
    assert torch.equal(got_again, want)
    return [first, again]


@pytest.mark.parametrize("case", list(_UNEVEN))
def test_uneven_all_to_all_single_rides_with_its_sizes(world, case):
    # every rank's row carries its table of sizes and, when all fit, its chunk for
    # that row's rank: one round, the same bits as unchecked
    rounds = world.run(_on_uneven, case, timeout=120)
    if world.size > 1:
        assert rounds == [_UNEVEN[case][3]] * world.size


def _on_uneven_refusal(comm, kind: str):
    w, r = comm.world_size, comm.rank
    c = Communicator(timeout=TIMEOUT)
    sends = [1] * w
    if kind == "a rank declares another dtype":
        dtype = torch.float64 if r == w - 1 else torch.float32
    else:  # "rows of another shape": the same elements, rows of (2,) on the last rank
        dtype = torch.float32
    rows_of = (2,) if kind != "a rank declares another dtype" and r == w - 1 else (1,)
    x = torch.ones(sum(sends), *rows_of, dtype=dtype)
    try:
        c.all_to_all_single(torch.empty(w, *rows_of, dtype=dtype), x, sends, sends)
    except RemoteArgumentError as exc:
        error = str(exc)
    else:
        error = "no error"
    y = torch.ones(2)
    c.all_reduce(y)  # nothing broke
    return error, y[0].item()


@pytest.mark.parametrize("kind", ["a rank declares another dtype", "rows of another shape"])
def test_uneven_all_to_all_single_refuses_on_every_rank(multi_world, kind):
    for error, total in multi_world.run(_on_uneven_refusal, kind, timeout=120):
        assert "ranks passed different arguments" in error, error
        assert total == multi_world.size


def _uneven_lists_call(c: Communicator, dtype: torch.dtype, rows_of: tuple[int, ...], most: int):
    w, r = c.world_size, c.rank

    def size(i: int, j: int) -> int:  # rows rank i sends rank j: the most to itself alone
        return most if i == j else (i * 7 + j * 3 + 1) % most

    def made(n: int, j: int) -> torch.Tensor:
        values = torch.arange(n * max(1, math.prod(rows_of)), dtype=torch.float64)
        return ((values + 100 * j + 1000 * r) % 251).to(dtype).view(n, *rows_of)

    ins = [made(size(r, j), j) for j in range(w)]
    outs = [torch.zeros(size(j, r), *rows_of, dtype=dtype) for j in range(w)]
    before = c._engine.seq
    c.all_to_all(outs, ins)
    return c._engine.seq - before, outs


def _on_uneven_lists(comm, case: str):
    dtype, rows_of, most, _ = _UNEVEN[case]
    w = comm.world_size
    checked = Communicator(timeout=TIMEOUT).new_group(range(w))  # nothing learnt
    unchecked = Communicator(timeout=TIMEOUT, strict=False).new_group(range(w))
    calls = [_uneven_lists_call(checked, dtype, rows_of, most) for _ in "12"]
    _, want = _uneven_lists_call(unchecked, dtype, rows_of, most)
    for _, got in calls:
        for part, expected in zip(got, want):
            assert part.dtype == expected.dtype and torch.equal(part, expected), (part, expected)
    return [rounds for rounds, _ in calls]


@pytest.mark.parametrize("case", list(_UNEVEN))
def test_all_to_all_lists_of_several_shapes_ride_with_their_sizes(world, case):
    rounds = world.run(_on_uneven_lists, case, timeout=120)
    if world.size > 1:
        assert rounds == [_UNEVEN[case][3]] * world.size


def _on_whole(comm):
    """Parts ride whole where the slot is too large for its rows to go apart."""
    from commlib._rooms import rooms_of

    w, r = comm.world_size, comm.rank
    c = Communicator(timeout=TIMEOUT).new_group(range(w))
    c.all_reduce(torch.ones(300_000 // w))  # the slot learns 1.2 MB / w: world x slot > 1 MiB
    assert not c._engine.sends_slot_rows_apart(rooms_of(c._engine).slot_bytes(c.slot_size))
    rounds = []
    got = torch.zeros(5)
    before = c._engine.seq
    c.scatter(got, [torch.full((5,), 10.0 * j) for j in range(w)] if r == 0 else None, src=0)
    rounds.append(c._engine.seq - before)
    assert got.tolist() == [10.0 * r] * 5
    x = torch.arange(3 * w, dtype=torch.int64) + 100 * r
    out = torch.zeros(3 * w, dtype=torch.int64)
    before = c._engine.seq
    c.all_to_all_single(out, x)
    rounds.append(c._engine.seq - before)
    assert out.tolist() == [100 * j + 3 * r + i for j in range(w) for i in range(3)]
    outs = [torch.zeros(2) for _ in range(w)]
    before = c._engine.seq
    c.all_to_all(outs, [torch.full((2,), float(10 * r + j)) for j in range(w)])
    rounds.append(c._engine.seq - before)
    assert [t.tolist() for t in outs] == [[float(10 * j + r)] * 2 for j in range(w)]
    return rounds


def test_parts_ride_whole_where_rows_do_not_go_apart(multi_world):
    # every rank gets every rank's slot: a scatter's list and an all_to_all's parts
    # travel whole in the sender's slot, each rank taking its own: still one round
    assert multi_world.run(_on_whole, timeout=120) == [[1, 1, 1]] * multi_world.size


def _steady_call(c: Communicator, what: str, i: int, changed: bool) -> list[torch.Tensor]:
    """One call of ``what``, its data new each time; ``changed``: this rank's call differs.

    Each change keeps the byte count of the steady call where it can (a shape of
    the same elements, a dtype of the same size, another root or op), so only
    the description tells it apart from the round prepared for the steady one.
    """
    r, w = c.rank, c.world_size
    x = torch.arange(4.0) + 10 * r + i
    if what == "all_reduce shape":
        t = x.view(2, 2).clone() if changed else x.clone()
        c.all_reduce(t)
        return [t]
    if what == "all_reduce dtype":
        t = x.to(torch.int32) if changed else x.clone()
        c.all_reduce(t)
        return [t]
    if what == "all_reduce op":
        t = x.clone()
        c.all_reduce(t, op="max" if changed else "sum")
        return [t]
    if what == "all_reduce op, async":
        t = x.clone()
        handle = c.all_reduce(t, op="max" if changed else "sum", async_op=True)
        assert handle is not None and handle.wait()
        return [t]
    if what == "all_to_all_single shape, a timeout":  # the round without the lane
        inp = torch.cat([x + 100 * j for j in range(w)])
        out = torch.empty(4 * w)
        if changed:
            inp, out = inp.view(2 * w, 2), out.view(2 * w, 2)
        c.all_to_all_single(out, inp, timeout=TIMEOUT)
        return [out]
    if what == "broadcast src":
        t = x.clone()
        c.broadcast(t, src=(w - 1 if changed else 0) if r == w - 1 else 0)
        return [t]
    if what == "reduce dst":
        t = x.clone()
        c.reduce(t, dst=w - 1 if changed else 0)
        return [t]
    if what == "scatter shape":
        got = torch.empty(2, 2) if changed else torch.empty(4)
        parts = [x + 100 * j for j in range(w)] if r == 0 else None
        c.scatter(got, parts, src=0)
        return [got]
    if what == "all_gather_into_tensor dtype":
        t = x.to(torch.int32) if changed else x
        out = torch.empty(4 * w, dtype=t.dtype)
        c.all_gather_into_tensor(out, t)
        return [out]
    if what == "reduce_scatter shape":
        out = torch.empty(2, 2) if changed else torch.empty(4)
        chunks = torch.cat([x + j for j in range(w)])
        c.reduce_scatter(out, chunks.view(w * out.shape[0], *out.shape[1:]))
        return [out]
    if what == "all_to_all_single shape":
        inp = torch.cat([x + 100 * j for j in range(w)])
        out = torch.empty(4 * w)
        if changed:
            inp, out = inp.view(2 * w, 2), out.view(2 * w, 2)
        c.all_to_all_single(out, inp)
        return [out]
    if what == "all_to_all dtype":  # (a shape of as many elements matches pair by pair)
        dtype = torch.int32 if changed else torch.float32
        outs = [torch.empty(4, dtype=dtype) for _ in range(w)]
        c.all_to_all(outs, [(x + 100 * j).to(dtype) for j in range(w)])
        return outs
    raise AssertionError(what)


_STEADY = [
    "all_reduce shape",
    "all_reduce dtype",
    "all_reduce op",
    "all_reduce op, async",
    "all_to_all_single shape, a timeout",
    "broadcast src",
    "reduce dst",
    "scatter shape",
    "all_gather_into_tensor dtype",
    "reduce_scatter shape",
    "all_to_all_single shape",
    "all_to_all dtype",
]


def _on_steady_then_change(comm, what: str, strict: bool | None) -> tuple[int, str]:
    c = Communicator(timeout=TIMEOUT, strict=strict)
    plain = Communicator(timeout=TIMEOUT, strict=False)
    last = c.rank == c.world_size - 1
    for i in range(4):  # steady calls take the round prepared by the first: new data each time
        got = _steady_call(c, what, i, changed=False)
        want = _steady_call(plain, what, i, changed=False)
        assert all(torch.equal(g, v) for g, v in zip(got, want)), (i, got, want)
    try:  # one rank changes: the prepared round must not hide it
        _steady_call(c, what, 4, changed=last)
        error = ""
    except RemoteArgumentError as exc:
        error = str(exc)
    # and back: the steady kind again, right results (its round prepared anew or reused)
    for i in range(5, 7):
        got = _steady_call(c, what, i, changed=False)
        want = _steady_call(plain, what, i, changed=False)
        assert all(torch.equal(g, v) for g, v in zip(got, want)), (i, got, want)
    return c.world_size, error


@pytest.mark.parametrize("strict", [None, True], ids=["default", "strict"])
@pytest.mark.parametrize("what", _STEADY)
def test_a_prepared_round_is_not_taken_when_one_rank_changes(multi_world, what, strict):
    out = multi_world.run(_on_steady_then_change, what, strict, timeout=120)
    errors = [e for _, e in out]
    assert all(errors) and len(set(errors)) == 1, errors  # every rank raised, the same
    assert "ranks passed different arguments" in errors[0], errors[0]


def _on_slot_changes_under_a_steady_kind(comm) -> list[float]:
    c = Communicator(timeout=TIMEOUT).new_group(range(comm.world_size))
    plain = Communicator(timeout=TIMEOUT, strict=False)
    got = []
    for i in range(6):
        if i in (2, 4):  # the slot learns a large size, then (4) another: new slots
            c.all_reduce(torch.ones(20_000 * (i // 2)))
        t = torch.arange(8.0) + comm.rank + i
        want = t.clone()
        c.all_reduce(t)
        plain.all_reduce(want)
        assert torch.equal(t, want), (i, t, want)
        got.append(t[0].item())
    return got


def test_a_prepared_round_follows_the_slot_it_was_made_for(multi_world):
    # a round prepared on one slot is not taken on a slot learnt since (other buffers)
    w = multi_world.size
    want = [sum(r + i for r in range(w)) for i in range(6)]
    assert multi_world.run(_on_slot_changes_under_a_steady_kind) == [want] * w


def test_a_kept_view_follows_its_tensor_and_keeps_no_large_memory():
    import gc
    import weakref

    from commlib._guard import _KEEP_VIEWS_UP_TO, _Reshaped

    views = _Reshaped((2, 3))
    t = torch.arange(6.0)
    first = views.of(t)
    assert views.of(t) is first  # the same tensor: the view made for it
    other = torch.zeros(6)
    assert views.of(other).data_ptr() == other.data_ptr()  # another tensor: its own view
    t.set_(torch.ones(6).untyped_storage())  # the same tensor, other memory: a new view
    assert torch.equal(views.of(t), torch.ones(2, 3))
    big = torch.zeros(_KEEP_VIEWS_UP_TO // 4 + 2)[:6]  # a small view of large memory
    assert torch.equal(views.of(big), torch.zeros(2, 3))
    dropped = weakref.ref(big)
    del big
    gc.collect()
    assert dropped() is None  # not held by a kept view
    small = torch.zeros(6)
    views.of(small)
    kept = weakref.ref(small)
    del small
    gc.collect()
    assert kept() is not None  # a small one is (that is the point: the next call finds it)
