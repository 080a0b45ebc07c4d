"""``weights_only=`` on the object collectives: torch 2.14's argument, on every torch here.

True loads only tensors and allowed types (the restricted loading plus what
``torch.serialization.add_safe_globals`` allowed); a class outside them is
refused on the rank that loads it, naming it, and every rank raises.
"""

from __future__ import annotations

import traceback

import pytest
import torch

import commlib as dist
from commlib.serialization import (
    OutOfBandSerializer,
    PickleSerializer,
    RefusedClassError,
    RestrictedSerializer,
    object_serializer,
    torch_safe_names,
)


class Point:
    def __init__(self, x, y):
        self.x, self.y = x, y

    def __eq__(self, other):
        return type(other) is Point and (self.x, self.y) == (other.x, other.y)


POINT = f"{__name__}.Point"


# -- which serializer weights_only selects ------------------------------------------------
def test_weights_only_false_keeps_the_serializer():
    default, given = OutOfBandSerializer(), PickleSerializer()
    assert object_serializer(None, default) is default
    assert object_serializer(given, default) is given


def test_weights_only_selects_the_restricted_loading():
    chosen = object_serializer(None, OutOfBandSerializer(), weights_only=True)
    assert isinstance(chosen, RestrictedSerializer) and chosen.torch_safe_globals
    mine = RestrictedSerializer(allow=[Point])
    kept = object_serializer(mine, OutOfBandSerializer(), weights_only=True)
    assert kept.allowed == mine.allowed and kept.torch_safe_globals
    assert not mine.torch_safe_globals  # the user's own serializer is left as it was
    # the communicator's own restricted serializer is kept too
    assert object_serializer(None, mine, weights_only=True).allowed == mine.allowed


def test_weights_only_with_an_unrestricted_serializer_is_a_value_error():
    with pytest.raises(ValueError, match="weights_only=True loads with a RestrictedSerializer"):
        object_serializer(PickleSerializer(), OutOfBandSerializer(), weights_only=True)


def test_torch_safe_globals_load_and_nothing_else():
    ser = object_serializer(None, OutOfBandSerializer(), weights_only=True)
    payload = {"t": torch.arange(3), "err": ValueError("bad"), "stack": traceback.StackSummary()}
    back = ser.loads(*ser.dumps(payload))
    assert torch.equal(back["t"], payload["t"]) and str(back["err"]) == "bad"
    assert "builtins.KeyError" in torch_safe_names()
    with pytest.raises(RefusedClassError, match="Point"):
        ser.loads(*ser.dumps([Point(1, 2)]))
    with torch.serialization.safe_globals([Point]):  # torch's own allow-list, read at load
        assert POINT in torch_safe_names()
        assert ser.loads(*ser.dumps([Point(1, 2)])) == [Point(1, 2)]
    assert POINT not in torch_safe_names()


# -- the six object collectives (and broadcast_object), on 2 and 3 ranks -----------------
def _on_allowed(comm):
    r, n = comm.rank, comm.world_size
    mine = {"rank": r, "t": torch.full((2,), r)}
    gathered = dist.all_gather_object(mine, weights_only=True)
    at_0 = dist.gather_object(mine, dst=0, weights_only=True)
    objs = [torch.ones(r + 1), {"k": (1, 2.5)}] if r == 0 else [None, None]
    dist.broadcast_object_list(objs, src=0, weights_only=True)
    one = comm.broadcast_object(torch.arange(4) if r == 0 else None, weights_only=True)
    box = [None]
    dist.scatter_object_list(
        box, [{"shard": i} for i in range(n)] if r == 0 else None, src=0, weights_only=True
    )
    sent = [None]
    if r == 0:
        dist.send_object_list([{"step": 3}], dst=1, weights_only=True)
    elif r == 1:
        dist.recv_object_list(sent, src=0, weights_only=True)
    return gathered, at_0, objs, one, box, sent


def test_tensors_and_allowed_types_travel(multi_world):
    n = multi_world.size
    for r, (gathered, at_0, objs, one, box, sent) in enumerate(multi_world.run(_on_allowed)):
        assert [g["rank"] for g in gathered] == list(range(n))
        assert all(torch.equal(g["t"], torch.full((2,), i)) for i, g in enumerate(gathered))
        assert (at_0 is None) == (r != 0)
        assert torch.equal(objs[0], torch.ones(1)) and objs[1] == {"k": (1, 2.5)}
        assert torch.equal(one, torch.arange(4))
        assert box == [{"shard": r}]
        assert sent == ([{"step": 3}] if r == 1 else [None])


def _on_point(comm, call):
    r = comm.rank
    if call == "all_gather_object":
        return dist.all_gather_object(Point(r, r), weights_only=True)
    if call == "broadcast_object":
        return dist.broadcast_object(Point(0, 0) if r == 0 else None, weights_only=True)
    if call == "recv_object_list":
        if r == 0:
            return dist.send_object_list([Point(0, 0)], dst=1, weights_only=True)
        if r == 1:
            return dist.recv_object_list([None], src=0, weights_only=True)
        return None
    # without weights_only the same object loads (the default is unrestricted, as torch's)
    return dist.all_gather_object(Point(r, r))


def test_a_class_outside_them_is_refused_on_every_rank_that_loads_it(world2):
    outcomes = world2.outcomes(_on_point, "all_gather_object")
    assert all(isinstance(o.error, RefusedClassError) for o in outcomes), outcomes
    assert all(POINT in str(o.error) for o in outcomes)


@pytest.mark.parametrize("call", ["broadcast_object", "recv_object_list"])
def test_the_sender_keeps_its_own_and_the_receiver_refuses(world2, call):
    # as torch's: the root or sender loads nothing, so only the receiver can refuse
    sender, receiver = world2.outcomes(_on_point, call)
    assert sender.error is None
    assert isinstance(receiver.error, RefusedClassError) and POINT in str(receiver.error)


def test_without_weights_only_the_class_loads(world2):
    assert world2.run(_on_point, "plain") == [[Point(0, 0), Point(1, 1)]] * 2
