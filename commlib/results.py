"""``collect_results``: gather per-rank result lists on rank 0, in dataset order.

A distributed sampler hands rank ``r`` samples ``r, r + W, r + 2W, ...``, so the
dataset order is recovered by interleaving the parts, and the padding the
sampler added is cut off by truncating to ``size``.
"""

from __future__ import annotations

import operator
import os
import pickle
import shutil
import tempfile
import warnings
from typing import Any

from commlib import data_device
from commlib.communicator import Communicator
from commlib.errors import BackendUnavailableError, RemoteError

_MISSING = object()


def interleave(parts: list[list[Any]], size: int) -> list[Any]:
    """Merge per-rank parts round-robin and keep the first ``size`` items.

    Genuine ``None`` results are kept; parts of unequal length are fine.

    Examples:
        >>> interleave([[0, 2, 4], [1, 3]], 5)
        [0, 1, 2, 3, 4]
    """
    longest = max((len(p) for p in parts), default=0)
    out = []
    for i in range(longest):
        for part in parts:
            item = part[i] if i < len(part) else _MISSING
            if item is not _MISSING:
                out.append(item)
    return out[:size]


def _checked_size(comm: Communicator, result_part: Any, size: Any, first: str) -> int:
    """``size`` as an int, once ``result_part`` is a list and ``size`` a count.

    A mistake only this rank made fails every rank: the others are in the
    helper's ``first`` collective already, and the refusal joins it.
    """
    if comm.world_size < 2:  # no other rank waits for this one (or not a member)
        return _count(result_part, size)
    with comm.refusing(first):
        return _count(result_part, size)


def _count(result_part: Any, size: Any) -> int:
    if not isinstance(result_part, list):
        raise TypeError(f"result_part must be a list, got {type(result_part).__name__}")
    try:
        # numpy and torch integers too: mmengine only slices with it
        count = -1 if isinstance(size, bool) else operator.index(size)
    except TypeError:
        count = -1
    if count < 0:
        raise ValueError(f"size must be a non-negative int, got {size!r}")
    return count


def collect_results_gpu(comm: Communicator, result_part: list, size: int) -> list | None:
    """Collect through the backend's object collective (on its device).

    Examples:
        >>> collect_results_gpu(comm, [comm.rank * 10], size=1)
        [0]
        >>> # 2 ranks, size=2: [0, 10] on rank 0, None on rank 1
    """
    size = _checked_size(comm, result_part, size, "gather_object")
    if comm.world_size == 1:
        return result_part[:size]
    parts = comm.gather_object(result_part, dst=0)
    return interleave(parts, size) if parts is not None else None


def collect_results_cpu(
    comm: Communicator, result_part: list, size: int, tmpdir: str | None = None
) -> list | None:
    """Collect through files in a directory every rank can see.

    Without ``tmpdir``, rank 0 creates a unique directory under ``./.dist_test``
    and removes it afterwards, also on error. A given ``tmpdir`` is created if
    needed and removed when collecting leaves it empty (anything else in it is
    kept, and so is the directory). A directory that some rank cannot see
    makes every rank raise an error naming that rank.

    Examples:
        >>> collect_results_cpu(comm, [0, 2, 4], size=2)   # one rank: its part, cut to size
        [0, 2]
    """
    size = _checked_size(comm, result_part, size, "broadcast_object")
    if comm.world_size == 1:
        return result_part[:size]
    rank, world = comm.rank, comm.world_size
    created = None
    if rank == 0 and tmpdir is None:
        os.makedirs(".dist_test", exist_ok=True)
        created = tempfile.mkdtemp(prefix="commlib-", dir=".dist_test")
        with open(os.path.join(created, ".owner"), "w") as f:
            f.write(str(os.getpid()))
    own_file = path = None
    try:
        path = comm.broadcast_object(os.path.abspath(created) if created else tmpdir, src=0)
        status = ""
        try:
            if tmpdir is None and not os.path.isfile(os.path.join(path, ".owner")):
                raise FileNotFoundError(
                    f"rank {rank} cannot see the directory {path} that rank 0 created; "
                    "it is not shared by all ranks (pass tmpdir= on a shared file system, "
                    "or use device='gpu')"
                )
            os.makedirs(path, exist_ok=True)
            own_file = os.path.join(path, f"part_{rank}.pkl")
            with open(own_file, "wb") as f:
                pickle.dump(result_part, f, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as exc:  # every failure goes through the status round
            status = f"{type(exc).__name__}: {exc}"
        statuses = comm.all_gather_object(status)
        failed = {r: s for r, s in enumerate(statuses) if s}
        if not failed:  # every rank takes this branch alike
            if rank == 0:
                failed = {
                    r: f"rank 0 cannot see {path}/part_{r}.pkl: {path} is not shared "
                    f"by rank {r} (use a shared tmpdir or device='gpu')"
                    for r in range(world)
                    if not os.path.isfile(os.path.join(path, f"part_{r}.pkl"))
                }
            failed = comm.broadcast_object(failed, src=0)
        if failed:
            raise RemoteError("collect_results_cpu", failed)
        if rank != 0:
            own_file = None  # rank 0 reads it, then removes it
            return None
        parts = []
        for r in range(world):
            part_file = os.path.join(path, f"part_{r}.pkl")
            with open(part_file, "rb") as f:
                parts.append(pickle.load(f))
            if r != 0:
                os.remove(part_file)
        return interleave(parts, size)
    finally:
        if own_file is not None and os.path.exists(own_file):
            os.remove(own_file)
        if created is not None:
            shutil.rmtree(created, ignore_errors=True)
            _remove_if_empty(".dist_test")
        elif rank == 0 and path is not None:
            # rank 0 removed every part file; rmdir refuses a directory with user files
            _remove_if_empty(path)


def _remove_if_empty(directory: str) -> None:
    try:
        os.rmdir(directory)
    except OSError:
        pass


def collect_results(
    comm: Communicator, results: list, size: int, device: str, tmpdir: str | None
) -> list | None:
    """:func:`commlib.collect_results` on ``comm``: the path ``device`` picks, files or objects."""
    if not isinstance(device, str):
        raise TypeError(f"device must be a str such as 'cpu' or 'gpu', got {device!r}")
    if device == "cpu":
        return collect_results_cpu(comm, results, size, tmpdir)
    if device != data_device.ACCELERATOR_ALIAS:
        kind = device.partition(":")[0]
        if kind not in data_device.accelerator_types():
            accepted = ["cpu", data_device.ACCELERATOR_ALIAS, *data_device.accelerator_types()]
            raise ValueError(
                f"device must be one of {', '.join(map(repr, accepted))} (the device types "
                f"registered backends serve), got {device!r}"
            )
        try:
            data_device.resolve_device(device)
        except BackendUnavailableError as exc:
            # mmengine's device picks the object path; the group's backend carries it
            warnings.warn(
                f"collect_results(device={device!r}): {exc}; collecting through the "
                f"group's {comm.backend!r} backend on {comm.device} instead",
                RuntimeWarning,
                stacklevel=3,  # the program's call of commlib.collect_results
            )
    if tmpdir is not None:
        raise ValueError(f"tmpdir is only used with device='cpu', not device={device!r}")
    return collect_results_gpu(comm, results, size)
