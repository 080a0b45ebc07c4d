"""gather and all_gather's first round (commlib._ragged) across sequences of calls.

The round keeps what a call needs from call to call (the sent slot, the
header and views of each kind of call), and a call whose header every rank
sent alike skips reading them. These tests mix kinds of calls in one
communicator (equal shapes, then different ones, then equal again; refusals
and disagreements in between; a slot that grows and shrinks; dtypes of
every width), so a kept header or view that no longer fits would show as a
wrong result, a wrong error, or ranks taking different numbers of rounds.
They run on the session's gloo worlds of 1 to 4 ranks; which calls take the
engine's direct call (``Engine.direct``) is seen in one process on torch's
fake process group.
"""

from __future__ import annotations

import contextlib
from unittest import mock

import pytest
import torch

from commlib import Communicator
from commlib._rooms import SHRINK_AFTER, rooms_of
from commlib.errors import RemoteArgumentError


def _caught(fn, *args, **kwargs):
    try:
        fn(*args, **kwargs)
    except RemoteArgumentError as exc:
        return ("remote", str(exc))
    except (ValueError, TypeError) as exc:
        return (type(exc).__name__, str(exc))
    return None


def _mine(r: int, kind: str) -> torch.Tensor:
    """Rank ``r``'s tensor of each kind of call in the sequence."""
    if kind == "equal":
        return torch.arange(4.0) + 10 * r
    if kind == "ragged":
        return torch.full((r + 1, 2), float(r))
    if kind == "ragged_inner":  # the same ndim, a different last dim
        return torch.full((2, r + 1), r, dtype=torch.int64)
    if kind == "scalar":
        return torch.tensor(r, dtype=torch.int32)
    if kind == "bool":
        return torch.tensor([r % 2 == 0, True, False])
    if kind == "bf16":
        return torch.full((3, 5), r + 0.5, dtype=torch.bfloat16)
    if kind == "complex":
        return torch.tensor([complex(r, -r), complex(1, r)], dtype=torch.complex128)
    if kind == "large":  # past the communicator's slot: a second round, then learnt
        return torch.full((600, 3), float(r))
    if kind == "empty":
        return torch.zeros((0, 3))
    raise AssertionError(kind)


_SEQUENCE = [
    "equal", "equal", "ragged", "equal", "ragged_inner", "scalar", "equal", "bool",
    "ragged", "bf16", "complex", "equal", "empty", "ragged", "large", "large", "equal",
    "ragged",
]  # fmt: skip


def _on_sequence(comm: Communicator, strict: bool | None):
    comm = Communicator(comm.group, strict=strict)
    r, n = comm.rank, comm.world_size
    engine = comm._engine
    out: dict = {"rounds": [], "gather": [], "all_gather": [], "errors": {}}

    def rounds(fn, *args, **kwargs):
        before = engine.seq
        got = fn(*args, **kwargs)
        out["rounds"].append(engine.seq - before)
        return got

    def seen(tensors):
        # no result holds the round's slots: its storage is at most twice the data's
        held = max(
            (t.untyped_storage().nbytes() / (n * max(t.nbytes, 1)) for t in tensors), default=0
        )
        out["held"] = max(out.get("held", 0), held)
        return [(str(t.dtype), tuple(t.shape), t.tolist()) for t in tensors]

    for step, kind in enumerate(_SEQUENCE):
        dst = step % n
        out["gather"].append(seen(rounds(comm.gather, _mine(r, kind), dst=dst)))
        out["all_gather"].append(seen(rounds(comm.all_gather, _mine(r, kind))))
        if step == 3:  # only rank 0 passes a wrong argument: every rank raises
            bad = "not a tensor" if r == 0 else _mine(r, "equal")
            out["errors"]["refused"] = _caught(comm.gather, bad, dst=0)
        if step == 6:  # every rank names its own dst
            out["errors"]["dst"] = _caught(comm.gather, _mine(r, "equal"), dst=r)
        if step == 8:  # rank 1 passes another dtype
            odd = _mine(r, "equal").to(torch.float64 if r == 1 else torch.float32)
            out["errors"]["dtype"] = _caught(comm.all_gather, odd)
    # a steady loop of small calls after the large ones: the slot shrinks back
    for _ in range(10):
        out["gather"].append(seen(rounds(comm.gather, _mine(r, "equal"), dst=0)))
    # every rank's own list of shapes, each its own to change
    shapes = comm.all_gather_shapes(_mine(r, "equal"))
    shapes[0].append(99)
    out["shapes"] = shapes
    # adapt_empty: rank 0's placeholder takes the dtype and dims of the ranks with data
    holder = torch.zeros(0) if r == 0 else torch.arange(r * 2, dtype=torch.int64).view(r, 2)
    out["adapted"] = seen(comm.all_gather(holder, adapt_empty=True))
    return out


def _expected_gather(kind: str, n: int) -> list:
    return [(str(t.dtype), tuple(t.shape), t.tolist()) for t in (_mine(q, kind) for q in range(n))]


@pytest.mark.parametrize("strict", [None, False, True], ids=["default", "unchecked", "strict"])
def test_mixed_sequence_of_gathers(world, strict):
    n = world.size
    results = world.run(_on_sequence, strict)
    for r, got in enumerate(results):
        for step, kind in enumerate(_SEQUENCE):
            want = _expected_gather(kind, n)
            assert got["gather"][step] == (want if r == step % n else []), (r, step, kind)
            assert got["all_gather"][step] == want, (r, step, kind)
        for extra in got["gather"][len(_SEQUENCE) :]:
            assert extra == (_expected_gather("equal", n) if r == 0 else [])
        assert got["held"] <= 2, got["held"]
        assert got["shapes"] == [[4, 99]] + [[4]] * (n - 1)
        want_adapted = [("torch.int64", (0, 2), [])] + [
            ("torch.int64", (q, 2), torch.arange(q * 2).view(q, 2).tolist()) for q in range(1, n)
        ]
        assert got["adapted"] == (want_adapted if n > 1 else [("torch.float32", (0,), [])])
        errors = got["errors"]
        if n == 1:
            assert errors["refused"][0] == "TypeError"
            assert errors["dst"] is None and errors["dtype"] is None
            continue
        assert errors["refused"][0] == "remote" and "rank 0 refused" in errors["refused"][1]
        assert errors["dst"][0] == "remote" and "dst=1" in errors["dst"][1]
        assert errors["dtype"][0] == "remote" and "torch.float64" in errors["dtype"][1]
    # the number of engine calls is the same on every rank, call by call
    assert all(got["rounds"] == results[0]["rounds"] for got in results)
    if n > 1:
        rounds = results[0]["rounds"]
        per_kind = dict(zip(_SEQUENCE, zip(rounds[0::2], rounds[1::2])))
        # the data came with the shapes; the round is all_gather's check in strict mode too
        assert per_kind["equal"] == (1, 1)
        large = _SEQUENCE.index("large")
        # the first large call takes a second round; the slot learns it, the next does not
        assert rounds[2 * large] == 2 and rounds[2 * large + 2] == 1


def _on_all_to_all_forms(comm: Communicator):
    r, n = comm.rank, comm.world_size

    def sent(j: int) -> torch.Tensor:
        return torch.arange(4.0).view(2, 2) + 10.0 * r + j

    out = {}
    # a tuple, plain tensors: the engine takes them as they are
    outs = tuple(torch.empty(2, 2) for _ in range(n))
    comm.all_to_all(outs, tuple(sent(j) for j in range(n)))
    out["tuple"] = [t.tolist() for t in outs]
    # outputs that are not contiguous, inputs that require grad: adapted one by one
    bases = [torch.zeros(2, 2) for _ in range(n)]
    strided = [b.t() for b in bases]
    grads = [sent(j).requires_grad_() for j in range(n)]
    comm.all_to_all(strided, grads)
    out["adapted"] = [t.tolist() for t in strided]
    out["mixed"] = _caught(
        comm.all_to_all,
        [torch.empty(2, 2) for _ in range(n)],
        [sent(j).to(torch.float64 if j == 0 else torch.float32) for j in range(n)],
    )
    return out


def test_all_to_all_lists_as_they_are_and_adapted(world):
    n = world.size
    for r, got in enumerate(world.run(_on_all_to_all_forms)):
        want = [(torch.arange(4.0).view(2, 2) + 10.0 * q + r).tolist() for q in range(n)]
        assert got["tuple"] == want
        assert got["adapted"] == want  # written through the transposed views
        assert got["mixed"][0] in ("TypeError", "remote")
        assert "one dtype" in got["mixed"][1]


def _on_large_slot(comm: Communicator):
    # past the all_to_all's sizes, the learnt slot's round is the engine's own gather
    r = comm.rank
    mine = torch.full((150_000,), float(r))  # 600 KB: learnt at 2 ranks (1 MiB a rank)
    got, rounds = [], []
    for _ in range(3):
        before = comm._engine.seq
        got.append([t[::50_000].tolist() for t in comm.all_gather(mine)])
        rounds.append(comm._engine.seq - before)
    lanes = [k for k, lane in comm._engine.lanes.items() if k[0] == "all_gather_slots" and lane]
    return got, rounds, bool(lanes), comm.all_gather(torch.ones(2) * r, timeout=30)[-1].tolist()


def test_a_large_learnt_slot_is_gathered_directly(world2):
    for got, rounds, lane, timed in world2.run(_on_large_slot):
        assert got == [[[float(q)] * 3 for q in range(2)]] * 3
        assert rounds == [2, 1, 1] and lane
        assert timed == [1.0, 1.0]


def _on_gather_sizes(comm: Communicator):
    # a gather's data only dst keeps: the slot learns it up to _rooms.PAD_UP_TO alone, or
    # where the group's rounds go through shared memory (a large slot pads nothing) as an
    # all_gather's, up to the segment's room
    r = comm.rank
    out = {}
    for label, n in (("64K", 16_000), ("600K", 150_000)):
        for _ in range(SHRINK_AFTER):  # back to the communicator's slot
            comm.gather(torch.ones(1), 0)
        rounds, got = [], []
        for _ in range(3):
            before = comm._engine.seq
            parts = comm.gather(torch.full((n,), float(r)), 0)
            rounds.append(comm._engine.seq - before)
            got.append([float(t[-1]) for t in parts])
        out[label] = (rounds, got, rooms_of(comm._engine).learnt)
    return out, comm._engine.kept.get("shared") is not None


def test_a_gather_teaches_the_slot_what_a_broadcast_does_or_through_shared_memory_all(world2):
    for r, (got, shared) in enumerate(world2.run(_on_gather_sizes)):
        want = [[0.0, 1.0]] * 3 if r == 0 else [[]] * 3
        rounds, parts, learnt = got["64K"]
        assert parts == want and rounds == [2, 1, 1] and learnt >= 64_000
        rounds, parts, learnt = got["600K"]
        if shared:
            assert parts == want and rounds == [2, 1, 1] and learnt >= 600_000
        else:
            assert parts == want and rounds == [2, 2, 2] and learnt < 1024


def _on_kept_results(comm: Communicator):
    # results kept from call to call: the round's landing buffer is reused only where
    # no result refers to it (compact copies, shapes alone), never under a kept view
    r = comm.rank
    kept = []
    for step in range(4):
        for n in (4, 600, 0):  # a copy of the slot; a view of it (2.4 KB of 4 KB); empty
            kept.append(comm.all_gather(torch.full((n,), float(10 * step + r))))
            kept.append(comm.gather(torch.full((n,), float(10 * step + r)), 0))
    return [[[*t.tolist()[:1], t.numel()] for t in parts] for parts in kept]


def test_results_kept_across_calls_keep_their_values(world):
    n = world.size
    for r, got in enumerate(world.run(_on_kept_results)):
        want = []
        for step in range(4):
            for size in (4, 600, 0):
                every = [[*([10.0 * step + q] if size else []), size] for q in range(n)]
                want += [every, every if r == 0 else []]
        assert got == want


# -- one process, torch's fake process group: which calls take the direct call ----------


@contextlib.contextmanager
def _counted(engine):
    with mock.patch.object(engine, "direct", wraps=engine.direct) as direct:
        yield direct


def _fake_fills_all_to_all(comm) -> bool:
    """Whether torch's fake group fills all_to_all's outputs (2.13 on; 2.12's leaves them)."""
    import torch.distributed as tdist

    outs, single = [torch.zeros(1) for _ in range(8)], torch.zeros(8)
    tdist.all_to_all(outs, [torch.ones(1)] * 8, group=comm.group)
    tdist.all_to_all_single(single, torch.ones(8), group=comm.group)
    return bool(outs[0].item() == 1 and single[0].item() == 1)


def test_the_rounds_and_all_to_all_take_the_direct_call(fake8):
    comm, engine = fake8, fake8._engine
    fills = _fake_fills_all_to_all(comm)
    x = torch.arange(4.0)
    ins = [torch.full((2,), float(j)) for j in range(8)]
    with _counted(engine) as direct:
        for _ in range(2):
            # the fake group copies this rank's input into every output
            assert [t.tolist() for t in comm.gather(x, 0)] == [x.tolist()] * 8
            assert [t.tolist() for t in comm.all_gather(x)] == [x.tolist()] * 8
            outs = [torch.empty(2) for _ in range(8)]
            comm.all_to_all(outs, tuple(ins))
            assert not fills or [t.tolist() for t in outs] == [t.tolist() for t in ins]
        assert direct.call_count == 6
        assert {k[0] for k, lane in engine.lanes.items() if lane} >= {
            "all_gather_slots",
            "all_to_all",
        }


def test_what_the_direct_call_does_not_take(fake8):
    comm, engine = fake8, fake8._engine
    x = torch.arange(4.0)
    comm.all_gather(x)
    comm.all_to_all([torch.empty(2) for _ in range(8)], [torch.ones(2) for _ in range(8)])
    with _counted(engine) as direct:
        comm.all_gather(x, timeout=5)
        comm.gather(x, 0, timeout=5)
        outs = [torch.empty(2) for _ in range(8)]
        comm.all_to_all(outs, [torch.ones(2) for _ in range(8)], timeout=5)
        comm.all_to_all(outs, [torch.ones(2) for _ in range(8)], async_op=True).wait()
        # shapes that differ: the plugin's own path (one all_to_all_single)
        uneven = [torch.empty(j + 1) for j in range(8)]
        comm.all_to_all(uneven, [torch.full((j + 1,), 2.0) for j in range(8)])
        assert direct.call_count == 0
    if _fake_fills_all_to_all(comm):  # what was sent, where torch's fake group sends at all
        assert [t.tolist() for t in uneven] == [[2.0] * (j + 1) for j in range(8)]


# -- a steady kind of call: its prepared round (commlib._ragged.steady) -------------------


def _on_steady_then_changed(comm: Communicator, length: int = 3):
    # every rank prepares the round of a steady kind; then one rank alone changes its
    # shape, its dtype, or refuses: the ranks still in the prepared round find out from
    # the headers and end the call as the whole way would
    comm = Communicator(comm.group, strict=False)
    r, n = comm.rank, comm.world_size
    last = n - 1
    out: dict = {}

    def equal(step: int) -> torch.Tensor:
        return torch.arange(float(length)) + 10 * r + 100 * step

    def listed(tensors):
        return [t.tolist() for t in tensors]

    engine = comm._engine
    for step in range(3):
        before = engine.seq
        out.setdefault("steady", []).append(
            (listed(comm.all_gather(equal(step))), listed(comm.gather(equal(step), dst=0)))
        )
        out.setdefault("rounds", []).append(engine.seq - before)
    # both kinds prepared (the engine's own exchange of the rows, every size here)
    out["prepared"] = len(engine.kept["ragged"].steady)
    longer = torch.arange(length + 2.0) + 10 * r if r == last else equal(0)
    out["uneven"] = (listed(comm.all_gather(longer)), listed(comm.gather(longer, dst=0)))
    comm.all_gather(equal(0))
    comm.gather(equal(0), dst=0)
    odd = equal(0).double() if r == last else equal(0)
    out["dtype"] = (_caught(comm.all_gather, odd), _caught(comm.gather, odd, dst=0))
    comm.gather(equal(0), dst=0)
    out["refused"] = _caught(comm.gather, "not a tensor" if r == 0 else equal(0), dst=0)
    comm.gather(equal(0), dst=0)
    out["dst"] = _caught(comm.gather, equal(0), dst=last if r == last else 0)
    # after each of them the kind is steady again, its own entry the caller's tensor
    mine = equal(7).requires_grad_()
    got = comm.all_gather(mine)
    got = comm.all_gather(mine)
    out["own"] = got[r] is mine
    sum(t.sum() for t in got).backward()
    out["grad"] = mine.grad.tolist()
    out["after"] = listed(got), listed(comm.gather(equal(7), dst=last))
    comm.slot_size = 8192  # another slot: the prepared round is not this call's
    out["slot"] = listed(comm.all_gather(equal(8)))
    return out


# 3 elements: small against the slot; 900 (3600 of the slot's 3808 bytes): both with the
# prepared round's buffer kept and the results copied out; 32768 (128 KiB, what a
# gather's slot learns at most, a header more than the rows written for every rank
# before): each call gathers into a buffer of its own, its results views of it
@pytest.mark.parametrize("length", [3, 900, 32768])
def test_a_steady_kind_meets_a_rank_that_changed(world, length):
    n = world.size

    def seq(size: int, q: int, plus: int) -> list[float]:
        return (torch.arange(float(size)) + 10 * q + plus).tolist()

    for r, got in enumerate(world.run(_on_steady_then_changed, length)):
        for step, (gathered, to_zero) in enumerate(got["steady"]):
            every = [seq(length, q, 100 * step) for q in range(n)]
            assert gathered == every and to_zero == (every if r == 0 else [])
        # learnt from the first call (in one round from the second), all_gather and
        # gather one round each
        assert got["rounds"][1:] == [2, 2]
        assert got["prepared"] == (2 if n > 1 else 0)
        uneven = [seq(length + 2 if q == n - 1 else length, q, 0) for q in range(n)]
        assert got["uneven"] == (uneven, uneven if r == 0 else [])
        after = [seq(length, q, 700) for q in range(n)]
        assert got["after"] == (after, after if r == n - 1 else [])
        assert got["own"] and got["grad"] == [1.0] * length
        assert got["slot"] == [seq(length, q, 800) for q in range(n)]
        if n == 1:
            assert got["dtype"] == (None, None) and got["dst"] is None
            assert got["refused"][0] == "TypeError"
            continue
        for caught in got["dtype"]:
            assert caught[0] == "remote" and "torch.float64" in caught[1]
        assert got["refused"][0] == "remote" and "rank 0 refused" in got["refused"][1]
        assert got["dst"][0] == "remote" and f"dst={n - 1}" in got["dst"][1]


def _on_large_tensors_of_every_layout(comm: Communicator):
    # tensors whose copy into the slot goes through numpy (commlib._host_copy, past
    # torch's grain): non-contiguous rows, bfloat16, a tensor that requires grad; each
    # called three times (the slot learnt, the round prepared, then taken)
    comm = Communicator(comm.group, strict=False)
    r = comm.rank
    wide = (torch.arange(2 * 40_000.0) + r).view(2, 40_000)
    tensors = {
        "rows": wide[:, :20_000],  # the last dim contiguous, the rows 40000 apart
        "bf16": torch.full((40_000,), r + 0.5, dtype=torch.bfloat16),
        "grad": torch.full((40_000,), float(r), requires_grad=True),
    }
    out = {}
    for name, t in tensors.items():
        for _ in range(3):
            got = comm.all_gather(t)
            parts = comm.gather(t, dst=0)
        out[name] = (
            [g.detach().double().sum().item() for g in got],
            [p.double().sum().item() for p in parts],
            got[r] is t,
        )
    return out


def test_large_tensors_of_every_layout(world):
    n = world.size
    sums = {
        "rows": [sum(range(q, 20_000 + q)) + sum(range(40_000 + q, 60_000 + q)) for q in range(n)],
        "bf16": [40_000 * (q + 0.5) for q in range(n)],
        "grad": [40_000.0 * q for q in range(n)],
    }
    for r, got in enumerate(world.run(_on_large_tensors_of_every_layout)):
        for name, (gathered, to_zero, own) in got.items():
            assert gathered == sums[name] and own
            assert to_zero == (sums[name] if r == 0 else [])


def _on_large_kinds_in_turn(comm: Communicator):
    # gathers of three large kinds in turn (two shapes to rank 0, one to the last rank),
    # each prepared: a rank that is not a kind's dst lands every kind's round in one
    # buffer it keeps, dst gathers into one of its own each call
    comm = Communicator(comm.group, strict=False)
    r, n, engine = comm.rank, comm.world_size, comm._engine
    kinds = [(32768, 0), (30000, 0), (32768, n - 1)]
    got, rounds = [], []
    for step in range(4):
        for length, dst in kinds:
            before = engine.seq
            parts = comm.gather(torch.arange(float(length)) + 10 * r + 100 * step, dst=dst)
            rounds.append(engine.seq - before)
            got.append([(len(t), t[0].item(), t[-1].item()) for t in parts])
    return got, rounds


def test_large_gathers_of_several_kinds_in_turn(world):
    n = world.size
    kinds = [(32768, 0), (30000, 0), (32768, n - 1)]
    for r, (got, rounds) in enumerate(world.run(_on_large_kinds_in_turn)):
        calls = iter(got)
        for step in range(4):
            for length, dst in kinds:
                plus = 100 * step
                every = [(length, 10.0 * q + plus, length - 1 + 10.0 * q + plus) for q in range(n)]
                assert next(calls) == (every if r == dst else [])
        # the first call of the first kind learns the slot; one round each after it
        assert rounds[1:] == [1] * (len(rounds) - 1)


@pytest.mark.parametrize("strict", [False, True], ids=["unchecked", "strict"])
def test_a_steady_kind_takes_its_prepared_round(fake8, strict):
    from commlib import _ragged

    comm, engine = fake8, fake8._engine
    comm.strict = strict  # the gathering round is the check: strict mode takes it alike
    x = torch.arange(4.0)
    comm.all_gather(x)
    comm.gather(x, 0)
    with (
        _counted(engine) as direct,
        mock.patch.object(_ragged, "exchange", wraps=_ragged.exchange) as whole,
    ):
        for _ in range(3):
            got = comm.all_gather(x)
            assert got[0] is x and [t.tolist() for t in got[1:]] == [x.tolist()] * 7
            # results are copies: none holds the round's buffer, kept for the next call
            assert all(t.untyped_storage().nbytes() == 8 * x.nbytes for t in got[1:])
            assert [t.tolist() for t in comm.gather(x, 0)] == [x.tolist()] * 8
        assert direct.call_count == 6 and whole.call_count == 0
        comm.all_gather(x, timeout=5)  # a timeout of its own: the whole way
        comm.all_gather(x.to(torch.float64))  # a kind not seen yet: the whole way
        assert whole.call_count == 2


def test_a_steady_kind_of_large_slots_gathers_into_a_buffer_of_its_own(fake8):
    # data that fills a learnt slot of 80 KiB (640 KiB gathered): a prepared round too,
    # but each call's results are views of a buffer of its own (no copy out), so a later
    # call leaves them as they were
    from commlib import _ragged

    comm, engine = fake8, fake8._engine
    if not _fake_fills_all_to_all(comm):
        pytest.skip("this torch's fake group sends nothing back: no headers to compare")
    x = torch.arange(20_000.0)
    comm.all_gather(x)  # learns the slot (two rounds)
    comm.all_gather(x)
    comm.gather(x, 0)
    kept = []
    with (
        _counted(engine) as direct,
        mock.patch.object(_ragged, "exchange", wraps=_ragged.exchange) as whole,
    ):
        for step in range(3):
            mine = x + step
            got = comm.all_gather(mine)
            assert got[0] is mine and [t.tolist() for t in got[1:]] == [mine.tolist()] * 7
            parts = comm.gather(mine * 2, 0)
            assert [t.tolist() for t in parts] == [(mine * 2).tolist()] * 8
            kept.append((got[1], parts[1]))
            # views of the round's buffer (every rank's header in it too), not copies
            assert got[1].untyped_storage().nbytes() > 8 * mine.nbytes
        assert direct.call_count == 6 and whole.call_count == 0
    for step, (gathered, to_zero) in enumerate(kept):
        assert gathered.tolist() == (x + step).tolist()
        assert to_zero.tolist() == ((x + step) * 2).tolist()
    buffers = {t.untyped_storage().data_ptr() for pair in kept for t in pair}
    assert len(buffers) == 6


def test_on_a_device_the_data_goes_into_the_row_there(fake8):
    # an engine off the CPU (its "device" memory host memory here): the sent row lives
    # on the device, made once per kind with its header; a call copies its data into it
    # there (no copy through the host slot) and reads only the headers back
    from commlib._ragged import _slots

    comm, engine = fake8, fake8._engine
    x = torch.arange(4.0)
    with mock.patch.object(engine, "on_cpu", False):
        for _ in range(3):
            got = comm.all_gather(x)
            assert got[0] is x and [t.tolist() for t in got] == [x.tolist()] * 8
            assert [t.tolist() for t in comm.gather(x * 2, 0)] == [(x * 2).tolist()] * 8
        slots = engine.kept["ragged"]
        assert slots is _slots(engine, slots.sent.size)
        assert len(slots.device_rows) == 2 and not any(slots.sent.raw)  # the host slot unused
        row, area = next(iter(slots.device_rows.values()))
        assert area is not None and area.data_ptr() == row.data_ptr() + 288
        with _counted(engine) as direct:  # the round: the engine's own all_gather
            comm.all_gather(x)
            comm.gather(x, 0)
            assert direct.call_count == 2
        # a list all_to_all of plain tensors on the device takes its lane
        comm.all_to_all([torch.empty(2) for _ in range(8)], [torch.ones(2)] * 8)
        with _counted(engine) as direct:
            comm.all_to_all([torch.empty(2) for _ in range(8)], [torch.ones(2)] * 8)
            assert direct.call_count == 1


def test_a_steady_kind_copies_any_layout_of_its_data_exactly(fake8):
    # a steady kind's data goes into the slot as plain memory where it is contiguous
    # real data; a transposed tensor, a lazily negated or conjugated one, a tensor
    # that requires grad travel with their values as they read (copy_ resolves them)
    from commlib import _ragged

    comm = fake8
    plain = torch.arange(6.0).reshape(2, 3)
    waves = plain * (1 + 1j)
    cases = [
        ("contiguous", plain + 1, 1),
        ("transposed", torch.arange(6.0).reshape(3, 2).t(), 0),
        ("negated", torch._neg_view(plain + 2), 0),
        ("requires_grad", (plain + 3).requires_grad_(), 1),
        ("conjugated", waves.conj(), 0),
        ("complex", waves, 0),
    ]
    for name, x, copies in cases:
        for _ in range(2):  # each kind learnt (the slot's room too), then steady
            comm.all_gather(x)
            comm.gather(x, 0)
        with (
            mock.patch.object(_ragged, "copy_bytes", wraps=_ragged.copy_bytes) as plain_copies,
            mock.patch.object(_ragged, "exchange", wraps=_ragged.exchange) as whole,
        ):
            expected = x.detach().resolve_conj().resolve_neg().tolist()
            got = comm.all_gather(x)
            assert [t.tolist() for t in got[1:]] == [expected] * 7, name
            assert [t.tolist() for t in comm.gather(x, 0)] == [expected] * 8, name
            assert whole.call_count == 0, name  # each took its kind's prepared round
            assert plain_copies.call_count == 2 * copies, name
