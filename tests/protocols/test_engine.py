"""The engine layer alone: error mapping, and the object protocol over a fake engine.

The fake is a backend whose ranks are threads of this process (a shared
rendezvous plays the wire), so the object protocol of :mod:`commlib._objects`
runs its real code, both payload transports included, without any process
group.
"""

from __future__ import annotations

import datetime
import threading
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch

from commlib import _objects
from commlib._engine import Engine
from commlib.backend import Backend
from commlib.errors import CommError, CommTimeoutError, RemoteArgumentError, RemoteError
from commlib.serialization import OutOfBandSerializer

SECONDS = datetime.timedelta(seconds=20)


class _Hub:
    """What the ranks of one threaded world share: a barrier and a mailbox."""

    def __init__(self, world: int):
        self.world = world
        self.barrier = threading.Barrier(world, timeout=20)
        self.slots: list[Any] = [None] * world
        self.mail: dict[tuple[int, int], list[torch.Tensor]] = {}
        self.lock = threading.Lock()

    def exchange_all(self, rank: int, value: Any) -> list[Any]:
        self.slots[rank] = value
        self.barrier.wait()
        seen = list(self.slots)
        self.barrier.wait()
        return seen


class ThreadedBackend(Backend):
    """One rank of a world of threads: collectives through a :class:`_Hub`."""

    name = "threaded-test"
    torch_backend = None

    def __init__(self, hub: _Hub, rank: int, transport: str):
        self.hub, self.me = hub, rank
        self.large_payload_transport = transport  # type: ignore[misc]

    def rank(self, group: Any) -> int:
        return self.me

    def world_size(self, group: Any) -> int:
        return self.hub.world

    def to_device(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor

    def all_gather_into_tensor(self, output, tensor, group, async_op=False):
        parts = self.hub.exchange_all(self.me, tensor.clone())
        output.view(self.hub.world, -1).copy_(torch.stack([p.reshape(-1) for p in parts]))

    def gather(self, tensor, gather_list, dst, group, async_op=False):
        parts = self.hub.exchange_all(self.me, tensor.clone())
        if self.me == dst:
            for out, part in zip(gather_list, parts):
                out.copy_(part)

    def broadcast(self, tensor, src, group, async_op=False):
        parts = self.hub.exchange_all(self.me, tensor.clone())
        tensor.copy_(parts[src])

    def exchange(self, sends, recvs, group, async_op=False):
        with self.hub.lock:
            for t, peer in sends:
                self.hub.mail.setdefault((self.me, peer), []).append(t.clone())
        self.hub.barrier.wait()
        for t, peer in recvs:
            t.copy_(self.hub.mail[(peer, self.me)].pop(0))
        self.hub.barrier.wait()


def _threaded(world: int, transport: str, fn: Callable[[Engine], Any]) -> list[Any]:
    """Run ``fn(engine)`` on ``world`` thread-ranks; each result, or the exception raised."""
    hub = _Hub(world)
    out: list[Any] = [None] * world

    def rank_main(r: int) -> None:
        engine = Engine(ThreadedBackend(hub, r, transport), None, SECONDS)
        try:
            out[r] = fn(engine)
        except Exception as exc:
            out[r] = exc

    threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads), "a thread-rank hung"
    return out


SER = OutOfBandSerializer()
SLOT = 256  # small, so modest objects already take round two


@pytest.mark.parametrize("transport", ["p2p", "collective"])
@pytest.mark.parametrize("world", [2, 3])
def test_all_gather_object_over_a_fake_engine(world, transport):
    def fn(engine):
        big = np.full(1000 * (engine.rank + 1), engine.rank, dtype=np.int32)
        return _objects.all_gather_object(engine, {"rank": engine.rank, "big": big}, SER, SLOT)

    for got in _threaded(world, transport, fn):
        assert [g["rank"] for g in got] == list(range(world))
        for r, g in enumerate(got):
            np.testing.assert_array_equal(g["big"], np.full(1000 * (r + 1), r, dtype=np.int32))


@pytest.mark.parametrize("transport", ["p2p", "collective"])
def test_gather_and_broadcast_over_a_fake_engine(transport):
    def fn(engine):
        got = _objects.gather_object(engine, torch.arange(500) * engine.rank, 1, SER, SLOT)
        box = [torch.ones(300), "x" * 400] if engine.rank == 2 else [None, None]
        _objects.broadcast_object_list(engine, box, 2, SER, SLOT)
        return got, box

    results = _threaded(3, transport, fn)
    assert results[0][0] is None and results[2][0] is None
    for r, t in enumerate(results[1][0]):
        assert torch.equal(t, torch.arange(500) * r)
    for _, box in results:
        assert torch.equal(box[0], torch.ones(300)) and box[1] == "x" * 400


def test_failures_are_agreed_over_a_fake_engine():
    def fn(engine):
        obj = (lambda: 0) if engine.rank == 1 else engine.rank
        return _objects.all_gather_object(engine, obj, SER, SLOT)

    errors = _threaded(3, "p2p", fn)
    assert all(isinstance(e, RemoteError) and list(e.failures) == [1] for e in errors)

    def bad_src(engine):
        box = [None]
        return _objects.broadcast_object_list(engine, box, engine.rank, SER, SLOT)

    errors = _threaded(2, "p2p", bad_src)
    assert all(isinstance(e, RemoteArgumentError) and "src/dst" in str(e) for e in errors)


class _Works(Backend):
    name = "works-test"
    torch_backend = None

    def __init__(self, wait: Callable[[datetime.timedelta], bool]):
        self._wait = wait

    def rank(self, group: Any) -> int:
        return 0

    def world_size(self, group: Any) -> int:
        return 1

    def broadcast(self, tensor, src, group, async_op=False):
        outer = self

        class Work:
            def wait(self, timeout=None):
                return outer._wait(timeout)

            def is_completed(self):
                return False

        return Work()


def test_map_errors_is_where_engine_failures_become_commlib_errors():
    def timed_out(timeout):
        raise RuntimeError("[gloo] Timed out waiting 1000ms for recv operation to complete")

    def reset(timeout):
        raise RuntimeError("Connection reset by peer")

    def ok(timeout):
        return True

    t = torch.zeros(1)
    engine = Engine(_Works(timed_out), None, datetime.timedelta(seconds=1))
    with pytest.raises(CommTimeoutError, match=r"broadcast did not complete within 1s"):
        engine.run("broadcast", "broadcast", t, 0)
    engine = Engine(_Works(reset), None, datetime.timedelta(seconds=1))
    with pytest.raises(CommError, match="broadcast failed on rank 0: Connection reset") as info:
        engine.run("broadcast", "broadcast", t, 0)
    assert not isinstance(info.value, CommTimeoutError)
    engine = Engine(_Works(ok), None, datetime.timedelta(seconds=1))
    engine.run("broadcast", "broadcast", t, 0)
    handle = engine.broadcast(t, 0, async_op=True)
    assert handle is not None and not handle.is_completed()
    assert handle.wait() and handle.is_completed()
    assert engine.seq == 2  # one number per call: they name the call in errors
    # point to point is numbered apart: only the ranks involved make it, and the
    # collectives' numbers must stay the same on every rank
    engine.run("send", "broadcast", t, 0)
    engine.run("recv_object_list", "broadcast", t, 0)
    assert (engine.seq, engine.p2p_seq) == (2, 2)
    engine.run("broadcast", "broadcast", t, 0)
    assert (engine.seq, engine.p2p_seq) == (3, 2)


def test_commlib_errors_pass_through_unchanged():
    mine = RemoteError("broadcast", {1: "boom"})

    def raises(timeout):
        raise mine

    engine = Engine(_Works(raises), None, SECONDS)
    with pytest.raises(RemoteError) as info:
        engine.run("broadcast", "broadcast", torch.zeros(1), 0)
    assert info.value is mine
