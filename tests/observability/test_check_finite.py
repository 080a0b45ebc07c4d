"""The agreed NaN/Inf check in one process: the flag, the error, the environment.

Every rank raising the same error is tested on gloo in
``tests/observability/test_stacks_world.py``.
"""

from __future__ import annotations

import pickle

import pytest
import torch

from commlib import Communicator, _finite
from commlib.errors import NonFiniteError, RemoteArgumentError


def test_a_world_of_one_refuses_its_own_nan_and_reduces_finite_tensors():
    comm = Communicator(check_finite=True)
    x = torch.tensor([1.0, float("inf")])
    with pytest.raises(NonFiniteError) as caught:
        comm.all_reduce(x)  # the call
    assert caught.value.ranks == [0] and "test_check_finite.py:" in caught.value.where
    y = torch.ones(2)
    comm.all_reduce(y)
    comm.reduce(torch.ones(2, dtype=torch.int64), dst=0)  # integers are always finite
    assert y.tolist() == [1.0, 1.0]
    assert Communicator().check_finite is False


def test_the_environment_turns_it_on(monkeypatch):
    monkeypatch.setenv("COMMLIB_CHECK_FINITE", "1")
    assert Communicator().check_finite is True
    assert Communicator(check_finite=False).check_finite is False


def test_a_mismatch_in_the_flag_alone_is_the_nan_error():
    flag_only = RemoteArgumentError(
        "all_reduce", {0: "all_reduce(op=sum)", 1: f"all_reduce(op=sum{_finite.MARK})"}
    )
    found = _finite.from_mismatch("all_reduce", flag_only)
    assert isinstance(found, NonFiniteError) and found.ranks == [1]
    other = RemoteArgumentError(
        "all_reduce", {0: "all_reduce(op=sum)", 1: f"all_reduce(op=max{_finite.MARK})"}
    )
    assert _finite.from_mismatch("all_reduce", other) is other  # the arguments come first
    again = pickle.loads(pickle.dumps(found))
    assert str(again) == str(found) and again.ranks == [1]
