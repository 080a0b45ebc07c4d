"""The communicator per process group, one per process: the cache behind ``group=`` arguments.

Its state lives in :data:`commlib._world.world`; :mod:`commlib.functional`
gives these functions their public names. Above the communicator, below
everything that turns a ``group`` into one (helpers, functional, launch).
"""

from __future__ import annotations

from typing import Any

import torch.distributed as dist

from commlib._torch_groups import DESTROYED, dist_ready, is_destroyed
from commlib._world import world
from commlib.communicator import Communicator
from commlib.torch_backend import communicator_of, is_served


def communicator_for(group: Any = None) -> Communicator:
    """The communicator for ``group`` (made once per process group, then cached).

    Examples:
        >>> communicator_for().world_size     # not distributed
        1
    """
    if isinstance(group, Communicator):
        return group
    if is_destroyed(group):
        with world.lock:
            world.communicators.pop(group, None)
        raise ValueError(f"group {group!r}: {DESTROYED}")
    current = dist.group.WORLD if dist_ready() else None
    with world.lock:
        if world.communicators_world is not current:  # the world was (re)initialised or destroyed
            world.communicators.clear()
            world.communicators_world = current
        key = current if group is None else group
        comm: Communicator | None = world.communicators.get(key)
        if comm is None:
            if is_served(key):
                # a group commlib serves to torch (commlib.torch_backend): the one its calls use
                comm = world.communicators[key] = communicator_of(key)
            else:
                comm = world.communicators[key] = Communicator(group)
            world.forget_communicators_at_exit()
        return comm


def set_default(comm: Communicator) -> None:
    """Serve ``group=None`` calls with ``comm`` from now on.

    Examples:
        >>> set_default(Communicator())
    """
    communicator_for()  # bring the cache up to date with the current world
    with world.lock:
        world.communicators[world.communicators_world] = comm


def remember_local(comm: Communicator) -> None:
    """Keep ``comm`` as this machine's group in the current world (init_local_group's).

    Examples:
        >>> remember_local(node)  # doctest: +SKIP
    """
    with world.lock:
        world.communicators[comm.group] = comm  # communicator_for(its group) is this one
        world.local_world, world.local_communicator = dist.group.WORLD, comm


def local_communicator() -> Communicator | None:
    """init_local_group's communicator, if one was made in the current world.

    Examples:
        >>> local_communicator() is None      # init_local_group was not called
        True
    """
    if not dist_ready() or world.local_world is not dist.group.WORLD:
        return None
    comm: Communicator | None = world.local_communicator
    return comm


def init_local_group(
    node_rank: int, num_gpus_per_node: int, world_comm: Communicator | None
) -> None:
    """:func:`commlib.init_local_group` on ``world_comm`` (``None``: not distributed)."""
    for name, value, least in (
        ("node_rank", node_rank, 0),
        ("num_gpus_per_node", num_gpus_per_node, 1),
    ):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"init_local_group: {name} must be an int, got {type(value).__name__}")
        if value < least:
            raise ValueError(f"init_local_group: {name} must be at least {least}, got {value}")
    if world_comm is None:
        return
    if local_communicator() is not None:
        raise RuntimeError("init_local_group was already called in this world")
    claims = world_comm.all_gather_object((node_rank, num_gpus_per_node))
    wrong = {
        r: f"node_rank={n}, num_gpus_per_node={g}"
        for r, (n, g) in enumerate(claims)
        if g != num_gpus_per_node or r // g != n
    }
    if wrong:  # the same answer on every rank: all ranks saw every claim
        per_rank = "; ".join(f"rank {r}: {w}" for r, w in wrong.items())
        raise ValueError(
            "init_local_group: every rank must pass the same num_gpus_per_node and the "
            f"node_rank that holds it (rank // num_gpus_per_node); got {per_rank}"
        )
    size, per_node = world_comm.world_size, num_gpus_per_node
    mine = None
    for first in range(0, size, per_node):
        node = world_comm.new_group(range(first, min(first + per_node, size)))
        if node.is_member:
            mine = node
    if mine is None:  # every rank is in one machine's group, so this cannot happen
        raise RuntimeError("init_local_group: this rank is in no machine's group")
    remember_local(mine)


def local_group() -> Any:
    """The torch group of this machine's ranks, made by :func:`init_local_group`."""
    comm = local_communicator()
    if comm is None:
        raise RuntimeError(
            "the local process group is not created: call "
            "init_local_group(node_rank, num_gpus_per_node) first"
        )
    return comm.group
