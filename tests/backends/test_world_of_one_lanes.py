"""A group of one rank: which collectives take a lane, by the plugin's device type.

The reductions, broadcast and barrier issue nothing (``call=None``). The
gathers and exchanges copy in the plugin's method on a CPU engine; on an
accelerator they take the engine's own call, as at any size (on NCCL the
method's async issue costs a side stream and an event join; the lane runs on
the caller's stream). On torch's fake process group of 1.
"""

from __future__ import annotations

import pytest
import torch.distributed as dist

import commlib
from commlib import _torch_lanes
from commlib.bench.fake_world import dispatch_plugin, fake_world

GATHERS = ("all_gather_into_tensor", "reduce_scatter", "all_to_all_single", "all_to_all")


class OnAnAccelerator:
    """What process_group_lane asks of a plugin: an accelerator's device type."""

    device_type = "cuda"

    def torch_reduce_op(self, op):
        return commlib.plugins.resolve_backend("gloo").torch_reduce_op(op)


@pytest.fixture
def group_of_one():
    assert not dist.is_initialized()
    gloo = commlib.plugins.resolve_backend("gloo")
    with fake_world(1, dispatch_plugin(gloo)):
        yield dist.group.WORLD


def _lane(plugin, collective, group, **key):
    return _torch_lanes.process_group_lane(plugin, collective, group, key, commlib.Backend)


def test_a_group_of_one_on_an_accelerator_takes_the_engine_s_gathers(group_of_one):
    accelerator = OnAnAccelerator()
    for collective in GATHERS:
        key = {"op": "sum"} if collective == "reduce_scatter" else {}
        lane = _lane(accelerator, collective, group_of_one, **key)
        assert lane is not None and lane.call is not None, collective
    # nothing to issue for a reduction or a broadcast, on any engine
    assert _lane(accelerator, "all_reduce", group_of_one, op="sum").call is None
    assert _lane(accelerator, "broadcast", group_of_one, src=0).call is None


def test_a_group_of_one_on_a_cpu_engine_copies_in_the_plugin_s_method(group_of_one):
    gloo = commlib.plugins.resolve_backend("gloo")
    for collective in GATHERS:
        key = {"op": "sum"} if collective == "reduce_scatter" else {}
        assert _lane(gloo, collective, group_of_one, **key) is None, collective
