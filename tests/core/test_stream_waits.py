"""An engine whose blocking wait orders the caller's stream is waited on as torch does.

torch's NCCL blocks the host until the GPU is done when ``Work.wait`` gets a
timeout (1 ms sleeps, seen on an H200), and orders the caller's stream when it
gets none. A plugin saying so (:meth:`commlib.Backend.waits_on_stream`) has
every blocking call waited with ``wait()``: the lanes, the plugin's methods and
async handles; every other plugin keeps ``wait(timeout)``. On torch's fake
group of 8, with works that record how they were waited on.
"""

from __future__ import annotations

import datetime
from typing import Any

import pytest
import torch

import commlib
from commlib.bench.fake_world import dispatch_plugin, fake_world
from commlib.types import DirectCall

waits: list[tuple[Any, ...]] = []


class Recorded:
    """A work that is done at once and notes the arguments of each wait."""

    def wait(self, *args: Any) -> bool:
        waits.append(args)
        return True

    def is_completed(self) -> bool:
        return True


class OnHost(commlib.Backend):
    name = "waits-on-host"
    torch_backend = "gloo"
    device_type = "cpu"

    def all_reduce(self, tensor, op, group, async_op=False):
        return Recorded()

    def all_gather_into_tensor(self, output, tensor, group, async_op=False):
        return Recorded()

    def direct_call(self, collective, group, **key):
        if collective == "all_reduce":
            return DirectCall(lambda tensors, options: Recorded(), None)
        return None


class OnStream(OnHost):
    name = "waits-on-stream"

    def waits_on_stream(self) -> bool:
        return True


@pytest.fixture(autouse=True)
def _fresh():
    import torch.distributed as dist

    assert not dist.is_initialized()
    waits.clear()
    yield


def _calls(comm: commlib.Communicator) -> dict[str, list[tuple[Any, ...]]]:
    seen = {}
    t = torch.ones(4)
    for name, call in {
        "learning all_reduce": lambda: comm.all_reduce(t),
        "lane all_reduce": lambda: comm.all_reduce(t),
        "method all_gather_into_tensor": lambda: comm.all_gather_into_tensor(torch.empty(32), t),
        "async handle": lambda: comm.all_gather_into_tensor(
            torch.empty(32), t, async_op=True
        ).wait(),
    }.items():
        waits.clear()
        call()
        seen[name] = list(waits)
    return seen


def test_a_stream_ordered_engine_is_waited_on_without_a_timeout():
    with fake_world(8, dispatch_plugin(OnStream())) as comm:
        assert comm._engine._on_stream
        seen = _calls(comm)
    assert seen == {name: [()] for name in seen}, seen


def test_other_engines_keep_the_timeout_on_every_wait():
    with fake_world(8, dispatch_plugin(OnHost())) as comm:
        assert not comm._engine._on_stream
        seen = _calls(comm)
    for name, args in seen.items():
        assert len(args) == 1 and len(args[0]) == 1, (name, args)
        assert isinstance(args[0][0], datetime.timedelta), (name, args)


def test_the_contract_default_and_an_accelerator_over_a_simulated_device(monkeypatch):
    assert commlib.plugins.resolve_backend("gloo").waits_on_stream() is False
    assert commlib.Backend.waits_on_stream(OnHost()) is False
    # a simulated device lives in host memory: its waits stay on the host
    nccl = commlib.plugins.resolve_backend("nccl")
    monkeypatch.setattr(type(nccl), "accelerator_device", lambda self: torch.device("cpu"))
    assert nccl.waits_on_stream() is False
    monkeypatch.setattr(type(nccl), "accelerator_device", lambda self: torch.device("cuda", 0))
    assert nccl.waits_on_stream() is True
