"""A broken process group: what breaks with it, what does not, and who learns of it how fast.

Each test starts its own world: the point is to break it.
"""

from __future__ import annotations

import time

import pytest
import torch

from commlib import Communicator
from commlib._engine import engine_limit
from commlib.errors import CommBrokenError, CommError, CommTimeoutError
from commlib.testing import World

# slow: each test breaks a world of its own
pytestmark = pytest.mark.slow


@pytest.fixture
def world3():
    world = World(3, timeout=120, pg_timeout=60).start()
    yield world
    world.kill()


def _on_timeout_breaks_the_group(comm) -> dict:
    a = Communicator(timeout=2.0)
    pair = a.new_group([0, 1])  # every rank makes it; rank 2 is not a member
    if a.rank == 2:
        # later than the others' timeout, and than the engine's own limit on their call
        # (before that, this rank's call could still complete the abandoned one)
        time.sleep(engine_limit(a.timeout).total_seconds() + 1.0)
    try:
        a.all_reduce(torch.ones(1))
        first = "ok"
    except CommError as exc:
        first = type(exc).__name__
    out = {"first": first}
    for name, c in (("same communicator", a), ("another one, same group", Communicator())):
        started = time.monotonic()
        try:
            c.broadcast(torch.ones(1), src=0)
            out[name] = "ok"
        except CommBrokenError as exc:
            out[name] = ("CommBrokenError", time.monotonic() - started < 0.5, "shrink" in str(exc))
    if pair.is_member:  # a group without the late rank was never part of it
        x = torch.ones(1)
        pair.all_reduce(x)
        out["subgroup"] = x.item()
    return out


def test_a_timeout_breaks_its_group_for_every_communicator_and_no_other(world3):
    results = world3.run(_on_timeout_breaks_the_group, timeout=120)
    broken = ("CommBrokenError", True, True)
    for rank, r in enumerate(results):
        assert r["first"] in ("CommTimeoutError", "RankLostError"), r
        assert r["same communicator"] == broken and r["another one, same group"] == broken, r
        if rank < 2:
            assert r["subgroup"] == 2.0, r


def _on_point_to_point_waiter(comm) -> dict[str, tuple[str, float]]:
    # rank 0 waits to receive from rank 1, then, on a pair of its own, to send to it
    # (gloo's sends and receives cannot be waited on in slices); rank 1 never matches
    # either: its own call on that pair times out and breaks it
    out = {}
    for side in ("exchange", "recv", "send"):
        c = Communicator(timeout=30.0).new_group([0, 1])
        # a message each way first: the recv and send below take the direct path
        buf = torch.empty(4)
        if c.rank == 0:
            c.send(torch.ones(4), dst=1)
            c.recv(buf, src=1)
        else:
            c.recv(buf, src=0)
            c.send(torch.ones(4), dst=0)
        started = time.monotonic()
        try:
            if c.rank == 1:
                c.all_reduce(torch.ones(1), timeout=1.0)
            elif side == "exchange":
                engine = c._engine
                engine.run("exchange", "exchange", [], [(torch.empty(4), 1)])
            elif side == "recv":
                c.recv(buf, src=1)
            else:
                c.send(torch.ones(4), dst=1)
            out[side] = "ok", time.monotonic() - started
        except CommTimeoutError as exc:
            out[side] = type(exc).__name__, time.monotonic() - started
    return out


def test_a_point_to_point_wait_learns_of_the_failure_within_moments():
    with World(2, timeout=120, pg_timeout=60) as world:
        waiter, giver = world.run(_on_point_to_point_waiter, timeout=120)
        world.kill()  # its groups are broken
    for side in ("exchange", "recv", "send"):
        kind1, waited1 = giver[side]
        assert kind1 == "CommTimeoutError" and waited1 < 5, (side, giver)
        # not its own 30 s: rank 1's announcement, seen by the watcher, which ended the wait
        kind0, waited0 = waiter[side]
        assert kind0 == "CommTimeoutError" and waited0 < 10, (side, waiter)


def _on_barrier_waiter(comm) -> tuple[str, float]:
    # rank 0 waits in a barrier; rank 1 never joins it but announces, as a rank
    # whose own call timed out does, that the group broke
    from commlib import _failure_notes

    c = Communicator(timeout=30.0)
    started = time.monotonic()
    if c.rank == 1:
        time.sleep(1.0)
        _failure_notes.announce_broken(c.group, "all_reduce #1: rank 1 gave up", timed_out=True)
        return "announced", 0.0
    try:
        c.barrier()
    except CommTimeoutError as exc:
        return type(exc).__name__ + (": first" if "gave up on it first" in str(exc) else ""), (
            time.monotonic() - started
        )
    return "ok", time.monotonic() - started


def test_a_barrier_learns_of_the_failure_within_moments():
    with World(2, timeout=120, pg_timeout=60) as world:
        (kind0, waited0), _ = world.run(_on_barrier_waiter, timeout=120)
        world.kill()  # its group is broken
    # not its own 30 s (torch's barrier was waited for in one block, without a look)
    assert kind0 == "CommTimeoutError: first" and waited0 < 10, (kind0, waited0)
