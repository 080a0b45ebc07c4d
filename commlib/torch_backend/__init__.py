"""torch.distributed backends served by commlib: unmodified torch programs on any plugin.

``dist.init_process_group("commlib-gloo")`` (or ``"commlib"`` for the
machine's default plugin, ``"commlib-mpi"`` under ``mpiexec``) starts a world
whose every collective, torch's own and those of DDP, FSDP, DeviceMesh and
checkpointing, goes through a :class:`~commlib.Communicator` over that
plugin: its argument check, timeout, observers and flight recorder.
``commlib.init_dist(..., serve_torch=True)`` does the same from commlib.

* :mod:`~commlib.torch_backend.registration`: the names and how torch finds
  them (its ``torch.distributed.backends`` entry points on 2.14+, ``import
  commlib`` before), shared with the mpi plugin's ``mpi4py`` group;
* :mod:`~commlib.torch_backend.process_group`: the group torch calls;
* :mod:`~commlib.torch_backend.shrinking`: :func:`shrink`, a torch group over
  the ranks still alive after a failure.

Examples:
    >>> import torch.distributed as dist
    >>> dist.init_process_group("commlib-gloo", rank=0, world_size=1,
    ...                         store=dist.HashStore())           # doctest: +SKIP
    >>> comm = communicator_of(dist.group.WORLD)                   # doctest: +SKIP
"""

from __future__ import annotations

from typing import Any

# what the communicator asks of a group below this package, named here too
from commlib._torch_groups import engine_group as engine_group
from commlib._torch_groups import is_served as is_served
from commlib.torch_backend.registration import PREFIX, commlib_name, plugin_of, register_all
from commlib.torch_backend.shrinking import shrink

__all__ = [
    "PREFIX",
    "commlib_name",
    "communicator_of",
    "engine_group",
    "is_served",
    "plugin_of",
    "register_all",
    "shrink",
]


def communicator_of(group: Any) -> Any:
    """The :class:`~commlib.Communicator` performing a ``commlib`` group's collectives.

    Examples:
        >>> communicator_of(dist.group.WORLD).backend   # a commlib-gloo world  # doctest: +SKIP
        'gloo'
    """
    if not is_served(group):
        raise ValueError(f"{group!r} is not a process group of a commlib torch backend")
    return group.communicator
