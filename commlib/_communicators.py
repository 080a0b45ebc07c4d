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
    served = dist.group.WORLD if group is None and dist_ready() else group
    if is_served(served):
        # a group commlib serves to torch (commlib.torch_backend): the communicator it runs on
        return communicator_of(served)
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
