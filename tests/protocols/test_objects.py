"""Object collectives across real gloo ranks.

Exact round trips of generated objects (both large-payload transports, slots
small enough to force every path), failures every rank agrees on within the
first round, mmengine's return conventions, and the number of rounds.

Examples travel to the ranks and results back through the harness's pipe
encoded by the out-of-band serializer (plain pickle cannot carry float8 or
uint16 tensors); they are drawn and compared in the test process.
"""

from __future__ import annotations

import fractions

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import commlib
from commlib import Communicator
from commlib.errors import CommError, DeserializationError, RemoteArgumentError, RemoteError
from commlib.serialization import OutOfBandSerializer, RefusedClassError, RestrictedSerializer
from commlib.testing.strategies import assert_same, picklable_objects, same
from commlib_backends.gloo import GlooBackend

_CARRIER = OutOfBandSerializer()


def carry(obj):
    """``obj`` as plain bytes, for the harness's pipe."""
    header, buffers = _CARRIER.dumps(obj)
    return header, [b.cpu().numpy().tobytes() for b in buffers]


def uncarry(carried):
    header, blobs = carried
    buffers = [
        torch.frombuffer(bytearray(b), dtype=torch.uint8)
        if b
        else torch.empty(0, dtype=torch.uint8)
        for b in blobs
    ]
    return _CARRIER.loads(header, buffers)


class CollectiveGloo(GlooBackend):
    """gloo, moving large payloads with padded collectives instead of send/recv."""

    name = "gloo-collective-test"
    large_payload_transport = "collective"


class CountingGloo(GlooBackend):
    """gloo that records every engine call the object collectives make."""

    name = "gloo-counting-test"
    # the engine's own rounds, counted: not the shared-memory ones (test_shared_rows.py)
    shares_host_rounds = False

    def __init__(self):
        self.calls: list[str] = []

    def all_gather_into_tensor(self, output, tensor, group, async_op=False):
        self.calls.append("all_gather")
        return super().all_gather_into_tensor(output, tensor, group, async_op)

    def exchange(self, sends, recvs, group, async_op=False):
        self.calls.append("exchange")
        return super().exchange(sends, recvs, group, async_op)

    def broadcast(self, tensor, src, group, async_op=False):
        self.calls.append("broadcast")
        return super().broadcast(tensor, src, group, async_op)

    def gather(self, tensor, gather_list, dst, group, async_op=False):
        self.calls.append("gather")
        return super().gather(tensor, gather_list, dst, group, async_op)


@pytest.fixture(scope="session", params=[2, 3], ids=lambda n: f"world{n}")
def some_world(request):
    return request.getfixturevalue(f"world{request.param}")


# -- exact round trips -----------------------------------------------------------------
def _all_three(comm, carried, src, slot_size, transport):
    objs = uncarry(carried)
    backend = CollectiveGloo() if transport == "collective" else comm.plugin
    c = Communicator(backend=backend, slot_size=slot_size)
    me = c.rank
    gathered = c.all_gather_object(objs[me])
    at_dst = c.gather_object(objs[me], dst=src)
    box = list(objs) if me == src else [None] * len(objs)
    returned = c.broadcast_object_list(box, src=src)
    return carry({"all": gathered, "gather": at_dst, "bcast": box, "returned": returned})


@settings(
    max_examples=30,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(
    data=st.lists(picklable_objects(), min_size=3, max_size=3),
    src=st.integers(0, 2),
    slot_size=st.sampled_from([64, 512, 4096]),
    transport=st.sampled_from(["p2p", "collective"]),
)
def test_objects_round_trip_exactly(some_world, data, src, slot_size, transport):
    n = some_world.size
    objs, src = data[:n], src % n
    results = some_world.run(_all_three, carry(objs), src, slot_size, transport)
    for rank, carried in enumerate(results):
        got = uncarry(carried)
        assert_same(got["all"], objs)
        assert_same(got["gather"], objs if rank == src else None)
        assert_same(got["bcast"], objs)
        assert got["returned"] is None


# -- rounds --------------------------------------------------------------------------------
def _fresh(counting: CountingGloo) -> Communicator:
    """A communicator on a group of its own: a slot that has learnt nothing yet."""
    comm = Communicator(backend=counting).new_group(range(Communicator().world_size))
    counting.calls = []  # new_group's agreement on the ranks is not what is counted
    return comm


def _count_rounds(comm, payload_kind):
    counting = CountingGloo()
    c = _fresh(counting)
    obj = _expected(payload_kind, c.rank)
    rounds = {}
    out = c.all_gather_object(obj)
    rounds["all_gather_object"], counting.calls = counting.calls, []
    _fresh(counting).gather_object(obj, dst=c.world_size - 1)
    rounds["gather_object"], counting.calls = counting.calls, []
    _fresh(counting).broadcast_object_list([obj], src=0)
    rounds["broadcast_object_list"] = counting.calls
    ok = all(same(out[r], _expected(payload_kind, r)) for r in range(c.world_size))
    return rounds, ok


def _count_learnt_rounds(comm):
    counting = CountingGloo()
    rounds = {}
    calls = {
        "all_gather_object": lambda c, obj: c.all_gather_object(obj),
        "gather_object": lambda c, obj: c.gather_object(obj, dst=0),
        "broadcast_object_list": lambda c, obj: c.broadcast_object_list([obj], src=0),
    }
    for name, call in calls.items():
        for kind, n in (("16 KB", 4_000), ("400 KB", 100_000)):
            c = _fresh(counting)
            obj = {"rank": c.rank, "w": np.full(n, c.rank, dtype=np.float32)}
            for attempt in ("first", "second"):
                counting.calls = []
                call(c, obj)
                rounds[f"{name} {kind} {attempt}"] = len(counting.calls)
    return rounds


def test_the_first_round_learns_steady_sizes(world2):
    rounds = world2.run(_count_learnt_rounds)[0]
    assert rounds == {
        # the slot grows up to 128 KiB: it pads every later first round of the group
        "all_gather_object 16 KB first": 2,
        "all_gather_object 16 KB second": 1,
        "all_gather_object 400 KB first": 2,
        "all_gather_object 400 KB second": 2,
        "gather_object 16 KB first": 2,
        "gather_object 16 KB second": 1,
        "gather_object 400 KB first": 2,
        "gather_object 400 KB second": 2,
        "broadcast_object_list 16 KB first": 2,
        "broadcast_object_list 16 KB second": 1,
        "broadcast_object_list 400 KB first": 2,
        "broadcast_object_list 400 KB second": 2,
    }


def _expected(kind, rank):
    if kind == "small":
        return {"rank": rank, "loss": 0.5}
    if kind == "medium":  # 400 KB: round two below P2P_MIN
        return {"rank": rank, "w": np.full(100_000, rank, dtype=np.float32)}
    if kind == "large":  # 1.2 MB
        return {"rank": rank, "w": np.full(300_000, rank, dtype=np.float32)}
    # more buffers than the slot's table has room for: tiny ones, or 1.4 MB in all
    n = 600 if kind == "packed-large" else 2
    return [torch.full((n,), float(i + rank)) for i in range(600)]


# the one padded collective a world of two uses for a round two below P2P_MIN: gather_object
# to rank 1 has one sender, and one sender to every other rank is a broadcast
_COLLECTIVE = {
    "all_gather_object": "all_gather",
    "gather_object": "broadcast",
    "broadcast_object_list": "broadcast",
}


@pytest.mark.parametrize(
    "kind, expected",
    [
        ("small", ["all_gather"]),
        ("medium", ["all_gather", "collective"]),
        ("large", ["all_gather", "exchange"]),
        ("packed", ["all_gather", "collective", "collective"]),
        ("packed-large", ["all_gather", "exchange", "exchange"]),
    ],
)
def test_small_objects_take_one_round_large_ones_two(world2, kind, expected):
    # gloo's round two is send/recv from P2P_MIN up, one padded collective below it
    for rounds, ok in world2.run(_count_rounds, kind):
        assert ok
        assert rounds == {
            name: [_COLLECTIVE[name] if c == "collective" else c for c in expected]
            for name in rounds
        }


# -- failures every rank agrees on ------------------------------------------------------
class FailsToPickle:
    def __reduce__(self):
        raise ValueError("cannot pickle me on this rank")


def _bad_object(kind):
    if kind == "lambda":
        return {"f": lambda: 0}
    return {"x": FailsToPickle()}


def _fail(comm, bad_ranks, kind, collective):
    counting = CountingGloo()
    c = Communicator(backend=counting)
    obj = _bad_object(kind) if c.rank in bad_ranks else {"rank": c.rank, "w": np.ones(5000)}
    try:
        if collective == "all_gather_object":
            c.all_gather_object(obj)
        elif collective == "gather_object":
            c.gather_object(obj, dst=0)
        else:
            c.broadcast_object_list([obj, 1], src=bad_ranks[0])
    except CommError as exc:
        return type(exc).__name__, str(exc), exc.failures, counting.calls
    return None, "", {}, counting.calls


@pytest.mark.parametrize("collective", ["all_gather_object", "gather_object", "broadcast"])
@pytest.mark.parametrize("kind", ["lambda", "reduce_raises"])
def test_a_rank_that_fails_to_serialize_fails_every_rank_in_one_round(
    multi_world, kind, collective
):
    n = multi_world.size
    bad = [n - 1] if collective == "broadcast" else [1, n - 1]
    results = multi_world.run(_fail, sorted(set(bad)), kind, collective)
    first = results[0]
    assert first[0] == "RemoteError"
    assert sorted(first[2]) == sorted(set(bad))
    expected = "ValueError: cannot pickle me" if kind == "reduce_raises" else "lambda"
    assert all(expected in msg for msg in first[2].values())
    assert collective.split("_")[0] in first[1] and f"rank {n - 1}" in first[1]
    for name, message, failures, calls in results:
        assert (name, message, failures) == first[:3]
        assert calls == ["all_gather"]  # the first round, and nothing after it


def _bad_argument(comm, case):
    c = Communicator()
    me, n = c.rank, c.world_size
    try:
        if case == "dst_out_of_range_on_one_rank":
            c.gather_object(me, dst=n if me == 1 else 0)
        elif case == "not_a_list_on_one_rank":
            c.broadcast_object_list((1, 2) if me == n - 1 else [1, 2], src=0)
        elif case == "src_differs":
            c.broadcast_object_list([me], src=0 if me == 0 else 1)
        elif case == "lengths_differ":
            c.broadcast_object_list([None] * (2 if me == 0 else 3), src=0)
        elif case == "different_collectives":
            if me == 0:
                c.all_gather_object(me)
            else:
                c.gather_object(me, dst=0)
    except RemoteArgumentError as exc:
        return str(exc), exc.failures, isinstance(exc, ValueError), isinstance(exc, TypeError)
    return None


@pytest.mark.parametrize(
    "case, needle",
    [
        ("dst_out_of_range_on_one_rank", "rank 1: ValueError"),
        ("not_a_list_on_one_rank", "TypeError: broadcast_object_list needs a list"),
        ("src_differs", "disagree on the src/dst"),
        ("lengths_differ", "disagree on the list length"),
        ("different_collectives", "disagree on the collective"),
    ],
)
def test_wrong_arguments_on_some_ranks_raise_everywhere(multi_world, case, needle):
    results = multi_world.run(_bad_argument, case)
    assert results[0] is not None
    assert needle in results[0][0]
    assert all(r == results[0] for r in results)
    assert results[0][2] and results[0][3]  # a ValueError and a TypeError, as documented


def _load_failure(comm, large):
    c = Communicator(serializer=RestrictedSerializer())
    obj = {"rank": c.rank}
    if c.rank == 1:
        obj["odd"] = fractions.Fraction(1, 3)
    if large:
        obj["w"] = np.zeros(50_000)
    try:
        out = c.all_gather_object(obj)
    except DeserializationError as exc:
        # the refusal is also a RefusedClassError, as serialization.md promises
        assert isinstance(exc, RefusedClassError) and exc.qualname == "fractions.Fraction"
        assert (exc.rank, exc.sender) == (c.rank, 1)
        return "DeserializationError", str(exc)
    return "ok", len(out)


@pytest.mark.parametrize("large", [False, True], ids=["inline", "round_two"])
def test_a_receiver_that_cannot_load_names_the_sender(multi_world, large):
    results = multi_world.run(_load_failure, large)
    for rank, (status, detail) in enumerate(results):
        if rank == 1:  # its own entry is never reloaded
            assert (status, detail) == ("ok", multi_world.size)
        else:
            assert status == "DeserializationError"
            assert f"rank {rank} could not load the object sent by rank 1" in detail
            assert "fractions.Fraction" in detail


def _after_failure(comm):
    try:
        comm.all_gather_object(lambda: 0)
    except RemoteError:
        pass
    return comm.all_gather_object({"rank": comm.rank, "w": np.arange(comm.rank + 10_000)})


def test_the_group_works_after_an_agreed_failure(multi_world):
    for got in multi_world.run(_after_failure):
        expected = [{"rank": r, "w": np.arange(r + 10_000)} for r in range(multi_world.size)]
        assert_same(got, expected)


# -- mmengine return conventions ------------------------------------------------------------
def _conventions(comm):
    me, n = comm.rank, comm.world_size
    gathered = commlib.all_gather_object({"rank": me})
    at_last = commlib.gather_object(me, dst=n - 1)
    box = ["a", np.arange(3), None] if me == 0 else [None, None, None]
    same_list = box
    returned = commlib.broadcast_object_list(box, src=0)
    return gathered, at_last, returned, box, box is same_list


def test_return_conventions(multi_world):
    n = multi_world.size
    for rank, (gathered, at_last, returned, box, in_place) in enumerate(
        multi_world.run(_conventions)
    ):
        assert gathered == [{"rank": r} for r in range(n)]
        assert at_last == (list(range(n)) if rank == n - 1 else None)
        assert returned is None and in_place
        assert_same(box, ["a", np.arange(3), None])


def _received_big_array(comm):
    out = comm.all_gather_object({"w": np.full(1 << 20, comm.rank, dtype=np.float64)})
    peer = out[(comm.rank + 1) % comm.world_size]["w"]
    return bool(peer.flags.writeable), peer.ctypes.data % 16, float(peer.sum())


def test_received_arrays_are_writable_and_aligned(world2):
    for rank, (writable, misalign, total) in enumerate(world2.run(_received_big_array)):
        assert writable and misalign == 0
        assert total == float((rank + 1) % 2) * (1 << 20)
