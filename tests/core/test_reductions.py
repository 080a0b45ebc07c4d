"""Local reductions: ``reduce_into`` gives the bits ``reduce_locally`` gives.

Both reduce in rank order; ``reduce_into`` writes into the caller's tensor
without a temporary where torch can. Property tests over ops, dtypes, shapes
and rank counts (wider-dtype and uint64 cases take the fallback).
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from commlib.reductions import reduce_into, reduce_locally
from commlib_backends.gloo import GlooBackend

# what gloo moves and reduces, float64, and two that take the fallback (uint16 is
# reduced in a wider dtype, uint64 as int64 bits)
_DTYPES = [
    *sorted(GlooBackend.wire_dtypes | GlooBackend.reduce_dtypes, key=str),
    torch.uint16,
    torch.uint64,
]


def _ops_for(dtype: torch.dtype) -> list[str]:
    if dtype.is_floating_point:
        return ["sum", "product", "min", "max", "avg"]
    return ["sum", "product", "min", "max", "band", "bor", "bxor"]


def _parts(
    dtype: torch.dtype, ranks: int, shape: tuple[int, ...], seed: int
) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    wide = torch.randint(-50, 50, (ranks, *shape), generator=gen)
    if dtype == torch.bool:
        wide = wide > 0
    elif not dtype.is_signed and not dtype.is_floating_point:
        wide = wide.abs()
    return [p.to(dtype) for p in wide.unbind(0)]


@settings(max_examples=200, deadline=None)
@given(
    dtype=st.sampled_from(_DTYPES),
    ranks=st.integers(1, 5),
    shape=st.lists(st.integers(0, 4), max_size=3).map(tuple),
    seed=st.integers(0, 2**16),
    data=st.data(),
)
def test_reduce_into_matches_reduce_locally(dtype, ranks, shape, seed, data):
    op = data.draw(st.sampled_from(_ops_for(dtype)))
    parts = _parts(dtype, ranks, shape, seed)
    want = reduce_locally(parts, op)
    out = torch.full(shape, 7).to(dtype)
    reduce_into(out, parts, op)
    assert out.dtype == dtype and out.shape == want.shape
    assert torch.equal(out.view(-1).view(torch.uint8), want.to(dtype).view(-1).view(torch.uint8))


@pytest.mark.parametrize("op", ["sum", "max"])
def test_reduce_into_a_tensor_of_another_dtype_takes_the_copy(op):
    out = torch.empty(3, dtype=torch.float64)
    parts = [torch.tensor([1.0, 2.0, 3.0]), torch.tensor([4.0, 0.5, 9.0])]
    reduce_into(out, parts, op)
    assert torch.equal(out, reduce_locally(parts, op).double())


@pytest.mark.parametrize("dtype", _DTYPES, ids=str)
def test_a_large_reduce_into_gives_torchs_bits_on_this_thread(dtype):
    # past torch's grain size reduce_into reduces with numpy (one thread): the same bits
    # as torch's own reduction, in rank order, for every op of every dtype (floats with
    # NaN, infinities and signed zeros among the values)
    n = 40_000
    for ranks in (2, 3):
        parts = _parts(dtype, ranks, (n,), seed=ranks)
        if dtype.is_floating_point:
            for p in parts:
                p[:4] = torch.tensor([float("nan"), float("inf"), -0.0, 0.0]).to(dtype)
        for op in _ops_for(dtype):
            want = reduce_locally(parts, op)
            out = torch.full((n,), 7).to(dtype)
            reduce_into(out, parts, op)
            assert torch.equal(out.view(torch.uint8), want.to(dtype).view(torch.uint8)), op
