"""Bad arguments: a clear ValueError / TypeError on every rank, and nothing sent."""

from __future__ import annotations

from typing import Any

import torch

import commlib.functional as F
from commlib.errors import CommError
from commlib.testing.checks import check, expect, expect_raises


def _still_in_step(comm: Any) -> None:
    # a rank that had sent something would now pair this collective with it
    t = torch.tensor([float(comm.rank + 1)])
    comm.all_reduce(t)
    n = comm.world_size
    expect(float(t) == n * (n + 1) / 2, f"the world is out of step after an error: {t}")


@check("bad_arguments")
def _bad_arguments(comm: Any, ctx: dict) -> None:
    """Wrong arguments raise ValueError / TypeError before anything is sent."""
    n = comm.world_size
    x = torch.ones(2)
    expect_raises(ValueError, comm.all_reduce, x, "average")
    expect_raises(TypeError, comm.all_reduce, ["not", "numbers"])
    expect_raises(TypeError, comm.all_reduce, x, "band")  # bitwise op on floats
    expect_raises(TypeError, comm.all_gather, [x.to_sparse()])  # a leaf without dense data
    expect_raises(ValueError, comm.gather, x, dst=n)
    expect_raises(ValueError, comm.gather, x, dst=-1)
    expect_raises(TypeError, comm.gather, x, dst=0.0)
    expect_raises(ValueError, comm.broadcast, x, src=n)
    expect_raises(TypeError, comm.broadcast, x, src=True)
    expect_raises(ValueError, comm.all_gather_into_tensor, torch.empty(n * 2 + 1), x)
    expect_raises(TypeError, comm.all_gather_into_tensor, torch.empty(n * 2, dtype=torch.int64), x)
    expect_raises(ValueError, comm.reduce_scatter, torch.empty(2), torch.ones(2 * n + 1))
    expect_raises(ValueError, comm.reduce_scatter, torch.empty(2), [torch.ones(2)] * (n + 1))
    expect_raises(
        TypeError, comm.reduce_scatter, torch.empty(2), torch.ones(2 * n, dtype=torch.int64)
    )
    expect_raises(TypeError, F.all_reduce_dict, [x], group=comm)
    expect_raises(ValueError, F.all_reduce_dict, {"a": x}, "nope", group=comm)
    expect_raises(ValueError, F.collect_results, [], 0, device="tpu", group=comm)
    expect_raises(ValueError, comm.new_group, [])
    expect_raises(ValueError, comm.new_group, [0, n])
    _still_in_step(comm)


@check("bad_arguments_agreed")
def _bad_arguments_agreed(comm: Any, ctx: dict) -> None:
    """Object collectives with bad arguments raise the same error on every rank."""
    n = comm.world_size
    expect_raises((ValueError, TypeError), comm.gather_object, "x", dst=n)
    expect_raises(TypeError, comm.broadcast_object_list, ("not", "a list"))
    expect_raises(ValueError, comm.broadcast_object_list, [None], src=n)
    _still_in_step(comm)


@check("disagreeing_ranks", min_world=2)
def _disagreeing_ranks(comm: Any, ctx: dict) -> None:
    """Ranks that disagree (dict keys, dtypes, unpicklable objects) all raise, none hang."""
    r = comm.rank
    keys = {"a": torch.ones(1)} if r == 0 else {"a": torch.ones(1), "b": torch.ones(1)}
    expect_raises(ValueError, F.all_reduce_dict, keys, group=comm)
    dtype = torch.float32 if r == 0 else torch.int64
    expect_raises((ValueError, TypeError), comm.all_gather, torch.ones(2, dtype=dtype))
    last = comm.world_size - 1
    obj = (lambda: None) if r == last else "fine"
    err = expect_raises(CommError, comm.all_gather_object, obj)
    expect(str(last) in str(err), f"the error does not name rank {last}: {err}")
    _still_in_step(comm)
