"""Bad input, fuzzed: every public call works or raises ValueError/TypeError/CommError.

Calls are generated as picklable *recipes* (``("tensor", shape, dtype)``,
``("unpicklable",)``, ...) so the same call can be sent to every rank of a gloo
world and built there. Nothing may hang (every run has a timeout), crash the
interpreter, or leave the world unusable: after each generated call the world
must still complete a plain all_reduce.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import commlib as dist
from commlib import Communicator
from commlib.errors import CommError

# slow: hundreds of generated calls, each checked on every rank
pytestmark = pytest.mark.slow

ALLOWED = (ValueError, TypeError, CommError)

_DTYPES = ["float32", "int64", "bool", "float16", "complex64", "uint8"]

tensor_recipe = st.tuples(
    st.just("tensor"),
    st.lists(st.integers(0, 3), max_size=3),
    st.sampled_from(_DTYPES),
)
bad_value = st.one_of(
    st.none(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True),
    st.text(max_size=8),
    st.booleans(),
    st.lists(st.integers(), max_size=3),
    st.tuples(st.just("ndarray"), st.integers(0, 4)),
    st.tuples(st.just("unpicklable")),
    st.tuples(st.just("dict"), st.lists(st.text(max_size=3), max_size=3)),
)
value = st.one_of(tensor_recipe, bad_value)
op = st.one_of(
    st.sampled_from(["sum", "mean", "product", "min", "max", "band", "bor", "bxor", "MEAN"]),
    st.text(max_size=6),
    st.integers(-3, 3),
    st.none(),
)
rank = st.one_of(st.integers(-2, 5), st.sampled_from([2**63, True, 1.0, "0", None]))
obj = st.recursive(
    st.one_of(
        st.none(),
        st.integers(),
        st.text(max_size=5),
        st.binary(max_size=64),
        st.tuples(st.just("unpicklable")),
        st.tuples(st.just("ndarray"), st.integers(0, 5)),
    ),
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=3), inner, max_size=3)
    ),
    max_leaves=6,
)

calls = st.one_of(
    st.tuples(st.just("all_reduce"), st.tuples(value, op)),
    st.tuples(st.just("all_gather"), st.tuples(value)),
    st.tuples(st.just("broadcast"), st.tuples(value, rank)),
    st.tuples(st.just("gather"), st.tuples(value, rank)),
    st.tuples(st.just("all_gather_into_tensor"), st.tuples(value, value)),
    st.tuples(st.just("reduce_scatter"), st.tuples(value, value, op)),
    st.tuples(st.just("all_gather_object"), st.tuples(obj)),
    st.tuples(st.just("gather_object"), st.tuples(obj, rank)),
    st.tuples(st.just("broadcast_object_list"), st.tuples(st.one_of(obj, st.lists(obj)), rank)),
    st.tuples(st.just("all_reduce_dict"), st.tuples(value, op)),
    st.tuples(st.just("all_reduce_params"), st.tuples(st.lists(value, max_size=3), op)),
    st.tuples(st.just("reduce_mean"), st.tuples(value)),
    st.tuples(st.just("pad_to_largest_tensor"), st.tuples(value)),
    st.tuples(st.just("collect_results"), st.tuples(obj, st.integers(-1, 5))),
)


def build(recipe):
    """Turn a recipe into the real argument (on the rank that runs the call)."""
    if isinstance(recipe, tuple) and recipe:
        kind = recipe[0]
        if kind == "tensor":
            return torch.zeros(recipe[1], dtype=getattr(torch, recipe[2]))
        if kind == "ndarray":
            return np.arange(recipe[1])
        if kind == "unpicklable":
            return threading.Lock()
        if kind == "dict":
            return {k: torch.ones(1) for k in recipe[1]}
    if isinstance(recipe, list):
        return [build(r) for r in recipe]
    if isinstance(recipe, dict):
        return {k: build(v) for k, v in recipe.items()}
    return recipe


def perform(comm, name, recipes):
    """Run one generated call; return the exception type name, or "ok"."""
    args = [build(r) for r in recipes]
    try:
        getattr(dist, name)(*args, group=comm)
        return "ok"
    except ALLOWED as exc:
        return type(exc).__name__


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(call=calls)
def test_single_process(call):
    comm = dist.get_communicator()
    name, recipes = call
    perform(comm, name, recipes)  # any other exception fails the test


def _on_fuzz(comm, examples):
    c = Communicator(timeout=10, strict=True)
    out = []
    for name, recipes in examples:
        out.append(perform(c, name, recipes))
        x = torch.ones(1)
        c.all_reduce(x)  # the world is still in step
        if x.item() != c.world_size:
            raise AssertionError(f"out of step after {name}")
    return out


def test_gloo_world(world3):
    # examples drawn once, then sent to every rank: ranks must make the same calls
    examples = []

    @settings(
        max_examples=60, deadline=None, database=None, suppress_health_check=list(HealthCheck)
    )
    @given(call=calls)
    def collect(call):
        examples.append(call)

    collect()
    results = world3.run(_on_fuzz, examples, timeout=240)
    assert len(results[0]) == len(examples)
    # a call fails or succeeds alike on every rank (gather's dst rank aside)
    for i, (name, _) in enumerate(examples):
        outcomes = {r[i] for r in results}
        if name not in ("gather", "gather_object"):
            assert len(outcomes) == 1, (examples[i], [r[i] for r in results])


@pytest.mark.parametrize("bad", [threading.Lock(), {"a": [1, (lambda: 0)]}, (i for i in [])])
def test_nested_unpicklable_object_in_a_world(world2, bad):
    outcomes = world2.outcomes(_on_gather_built, ("unpicklable",))
    assert all(isinstance(o.error, CommError) for o in outcomes)


def _on_gather_built(comm, recipe):
    return dist.all_gather_object({"x": [build(recipe)]}, group=comm)


# -- ranks that disagree, under default settings ------------------------------------
# each rank's own arguments are valid; only together do they mismatch, which gloo
# would answer by aborting a process (or by wrong results)
_MISMATCH_DTYPES = ["float32", "float64", "int64", "int32"]
_one_rank = st.tuples(
    st.lists(st.integers(0, 3), min_size=1, max_size=2),
    st.sampled_from(_MISMATCH_DTYPES),
    st.sampled_from(["sum", "max", "min"]),
    st.integers(0, 2),  # src / dst: in range for the 3 ranks
    st.integers(1, 3),  # per-rank element count of the flat collectives
)
disagreements = st.tuples(
    st.sampled_from(
        ["all_reduce", "broadcast", "gather", "all_gather_into_tensor", "reduce_scatter"]
    ),
    st.lists(_one_rank, min_size=3, max_size=3),
)


def _disagree(c, name, mine):
    shape, dtype, op, root, n = mine
    dtype = getattr(torch, dtype)
    w = c.world_size
    if name == "all_reduce":
        c.all_reduce(torch.ones(shape, dtype=dtype), op=op)
    elif name == "broadcast":
        c.broadcast(torch.ones(shape, dtype=dtype), src=root)
    elif name == "gather":
        c.gather(torch.ones(shape, dtype=dtype), dst=root)
    elif name == "all_gather_into_tensor":
        c.all_gather_into_tensor(torch.empty(n * w, dtype=dtype), torch.ones(n, dtype=dtype))
    else:
        c.reduce_scatter(torch.empty(n, dtype=dtype), torch.ones(n * w, dtype=dtype), op=op)


def _on_disagree(comm, examples):
    c = Communicator(timeout=20)  # default settings: the guard, not strict mode
    out = []
    for name, per_rank in examples:
        try:
            _disagree(c, name, per_rank[c.rank])
            out.append("ok")
        except CommError as exc:
            out.append(f"{type(exc).__name__}: {exc}")
        x = torch.ones(1)
        c.all_reduce(x)  # the world is still in step
        if x.item() != c.world_size:
            raise AssertionError(f"out of step after {name}")
    return out


def test_ranks_that_disagree_never_abort_and_raise_alike():
    from commlib.testing import World

    examples = []

    @settings(
        max_examples=80, deadline=None, database=None, suppress_health_check=list(HealthCheck)
    )
    @given(call=disagreements)
    def collect(call):
        examples.append(call)

    collect()
    # a world of its own: a failure here must not leave the session's worlds broken
    with World(3, timeout=300) as world:
        results = world.run(_on_disagree, examples, timeout=300)
    for i, (name, per_rank) in enumerate(examples):
        outcomes = {r[i] for r in results}
        assert len(outcomes) == 1, (examples[i], [r[i] for r in results])
        (outcome,) = outcomes
        agree = len({tuple(map(str, a)) for a in _relevant(name, per_rank)}) == 1
        assert (outcome == "ok") == agree, (examples[i], outcome)


def _relevant(name, per_rank):
    """What must match across ranks for ``name`` (the rest is ignored by the collective)."""
    if name == "all_reduce":
        return [(s, d, o) for s, d, o, _, _ in per_rank]
    if name == "broadcast":
        return [(s, d, r) for s, d, _, r, _ in per_rank]
    if name == "gather":  # shapes may differ (an uneven gather), not their number of dims
        return [(len(s), d, r) for s, d, _, r, _ in per_rank]
    if name == "all_gather_into_tensor":
        return [(d, n) for _, d, _, _, n in per_rank]
    return [(d, o, n) for _, d, o, _, n in per_rank]
