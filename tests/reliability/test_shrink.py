"""Recovery without restarting: a rank dies, the survivors shrink and go on.

Each test starts its own world on gloo (a killed rank leaves it unusable, and a
shrink breaks the group it shrank). A rank SIGKILLs itself in the middle of a
collective; every survivor gets a commlib error, its communicator is broken
(the next call says so at once), and ``shrink()`` gives a communicator over the
survivors, renumbered in order, on which every collective (the object ones too)
is checked. The seconds shrink took are printed (``pytest -s``) for the
reliability report.
"""

from __future__ import annotations

import os
import signal
import threading
import time

import numpy as np
import pytest
import torch

import commlib
from commlib import Communicator
from commlib.errors import CommBrokenError, CommError
from commlib.testing import RankDied, World
from tests.reliability.collective_checks import check_every_collective

# slow: each test kills a rank of a world of its own
pytestmark = pytest.mark.slow

TIMEOUT = 20.0  # communicator timeout in the ranks: generous, nothing here waits for it


@pytest.fixture
def make_world():
    worlds: list[World] = []

    def make(size: int) -> World:
        world = World(size, timeout=120, pg_timeout=60).start()
        worlds.append(world)
        return world

    yield make
    for world in worlds:
        world.kill()


def _die_soon() -> None:
    threading.Timer(0.05, os.kill, (os.getpid(), signal.SIGKILL)).start()


def _until_it_fails(comm: Communicator) -> tuple[str, float]:
    """Collectives until one raises (a peer was killed); the error's type and when."""
    started = time.monotonic()
    payload = {"blob": np.ones(64 << 10, dtype=np.uint8)}
    try:
        for i in range(1_000_000):
            if i % 2:
                comm.all_reduce(torch.ones(1 << 14))
            else:
                comm.all_gather_object(payload)
    except CommError as exc:
        return type(exc).__name__, time.monotonic() - started
    raise AssertionError("no collective failed")


def _on_kill_and_shrink(comm, victims: list[int]) -> dict:
    """Each victim (a rank of the communicator at that point) dies; the others shrink."""
    c = Communicator(timeout=TIMEOUT)
    world_ranks = c.ranks
    shrinks = []
    for victim in victims:
        if c.rank == victim:
            _die_soon()
        error, raised_after = _until_it_fails(c)
        try:
            c.all_reduce(torch.ones(1))
        except CommBrokenError as exc:
            broken = str(exc)
        started = time.monotonic()
        old_rank = c.rank
        c = c.shrink()
        shrinks.append(
            {
                "error": error,
                "raised_after": raised_after,
                "broken": broken,
                "shrink_seconds": time.monotonic() - started,
                "old_rank": old_rank,
                "new_rank": c.rank,
                "world_size": c.world_size,
            }
        )
    check_every_collective(c)
    return {"world_ranks": world_ranks, "shrinks": shrinks, "ranks_after": c.ranks}


def _report(name: str, outcomes) -> None:
    for o in outcomes:
        if not o.ok:
            continue
        steps = "; ".join(
            f"{s['error']} after {s['raised_after']:.2f}s, shrink {s['shrink_seconds']:.3f}s "
            f"(rank {s['old_rank']} -> {s['new_rank']} of {s['world_size']})"
            for s in o.value["shrinks"]
        )
        print(f"\n[shrink] {name} rank {o.rank}: {steps}")


def _check_step(step: dict, new_rank: int, world_size: int) -> None:
    """One survivor's kill-and-shrink step: the error, the broken communicator, its new place."""
    assert step["error"] in ("RankLostError", "CommTimeoutError")
    assert "comm.shrink()" in step["broken"]
    assert (step["new_rank"], step["world_size"]) == (new_rank, world_size)


# victim rank 0 at world 3 is test_module_level_shrink_replaces_the_default_communicator's;
# rank 1 of 4 is the first step of test_shrink_twice_four_to_three_to_two
@pytest.mark.parametrize(("size", "victim"), [(2, 1), (3, 2)], ids=lambda v: str(v))
def test_survivors_shrink_after_a_rank_is_killed_mid_collective(make_world, size, victim):
    world = make_world(size)
    outcomes = world.outcomes(_on_kill_and_shrink, [victim], timeout=240)
    _report(f"world={size} victim={victim}", outcomes)
    assert isinstance(outcomes[victim].error, RankDied)
    survivors = [o for o in outcomes if o.rank != victim]
    for new_rank, o in enumerate(survivors):
        assert o.ok, o.traceback
        (step,) = o.value["shrinks"]
        _check_step(step, new_rank, size - 1)
        assert o.value["ranks_after"] == [q for q in range(size) if q != victim]


def test_shrink_twice_four_to_three_to_two(make_world):
    world = make_world(4)
    # world rank 1 dies, then the rank that is 2 of the three left (world rank 3)
    outcomes = world.outcomes(_on_kill_and_shrink, [1, 2], timeout=240)
    _report("world=4 twice", outcomes)
    assert isinstance(outcomes[1].error, RankDied) and isinstance(outcomes[3].error, RankDied)
    for q in (0, 2):
        o = outcomes[q]
        assert o.ok, o.traceback
        first, second = o.value["shrinks"]
        # world ranks 0, 2, 3 become 0, 1, 2; then 0 and 2 become 0, 1
        _check_step(first, (0, 2, 3).index(q), 3)
        _check_step(second, (0, 2).index(q), 2)
        assert o.value["ranks_after"] == [0, 2]


def _on_exclude(comm, leaving: int) -> list[int] | None:
    c = Communicator(timeout=TIMEOUT)
    if c.rank == leaving:
        return None  # an excluded rank does not call shrink
    started = time.monotonic()
    new = c.shrink(exclude=[leaving], timeout=TIMEOUT)
    assert time.monotonic() - started < TIMEOUT / 2  # nobody waited for the excluded rank
    check_every_collective(new)
    return new.ranks


def test_shrink_leaves_out_an_excluded_live_rank_without_waiting(make_world):
    world = make_world(3)
    assert world.run(_on_exclude, 1, timeout=240) == [[0, 2], None, [0, 2]]


def _on_late(comm) -> str:
    c = Communicator(timeout=TIMEOUT)
    if c.rank == c.world_size - 1:
        time.sleep(4.0)
        try:
            c.shrink(timeout=TIMEOUT)
        except CommError as exc:
            return str(exc)
        return "not left out"
    new = c.shrink(timeout=1.0)
    check_every_collective(new)
    return f"world {new.world_size}"


def test_a_rank_later_than_the_shrink_timeout_is_left_out_and_told(make_world):
    world = make_world(3)
    results = world.run(_on_late, timeout=240)
    assert results[:2] == ["world 2", "world 2"]
    assert "rank 2 was left out of the new group" in results[2]


def _on_module_level_shrink(comm, victim: int) -> dict:
    if commlib.get_rank() == victim:
        _die_soon()
    error, _ = _until_it_fails(commlib.get_communicator())
    try:
        commlib.all_reduce(torch.ones(1))
    except CommBrokenError as exc:
        broken = str(exc)
    commlib.shrink()
    check_every_collective(commlib.get_communicator())
    return {
        "error": error,
        "broken": broken,
        "new_rank": commlib.get_rank(),
        "world_size": commlib.get_world_size(),
        "ranks_after": commlib.get_communicator().ranks,
    }


def test_module_level_shrink_replaces_the_default_communicator(make_world):
    # also the kill-and-shrink case where rank 0 dies: every survivor is renumbered
    world = make_world(3)
    outcomes = world.outcomes(_on_module_level_shrink, 0, timeout=240)
    assert isinstance(outcomes[0].error, RankDied)
    for new_rank, o in enumerate(outcomes[1:]):
        assert o.ok, o.traceback
        _check_step(o.value, new_rank, 2)
        assert o.value["ranks_after"] == [1, 2]


def test_shrink_checks_its_arguments_first():
    comm = Communicator()  # a world of one
    with pytest.raises(ValueError, match="exclude"):
        comm.shrink(exclude=[1])
    with pytest.raises(ValueError, match="excludes itself"):
        comm.shrink(exclude=[0])
    # nothing can be lost from a world of one: no new communicator, this one still usable
    with pytest.raises(ValueError, match="no rank was lost and the group is not broken"):
        comm.shrink()
    comm.all_reduce(torch.ones(1))
    comm._engine.health.mark_broken("a timeout, say")
    again = comm.shrink()
    assert (again.rank, again.world_size) == (0, 1) and again is not comm
