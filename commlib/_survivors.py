"""Which ranks go on after a failure: the surviving ranks agree through the store.

The process group is what failed, so the ranks meet in the store that
torch.distributed's rendezvous left behind (torchrun's agent holds it, or
rank 0's process with ``env://``). Each surviving rank announces itself (and
the ranks it wants left out); when every rank not left out has announced
itself, or is known to be dead, or the timeout has passed, the first rank to
get there writes the decision with one atomic ``compare_set``, and every rank
adopts that one decision. So all survivors build the same group.

A rank that died on this machine is known at once: each process records its
process id (with the machine's boot id and its pid namespace, so a pid is only
ever compared where it means the same process) when its first communicator is
made. A rank elsewhere is known dead only by not arriving within the timeout.
"""

from __future__ import annotations

import datetime
import os
import time
from collections.abc import Collection, Sequence
from typing import Any

import torch.distributed as dist

from commlib import _world
from commlib.errors import CommError

_POLL = 0.01  # seconds between looks at the store while waiting for the others
#: where a shrink notes each process it left out (``<machine> <pid>``), in the job's own
#: store: ``commlib run`` does not count their failure against the job
LEFT_OUT = "commlib/run/left_out"
_BROKEN = "broken:"  # leads a rank's announcement (and the decision) when its group broke


def store() -> Any:
    """The store of the world's rendezvous (``None`` when there is none).

    Examples:
        >>> store() is None     # not distributed
        True
    """
    return _world.default_store()


def _this_machine() -> str | None:
    """Where a process id means this process: boot id and pid namespace (Linux only)."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
        return f"{boot}/{os.readlink('/proc/self/ns/pid')}"
    except OSError:
        return None


def process_record() -> str | None:
    """This process as another process of this machine can check on it: ``"<machine> <pid>"``.

    ``None`` where there is no telling (not Linux).

    Examples:
        >>> process_record().endswith(str(os.getpid()))  # doctest: +SKIP
        True
    """
    where = _this_machine()
    return None if where is None else f"{where} {os.getpid()}"


def record_ended(record: str) -> bool:
    """Whether the process :func:`process_record` described has ended (on this machine only).

    A process of another machine (or pid namespace) is never known ended.

    Examples:
        >>> record_ended(process_record())
        False
    """
    where, _, pid = record.rpartition(" ")
    if where != _this_machine():
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rpartition(")")[2].split()[0]
    except (OSError, IndexError):
        return True
    return state in ("Z", "X")  # a zombie has ended; only its parent has not looked yet


def record_process() -> None:
    """Leave this process's id in the world's store, once per world.

    Examples:
        >>> record_process()
    """
    if not dist.is_initialized():
        return
    world = dist.group.WORLD
    if world is None or world in _world.world.worlds_recorded:
        return
    record, kv = process_record(), store()
    if record is not None and kv is not None:
        try:
            kv.set(f"commlib/proc/{dist.get_rank()}", record)
        except Exception as exc:  # only a shortcut for shrink; without it shrink waits
            _world.store_failed(exc)
    _world.world.worlds_recorded.add(world)


def _dead_here(kv: Any, world_rank: int, seen: dict[int, str]) -> bool:
    """Whether world rank ``world_rank`` is a process of this machine that has ended."""
    key = f"commlib/proc/{world_rank}"
    if world_rank not in seen:
        if not kv.check([key]):
            return False
        seen[world_rank] = kv.get(key).decode()
    return record_ended(seen[world_rank])


def ended(world_ranks: Sequence[int]) -> list[int]:
    """Which of ``world_ranks`` (by index) are processes of this machine that have ended.

    Read only on the failure path: the process ids ranks left in the store
    (:func:`record_process`) and ``/proc``. A rank on another machine, or
    one that left no id, is not counted.

    Examples:
        >>> ended([0, 1, 2])  # doctest: +SKIP
        [2]
    """
    kv = store()
    if kv is None:
        return []
    seen: dict[int, str] = {}
    try:
        return [i for i, world_rank in enumerate(world_ranks) if _dead_here(kv, world_rank, seen)]
    except Exception as exc:  # the store is gone: nothing to tell by
        _world.store_failed(exc)
        return []


def records(world_ranks: Sequence[int]) -> list[str | None]:
    """The process records (:func:`process_record`) the world's ranks left; ``None`` where none.

    Examples:
        >>> records([0, 1])  # doctest: +SKIP
        ['<boot>/pid:[4026531836] 4242', '<boot>/pid:[4026531836] 4243']
    """
    kv = store()
    if kv is None:
        return [None] * len(world_ranks)
    found: list[str | None] = []
    try:
        for world_rank in world_ranks:
            key = f"commlib/proc/{world_rank}"
            found.append(kv.get(key).decode() if kv.check([key]) else None)
    except Exception as exc:  # the store is gone: nothing to tell by
        _world.store_failed(exc)
        return [None] * len(world_ranks)
    return found


def _ranks(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def _store_gone(why: str) -> str:
    return (
        f"shrink: the store of the rendezvous cannot be reached ({why}). It lives in the "
        "launcher's agent (torchrun) or in rank 0's process (env://); when that process is "
        "gone the survivors cannot meet: restart the job"
    )


def nothing_lost(size: int) -> str:
    """Why shrink made no group: every rank of ``size`` arrived and the group is not broken.

    Examples:
        >>> nothing_lost(2).startswith("shrink: no rank was lost")
        True
    """
    return (
        f"shrink: no rank was lost and the group is not broken (all {size} ranks called "
        "shrink, none excluded, no call failed), so no new group was made and this "
        "communicator is still usable. shrink recovers from a rank that died or left "
        "(commlib.RankLostError) or a collective that timed out (commlib.CommTimeoutError); "
        "the error handled before this call was neither: catch only those two around "
        "shrink, and fix what the other error says"
    )


def _note_left_out(kv: Any, world_ranks: Sequence[int], keep: list[int]) -> None:
    """Note the processes this shrink left out, by their records, in the job's own store."""
    base = kv
    while isinstance(base, dist.PrefixStore):  # commlib run's store, under torch's prefix
        base = base.underlying_store
    try:
        for r, world_rank in enumerate(world_ranks):
            key = f"commlib/proc/{world_rank}"
            if r not in keep and kv.check([key]):
                base.set(f"{LEFT_OUT}/{kv.get(key).decode()}", "1")
    except Exception as exc:  # a courtesy to the launcher: shrink goes on without it
        _world.store_failed(exc)


def agree(
    name: str,
    rank: int,
    world_ranks: Sequence[int],
    exclude: Collection[int],
    timeout: datetime.timedelta,
    broken: bool = True,
) -> tuple[list[int], bool]:
    """The ranks of the group that go on (group ranks, in order), and whether the group broke.

    Both the same on every caller. ``name`` names this attempt (the same on
    every survivor, new each time); ``world_ranks`` are the group's members'
    world ranks, in group order; ``exclude`` are group ranks this rank wants
    left out; ``broken``: whether the group broke on this rank. The second
    answer is whether it broke on any rank of the decision. Raises
    :class:`~commlib.errors.CommError` when the store cannot be reached or
    when this rank itself was left out.

    Examples:
        >>> agree("0.shrunk0", 1, [0, 1, 2, 3], {3}, timedelta(seconds=60))  # doctest: +SKIP
        ([0, 1, 2], True)
    """
    kv = store()
    if kv is None:
        lost = _world.world.stores_lost.get(dist.group.WORLD) if dist.is_initialized() else None
        if lost is not None:
            raise CommError(_store_gone(lost))
        raise CommError("shrink: there is no store to meet the other ranks in")
    prefix = f"commlib/shrink/{name}"
    decision = f"{prefix}/decision"
    size = len(world_ranks)
    deadline = time.monotonic() + timeout.total_seconds()
    seen: dict[int, str] = {}
    try:
        mine = ",".join(map(str, sorted(exclude)))
        kv.set(f"{prefix}/here/{rank}", f"{_BROKEN if broken else ''}{mine}")
        while not kv.check([decision]):
            here = [r for r in range(size) if kv.check([f"{prefix}/here/{r}"])]
            awaited = [
                r
                for r in range(size)
                if r not in here and r not in exclude and not _dead_here(kv, world_ranks[r], seen)
            ]
            if awaited and time.monotonic() < deadline:
                time.sleep(_POLL)
                continue
            left_out, any_broken = set(exclude), False
            for r in here:
                said = kv.get(f"{prefix}/here/{r}").decode()
                any_broken |= said.startswith(_BROKEN)
                left_out.update(_ranks(said.removeprefix(_BROKEN)))
            keep = [r for r in here if r not in left_out]
            flag = _BROKEN if any_broken else ""
            kv.compare_set(decision, "", flag + ",".join(map(str, keep)))
        said = kv.get(decision).decode()
        keep, any_broken = _ranks(said.removeprefix(_BROKEN)), said.startswith(_BROKEN)
    except CommError:
        raise
    except Exception as exc:  # the store is gone: its host died (rank 0 with env://)
        _world.store_failed(exc)
        raise CommError(_store_gone(f"{type(exc).__name__}: {exc}")) from exc
    if keep and rank == keep[0]:
        _note_left_out(kv, world_ranks, keep)
    if rank not in keep:
        raise CommError(
            f"shrink: rank {rank} was left out of the new group (ranks going on: {keep}): it "
            "arrived after the others' timeout or another rank excluded it"
        )
    return keep, any_broken
