"""``Communicator``: one per process group; validates arguments and composes collectives.

The communicator owns what is the same on every backend: argument checks, the
reduce-op names (``mean`` by sum-and-divide where the engine has no average),
moving data to the backend's device and back, tensors of different shapes in
``all_gather`` (:mod:`commlib._ragged`) and the object collectives
(:mod:`commlib._objects`). Every call to the backend goes through its
:class:`~commlib._engine.Engine`, which owns the plugin, the group, timeouts and
the translation of engine failures into commlib errors.

The collectives' families are rooms of their own, bases of the class whose
methods are the public methods themselves: :mod:`commlib._reducing_collectives`,
:mod:`commlib._gathering_collectives`, :mod:`commlib._distributing_collectives`,
:mod:`commlib._point_to_point` and :mod:`commlib._object_collectives`. What
stays here: the settings, who this rank is, the group changes (their bodies in
:mod:`commlib._membership`), the membership gate and ``barrier``.
"""

from __future__ import annotations

import contextlib
import datetime
import os
from collections.abc import Iterator, Sequence

import torch
import torch.distributed as dist

from commlib import _check_round, _finite, _membership, _plugin_choice, _steps, _world
from commlib._checked_lanes import checked_lanes
from commlib._collective import collective
from commlib._distributing_collectives import DistributingCollectives
from commlib._engine import Engine
from commlib._gathering_collectives import GatheringCollectives
from commlib._guard import Checks, Guard, checks_mode
from commlib._lanes import Lanes, learn_once
from commlib._object_collectives import ObjectCollectives
from commlib._point_to_point import PointToPoint
from commlib._reducing_collectives import ReducingCollectives
from commlib._settings import as_timedelta, default_timeout, strict_from_env
from commlib._shared_rows import shared_rows
from commlib._torch_groups import DESTROYED, dist_ready, engine_group, is_destroyed
from commlib.backend import Backend
from commlib.errors import CommError, NotInGroupError
from commlib.handle import Handle, ResultHandle
from commlib.serialization import Serializer
from commlib.types import Group, Timeout

__all__ = ["Communicator", "Handle", "ResultHandle", "dist_ready"]


class Communicator(
    ReducingCollectives,
    GatheringCollectives,
    DistributingCollectives,
    PointToPoint,
    ObjectCollectives,
):
    """Collectives over one process group, served by one backend plugin.

    Args:
        group: a ``torch.distributed.ProcessGroup``, or ``None`` for the world.
            With torch.distributed not initialised, the communicator is the
            ``single`` backend's world of one.
        backend: the plugin to use: an instance, a plugin name, a torch backend
            (also ``"cpu:gloo,cuda:nccl"``) or a device type (``"npu"``); by
            default the one that drives the group's torch.distributed backend.
        serializer: object-serialization strategy; the backend's by default.
        timeout: seconds (or a timedelta) a collective may wait for its peers
            before every waiting rank raises :class:`~commlib.errors.CommTimeoutError`;
            30 minutes by default (``COMMLIB_TIMEOUT`` overrides). Blocking
            calls also take a per-call ``timeout=``.
        slot_size: bytes each rank contributes to the first round of an object
            collective (and of a checked one, and of ``all_gather``), rounded up
            to a multiple of 16; objects that fit complete in that one round.
            The group's slot grows to what steady calls need (the docs'
            reliability page, "the check").
        strict: how much the ranks check that they pass matching arguments
            before a collective (a mismatch raises the same
            :class:`~commlib.errors.RemoteArgumentError` on every rank, showing
            what each passed): ``None`` (default), the tensor collectives where
            the engine would end the process on a mismatch
            (:attr:`Backend.mismatch_aborts`, gloo); ``True``, every collective;
            ``False``, none (hot loops). ``COMMLIB_STRICT=1`` / ``0`` set it
            where not given. See :attr:`checks` and the docs' reliability page.
        check_finite: before ``all_reduce`` and ``reduce``, the ranks agree that
            no floating-point tensor holds NaN or Inf; if one does, every rank
            raises the same :class:`~commlib.errors.NonFiniteError` naming those
            ranks and the calling line, and nothing is reduced (the flag rides in
            the check's round where that runs). ``None``: ``COMMLIB_CHECK_FINITE=1``
            turns it on; off by default (it reads every element).

    ``src`` and ``dst`` arguments are ranks *within* the group.

    Examples:
        >>> comm = Communicator()            # the world (or a world of one)
        >>> x = torch.ones(2) * (comm.rank + 1)
        >>> comm.all_reduce(x, op="mean")
        >>> x
        tensor([1., 1.])
        >>> comm.all_gather_object({"rank": comm.rank})
        [{'rank': 0}]
    """

    def __init__(
        self,
        group: Group = None,
        *,
        backend: str | Backend | None = None,
        serializer: Serializer | None = None,
        timeout: Timeout = None,
        slot_size: int = 4096,
        strict: bool | None = None,
        check_finite: bool | None = None,
    ):
        if slot_size < 64:
            raise ValueError(f"slot_size must be at least 64 bytes, got {slot_size}")
        self.timeout: datetime.timedelta = as_timedelta(timeout) or default_timeout()
        # a multiple of 16: every first round (checks, all_gather, objects) then
        # sends the same bytes, and data in the slots stays aligned for every dtype
        self._slot_size = (slot_size + 15) // 16 * 16
        self._strict: bool | None = strict_from_env() if strict is None else bool(strict)
        self._check_finite: bool = _finite.from_env() if check_finite is None else check_finite
        self._distributed = group is not None or dist_ready()
        if group is not None and not dist_ready():
            raise ValueError("a process group was given but torch.distributed is not initialised")
        if self._distributed and group is None:
            group = dist.group.WORLD
        # the whole job: the world's group, or what shrink made of it (grow replaces the world)
        self._whole_job = not self._distributed or group is dist.group.WORLD
        # a group commlib serves to torch (commlib.torch_backend): its plugin's own group
        group = engine_group(group)
        self.group: Group = group
        self.is_member = not (self._distributed and group is dist.GroupMember.NON_GROUP_MEMBER)
        # the group's world ranks as new_group made it, for a non-member (torch cannot say)
        self._outside_view: list[int] | None = None
        self._exited = False

        plugin = _plugin_choice.plugin_for(
            backend, group, distributed=self._distributed, is_member=self.is_member
        )
        self.plugin: Backend = plugin
        self._serializer: Serializer = serializer or plugin.serializer()
        self._engine: Engine | None = (
            Engine(plugin, group, self.timeout) if self.is_member else None
        )
        self._new_guard()
        if self._distributed:
            _world.world.teardown_at_exit(self._release_at_exit)

    def _new_guard(self) -> None:
        """The argument check and the lanes, for the settings in force (again when one is set)."""
        mode = checks_mode(
            distributed=self._distributed,
            strict=self._strict,
            world_size=self.world_size,
            mismatch_aborts=self.plugin.mismatch_aborts,
        )
        self._guard = guard = Guard(
            mode,
            self.plugin.completed_by_check,
            self._serializer,
            self._slot_size,
            distributed=self._distributed,
        )
        self._lanes = Lanes(
            self._engine, guard.checked, self._check_finite, checked_lanes(self._engine, guard)
        )

    @property
    def check_finite(self) -> bool:
        """Whether reductions first agree that no rank passes NaN or Inf (see above)."""
        return self._check_finite

    @check_finite.setter
    def check_finite(self, value: bool) -> None:
        self._check_finite = self._lanes.check_finite = value

    # settings the check depends on: public, settable after construction
    @property
    def strict(self) -> bool | None:
        """How much the ranks check their arguments: ``True``, ``None``, ``False`` (see above)."""
        return self._strict

    @strict.setter
    def strict(self, value: bool | None) -> None:
        self._strict = value
        self._new_guard()

    @property
    def slot_size(self) -> int:
        """Bytes each rank contributes to a first round (see above)."""
        return self._slot_size

    @slot_size.setter
    def slot_size(self, value: int) -> None:
        self._slot_size = value
        self._new_guard()

    @property
    def serializer(self) -> Serializer:
        """The object-serialization strategy of the object collectives."""
        return self._serializer

    @serializer.setter
    def serializer(self, value: Serializer) -> None:
        self._serializer = value
        self._new_guard()

    def _release_at_exit(self) -> None:
        """Let go of the process group (at interpreter exit, before C++ teardown)."""
        if self._engine is not None:
            self._engine.lanes.clear()  # their calls are the group's own bound methods
        self._engine = None
        self._lanes = Lanes(None, frozenset(), self._check_finite)
        self.group = None
        self._exited = True

    # -- who am I ----------------------------------------------------------------
    @property
    def backend(self) -> str:
        """Name of the backend plugin serving this communicator (``"gloo"``, ...)."""
        return self.plugin.name

    @property
    def rank(self) -> int:
        """This process's rank in the group; -1 when it is not a member."""
        return self._engine.rank if self._engine is not None else -1

    @property
    def world_size(self) -> int:
        """Number of ranks in the group; -1 when this process is not a member."""
        return self._engine.world_size if self._engine is not None else -1

    @property
    def local_rank(self) -> int:
        """Rank of this process on its machine (``LOCAL_RANK``; 0 when unset)."""
        return int(os.environ.get("LOCAL_RANK", 0)) if self._distributed else 0

    @property
    def local_size(self) -> int:
        """Number of ranks on this machine (``LOCAL_WORLD_SIZE``; 1 when unset)."""
        return int(os.environ.get("LOCAL_WORLD_SIZE", 1)) if self._distributed else 1

    @property
    def device(self) -> torch.device:
        """The device the backend's collectives run on, for this process."""
        return self.plugin.device()

    @property
    def checks(self) -> Checks:
        """Which collectives check their arguments across ranks first (see ``strict``).

        ``"strict"``: every collective; ``"guard"``: the tensor collectives,
        whose mismatched sizes would end the process in this backend's
        engine; ``"off"``: none.

        Examples:
            >>> comm.checks       # a world of one has nothing to mismatch with
            'off'
        """
        return self._guard.checks

    @property
    def ranks(self) -> list[int]:
        """World ranks of the group's members, in group order."""
        if not self._distributed:
            return [0]
        if not self.is_member:
            raise NotInGroupError("this process is not a member of the group")
        if is_destroyed(self.group):
            raise ValueError(f"the communicator's ranks are unknown: {DESTROYED}")
        return dist.get_process_group_ranks(self.group)

    def __repr__(self) -> str:
        who = f"rank={self.rank}/{self.world_size}" if self.is_member else "not a member"
        return f"<Communicator backend={self.backend!r} {who}>"

    # -- groups: their bodies in commlib._membership (every child: _membership.derive) --
    def new_group(
        self,
        ranks: Sequence[int],
        timeout: Timeout = None,
        *,
        use_local_synchronization: bool = False,
    ) -> Communicator:
        """A communicator for a subgroup; ``ranks`` are ranks of *this* group.

        As ``torch.distributed.new_group``: every rank of the world calls it
        with the same ``ranks``, members or not (ranks that differ raise
        :class:`~commlib.errors.RemoteArgumentError` on every rank after one
        small round over the world), and the group numbers its ranks in
        ascending world-rank order (``new_group([3, 1])``: world rank 1 is its
        rank 0). A non-member gets ``is_member=False``: its collectives raise
        :class:`~commlib.errors.NotInGroupError`; it can divide that further,
        but not a torch group it is not in (every rank raises saying so). The
        child keeps this one's settings (backend, serializer, slot size, checks).

        ``use_local_synchronization=True`` (torch's name): only the members
        call it, with the same ``ranks`` (another rank gets a ``ValueError``),
        while the others go on; torch names such a group after the number of
        groups each member knows, so members must have made as many before
        (the docs' usage page, "groups").

        Examples:
            >>> evens = comm.new_group(range(0, comm.world_size, 2))
            >>> evens.is_member, evens.world_size
            (True, 1)
            >>> pair = comm.new_group([0], use_local_synchronization=True)  # rank 0 alone calls
            >>> pair.world_size
            1
        """
        if use_local_synchronization:
            self._member("new_group")
        local, distributed = use_local_synchronization, self._distributed
        child = _membership.derive_new_group(self, ranks, timeout, local, distributed, self._world)
        return _sharing(child, "new_group")

    def _world(self, limit: datetime.timedelta) -> Engine | None:
        world = self if self.group is dist.GroupMember.WORLD else Communicator(timeout=limit)
        return world._engine  # new_group's round goes over the world

    @collective("split")
    def split(
        self, color: int | None, key: int | None = None, *, timeout: Timeout = None
    ) -> Communicator | None:
        """The communicator of the ranks that pass the same ``color`` (MPI_Comm_split).

        Every rank of this group calls it once; ranks of one color form a
        group ordered by ``key`` (by default their rank here), then by rank,
        as ``MPI_Comm_split`` and torch's ``split_group``; ``color=None``
        joins none and gets ``None`` (``MPI_UNDEFINED``). One round over this
        group, then each group is made by its members alone (as
        ``new_group(..., use_local_synchronization=True)``). An invalid color
        or key on any rank raises the same
        :class:`~commlib.errors.RemoteArgumentError` on every rank.

        Examples:
            >>> halves = comm.split(color=comm.rank % 2)   # evens and odds
            >>> halves.world_size                           # 4 ranks: 2
            1
            >>> backwards = comm.split(0, key=-comm.rank)   # the same ranks, reversed
            >>> backwards.rank                              # 4 ranks, on rank 0: 3
            0
        """
        engine = self._member("split")
        child = _membership.derive_split(self, engine, color, key, timeout, self._distributed)
        return None if child is None else _sharing(child, "split")

    @collective("shrink")
    def shrink(
        self, exclude: Sequence[int] | None = None, timeout: Timeout = None
    ) -> Communicator:
        """A communicator over the ranks of this group still alive, renumbered in order.

        After a :class:`~commlib.RankLostError` or
        :class:`~commlib.CommTimeoutError` this communicator is broken; every
        surviving rank calls ``shrink`` and gets one over a new process group
        (survivors 0, 2, 3 of four become 0, 1, 2; settings carry over), no
        process restarting. Ranks in ``exclude`` and ranks that do not call it
        within ``timeout`` (by default this communicator's, plus a few
        seconds) are left out. When no rank was lost and the group broke on
        none, every rank raises the same ``ValueError`` and this communicator
        stays usable. The ranks meet in the rendezvous store, whose host must
        be alive (the docs' reliability page, "After a failure: shrink").

        Examples:
            >>> try:  # doctest: +SKIP
            ...     comm.all_reduce(x)
            ... except (commlib.RankLostError, commlib.CommTimeoutError):
            ...     comm = comm.shrink(timeout=60)
            >>> comm.world_size  # doctest: +SKIP
            3
        """
        engine = self._member("shrink")
        return _membership.derive_shrunk(self, engine, exclude, timeout, self._distributed)

    @collective("grow")
    def grow(
        self,
        count: int | None = None,
        wait: Timeout = 0.0,
        timeout: Timeout = None,
    ) -> Communicator:
        """A communicator over this group and the newcomers that asked to join (``commlib.join``).

        Every member calls it; ``count`` newcomers are awaited for up to
        ``wait`` (seconds or a timedelta) and at most ``count`` taken
        (``count=None``: whoever asked by then; by default at once).
        When nobody asked, this communicator comes back untouched, so calling
        ``grow`` every few steps costs a look at the store. Otherwise members
        keep their ranks, newcomers follow in the order they asked, and the
        new communicator's world replaces this process's: no communicator of
        the old world can be used again. A process that dies or cannot
        connect within ``timeout`` is left out (the same ``CommError`` on
        every process only when forming fails three times). Only the whole
        job grows: the world's communicator or what :meth:`shrink` made of it
        (the docs' reliability page, "Growing back").

        Examples:
            >>> comm = comm.shrink(timeout=10)      # a rank died  # doctest: +SKIP
            >>> comm = comm.grow(count=1, wait=60)  # its replacement joined  # doctest: +SKIP
            >>> comm.world_size  # doctest: +SKIP
            4
        """
        engine = self._member("grow")
        return _membership.derive_grown(self, engine, count, wait, timeout, self._distributed)

    # -- composition helpers --------------------------------------------------------
    def _member(self, what: str) -> Engine:
        """The engine, for a member; a non-member gets :class:`NotInGroupError`."""
        engine = self._engine
        if engine is not None and self._distributed and not _steps.unfinished:
            return engine  # the common case, in three tests
        return _membership.member_slowly(self._engine, self._distributed, self._exited, what)

    @contextlib.contextmanager
    def refusing(self, what: str) -> Iterator[None]:
        """Argument errors found in the block, before collective ``what``, raised on every rank.

        For helpers built on the collectives (``pad_to_largest_tensor``,
        ``collect_results``): a ``ValueError`` or ``TypeError`` only this rank
        raises before the helper's first collective joins that collective's
        first round, where the other ranks wait, and every rank raises a
        :class:`~commlib.errors.RemoteArgumentError` naming this rank (its own
        error where every rank made it). A :class:`~commlib.errors.CommError`
        passes unchanged, as does an error before point to point (no round to
        join); outside the group, :class:`~commlib.errors.NotInGroupError`.

        Examples:
            >>> with comm.refusing("gather_object"):
            ...     raise ValueError("size must be >= 0")
            Traceback (most recent call last):
            ...
            ValueError: size must be >= 0
        """
        try:
            yield
        except (ValueError, TypeError) as exc:
            if isinstance(exc, CommError):
                raise
            self._guard.refuse(self._member(what), what, exc)

    @collective("ensure_same")
    def ensure_same(self, what: str, description: str) -> None:
        """Raise the same error on every rank unless all ranks pass the same ``description``.

        One round of the argument check's slots when the ranks agree; when
        they do not, every rank raises
        :class:`~commlib.errors.RemoteArgumentError` showing what each rank
        passed (also when another rank called another collective meanwhile).
        Use it before a collective whose arguments must match, so a mismatch
        is an error instead of a hang.

        Examples:
            >>> state = {"loss": torch.tensor(0.5), "acc": torch.tensor(0.9)}
            >>> comm.ensure_same("my_sync", f"keys={sorted(state)}")
        """
        engine = self._member(what)
        if self._distributed:
            _check_round.agree(engine, what, description, self._serializer, self._slot_size)

    # -- the collectives: barrier here, the families in their rooms (the bases above) --
    @collective("barrier")
    def barrier(self, *, async_op: bool = False, timeout: Timeout = None) -> Handle | None:
        """Block until every rank of the group has arrived (at most ``timeout``).

        With ``async_op=True`` it returns a :class:`Handle` at once, whose
        ``wait()`` returns when every rank has arrived: a one-element
        all_reduce on the backend's device, the barrier engines use anyway.

        Examples:
            >>> comm.barrier(timeout=60)
            >>> h = comm.barrier(async_op=True)
            >>> h.wait()
            True
        """
        if self._lanes.barrier(async_op, timeout):
            return None
        engine = self._member("barrier")
        learn_once(engine, "barrier")
        self._guard.check(engine, "barrier", lambda: "", timeout=timeout, key=())
        if not async_op:
            engine.barrier(as_timedelta(timeout))
            return None
        token = engine.to_device(torch.ones(1))
        return engine.all_reduce(
            token,
            "sum",
            what="barrier",
            timeout=as_timedelta(timeout),
            async_op=True,
            value=[],
        )


def _sharing(child: Communicator, what: str) -> Communicator:
    """``child``, its members' slot rounds through shared memory where they can be.

    A group made by ``new_group`` or ``split`` has all its members in the
    call: they set up what the group's first slot round would
    (:mod:`commlib._shared_rows`), so its first collective costs what later
    ones do.
    """
    engine = child._engine
    if engine is not None and "shared" not in engine.kept:
        shared_rows(engine, what, child.timeout)
    return child
