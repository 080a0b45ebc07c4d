"""World ranks and group ranks: what ``src`` / ``dst`` mean at the module level.

torch.distributed, and mmengine.dist which hands them on, read ``src`` / ``dst``
as *world* (global) ranks even when a ``group=`` is given, and since torch 2.6
take ``group_src`` / ``group_dst`` for a rank within the group. A
:class:`~commlib.Communicator` speaks group ranks only. The module-level
functions therefore translate once, here, before anything is sent:

* ``group=`` a torch ``ProcessGroup``: ``src`` is a world rank, ``group_src`` a
  group rank (torch's convention);
* ``group=`` a Communicator, or ``None`` (the world, where both numbers are the
  same): both name a rank within the group.

Messages about a rank give both numbers, so a reader never has to guess which
one was meant.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

import torch.distributed as dist

from commlib.communicator import Communicator
from commlib.errors import NotInGroupError, RemoteError
from commlib.handle import ResultHandle
from commlib.p2p import P2POp
from commlib.types import Timeout


def is_torch_group(group: Any) -> bool:
    """Whether ``group`` is a torch ``ProcessGroup`` (world ranks), not a Communicator.

    Examples:
        >>> is_torch_group(None), is_torch_group(comm)
        (False, False)
        >>> is_torch_group(dist.group.WORLD)   # after init_process_group  # doctest: +SKIP
        True
    """
    return group is not None and not isinstance(group, Communicator)


def _world_rank_of_this_process() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def describe(comm: Communicator, group_rank: int) -> str:
    """``"2 (world rank 3)"``: a group rank with its world rank, when they differ.

    Examples:
        >>> describe(comm, 0)                  # the world: the numbers agree
        '0'
        >>> pair = commlib.new_group([1, 3])   # in a world of 4  # doctest: +SKIP
        >>> describe(pair, 1)                  # doctest: +SKIP
        '1 (world rank 3)'
    """
    members = comm.ranks
    if 0 <= group_rank < len(members) and members[group_rank] != group_rank:
        return f"{group_rank} (world rank {members[group_rank]})"
    return str(group_rank)


def _check_int(value: Any, name: str, call: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{call}: {name} must be an int rank, got {type(value).__name__}")


def group_rank(
    comm: Communicator,
    call: str,
    name: str,
    rank: int | None,
    rank_in_group: int | None,
    *,
    world_ranks: bool,
) -> int:
    """The group rank a module-level call means by ``name=rank`` / ``group_<name>=rank_in_group``.

    ``world_ranks`` says whether ``rank`` is a world rank (``group=`` was a torch
    ProcessGroup). Neither given means the group's first rank, which is world
    rank 0 whenever world rank 0 is a member (torch orders a group's ranks).
    Raises ``TypeError`` / ``ValueError`` for a bad rank and
    :class:`~commlib.errors.NotInGroupError` when this process is outside the
    group, all before anything is sent.

    Examples:
        >>> # world ranks 1 and 2 of a world of 3 or more:
        >>> pair = commlib.get_communicator(dist.new_group([1, 2]))  # doctest: +SKIP
        >>> group_rank(pair, "broadcast", "src", 2, None, world_ranks=True)  # doctest: +SKIP
        1
        >>> group_rank(pair, "broadcast", "src", None, 1, world_ranks=True)  # doctest: +SKIP
        1
        >>> group_rank(pair, "broadcast", "src", 0, None, world_ranks=True)  # doctest: +SKIP
        Traceback (most recent call last):
        ValueError: broadcast: src=0 is not a member of the group (world ranks [1, 2]); ...
    """
    group_name = f"group_{name}"
    if rank is not None:
        _check_int(rank, name, call)
    if rank_in_group is not None:
        _check_int(rank_in_group, group_name, call)
    if not comm.is_member:
        raise NotInGroupError(
            f"{call}: this process (world rank {_world_rank_of_this_process()}) is not a "
            "member of the group"
        )
    size, members = comm.world_size, comm.ranks
    if rank is not None and rank_in_group is not None:
        raise ValueError(
            f"{call}: pass {name} (a {'world' if world_ranks else 'group'} rank) or "
            f"{group_name} (a rank within the group), not both; got {name}={rank} and "
            f"{group_name}={describe(comm, rank_in_group)}"
        )
    if rank_in_group is not None:
        if not 0 <= rank_in_group < size:
            raise ValueError(
                f"{call}: {group_name}={rank_in_group} is out of range for a group of {size} "
                f"ranks (0..{size - 1}; world ranks {members})"
            )
        return rank_in_group
    if rank is None:
        return 0
    if world_ranks:
        if rank not in members:
            raise ValueError(
                f"{call}: {name}={rank} is not a member of the group (world ranks {members}); "
                f"{name} is a world rank with a torch ProcessGroup, {group_name}= takes a rank "
                "within the group"
            )
        return members.index(rank)
    if not 0 <= rank < size:
        raise ValueError(
            f"{call}: {name}={rank} is out of range for a group of {size} ranks "
            f"(0..{size - 1}; world ranks {members})"
        )
    return rank


class world_ranks_in_errors:
    """Re-raise a :class:`~commlib.errors.RemoteError` of a subgroup with world ranks added.

    Its ``failures`` stay keyed by group rank (as documented); the message
    adds which world ranks those are, when the numbers differ. (A class, not a
    generator: it wraps every module-level call that takes a root rank.)

    Examples:
        >>> pair = commlib.new_group([1, 3])   # in a world of 4  # doctest: +SKIP
        >>> with world_ranks_in_errors(pair):   # a rank fails to pickle  # doctest: +SKIP
        ...     pair.broadcast_object_list(box, src=1)
        Traceback (most recent call last):
        RemoteError: broadcast_object_list failed on rank(s) [1] (world rank(s) [3]): ...
    """

    __slots__ = ("comm",)

    def __init__(self, comm: Communicator):
        self.comm = comm

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: Any, err: BaseException | None, tb: Any) -> Literal[False]:
        if not isinstance(err, RemoteError):
            return False
        comm = self.comm
        members = comm.ranks if comm.is_member else []
        failed = sorted(err.failures)
        if not members or all(members[r] == r for r in failed if 0 <= r < len(members)):
            return False
        world = [members[r] if 0 <= r < len(members) else r for r in failed]
        head = err.summary or f"failed on rank(s) {failed}"
        try:
            annotated = type(err)(err.collective, err.failures, f"{head} (world rank(s) {world})")
        except Exception:  # a subclass with another constructor keeps its own message
            return False
        raise annotated from err


# -- the module-level functions' roots and peers ---------------------------------------
def root(comm: Communicator, call: str, name: str, rank: Any, in_group: Any, group: Any) -> int:
    """The group rank ``src``/``dst`` (or ``group_src``/``group_dst``) names; see commlib.ranks.

    A root only this rank got wrong fails every rank of a collective at once
    (:meth:`Communicator.refusing`), as the communicator's own methods do; the
    error names world ranks as the other ranks' does.
    """
    if in_group is None and (group is None or isinstance(group, Communicator)):
        # the usual call: a rank within the group, or none (the group's first): known
        # good without the checks below, which cost more than a small collective's call
        size = comm.world_size
        if rank is None and size > 0:
            return 0
        if type(rank) is int and 0 <= rank < size:
            return rank
    with world_ranks_in_errors(comm), comm.refusing(call):
        return group_rank(comm, call, name, rank, in_group, world_ranks=is_torch_group(group))


def peer(comm: Communicator, call: str, name: str, rank: Any, in_group: Any, group: Any) -> int:
    """The group rank of a send's ``dst`` / a receive's ``src``; one of the two is required."""
    if rank is None and in_group is None:
        raise ValueError(f"{call} needs {name} (or group_{name}): the rank to exchange with")
    return root(comm, call, name, rank, in_group, group)


class SenderHandle:
    """An async ``recv_object_list``'s handle whose ``wait()`` names the sender by world rank.

    (torch names the sender of a receive on a torch group by its world rank.)
    """

    def __init__(self, handle: ResultHandle[int], rank: int):
        self._handle, self._rank = handle, rank

    def wait(self, timeout: Timeout = None) -> int:
        self._handle.wait(timeout)
        return self._rank

    def complete(self, timeout: Timeout = None) -> None:
        self._handle.complete(timeout)

    def is_completed(self) -> bool:
        return self._handle.is_completed()

    def add_done_callback(self, callback: Callable[[BaseException | None], None]) -> None:
        self._handle.add_done_callback(callback)

    def __repr__(self) -> str:
        return repr(self._handle)


def batch_group(p2p_op_list: Any) -> Any:
    """The group every op of a ``batch_isend_irecv`` batch names, checked.

    Examples:
        >>> batch_group([P2POp("isend", torch.ones(1), 0)]) is None
        True
    """
    if not isinstance(p2p_op_list, (list, tuple)) or not p2p_op_list:
        raise ValueError("batch_isend_irecv needs a non-empty list of P2POp")
    group = getattr(p2p_op_list[0], "group", None)
    if any(getattr(op, "group", None) is not group for op in p2p_op_list):
        raise ValueError("batch_isend_irecv: every P2POp of a batch must name the same group")
    return group


def batch_in_group(comm: Communicator, p2p_op_list: Any, group: Any) -> list[P2POp]:
    """The batch's ops with their peers as ranks of ``comm``'s group (torch's P2POp too)."""
    ops = []
    for i, op in enumerate(p2p_op_list):
        if not isinstance(op, P2POp) and not all(
            hasattr(op, a) for a in ("op", "tensor", "peer", "tag")
        ):
            raise TypeError(f"p2p_op_list[{i}] is not a P2POp: {op!r:.60}")
        world_peer, group_peer = op.peer, getattr(op, "group_peer", None)
        if isinstance(op, dist.P2POp) and group_peer is not None:
            world_peer = None  # torch's P2POp fills both, one from the other
        rank = peer(comm, "batch_isend_irecv", "peer", world_peer, group_peer, group)
        ops.append(P2POp(op.op, op.tensor, rank, tag=op.tag))
    return ops
