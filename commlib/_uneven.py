"""Collectives over chunks of different sizes, composed from the engine's even ones.

``Communicator.reduce_scatter`` given a list of tensors whose shapes differ
comes here: each chunk padded to the largest, one even ``reduce_scatter``, this
rank's part cut back.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from commlib import _validation as check
from commlib._guard import Guard, finished
from commlib._settings import as_timedelta
from commlib.reductions import reduce_locally, reduction

if TYPE_CHECKING:
    from commlib._engine import Engine
    from commlib.handle import Handle
    from commlib.types import ReduceOp, Timeout


def reduce_scatter_v(
    guard: Guard,
    engine: Engine,
    output: torch.Tensor,
    chunks: Sequence[torch.Tensor],
    op: ReduceOp | str,
    async_op: bool,
    timeout: Timeout,
) -> Handle | None:
    """``reduce_scatter`` of chunks that differ in size: padded to the largest, cut back.

    ``chunks[j]`` is this rank's part for rank ``j``; ``output`` is shaped like
    ``chunks[rank]``. One engine reduce_scatter of the padded rows (or none,
    where the check's round carried them).
    """
    world, me = engine.world_size, engine.rank
    if output.shape != chunks[me].shape:
        raise ValueError(
            f"output must be shaped like this rank's chunk input[{me}] "
            f"{tuple(chunks[me].shape)}, got {tuple(output.shape)}"
        )
    dtype = check.same_dtype([output, *chunks], "reduce_scatter's output and input")
    name = check.reduce_op(op, output)
    engine_op, back = reduction(name, output, engine.native_avg)
    largest = max(t.numel() for t in chunks)
    flat = torch.zeros(world, largest, dtype=dtype, device=engine.device())
    for row, t in zip(flat, chunks):
        row[: t.numel()].copy_(t.reshape(-1))
    in_t = flat.view(-1)
    out_t = torch.empty(largest, dtype=dtype, device=in_t.device)
    n = output.numel()

    def finish() -> None:
        back(out_t[:n], output, world)

    parts = guard.check(
        engine,
        "reduce_scatter",
        # every rank's list of shapes, the same everywhere (output's differs by rank)
        lambda: f"op={name}, {dtype}, v{[tuple(t.shape) for t in chunks]}",
        in_t,
        timeout,
    )
    if parts is not None:
        out_t.copy_(reduce_locally(parts, engine_op).view(world, -1)[me])
        return finished(finish, async_op, [output])
    return engine.reduce_scatter(
        out_t,
        in_t,
        engine_op,
        finish=finish,
        timeout=as_timedelta(timeout),
        async_op=async_op,
        value=[output],
    )
