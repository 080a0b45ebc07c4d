"""What torch.distributed's process-group registry says: is it started, is a group still known."""

from __future__ import annotations

import datetime
import gc
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from commlib import _torch_facts as torch_facts
from commlib.types import Group

__all__ = [
    "DESTROYED",
    "dist_ready",
    "engine_group",
    "is_destroyed",
    "is_served",
    "release_group",
    "torch_backend_name",
]


def dist_ready() -> bool:
    """Whether torch.distributed is available and initialised.

    Examples:
        >>> dist_ready()          # a plain single-process run
        False
    """
    return dist.is_available() and dist.is_initialized()


#: what a process group torch no longer knows (``destroy_process_group(group)``) is
DESTROYED = (
    "its process group was destroyed (torch.distributed.destroy_process_group); create a new group"
)


def is_destroyed(group: Any) -> bool:
    """Whether torch no longer knows ``group``: ``destroy_process_group(group)`` ended it.

    Examples:
        >>> is_destroyed(None)
        False
    """
    if group is None or not dist_ready() or group is dist.GroupMember.NON_GROUP_MEMBER:
        return False
    try:
        return group not in torch_facts.group_map()  # torch's registry
    except AttributeError:  # a torch without it: nothing known is destroyed
        return False


def torch_backend_name(group: Group) -> str:
    """The torch.distributed backend serving ``group`` (``None``: the world's).

    Examples:
        >>> torch_backend_name(None)  # doctest: +SKIP
        'gloo'
    """
    return str(dist.get_backend(group if group is not dist.GroupMember.WORLD else None))


def release_group(group: Any) -> None:
    """Let go of ``group``'s engine resources (threads, sockets): a group shrink replaced.

    ``destroy_process_group(group)`` for a group torch knows, other than the
    world's (destroying the world would end every group, the new one too; a
    grow lets go of the old world as a whole). The sockets close when the last
    reference to the group goes: a communicator is a reference cycle (its
    lanes hold it), so the groups of communicators already dropped are
    collected here too (a failure path: the collection's cost is no call's).
    Never raises: a broken group that fails to shut down is dropped all the same.

    Examples:
        >>> release_group(None)
    """
    if not dist_ready() or group is None or is_destroyed(group):
        return
    if group is dist.GroupMember.NON_GROUP_MEMBER or group is dist.GroupMember.WORLD:
        return
    try:
        dist.destroy_process_group(group)
    except Exception:  # a broken engine may fail to shut down; torch forgets the group anyway
        pass
    gc.collect()


def build_group(
    group: Group,
    keep: Sequence[int],
    name: str,
    timeout: datetime.timedelta,
    torch_backend: str | None,
    plugin_name: str,
) -> Group:
    """A new group of ``torch_backend`` over ``keep`` (ranks of ``group``), made by them alone.

    What :meth:`commlib.Backend.shrink_group` does by default: torch's private
    group builder over the world's store, as ``new_group`` builds one but
    without the ranks that are gone; ``NotImplementedError`` where this torch
    lacks a private name it needs.
    """
    world_ranks = dist.get_process_group_ranks(group)
    members = [world_ranks[r] for r in keep]
    try:
        build = torch_facts.new_process_group_helper()
        world = torch_facts.c10d_world()
        store = torch_facts.default_store()
        group_name: Any = getattr(c10d, "GroupName", str)(name)
    except AttributeError as exc:  # a private torch name gone: say so instead of guessing
        raise NotImplementedError(
            f"backend {plugin_name!r} cannot shrink a group with this torch "
            f"({torch.__version__}): {exc}"
        ) from exc
    new, _ = build(
        len(members),
        members.index(dist.get_rank()),
        members,
        torch_backend,
        store,
        group_name,
        timeout=timeout,
        group_desc=f"commlib shrink of {getattr(group, 'group_name', 'world')}",
    )
    world.pg_group_ranks[new] = {g: i for i, g in enumerate(members)}
    return new


def is_served(group: Any) -> bool:
    """Whether ``group`` is a torch process group commlib serves (a ``commlib`` backend's).

    Examples:
        >>> is_served(None)
        False
    """
    # asked of the class: the group's own communicator property makes one when read
    return getattr(type(group), "commlib_served", False) is True


def engine_group(group: Any) -> Any:
    """The plugin's own group under a ``commlib`` group (its communicator's); else ``group``.

    Examples:
        >>> engine_group(None) is None
        True
    """
    return group.inner if is_served(group) else group


class TorchNamed:
    """The name and description torch gives a group written in Python.

    torch names its groups through ``_set_group_name`` / ``_set_group_desc``
    and reads them back as properties; the C++ side of a Python group keeps
    neither. Listed before ``ProcessGroup`` among a group class's bases.

    Examples:
        >>> class Named(TorchNamed): ...
        >>> g = Named(); g._set_group_name("3"); g.group_name, g.group_desc
        ('3', '')
    """

    def _set_group_name(self, name: str) -> None:
        self._name = name

    @property
    def group_name(self) -> str:
        return getattr(self, "_name", "")

    def _set_group_desc(self, desc: str) -> None:
        self._desc = desc

    @property
    def group_desc(self) -> str:
        return getattr(self, "_desc", "")
