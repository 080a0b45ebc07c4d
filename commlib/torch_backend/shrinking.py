"""Shrink for torch's own groups commlib serves: a torch group over the ranks still alive.

torch's groups cannot change size: a ``ProcessGroup``'s rank and size are
fixed when it is made, torch's registry and everything built on the group
(DDP's reducer, a DeviceMesh) keep them, and the default group's size is
``dist.get_world_size()``. So a group commlib serves is not shrunk in place:
:func:`shrink` gives a *new* torch group over the survivors, served by the
communicator :meth:`~commlib.Communicator.shrink` gives (the same agreement
on who is alive, no second engine group), registered with torch as
``new_group`` registers one, so ``dist.*(..., group=new)`` and
``DDP(model, process_group=new)`` run on it. The old group stays broken:
its calls raise at once.

Examples:
    >>> try:                                                       # doctest: +SKIP
    ...     ddp(x).sum().backward()
    ... except (commlib.RankLostError, commlib.CommTimeoutError):
    ...     group = commlib.torch_backend.shrink(group)
    ...     ddp = DDP(model, process_group=group)
"""

from __future__ import annotations

import threading
from typing import Any

import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from commlib import _torch_facts as torch_facts
from commlib._torch_groups import engine_group, is_served
from commlib.communicator import Communicator
from commlib.types import Timeout

__all__ = ["adopted", "shrink"]

# the shrunk communicator the group torch is making now is to be served by (the creator
# torch calls reads it: no engine group of its own is made then)
_adopting = threading.local()


def adopted() -> Communicator | None:
    """The communicator a group torch is making in this thread must serve (``None``: a new one).

    Examples:
        >>> adopted() is None
        True
    """
    return getattr(_adopting, "comm", None)


def shrink(group: Any, exclude: Any = None, timeout: Timeout = None) -> dist.ProcessGroup:
    """A new torch group of ``group``'s ranks still alive, served by its shrunk communicator.

    Every surviving rank calls it (as :meth:`~commlib.Communicator.shrink`,
    with the same ``exclude`` and ``timeout``); ranks are renumbered in
    order. Use the new group where the old one was named (``group=``,
    ``process_group=``); torch's default group, where ``group`` was the
    world, keeps its size: pass the new group explicitly.

    Raises ``ValueError`` for a group commlib does not serve, and what
    :meth:`~commlib.Communicator.shrink` raises (the same ``ValueError``
    on every rank when no rank was lost).

    Examples:
        >>> survivors = shrink(dist.group.WORLD)       # a commlib-gloo world  # doctest: +SKIP
        >>> dist.all_reduce(torch.ones(2), group=survivors)                   # doctest: +SKIP
    """
    if not is_served(group):
        raise ValueError(
            f"{group!r} is not a process group of a commlib torch backend: "
            "commlib.torch_backend.shrink shrinks the groups commlib serves"
        )
    shrunk = group.communicator.shrink(exclude, timeout)
    inner = engine_group(shrunk.group)
    members = dist.get_process_group_ranks(inner)
    name: Any = getattr(c10d, "GroupName", str)(f"{inner.group_name}/{group.getBackendName()}")
    _adopting.comm = shrunk
    try:
        new, _ = torch_facts.new_process_group_helper()(
            len(members),
            members.index(dist.get_rank()),
            members,
            group.getBackendName(),
            torch_facts.default_store(),
            name,
            timeout=group.timeout,
            group_desc=f"shrink of {group.group_name or 'the world'}",
        )
    finally:
        _adopting.comm = None
    torch_facts.c10d_world().pg_group_ranks[new] = {g: i for i, g in enumerate(members)}
    return new
