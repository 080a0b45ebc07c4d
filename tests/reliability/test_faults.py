"""Injected faults: every surviving rank raises a clear error in time; nothing hangs.

A test whose fault leaves a process group unusable starts its own world;
those whose ranks agree on a :class:`RemoteArgumentError` run on the session's
worlds and check that they leave them usable. Communicators have a short
timeout. The seconds each rank took to raise are
printed (``pytest -s``) for the reliability report; they are not asserted.
"""

from __future__ import annotations

import os
import re
import signal
import threading

import numpy as np
import pytest
import torch

import commlib as dist
from commlib import Communicator
from commlib.errors import CommError, CommTimeoutError, RemoteArgumentError
from commlib.testing import RankDied, World

# slow: faults that break a group start a world of their own
pytestmark = pytest.mark.slow

TIMEOUT = 3.0


# an even and an odd size: the faults that break a group pay for a world each (the
# ones on the session's worlds, which cost nothing to start, run at 2, 3 and 4)
@pytest.fixture(params=[2, 3], ids=lambda n: f"world{n}")
def fresh_world(request):
    world = World(request.param, timeout=60, pg_timeout=20).start()
    yield world
    world.kill()


def _on_sum(comm) -> float:
    x = torch.ones(1)
    Communicator(timeout=TIMEOUT).all_reduce(x)
    return x.item()


def _still_usable(world) -> None:
    assert world.run(_on_sum) == [float(world.size)] * world.size


def _report(name, outcomes):
    times = ", ".join(
        f"rank {o.rank}: {type(o.error).__name__ if o.error else 'ok'} after {o.seconds:.2f}s"
        for o in outcomes
    )
    print(f"\n[fault] {name} world={len(outcomes)}: {times}")


def _on_raise_before(comm):
    c = Communicator(timeout=TIMEOUT)
    if c.rank == c.world_size - 1:
        raise KeyError("user code failed before the collective")
    c.all_reduce(torch.ones(4))


def test_one_rank_raises_before_a_collective(fresh_world):
    outcomes = fresh_world.outcomes(_on_raise_before)
    _report("raise-before", outcomes)
    last = fresh_world.size - 1
    assert isinstance(outcomes[last].error, KeyError)
    for o in outcomes[:last]:
        assert isinstance(o.error, CommTimeoutError), o.traceback
        msg = str(o.error)
        assert "all_reduce did not complete within 3s" in msg
        assert f"rank {last}: did not arrive" in msg


def _on_skip(comm):
    c = Communicator(timeout=TIMEOUT)
    if c.rank != 0:
        c.barrier()
    return "done"


def test_one_rank_skips_a_collective(fresh_world):
    outcomes = fresh_world.outcomes(_on_skip)
    _report("skip", outcomes)
    assert outcomes[0].value == "done"
    for o in outcomes[1:]:
        assert isinstance(o.error, CommTimeoutError)
        assert "barrier" in str(o.error) and "rank 0: did not arrive" in str(o.error)


def _on_different_collective(comm):
    c = Communicator(timeout=TIMEOUT, strict=True)
    if c.rank == 1:
        c.broadcast(torch.ones(4), src=0)
    else:
        c.all_reduce(torch.ones(4))


def test_one_rank_calls_a_different_collective(multi_world):
    outcomes = multi_world.outcomes(_on_different_collective)
    _report("different-collective", outcomes)
    assert all(isinstance(o.error, RemoteArgumentError) for o in outcomes)
    msg = str(outcomes[0].error)
    assert len({str(o.error) for o in outcomes}) == 1
    assert "rank 1: broadcast(src=0" in msg and "rank 0: all_reduce(op=sum" in msg
    _still_usable(multi_world)


# rounds of commlib's own on one rank, another collective on the others: the same
# bytes in every first round, so every rank raises instead of gloo ending a process
_OWN_ROUNDS = {
    "ensure_same": lambda c: c.ensure_same("sync", "keys=['a']"),
    "all_gather_shapes": lambda c: c.all_gather_shapes(torch.ones(2)),
    "all_reduce_dict": lambda c: dist.all_reduce_dict({"a": torch.ones(1)}, group=c),
    "new_group": lambda c: c.new_group([0]),
}


def _on_own_round_against(comm, first: str, other: str):
    c = Communicator(timeout=TIMEOUT)
    calls = {**_OWN_ROUNDS, "all_reduce": lambda c: c.all_reduce(torch.ones(2))}
    calls |= {"all_gather_object": lambda c: c.all_gather_object(1)}
    calls |= {"all_gather": lambda c: c.all_gather(torch.ones(2))}
    calls[first if c.rank == 0 else other](c)


@pytest.mark.parametrize(
    "first, other",
    [
        ("ensure_same", "all_reduce"),
        ("ensure_same", "all_gather"),
        ("all_gather_shapes", "all_gather"),
        ("all_gather_shapes", "all_reduce"),
        ("all_reduce_dict", "all_gather_object"),
        ("new_group", "all_reduce"),
    ],
)
def test_commlibs_own_rounds_against_another_collective(world3, first, other):
    outcomes = world3.outcomes(_on_own_round_against, first, other)
    assert all(isinstance(o.error, RemoteArgumentError) for o in outcomes), outcomes
    _still_usable(world3)


def _on_mismatch(comm, what):
    c = Communicator(timeout=TIMEOUT, strict=True)
    last = c.rank == c.world_size - 1
    if what == "shape":
        c.all_reduce(torch.ones(3 if last else 4))
    elif what == "dtype":
        c.all_reduce(torch.ones(4, dtype=torch.float64 if last else torch.float32))
    elif what == "src":
        c.broadcast(torch.ones(2), src=1 if last else 0)
    elif what == "gather-dst":
        c.gather_object(c.rank, dst=1 if last else 0)


@pytest.mark.parametrize("what", ["shape", "dtype", "src", "gather-dst"])
def test_strict_mode_catches_mismatched_arguments(multi_world, what):
    outcomes = multi_world.outcomes(_on_mismatch, what)
    _report(f"mismatch-{what}", outcomes)
    assert all(isinstance(o.error, RemoteArgumentError) for o in outcomes), outcomes
    assert len({str(o.error) for o in outcomes}) == 1
    _still_usable(multi_world)


def _on_mismatch_not_strict(comm):
    # even without strict mode the object collectives compare src/dst in round one
    c = Communicator(timeout=TIMEOUT)
    c.broadcast_object_list([c.rank], src=c.world_size - 1 if c.rank == 0 else 0)


def test_object_collective_root_mismatch_without_strict(multi_world):
    outcomes = multi_world.outcomes(_on_mismatch_not_strict)
    assert all(isinstance(o.error, RemoteArgumentError) for o in outcomes)
    assert "disagree on the src/dst" in str(outcomes[0].error)
    _still_usable(multi_world)


def _on_dict_keys(comm):
    c = Communicator(timeout=TIMEOUT)
    d = {"a": torch.ones(1)} if c.rank else {"b": torch.ones(1)}
    dist.all_reduce_dict(d, group=c)


def test_dict_keys_differ(multi_world):
    outcomes = multi_world.outcomes(_on_dict_keys)
    _report("dict-keys", outcomes)
    assert all(isinstance(o.error, RemoteArgumentError) for o in outcomes)
    assert len({str(o.error) for o in outcomes}) == 1
    _still_usable(multi_world)


def _on_killed_mid_transfer(comm, nbytes):
    # a survivor waiting on another survivor learns of the death only by this
    # timeout (waited in full): long enough for a 32 MiB round on 2 busy cores
    c = Communicator(timeout=6)
    payload = {"rank": c.rank, "blob": np.ones(nbytes, dtype=np.uint8)}
    if c.rank == c.world_size - 1:
        # die while the payload is on the wire
        threading.Timer(0.02, os.kill, (os.getpid(), signal.SIGKILL)).start()
    for _ in range(50):
        c.all_gather_object(payload)
    return "finished"


def test_rank_killed_mid_large_object_collective(fresh_world):
    outcomes = fresh_world.outcomes(_on_killed_mid_transfer, 32 << 20, timeout=90)
    _report("sigkill", outcomes)
    last = fresh_world.size - 1
    assert isinstance(outcomes[last].error, RankDied)
    for o in outcomes[:last]:
        assert isinstance(o.error, CommError), o  # a commlib error, not torch's
        # the dead rank by its rank (issue 29), not by gloo's address of it
        # (a survivor that waited on another survivor times out: "rank 3: did not arrive:
        # its process has exited")
        named = (
            rf"lost the connection to rank {last}\b"
            rf"|rank {last}( has|: [^;)]*: its process has) exited"
        )
        assert re.search(named, str(o.error)), o


def _on_timeout_then_teardown(comm):
    c = Communicator(timeout=TIMEOUT)
    if c.rank == 0:
        try:
            c.all_reduce(torch.ones(1), timeout=1.0)  # per-call timeout beats the default
        except CommTimeoutError as exc:
            return str(exc)
    return "idle"


def _on_teardown(comm):
    import torch.distributed as tdist

    dist.forget_communicators()
    tdist.destroy_process_group()
    return tdist.is_initialized()


def test_per_call_timeout_then_clean_teardown(fresh_world):
    results = fresh_world.run(_on_timeout_then_teardown)
    assert "within 1s" in results[0]
    # after a timeout the group can still be torn down on every rank
    assert fresh_world.run(_on_teardown, timeout=60) == [False] * fresh_world.size


def _on_subgroup_skip(comm):
    sub = comm.new_group([0, comm.world_size - 1], timeout=TIMEOUT)
    if comm.rank == comm.world_size - 1 or not sub.is_member:
        return None  # the last rank skips the subgroup's barrier
    try:
        sub.barrier()
    except CommTimeoutError as exc:
        return str(exc)
    return "no error"


def test_a_subgroup_timeout_names_world_ranks_too(world3):
    # messages about a rank give both numbers: group rank 1 is world rank 2 here
    message = world3.run(_on_subgroup_skip)[0]
    assert "on rank 0 (world rank 0) of 2" in message, message
    assert "rank 1 (world rank 2): did not arrive" in message, message
