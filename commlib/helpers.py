"""Helpers built on a Communicator: dicts, parameters, seeds, padding, decorators.

Each takes the communicator as its first argument; :mod:`commlib.functional`
exposes them under mmengine's and vis4d's names with ``group=`` arguments.
"""

from __future__ import annotations

import functools
import pickle
from collections import defaultdict
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import numpy as np
import torch

from commlib import _validation as check
from commlib._communicators import communicator_for
from commlib.communicator import Communicator
from commlib.errors import RemoteArgumentError

F = TypeVar("F", bound=Callable[..., Any])


def all_reduce_dict(comm: Communicator, data: dict, op: str = "sum") -> None:
    """Reduce every tensor of ``data`` across ranks; values are replaced.

    Keys are processed in sorted order; tensors of one dtype travel in one
    collective. Keys, shapes or dtypes that differ across ranks raise the same
    :class:`~commlib.errors.RemoteArgumentError` on every rank.

    Examples:
        >>> d = {"loss": torch.tensor(1.0 * comm.rank), "n": torch.tensor([2])}
        >>> all_reduce_dict(comm, d, op="sum")
        >>> d              # 2 ranks: {'loss': tensor(1.), 'n': tensor([4])}
        {'loss': tensor(0.), 'n': tensor([2])}
    """
    try:
        keys = _dict_keys(data, op)
    except (ValueError, TypeError) as exc:
        # a mistake only this rank made (a float where the others pass a tensor): the
        # others are in the agreement round already, so the refusal joins it
        if comm.world_size > 1:
            comm.ensure_same("all_reduce_dict", f"refused: {exc}")
        raise
    if comm.world_size == 1:
        return
    comm.ensure_same(
        "all_reduce_dict",
        "; ".join(f"{k!r}: {data[k].dtype} {tuple(data[k].shape)}" for k in keys),
    )
    by_dtype: dict[torch.dtype, list] = defaultdict(list)
    for k in keys:
        by_dtype[data[k].dtype].append(k)
    for dtype_keys in by_dtype.values():
        flat = torch.cat([comm.plugin.to_device(data[k]).reshape(-1) for k in dtype_keys])
        comm.all_reduce(flat, op)
        pos = 0
        for k in dtype_keys:
            n = data[k].numel()
            data[k] = flat[pos : pos + n].reshape(data[k].shape).to(data[k].device)
            pos += n


def _dict_keys(data: Any, op: str) -> list[Any]:
    """The keys of ``data`` in sorted order, once every value is a tensor ``op`` reduces."""
    if not isinstance(data, dict):
        raise TypeError(f"all_reduce_dict needs a dict of tensors, got {type(data).__name__}")
    check.reduce_op(op)
    try:
        keys = sorted(data)
    except TypeError as exc:
        raise TypeError(f"all_reduce_dict needs sortable keys: {exc}") from None
    for k in keys:
        check.tensor(data[k], f"data[{k!r}]")
    for k in keys:
        check.reduce_op(op, data[k])
    return keys


def _buckets(tensors: list[torch.Tensor], bucket_size_mb: float) -> list[list[torch.Tensor]]:
    """Group by (dtype, device), then split each group at ``bucket_size_mb``."""
    groups: dict[tuple, list[torch.Tensor]] = defaultdict(list)
    for t in tensors:
        groups[(t.dtype, t.device)].append(t)
    if bucket_size_mb <= 0:
        return list(groups.values())
    limit = bucket_size_mb * 1024 * 1024
    out = []
    for group in groups.values():
        bucket: list[torch.Tensor] = []
        size = 0
        for t in group:
            nbytes = t.numel() * t.element_size()
            if bucket and size + nbytes > limit:
                out.append(bucket)
                bucket, size = [], 0
            bucket.append(t)
            size += nbytes
        if bucket:
            out.append(bucket)
    return out


def all_reduce_params(
    comm: Communicator,
    params: Iterable[torch.Tensor],
    coalesce: bool = True,
    bucket_size_mb: float = -1,
    op: str = "sum",
) -> None:
    """Reduce parameters (or any tensors) in place, coalesced into buckets.

    With ``coalesce``, tensors are grouped by dtype and device, flattened into
    buckets of at most ``bucket_size_mb`` (one bucket per dtype when <= 0),
    reduced one bucket per collective, and copied back.

    Examples:
        >>> model = torch.nn.Linear(2, 1)
        >>> all_reduce_params(comm, model.parameters(), bucket_size_mb=25, op="mean")
    """
    op = check.reduce_op(op)
    tensors = []
    for p in params:
        check.tensor(p, "each parameter")
        tensors.append(p.data)
    if comm.world_size == 1:
        return
    if not coalesce:
        for t in tensors:
            comm.all_reduce(t, op)
        return
    for bucket in _buckets(tensors, bucket_size_mb):
        flat = torch.cat([t.reshape(-1) for t in bucket])
        comm.all_reduce(flat, op)
        pos = 0
        for t in bucket:
            n = t.numel()
            t.copy_(flat[pos : pos + n].view_as(t))
            pos += n


def sync_random_seed(comm: Communicator) -> int:
    """Rank 0's ``np.random.randint(2**31)`` on every rank.

    Every rank draws (so numpy's stream advances the same way everywhere);
    rank 0's draw wins. Seeding numpy first makes the result reproducible.

    Examples:
        >>> np.random.seed(0)
        >>> sync_random_seed(comm)
        209652396
    """
    seed = int(np.random.randint(2**31))
    if comm.world_size == 1:
        return seed
    value = torch.tensor([seed], dtype=torch.int64)
    comm.broadcast(value, src=0)
    return int(value.item())


def reduce_mean(comm: Communicator, tensor: torch.Tensor) -> torch.Tensor:
    """The mean of ``tensor`` over ranks, as a new tensor (the input is untouched).

    Examples:
        >>> reduce_mean(comm, torch.tensor([float(comm.rank)]))   # 2 ranks: tensor([0.5000])
        tensor([0.])
    """
    check.tensor(tensor, "tensor")
    out = tensor.clone()
    comm.all_reduce(out, "mean")
    return out


def pad_to_largest_tensor(
    comm: Communicator, tensor: torch.Tensor
) -> tuple[list[int], torch.Tensor]:
    """Pad ``tensor`` along dim 0 to the largest dim 0 of any rank.

    Returns every rank's dim-0 size and the zero-padded tensor; the other dims
    must agree across ranks.

    Examples:
        >>> sizes, padded = pad_to_largest_tensor(comm, torch.ones(comm.rank + 1))
        >>> sizes, padded.shape          # 2 ranks, on rank 0: ([1, 2], torch.Size([2]))
        ([1], torch.Size([1]))
    """
    with comm.refusing("all_gather_shapes"):  # the others are in its round already
        check.tensor(tensor, "tensor")
        if tensor.dim() == 0:
            raise ValueError("pad_to_largest_tensor needs a tensor with at least one dim")
    shapes = comm.all_gather_shapes(tensor)
    if len({tuple(s[1:]) for s in shapes}) > 1:
        raise RemoteArgumentError(
            "pad_to_largest_tensor",
            {r: f"shape {tuple(s)}" for r, s in enumerate(shapes)},
            "ranks passed tensors whose trailing dims differ",
        )
    sizes = [s[0] for s in shapes]
    largest = max(sizes)
    if largest == tensor.shape[0]:
        return sizes, tensor
    pad = tensor.new_zeros((largest - tensor.shape[0], *tensor.shape[1:]))
    return sizes, torch.cat([tensor, pad])


def rank_zero_only(func: F) -> F:
    """Run ``func`` on global rank 0 only; other ranks get ``None``.

    Examples:
        >>> @rank_zero_only
        ... def log(msg):
        ...     print(msg)
    """

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if communicator_for().rank == 0:
            return func(*args, **kwargs)
        return None

    return wrapper  # type: ignore[return-value]


def obj2tensor(pyobj: Any, device: torch.device | str | None = None) -> torch.Tensor:
    """Pickle ``pyobj`` into a 1-D ``uint8`` tensor (on ``device``; CPU by default).

    Examples:
        >>> tensor2obj(obj2tensor({"a": 1}))
        {'a': 1}
    """
    data = bytearray(pickle.dumps(pyobj, protocol=pickle.HIGHEST_PROTOCOL))
    out = torch.frombuffer(data, dtype=torch.uint8) if data else torch.empty(0, dtype=torch.uint8)
    return out if device is None else out.to(device)


def tensor2obj(tensor: torch.Tensor) -> Any:
    """Unpickle a tensor made by :func:`obj2tensor`.

    Examples:
        >>> tensor2obj(obj2tensor([1, 2]))
        [1, 2]
    """
    check.tensor(tensor, "tensor")
    return pickle.loads(tensor.detach().cpu().contiguous().numpy().tobytes())
