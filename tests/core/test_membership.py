"""What a child communicator inherits: every setting, through one record (commlib._membership).

Before the record, ``check_finite`` reached no child and a single-process
``shrink`` dropped ``slot_size`` and ``strict``.
"""

from __future__ import annotations

import datetime

import pytest
import torch

from commlib import Communicator, _membership
from commlib.errors import NonFiniteError
from commlib.serialization import PickleSerializer

_SETTINGS = {
    "timeout": datetime.timedelta(seconds=7),
    "slot_size": 8192,
    "strict": True,
    "check_finite": True,
}


def _parent() -> Communicator:
    return Communicator(serializer=PickleSerializer(), **_SETTINGS)


def _assert_inherits(child: Communicator, parent: Communicator) -> None:
    assert _membership.Settings.of(child) == _membership.Settings.of(parent)
    with pytest.raises(NonFiniteError):  # check_finite is on in the child too
        child.all_reduce(torch.tensor([float("nan")]))


@pytest.mark.parametrize(
    "derive",
    [
        lambda c: c.new_group([0]),
        lambda c: c.new_group([0], use_local_synchronization=True),
        lambda c: c.split(0),
    ],
    ids=["new_group", "new_group_local", "split"],
)
def test_every_child_keeps_every_setting(derive):
    parent = _parent()
    _assert_inherits(derive(parent), parent)


def test_a_child_given_its_own_timeout_keeps_the_other_settings():
    parent = _parent()
    child = parent.new_group([0], timeout=3)
    assert child.timeout == datetime.timedelta(seconds=3)
    assert _membership.Settings.of(child).replace(timeout=parent.timeout) == (
        _membership.Settings.of(parent)
    )


def test_a_single_process_shrink_keeps_slot_size_strict_and_check_finite():
    parent = _parent()
    parent._engine.health.mark_broken("all_reduce #1: a test broke it")
    _assert_inherits(parent.shrink(), parent)


def _on_subgroup_settings(comm):
    parent = Communicator(slot_size=8192, strict=True, check_finite=True)
    child = parent.new_group(list(range(comm.world_size)))
    return child.slot_size, child.strict, child.check_finite


def test_a_subgroup_on_gloo_keeps_check_finite(multi_world):
    assert multi_world.run(_on_subgroup_settings) == [(8192, True, True)] * multi_world.size
