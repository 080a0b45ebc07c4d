"""commlib._world: the process's state in one object, and its reset."""

from __future__ import annotations

import warnings

import pytest
import torch

import commlib
from commlib._world import World, default_store


def test_reset_forgets_the_cached_communicators(fresh_commlib_state):
    comm = commlib.get_communicator()
    assert fresh_commlib_state.communicators  # the world's, cached
    fresh_commlib_state.reset()
    assert fresh_commlib_state.communicators == {}
    assert commlib.get_communicator() is not comm


def test_reset_undoes_set_default_communicator(fresh_commlib_state):
    mine = commlib.Communicator(strict=True)
    commlib.set_default_communicator(mine)
    assert commlib.get_communicator() is mine
    fresh_commlib_state.reset()
    assert commlib.get_communicator() is not mine


def test_reset_lets_the_launch_warning_be_decided_again(fresh_commlib_state, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.warns(UserWarning, match="WORLD_SIZE=2"):
        commlib.all_reduce(torch.ones(1))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        commlib.all_reduce(torch.ones(1))  # decided: once per process
    fresh_commlib_state.reset()
    with pytest.warns(UserWarning, match="WORLD_SIZE=2"):
        commlib.all_reduce(torch.ones(1))


def test_not_distributed_there_is_no_store_and_no_started_plugin():
    assert default_store() is None
    assert World().started_plugin("gloo") is None
