"""Group membership: what a child communicator inherits, and the checks of group changes.

``new_group``, ``split``, ``shrink`` and ``grow`` each make a communicator
from another one. What the child keeps of its parent is one record,
:class:`Settings` (torchcomms' options record): the backend, the serializer,
the timeout, the first rounds' slot size, the argument check's strictness and
``check_finite``. The communicator derives every child from it in one place
(:func:`derive`), so a setting added later reaches every child.
The group changes' bodies are here too (``derive_new_group``, ``derive_split``,
``derive_shrunk``, ``derive_grown``): the communicator's methods are their
documentation and their frame.

The argument checks the group changes share live here too, as functions of
plain values: every rank computes the same answer from the same table.

Examples:
    >>> settings = Settings.of(comm)
    >>> settings.slot_size, settings.strict
    (4096, None)
    >>> settings.replace(timeout=datetime.timedelta(seconds=5)).timeout
    datetime.timedelta(seconds=5)
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Callable, Collection, Sequence
from typing import TYPE_CHECKING, Any

import torch.distributed as dist

from commlib import _check_round, _failure_notes, _newcomers, _split, _steps, _survivors
from commlib import _validation as check
from commlib._engine import Engine, engine_limit
from commlib._launched import warn_if_launched_without_init
from commlib._settings import as_timedelta
from commlib._torch_groups import release_group
from commlib.errors import CommError, NotInGroupError, RemoteArgumentError

if TYPE_CHECKING:
    from commlib.backend import Backend
    from commlib.serialization import Serializer
    from commlib.types import Timeout


@dataclasses.dataclass(frozen=True)
class Settings:
    """What a child communicator inherits from its parent (``Communicator``'s keywords)."""

    backend: Backend
    serializer: Serializer
    timeout: datetime.timedelta
    slot_size: int
    strict: bool | None
    check_finite: bool

    @classmethod
    def of(cls, comm: Any) -> Settings:
        """The settings ``comm`` runs with now (its public attributes)."""
        return cls(
            comm.plugin,
            comm.serializer,
            comm.timeout,
            comm.slot_size,
            comm.strict,
            comm.check_finite,
        )

    def replace(self, **changes: Any) -> Settings:
        """These settings with ``changes`` (a child's own timeout, say)."""
        return dataclasses.replace(self, **changes)

    def keywords(self) -> dict[str, Any]:
        """The settings as ``Communicator``'s keyword arguments."""
        return {field.name: getattr(self, field.name) for field in dataclasses.fields(self)}


def world_ranks_of(
    ranks: list[int], size: int | None, known: list[int] | None, distributed: bool
) -> list[int] | None:
    """``ranks`` of a group as world ranks, checked; ``None`` where they are unknown here.

    ``size`` is the group's size where this process knows it (a member, or a
    non-member told its ranks: ``known``), else ``None``.

    Examples:
        >>> world_ranks_of([1, 0], 2, [4, 6], distributed=True)
        [6, 4]
        >>> world_ranks_of([0, 0], 2, [4, 6], distributed=True)
        Traceback (most recent call last):
        ...
        ValueError: new_group got duplicate ranks: [0, 0]
    """
    if not ranks:
        raise ValueError("new_group needs at least one rank")
    if size is not None:
        for r in ranks:
            check.rank_in_range(r, size, f"new_group({list(ranks)}): rank")
    if len(set(ranks)) != len(ranks):
        raise ValueError(f"new_group got duplicate ranks: {ranks}")
    if not distributed:
        return list(ranks)
    return None if known is None else [known[r] for r in ranks]


@dataclasses.dataclass(frozen=True)
class NewGroupPlan:
    """What one rank brings to ``new_group``'s round: its list, checked, or its refusal."""

    ranks: list[int]
    world_ranks: list[int] | None
    limit: datetime.timedelta
    described: str
    refused: ValueError | TypeError | None = None


def plan_new_group(
    ranks: Any,
    timeout: Any,
    default: datetime.timedelta,
    world_ranks_of: Callable[[list[int]], list[int] | None],
    distributed: bool,
) -> NewGroupPlan:
    """This rank's ``new_group(ranks, timeout)``, checked (``world_ranks_of``: the group's check).

    In a distributed job a mistake only this rank made is kept for the round:
    the other ranks are in it already, and every rank raises alike.

    Examples:
        >>> same = lambda ranks: ranks
        >>> plan_new_group([0], None, datetime.timedelta(seconds=9), same, True).described
        'world ranks [0]'
        >>> plan_new_group(3, None, datetime.timedelta(seconds=9), same, True).refused
        TypeError("'int' object is not iterable")
    """
    try:
        listed = list(ranks)
        world_ranks = world_ranks_of(listed)
        limit = as_timedelta(timeout) or default
    except (ValueError, TypeError) as exc:
        if not distributed:
            raise
        return NewGroupPlan([], None, default, f"refused: {exc}", exc)
    described = (
        f"world ranks {world_ranks}"
        if world_ranks is not None
        else "refused: this process is not a member of the group it was asked to "
        "divide and does not know its ranks"
    )
    return NewGroupPlan(listed, world_ranks, limit, described)


def agree_new_group(
    world: Engine | None, plan: NewGroupPlan, serializer: Serializer, slot_size: int
) -> list[int]:
    """The new group's world ranks, once every world rank passed the same list.

    torch's new_group waits in the store for every world rank with the same
    list, without a bound: ranks that differ (or a non-member that cannot
    translate, or a rank that refused its own list) are an error on every
    rank, after one round of the argument check over the ``world``'s engine.

    Examples:
        >>> plan = plan_new_group([0], None, datetime.timedelta(seconds=9), list, False)
        >>> agree_new_group(None, plan, comm.serializer, 4096)
        [0]
    """
    if world is not None:  # commlib's own round: not a collective observers see
        if _steps.pending():  # it goes after the world's unfinished handles, as a call would
            _steps.finish_pending(world.group)
        _check_round.agree(world, "new_group", plan.described, serializer, slot_size)
    if plan.refused is not None:  # every rank refused alike
        raise plan.refused
    if plan.world_ranks is None:
        raise NotInGroupError(f"new_group({plan.described})")
    return plan.world_ranks


@dataclasses.dataclass(frozen=True)
class SplitOffer:
    """What one rank says in ``split``'s round: ``(color, key)``, or its refusal."""

    said: Any
    color: int | None
    limit: datetime.timedelta
    refused: Exception | None = None


def split_offer(
    color: Any, key: Any, rank: int, timeout: Any, default: datetime.timedelta
) -> SplitOffer:
    """This rank's ``split(color, key, timeout=timeout)``, checked; a refusal is said, not raised.

    Examples:
        >>> split_offer(1, None, 3, None, datetime.timedelta(seconds=9)).said
        (1, 3)
        >>> split_offer(-1, None, 0, None, datetime.timedelta(seconds=9)).said[0]
        'refused'
    """
    try:
        mine = _split.checked(color, key, rank)
        limit = as_timedelta(timeout) or default
    except (ValueError, TypeError) as exc:
        return SplitOffer(("refused", f"{type(exc).__name__}: {exc}"), None, default, exc)
    return SplitOffer(mine, mine[0], limit)


def split_refusals(table: list[Any], refused: Exception | None) -> None:
    """Raise on every rank alike when a rank's ``split`` arguments were refused.

    ``table`` holds every rank's ``(color, key)``, or ``("refused", text)``;
    ``refused`` is this rank's own error. Every rank made the same mistake:
    its own error; otherwise a :class:`~commlib.errors.RemoteArgumentError`.

    Examples:
        >>> split_refusals([(0, 0), (1, 1)], None)
    """
    refusals = {r: t[1] for r, t in enumerate(table) if t[0] == "refused"}
    if not refusals:
        return
    if refused is not None and len(refusals) == len(table) and len(set(refusals.values())) == 1:
        raise refused  # every rank made the same mistake: its own error
    raise RemoteArgumentError("split", refusals, refused=True)


def shrink_excluded(exclude: Sequence[int] | None, world_size: int, rank: int) -> list[int]:
    """The ranks ``shrink`` leaves out by name, checked.

    Examples:
        >>> shrink_excluded([2], 4, 0)
        [2]
        >>> shrink_excluded([0], 4, 0)
        Traceback (most recent call last):
        ...
        ValueError: rank 0 excludes itself: an excluded rank does not call shrink
    """
    excluded = list(exclude or [])
    for r in excluded:
        check.rank_in_range(r, world_size, "exclude")
    if rank in excluded:
        raise ValueError(f"rank {rank} excludes itself: an excluded rank does not call shrink")
    return excluded


def grow_refusal(
    count: Any, distributed: bool, whole_job: bool, plugin: Backend
) -> ValueError | TypeError | None:
    """Why ``grow`` cannot run with ``count`` on this communicator, or ``None``.

    Examples:
        >>> grow_refusal(0, True, True, comm.plugin)
        ValueError('count must be at least 1, got 0')
    """
    if count is not None and (isinstance(count, bool) or not isinstance(count, int)):
        return TypeError(f"count must be an int or None, got {type(count).__name__}")
    if count is not None and count < 1:
        return ValueError(f"count must be at least 1, got {count}")
    if not distributed:
        return ValueError(
            "grow needs a distributed job (started with `commlib run`, torchrun or "
            "init_dist): a single process has no store for newcomers to ask in"
        )
    if not whole_job:
        return ValueError(
            "grow: this communicator is a subgroup; the whole job grows (the world's "
            "communicator, or what shrink made of it)"
        )
    if plugin.own_rendezvous:
        return ValueError(
            f"grow: backend {plugin.name!r} finds its ranks itself (its launcher's "
            "processes): it cannot take in a newcomer"
        )
    return None


# -- the engine's side of shrink and grow ---------------------------------------------------
def shrink(
    engine: Engine,
    world_ranks: Sequence[int],
    exclude: Collection[int],
    timeout: datetime.timedelta | None = None,
) -> tuple[Any, list[int]]:
    """The surviving ranks' new group (``engine``'s group shrunk), and which of its ranks it holds.

    Every surviving rank calls it; ``world_ranks`` are the group's
    members' world ranks in group order, ``exclude`` ranks of this group
    to leave out. Ranks that do not arrive within ``timeout`` are left
    out; by default as long as a survivor may still be inside a call of
    this group (the engine's limit, and the time to name missing ranks).
    This group is broken afterwards, and let go
    (:func:`~commlib._torch_groups.release_group`). When every rank
    arrived, none excluded any and the group broke on none of them,
    nothing is made: every rank raises the same ``ValueError``
    (:func:`~commlib._survivors.nothing_lost`).

    Examples:
        >>> group, kept = shrink(engine, [0, 1, 2, 3], {3})  # doctest: +SKIP
        >>> kept  # doctest: +SKIP
        [0, 1, 2]
    """
    if timeout is None:
        grace = datetime.timedelta(seconds=_failure_notes.GRACE)
        timeout = engine_limit(engine.timeout) + grace
    if engine.on_call is not None:
        engine.on_call("shrink")
    attempt = engine.health.shrinks
    engine.health.shrinks += 1
    name = f"{getattr(engine.group, 'group_name', '') or 'world'}.shrunk{attempt}"
    broken = engine.health.broken is not None
    keep, broken = _survivors.agree(name, engine.rank, world_ranks, exclude, timeout, broken)
    if not broken and len(keep) == len(world_ranks):
        raise ValueError(_survivors.nothing_lost(len(keep)))
    try:
        group = engine.shrink_group(keep, name, timeout)
    except (RuntimeError, NotImplementedError) as exc:
        raise CommError(
            f"shrink: backend {engine.backend_name!r} could not build the group of ranks "
            f"{keep} on rank {engine.rank}: {exc}"
        ) from exc
    engine.health.mark_broken(f"shrunk into a group of ranks {keep}")
    # a job that recovers many times holds one group's sockets and threads, not many
    release_group(engine.group)
    return group, keep


def grow(
    engine: Engine,
    world_ranks: Sequence[int],
    count: int | None,
    wait: datetime.timedelta,
    timeout: datetime.timedelta,
) -> int | None:
    """Take the newcomers that asked to join into a new world; this rank's rank there.

    Every member calls it (``world_ranks``: the group's, in order); ``None``
    (and nothing changed) when no newcomer
    asked within ``wait`` (``count``: how many to wait for, at most). Else
    this process's world is replaced by the grown one (every group of the
    old world is destroyed; this one is broken) and the new world formed
    within ``timeout``, or without the processes that failed
    (:func:`commlib._newcomers.form`).

    Examples:
        >>> grow(engine, [0, 1], 1, timedelta(30), timedelta(60))  # doctest: +SKIP
        0
    """
    if engine.on_call is not None:
        engine.on_call("grow")
    address = _newcomers.store_address()
    kv = _newcomers.client(address, timeout)
    try:
        decided = _newcomers.decide(
            kv, world_ranks, count, wait, engine.plugin, timeout, engine.timeout
        )
    except Exception as exc:  # the store's host died (rank 0 with env://)
        raise CommError(f"grow: the job's store failed: {type(exc).__name__}: {exc}") from exc
    if decided is None:
        return None
    name, tickets = decided
    _newcomers.note_members(kv, name, _survivors.records(world_ranks))
    engine.health.mark_broken(f"grown into world {name} with {len(tickets)} newcomer(s)")
    size = engine.world_size + len(tickets)
    seconds = timeout.total_seconds(), engine.timeout.total_seconds()
    place = _newcomers.Place(name, engine.rank, size, engine.backend_name, *seconds)
    return _newcomers.form(engine.plugin, kv, place, timeout)


# -- the group changes' bodies (Communicator.new_group, split, shrink, grow) ---------------
# ``comm`` is the communicator called; every child comes from :func:`derive`.
def derive(
    comm: Any,
    group: Any,
    timeout: datetime.timedelta | None = None,
    *,
    outside_view: list[int] | None = None,
    whole_job: bool | None = None,
) -> Any:
    """The one way a communicator is made from ``comm``: over ``group``, with its settings.

    Every setting carries over (:class:`Settings`); ``timeout`` is the
    child's own where the call that makes it names one.

    Examples:
        >>> child = derive(comm, None, datetime.timedelta(seconds=5))
        >>> child.timeout, child.slot_size == comm.slot_size
        (datetime.timedelta(seconds=5), True)
    """
    settings = Settings.of(comm)
    if timeout is not None:
        settings = settings.replace(timeout=timeout)
    child = type(comm)(group, **settings.keywords())
    if outside_view is not None:
        child._outside_view = outside_view
    if whole_job is not None:
        child._whole_job = whole_job
    return child


def derive_new_group(
    comm: Any,
    ranks: Sequence[int],
    timeout: Timeout,
    members_only: bool,
    distributed: bool,
    world_engine: Callable[[datetime.timedelta], Engine | None],
) -> Any:
    """``comm.new_group(ranks, timeout, use_local_synchronization=members_only)``.

    ``world_engine(limit)``: the engine of the world, whose ranks agree on ``ranks``.
    """
    if members_only:
        ranks = list(ranks)
        world_ranks = _world_ranks_in(comm, ranks, distributed) or []
        if comm.rank not in ranks:
            raise ValueError(
                f"new_group(use_local_synchronization=True) is called by the members only; "
                f"rank {comm.rank} is not in {ranks}"
            )
        limit = as_timedelta(timeout) or comm.timeout
        return _members_only(comm, sorted(world_ranks), limit, distributed)
    plan = plan_new_group(
        ranks, timeout, comm.timeout, lambda r: _world_ranks_in(comm, r, distributed), distributed
    )
    if not distributed:
        comm.plugin.new_group(plan.ranks, plan.limit)
        return derive(comm, None, plan.limit)
    world_ranks = agree_new_group(world_engine(plan.limit), plan, comm.serializer, comm.slot_size)
    # a non-member of it can still divide it: its ranks in the group's order,
    # ascending world ranks as torch numbers them
    group = comm.plugin.new_group(world_ranks, plan.limit)
    return derive(comm, group, plan.limit, outside_view=sorted(world_ranks))


def derive_split(
    comm: Any,
    engine: Engine,
    color: int | None,
    key: int | None,
    timeout: Timeout,
    distributed: bool,
) -> Any:
    """``comm.split(color, key, timeout=timeout)``, ``engine`` its member's engine."""
    offer = split_offer(color, key, engine.rank, timeout, comm.timeout)
    said = offer.said
    table = comm.all_gather_object(said, timeout=timeout) if comm.world_size > 1 else [said]
    split_refusals(table, offer.refused)
    known = comm.ranks
    order = _split.members(table, offer.color)
    if not order:
        if distributed:
            # torch names a members-only group after how many groups each member
            # knows: a rank left out makes a group of its own, so that every rank
            # of this split still knows as many as the others afterwards
            comm.plugin.new_group([known[engine.rank]], offer.limit, members_only=True)
        return None
    # each group is made by its own members, all groups at once
    return _members_only(
        comm, [known[r] for r in order], offer.limit, distributed, keep_order=True
    )


def derive_shrunk(
    comm: Any, engine: Engine, exclude: Sequence[int] | None, timeout: Timeout, distributed: bool
) -> Any:
    """``comm.shrink(exclude, timeout)``, ``engine`` its member's engine."""
    excluded = shrink_excluded(exclude, engine.world_size, engine.rank)
    if not distributed:
        if engine.health.broken is None:  # a world of one: nothing can have been lost
            raise ValueError(_survivors.nothing_lost(1))
        return derive(comm, None)
    group, _ = shrink(engine, comm.ranks, set(excluded), as_timedelta(timeout))
    return derive(comm, group, whole_job=comm._whole_job)


def derive_grown(
    comm: Any,
    engine: Engine,
    count: int | None,
    wait: Timeout,
    timeout: Timeout,
    distributed: bool,
) -> Any:
    """``comm.grow(count, wait, timeout)``: ``comm`` itself when nobody asked to join."""
    refused = grow_refusal(count, distributed, comm._whole_job, comm.plugin)
    if refused is not None:
        raise refused
    waiting = (as_timedelta(wait) if wait else None) or datetime.timedelta(0)
    limit = as_timedelta(timeout) or comm.timeout
    if grow(engine, comm.ranks, count, waiting, limit) is None:
        return comm
    return derive(comm, None)  # the new world


def _members_only(
    comm: Any,
    world_ranks: list[int],
    limit: datetime.timedelta,
    distributed: bool,
    *,
    keep_order: bool = False,
) -> Any:
    """A communicator over ``world_ranks``, made by its members only, with ``comm``'s settings."""
    if not distributed:
        return derive(comm, None, limit)
    group = comm.plugin.new_group(world_ranks, limit, members_only=True, keep_order=keep_order)
    return derive(comm, group, limit, outside_view=list(world_ranks))


def _world_ranks_in(comm: Any, ranks: list[int], distributed: bool) -> list[int] | None:
    """``ranks`` of ``comm``'s group as world ranks, checked; ``None`` where unknown here.

    A non-member checks them against the group new_group told it of.
    """
    member = comm.is_member
    known = comm.ranks if member and distributed else comm._outside_view
    size = comm.world_size if member else None if known is None else len(known)
    return world_ranks_of(ranks, size, known, distributed)


def member_slowly(engine: Engine | None, distributed: bool, exited: bool, what: str) -> Engine:
    """A communicator's ``engine`` for ``what`` off the common path (``Communicator._member``).

    A non-member (or a communicator let go at exit) gets its error; a world
    of one under a launcher warns once; async object collectives started
    earlier on the group finish first, keeping their place.
    """
    if engine is None:
        if exited:
            raise RuntimeError(
                f"{what}: the interpreter is exiting; commlib let go of this "
                "communicator's process group at exit"
            )
        raise NotInGroupError(
            f"{what}: this process (world rank {dist.get_rank()}) is not a member of the "
            "communicator's group"
        )
    if not distributed:
        # under torchrun before init_dist each rank would compute alone: say so once
        warn_if_launched_without_init()
    if _steps.pending():
        _steps.finish_pending(engine.group)
    return engine
