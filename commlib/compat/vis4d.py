"""``vis4d.common.distributed``'s 17 names on commlib: ``import commlib.compat.vis4d as dist``.

Every function works on the default communicator (the world, or a world of
one without torch.distributed), on any backend commlib serves. Where vis4d's
meaning differs from commlib's own function of the same name, this module
follows vis4d:

* ``broadcast(obj, src=0)`` returns ``src``'s *object* (commlib's
  ``broadcast`` copies a tensor in place);
* ``all_reduce_dict(py_dict, reduce_op="sum", to_float=True)`` returns the
  reduced dict (values made float first), leaving the caller's as it was;
* ``obj2tensor(pyobj, device=None)`` puts the bytes on the backend's device
  by default (vis4d's default is ``"cuda"``);
* ``serialize_to_tensor`` serves every backend (vis4d asserts gloo or nccl).

``all_gather_object_gpu`` and ``all_gather_object_cpu`` return every rank's
object on rank 0 only (``None`` elsewhere) unless ``rank_zero_return_only``
is ``False``, as vis4d's do; the first goes through the backend's object
collective, the second through files in a directory every rank can read.

Examples:
    >>> import commlib.compat.vis4d as dist
    >>> dist.broadcast("config from rank 0")
    'config from rank 0'
    >>> dist.all_gather_object_gpu({"ap": 0.5})
    [{'ap': 0.5}]
"""

from __future__ import annotations

import os
import pickle
import shutil
import tempfile
from typing import Any

import torch
import torch.distributed as torch_dist
from torch import nn

from commlib import helpers
from commlib.errors import RemoteError
from commlib.functional import (
    get_comm_device,
    get_communicator,
    get_local_rank,
    get_rank,
    get_world_size,
    pad_to_largest_tensor,
    reduce_mean,
)
from commlib.helpers import rank_zero_only, tensor2obj

__all__ = [
    "all_gather_object_cpu",
    "all_gather_object_gpu",
    "all_reduce_dict",
    "broadcast",
    "create_tmpdir",
    "distributed_available",
    "get_local_rank",
    "get_rank",
    "get_world_size",
    "is_module_wrapper",
    "obj2tensor",
    "pad_to_largest_tensor",
    "rank_zero_only",
    "reduce_mean",
    "serialize_to_tensor",
    "synchronize",
    "tensor2obj",
]


def distributed_available() -> bool:
    """Whether torch.distributed is available and initialised (vis4d's meaning).

    Examples:
        >>> distributed_available()      # a single process
        False
    """
    return torch_dist.is_available() and torch_dist.is_initialized()


def synchronize() -> None:
    """A barrier over every process; nothing in a world of one.

    Examples:
        >>> synchronize()
    """
    comm = get_communicator()
    if comm.world_size > 1:
        comm.barrier()


def broadcast(obj: Any, src: int = 0) -> Any:
    """``src``'s ``obj`` on every process (any picklable object; vis4d's ``broadcast``).

    Examples:
        >>> broadcast([1, 2], src=0)
        [1, 2]
    """
    return get_communicator().broadcast_object(obj, src)


def obj2tensor(pyobj: Any, device: torch.device | str | None = None) -> torch.Tensor:
    """Pickle ``pyobj`` into a 1-D ``uint8`` tensor, on ``device`` (the backend's by default).

    Examples:
        >>> tensor2obj(obj2tensor({"a": 1}))
        {'a': 1}
    """
    return helpers.obj2tensor(pyobj, get_comm_device() if device is None else device)


def serialize_to_tensor(data: Any) -> torch.Tensor:
    """``data`` pickled into a ``uint8`` tensor on the backend's device (CPU for gloo).

    Examples:
        >>> serialize_to_tensor("abc").dtype
        torch.uint8
    """
    return obj2tensor(data)


def all_reduce_dict(
    py_dict: dict[str, Any], reduce_op: str = "sum", to_float: bool = True
) -> dict[str, Any]:
    """The dict with every value reduced across processes (vis4d's ``all_reduce_dict``).

    Values are tensors (or numbers, made tensors); with ``to_float`` they are
    made ``float`` first. ``reduce_op`` is ``"sum"`` or ``"mean"`` (any op
    commlib takes). Keys, shapes or dtypes that differ across ranks raise the
    same :class:`~commlib.errors.RemoteArgumentError` on every rank.

    Examples:
        >>> all_reduce_dict({"loss": torch.tensor(2), "acc": torch.tensor(0.5)}, "mean")
        {'loss': tensor(2.), 'acc': tensor(0.5000)}
    """
    if not isinstance(py_dict, dict):
        raise TypeError(f"all_reduce_dict needs a dict, got {type(py_dict).__name__}")
    out = {k: v if isinstance(v, torch.Tensor) else torch.tensor(v) for k, v in py_dict.items()}
    out = {k: (v.float() if to_float else v.clone()) for k, v in out.items()}
    helpers.all_reduce_dict(get_communicator(), out, reduce_op)
    return {k: out[k] for k in py_dict}


def all_gather_object_gpu(data: Any, rank_zero_return_only: bool = True) -> list[Any] | None:
    """Every process's ``data`` through the backend's object collective.

    With ``rank_zero_return_only`` (the default, as vis4d) rank 0 gets the
    list and the others ``None``.

    Examples:
        >>> all_gather_object_gpu({"n": 1}, rank_zero_return_only=False)
        [{'n': 1}]
    """
    comm = get_communicator()
    if comm.world_size == 1:
        return [data]
    if rank_zero_return_only:
        gathered = comm.gather_object(data, 0)
        return gathered if comm.rank == 0 else None
    return comm.all_gather_object(data)


def create_tmpdir(rank: int, tmpdir: str | None = None, use_system_tmp: bool = True) -> str:
    """A directory every process uses: ``tmpdir``, or one rank 0 makes and broadcasts.

    ``rank`` is this process's rank (as vis4d passes it). Without
    ``tmpdir``, rank 0 makes a new directory under the system's temporary
    directory (``use_system_tmp``) or under ``./.dist_tmp``.

    Examples:
        >>> path = create_tmpdir(get_rank())
        >>> os.path.isdir(path)
        True
        >>> os.rmdir(path)
    """
    if tmpdir is not None:
        os.makedirs(tmpdir, exist_ok=True)
        return tmpdir
    made = None
    if rank == 0:
        parent = tempfile.gettempdir() if use_system_tmp else ".dist_tmp"
        os.makedirs(parent, exist_ok=True)
        made = tempfile.mkdtemp(dir=parent)
    path = broadcast(made, 0)
    if not isinstance(path, str):
        raise RuntimeError("create_tmpdir: rank 0 did not make a directory (was rank 0 passed?)")
    return path


def all_gather_object_cpu(
    data: Any,
    tmpdir: str | None = None,
    rank_zero_return_only: bool = True,
    use_system_tmp: bool = False,
) -> list[Any] | None:
    """Every process's ``data`` through pickle files in a directory all can read.

    Rank 0 (every rank, without ``rank_zero_return_only``) reads every part;
    a directory made here is removed afterwards. A part a rank cannot read
    (the directory is not shared) is the same
    :class:`~commlib.errors.RemoteError` on every rank, not a hang.

    Examples:
        >>> all_gather_object_cpu([1, 2], rank_zero_return_only=False)
        [[1, 2]]
    """
    comm = get_communicator()
    rank, world = comm.rank, comm.world_size
    if world == 1:
        return [data]
    made_here = tmpdir is None
    path = create_tmpdir(rank, tmpdir, use_system_tmp)
    with open(os.path.join(path, f"part_{rank}.pkl"), "wb") as f:
        pickle.dump(data, f, protocol=pickle.HIGHEST_PROTOCOL)
    comm.barrier()
    parts: list[Any] | None = None
    failure = None
    if rank == 0 or not rank_zero_return_only:
        try:
            parts = []
            for r in range(world):
                with open(os.path.join(path, f"part_{r}.pkl"), "rb") as f:
                    parts.append(pickle.load(f))
        except (OSError, pickle.UnpicklingError, EOFError) as exc:
            failure = f"{type(exc).__name__}: {exc}"
    # every rank learns whether every reader succeeded: all raise, or none
    failures = {r: why for r, why in enumerate(comm.all_gather_object(failure)) if why}
    if rank == 0 and made_here:
        shutil.rmtree(path, ignore_errors=True)
    if failures:
        raise RemoteError("all_gather_object_cpu", failures, "could not read the parts")
    return parts


def is_module_wrapper(module: nn.Module) -> bool:
    """Whether ``module`` is wrapped: a ``DataParallel`` or ``DistributedDataParallel``.

    Examples:
        >>> is_module_wrapper(torch.nn.Linear(1, 1))
        False
        >>> is_module_wrapper(torch.nn.DataParallel(torch.nn.Linear(1, 1)))
        True
    """
    return isinstance(module, (nn.DataParallel, nn.parallel.DistributedDataParallel))
