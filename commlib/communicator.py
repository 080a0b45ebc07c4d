"""``Communicator``: one per process group; validates arguments and composes collectives.

The communicator owns what is the same on every backend: argument checks, the
reduce-op names (``mean`` by sum-and-divide where the engine has no average),
moving data to the backend's device and back, tensors of different shapes in
``all_gather`` (:mod:`commlib._ragged`) and the object collectives
(:mod:`commlib._objects`). Every call to the backend goes through its
:class:`~commlib._engine.Engine`, which owns the plugin, the group, timeouts and
the translation of engine failures into commlib errors.
"""

from __future__ import annotations

import contextlib
import datetime
import operator
import os
from collections.abc import Iterator, Sequence
from typing import Any, Literal, TypeVar, cast, overload

import torch
import torch.distributed as dist

from commlib import (
    _check_round,
    _finite,
    _membership,
    _nested,
    _object_calls,
    _plugin_choice,
    _ragged,
    _rooms,
    _steps,
    _uneven,
    _world,
)
from commlib import _validation as check
from commlib._collective import collective
from commlib._engine import Engine
from commlib._guard import (
    Checks,
    Guard,
    checks_mode,
    finished,
    write_nothing,
)
from commlib._host_copy import PARALLEL_FROM, host_copy, stack_into
from commlib._lanes import Lanes, learn_once
from commlib._settings import as_timedelta, default_timeout, strict_from_env
from commlib._torch_groups import DESTROYED, dist_ready, engine_group, is_destroyed
from commlib.backend import Backend
from commlib.errors import (
    CommError,
    NotInGroupError,
    RemoteArgumentError,
)
from commlib.handle import Handle, ResultHandle
from commlib.p2p import P2POp
from commlib.reductions import copy_back, reduce_into, reduction, write_back
from commlib.serialization import Serializer
from commlib.types import Group, P2PRequest, ReduceOp, Timeout

__all__ = ["Communicator", "Handle", "ResultHandle", "dist_ready"]

_Data = TypeVar("_Data")


class Communicator:
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
        self._lanes = Lanes(self._engine, guard.checked, self._check_finite)

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
        return _membership.derive_new_group(self, ranks, timeout, local, distributed, self._world)

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
        return _membership.derive_split(self, engine, color, key, timeout, self._distributed)

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

    @collective("all_gather_shapes")
    def all_gather_shapes(
        self, tensor: torch.Tensor, *, timeout: Timeout = None
    ) -> list[list[int]]:
        """Every rank's shape of ``tensor`` (same dtype and number of dims everywhere).

        Examples:
            >>> comm.all_gather_shapes(torch.zeros(3, 2))
            [[3, 2]]
        """
        engine = self._member("all_gather_shapes")
        check.tensor(tensor, "tensor")
        shapes, _, _ = _ragged.exchange(
            engine,
            engine.to_device(tensor),
            "all_gather_shapes",
            room=_ragged.inline_room(self._slot_size),
            timeout=as_timedelta(timeout),
            rooms=_rooms.rooms_of(engine),
            shapes_only=True,
        )
        return [list(s) for s in shapes]  # one list per rank, the caller's to change

    @collective("all_gather_cat")
    def all_gather_cat(self, data: _Data, dim: int = 0, *, timeout: Timeout = None) -> _Data:
        """Every rank's ``data`` concatenated along ``dim``, leaf by leaf, in rank order.

        ``data`` is a tensor or a nested structure of them (dicts, lists,
        tuples, namedtuples); every leaf may have a different length along
        ``dim`` on each rank (the last, shorter batch of an evaluation loop),
        and comes back exactly: nothing is padded, nothing dropped or
        duplicated. Structure, dtypes and the other dims must match across
        ranks; where they differ every rank raises the same
        :class:`~commlib.errors.RemoteArgumentError` naming the path. Leaves
        of one dtype travel together, one ``all_gather`` each (as
        accelerate's ``gather``, which pads instead).

        Examples:
            >>> out = comm.all_gather_cat({"pred": torch.arange(comm.rank + 2)})
            >>> out                # 2 ranks: {'pred': tensor([0, 1, 0, 1, 2])}
            {'pred': tensor([0, 1])}
        """
        self._member("all_gather_cat")
        return cast(_Data, _nested.all_gather_cat(self, data, dim, timeout))

    # -- tensor collectives -------------------------------------------------------
    @overload
    def all_reduce(
        self,
        tensor: torch.Tensor,
        op: ReduceOp | str = ...,
        *,
        async_op: bool = ...,
        timeout: Timeout = ...,
    ) -> Handle | None: ...
    @overload
    def all_reduce(
        self,
        tensor: _Data,
        op: ReduceOp | str = ...,
        *,
        async_op: bool = ...,
        timeout: Timeout = ...,
    ) -> _Data: ...
    @collective("all_reduce")
    def all_reduce(
        self,
        tensor: Any,
        op: ReduceOp | str = "sum",
        *,
        async_op: bool = False,
        timeout: Timeout = None,
    ) -> Any:
        """Reduce ``tensor`` across the group, in place.

        ``op`` is one of ``sum mean product min max band bor bxor``. ``mean`` of
        an integer tensor is computed in floating point and written back into
        the integer tensor (truncated), as mmengine does.

        ``tensor`` may also be a Python number, whose reduced value is
        returned (ignite's ``idist.all_reduce``; an int's ``mean`` is a
        float), or a nested structure of tensors and numbers (dicts, lists,
        tuples, namedtuples, any depth): its tensors are reduced in place and
        the structure is returned, with its numbers reduced. Leaves travel
        packed, one collective per dtype and device. A structure, dtype or
        shape that differs across ranks raises the same
        :class:`~commlib.errors.RemoteArgumentError` on every rank, naming the
        path (``['logits']: rank 1 (3, 10), rank 0 (4, 10)``). ``async_op``
        takes a tensor only.

        Examples:
            >>> x = torch.tensor([1.0, 2.0]) * (comm.rank + 1)
            >>> comm.all_reduce(x, op="mean")   # 2 ranks: tensor([1.5, 3.0])
            >>> comm.all_reduce(comm.rank + 1)  # 2 ranks: 3
            1
            >>> comm.all_reduce({"loss": torch.tensor(0.5), "n": [2, 3]})
            {'loss': tensor(0.5000), 'n': [2, 3]}
        """
        if self._lanes.all_reduce(tensor, op, async_op, timeout):
            return None
        engine = self._member("all_reduce")
        if not isinstance(tensor, torch.Tensor):
            return _nested.all_reduce(self, tensor, op, timeout, async_op=async_op)
        check.tensor(tensor, "tensor")
        name = check.reduce_op(op, tensor)
        engine_op, back = reduction(name, tensor, self.plugin.native_avg)
        work_t, world = engine.to_device(tensor), engine.world_size
        finite = _finite.flag(self.check_finite, tensor)
        if "all_reduce" in self._guard.checked:  # (a checked call takes no lane: none learnt)
            parts = _finite.checked(
                self._guard,
                engine,
                "all_reduce",
                lambda: f"op={name}, {tensor.dtype}, {tuple(tensor.shape)}",
                work_t,
                timeout,
                finite,
                (name, tensor.dtype, tensor.shape),
            )
            if parts is not None:
                reduce_into(work_t, parts, engine_op)
                return write_back(back, work_t, tensor, world, async_op)
        else:
            Lanes.learn_all_reduce(engine, op, name, engine_op, back, tensor)
            if finite is not None:
                _finite.agree_finite(
                    engine, "all_reduce", finite, self._serializer, self._slot_size
                )
        return engine.all_reduce(
            work_t,
            engine_op,
            # nothing to finish when the engine wrote the caller's tensor itself
            finish=None
            if back is copy_back and work_t is tensor
            else lambda: back(work_t, tensor, world),
            timeout=None if timeout is None else as_timedelta(timeout),
            async_op=async_op,
            value=[tensor],
        )

    @overload
    def all_gather(
        self, tensor: torch.Tensor, *, timeout: Timeout = ..., adapt_empty: bool = ...
    ) -> list[torch.Tensor]: ...
    @overload
    def all_gather(
        self, tensor: _Data, *, timeout: Timeout = ..., adapt_empty: bool = ...
    ) -> list[_Data]: ...
    @collective("all_gather")
    def all_gather(
        self, tensor: Any, *, timeout: Timeout = None, adapt_empty: bool = False
    ) -> list[Any]:
        """Every rank's ``tensor``, as a list indexed by rank.

        ``tensor`` may also be a Python value (a number, a string, any
        picklable object: ignite's ``idist.all_gather``) or a nested
        structure of tensors and values: the list then holds every rank's
        structure. The structure and the dtypes and dims of its tensors must
        match across ranks (the same :class:`~commlib.errors.RemoteArgumentError`
        on every rank names the path where they do not); shapes may differ.
        Its tensors travel packed, one ragged all_gather per dtype and device.

        Ranks may pass tensors of different shapes (same number of dims, same
        dtype); each rank receives every rank's true tensor. Results are on the
        caller's device. Tensors that fit ``slot_size`` travel with their
        shapes in one round, larger ones in two; the slot learns steady shapes
        (up to 1 MiB per rank), so a loop of them costs one round per call.

        This rank's own entry is ``tensor`` itself, not a copy, so autograd
        flows through it (a metric used as a loss keeps its gradient, as with
        torchmetrics' own gather); the other entries are new tensors.

        With ``adapt_empty``, a rank whose ``tensor`` has no elements may pass
        any dtype and number of dims: its entry, on every rank, is an empty
        tensor of the dtype the ranks with data agree on, shaped ``(0, *the
        trailing dims of the first rank with data)`` (a rank that saw no data
        and holds a placeholder, as torchmetrics' list states do). Every rank
        passes the same ``adapt_empty``; where they differ, every rank raises
        :class:`~commlib.errors.RemoteArgumentError`.

        Examples:
            >>> comm.all_gather(torch.arange(comm.rank + 1))
            [tensor([0])]
            >>> # on 2 ranks, each rank gets: [tensor([0]), tensor([0, 1])]
        """
        found = _ragged.steady_all_gather(
            self._lanes, tensor, timeout, adapt_empty, self._slot_size
        )
        if isinstance(found, list):  # a steady kind of call: its prepared round
            return found
        engine = self._member("all_gather")
        if not isinstance(tensor, torch.Tensor):
            return _nested.all_gather(self, tensor, timeout)
        check.tensor(tensor, "tensor")
        world = engine.world_size
        # no check's round of its own, in any mode: the gathering round is the check (its
        # slots are fixed-size; ranks agree there on dtypes, dims and adapt_empty)
        work_t = engine.to_device(tensor)
        limit = as_timedelta(timeout)
        # (a prepared round that found shapes that differ: its exchange, to go on from)
        shapes, out, dtype = found or _ragged.exchange(
            engine,
            work_t,
            "all_gather",
            room=_ragged.inline_room(self._slot_size),
            timeout=limit,
            rooms=_rooms.rooms_of(engine),
            adapt_empty=adapt_empty,
        )
        me = engine.rank
        if work_t.dtype != dtype or work_t.dim() != len(shapes[me]):  # an adapted empty one
            tensor = torch.empty(shapes[me], dtype=dtype, device=tensor.device)
            work_t = engine.to_device(tensor)
        if out is not None:  # small: the data came with the shapes, one round
            pass
        elif all(s == shapes[0] for s in shapes):
            # one flat buffer: cheaper on the engines than a list of outputs
            flat = torch.empty((world, *work_t.shape), dtype=work_t.dtype, device=work_t.device)
            engine.all_gather_into_tensor(
                flat.view(-1), work_t.reshape(-1), what="all_gather", timeout=limit
            )
            out = list(flat.unbind(0))
        else:
            max_shape = [max(dims) for dims in zip(*shapes)]
            padded = work_t.new_zeros(max_shape)
            padded[tuple(slice(0, d) for d in work_t.shape)] = work_t
            buf = [torch.empty_like(padded) for _ in range(world)]
            engine.all_gather(buf, padded, timeout=limit)
            out = [b[tuple(slice(0, d) for d in s)] for b, s in zip(buf, shapes)]
        if engine.on_cpu and tensor.is_cpu:  # where the caller's tensor is already
            out[me] = tensor
            return out
        return [tensor if r == me else t.to(tensor.device) for r, t in enumerate(out)]

    @collective("all_gather_into_tensor")
    def all_gather_into_tensor(
        self,
        output: torch.Tensor,
        tensor: torch.Tensor,
        *,
        async_op: bool = False,
        timeout: Timeout = None,
    ) -> Handle | None:
        """Concatenate every rank's ``tensor`` along dim 0 into ``output``.

        ``output`` must hold ``world_size`` times ``tensor``'s elements.

        Examples:
            >>> out = torch.empty(comm.world_size * 2)
            >>> comm.all_gather_into_tensor(out, torch.ones(2) * comm.rank)
        """
        if self._lanes.all_gather_into_tensor(output, tensor, async_op, timeout):
            return None
        engine = self._member("all_gather_into_tensor")
        check.tensor(output, "output")
        check.tensor(tensor, "tensor")
        if output.numel() != tensor.numel() * engine.world_size:
            raise ValueError(
                f"output has {output.numel()} elements; all_gather_into_tensor needs "
                f"world_size ({engine.world_size}) x {tensor.numel()}"
            )
        if output.dtype != tensor.dtype:
            raise TypeError(
                f"output dtype {output.dtype} differs from tensor dtype {tensor.dtype}"
            )
        out_t = engine.to_device(output)
        in_t = engine.to_device(tensor)
        world = engine.world_size
        guard = self._guard
        if "all_gather_into_tensor" in guard.checked:
            parts = guard.check(
                engine,
                "all_gather_into_tensor",
                lambda: f"{tensor.dtype}, {tuple(tensor.shape)}",
                in_t,
                timeout,
                key=(tensor.dtype, tensor.shape),
            )
            if parts is not None:
                if out_t.dim() == 1 == in_t.dim():
                    torch.cat(parts, out=out_t)  # one op, no view
                else:
                    torch.stack(parts, out=out_t.view(world, *parts[0].shape))
                return write_back(copy_back, out_t, output, world, async_op)
        else:  # (a checked call takes no lane: none learnt)
            learn_once(engine, "all_gather_into_tensor", dtype=tensor.dtype)
        return engine.all_gather_into_tensor(
            # flat views: engines such as gloo insist on matching shapes, and
            # the contract is about element counts (a view of a 1-dim tensor is
            # the tensor's own shape: no view op for it)
            out_t if out_t.dim() == 1 else out_t.view(-1),
            in_t if in_t.dim() == 1 else in_t.view(-1),
            finish=None if out_t is output else lambda: copy_back(out_t, output, world),
            timeout=None if timeout is None else as_timedelta(timeout),
            async_op=async_op,
            value=[output],
        )

    @collective("gather")
    def gather(
        self, tensor: torch.Tensor, dst: int = 0, *, timeout: Timeout = None
    ) -> list[torch.Tensor]:
        """Every rank's ``tensor`` on ``dst`` (a list); other ranks get ``[]``.

        Ranks may pass tensors of different shapes (same dtype and number of
        dims: MPI's ``Gatherv``, torchcomms' ``gather_v``); ``dst`` receives
        every rank's true tensor. As in :meth:`all_gather`, the first round
        carries every rank's shape, and small tensors with it (one round);
        larger ones follow in the engine's gather, padded to the largest
        shape where shapes differ and cut back on ``dst``. A dtype, number of
        dims or ``dst`` that differs across ranks raises the same
        :class:`~commlib.errors.RemoteArgumentError` on every rank.

        Examples:
            >>> comm.gather(torch.tensor([comm.rank]), dst=0)
            [tensor([0])]
            >>> # on 2 ranks: [tensor([0]), tensor([1])] on rank 0, [] on rank 1
            >>> comm.gather(torch.arange(comm.rank + 1))   # uneven: [tensor([0]), tensor([0, 1])]
            [tensor([0])]
        """
        found = _ragged.steady_gather(self._lanes, tensor, dst, timeout, self._slot_size)
        if isinstance(found, list):  # a steady kind of call: its prepared round
            return found
        engine = self._member("gather")
        check.tensor(tensor, "tensor")
        check.rank_in_range(dst, engine.world_size, "dst")
        work_t = engine.to_device(tensor)
        is_dst = engine.rank == dst
        limit = as_timedelta(timeout)
        # (a prepared round that found shapes that differ: its exchange, to go on from)
        shapes, parts, _ = found or _ragged.exchange(
            engine,
            work_t,
            "gather",
            room=_ragged.inline_room(self._slot_size),
            timeout=limit,
            rooms=_rooms.rooms_of(engine),
            dst=dst,
        )
        if parts is not None:  # small: the data came with the shapes, one round
            if not is_dst:
                return []
            # views of this call's own gathered buffer: nothing else holds it
            if engine.on_cpu and tensor.is_cpu:
                return parts
            return [p.to(tensor.device) for p in parts]
        mine = list(work_t.shape)
        if all(s == mine for s in shapes):
            out = [torch.empty_like(work_t) for _ in shapes] if is_dst else None
            engine.gather(work_t, out, dst, timeout=limit)
            if out is None:
                return []
            if engine.on_cpu and tensor.is_cpu:  # where the caller's tensor is already
                return out
            return [t.to(tensor.device) for t in out]
        # uneven: the engine's gather of the largest shape, each rank's part cut back
        largest = [max(dims) for dims in zip(*shapes)]
        padded = work_t.new_zeros(largest)
        padded[tuple(slice(0, d) for d in mine)] = work_t
        out = [torch.empty_like(padded) for _ in shapes] if is_dst else None
        engine.gather(padded, out, dst, timeout=limit)
        if out is None:
            return []
        return [t[tuple(slice(0, d) for d in s)].to(tensor.device) for t, s in zip(out, shapes)]

    @collective("gather_into_tensor")
    def gather_into_tensor(
        self,
        tensor: torch.Tensor,
        gather_tensor: torch.Tensor | None = None,
        dst: int = 0,
        *,
        timeout: Timeout = None,
    ) -> None:
        """Every rank's ``tensor`` into one tensor on ``dst``, rank after rank (torch 2.14's).

        ``gather_tensor`` holds world_size x ``tensor``'s elements (flat, or
        stacked as ``(world_size, *tensor.shape)``) and is needed on ``dst``
        alone; the other ranks may pass ``None``. Every rank passes the same
        shape and dtype. Composed on the engine's ``gather``, so it serves on
        every torch commlib supports (2.13 has no such call).

        Examples:
            >>> out = torch.zeros(2 * comm.world_size)
            >>> comm.gather_into_tensor(torch.tensor([1.0, 2.0]), out)
            >>> out                            # 2 ranks, on rank 0: tensor([1., 2., 1., 2.])
            tensor([1., 2.])
        """
        engine = self._member("gather_into_tensor")
        check.tensor(tensor, "tensor")
        world = engine.world_size
        check.rank_in_range(dst, world, "dst")
        output = None
        if engine.rank == dst:  # the others wait for dst: a mistake here reaches them
            output = check.gathered_output(gather_tensor, tensor, world, "gather_into_tensor")
        self._guard.check(
            engine,
            "gather_into_tensor",
            lambda: f"dst={dst}, {tensor.dtype}, {tuple(tensor.shape)}",
            timeout=timeout,
            key=(dst, tensor.dtype, tensor.shape),
        )
        work_t = engine.to_device(tensor)
        out_t = None if output is None else engine.to_device(output)
        rows = None if out_t is None else list(out_t.view(world, *work_t.shape).unbind(0))
        engine.gather(work_t, rows, dst, timeout=as_timedelta(timeout))
        if output is not None and out_t is not None:
            copy_back(out_t, output, world)

    @overload
    def broadcast(
        self,
        tensor: torch.Tensor,
        src: int = ...,
        *,
        async_op: bool = ...,
        timeout: Timeout = ...,
    ) -> Handle | None: ...
    @overload
    def broadcast(
        self, tensor: _Data, src: int = ..., *, async_op: bool = ..., timeout: Timeout = ...
    ) -> _Data: ...
    @collective("broadcast")
    def broadcast(
        self,
        tensor: Any,
        src: int = 0,
        *,
        async_op: bool = False,
        timeout: Timeout = None,
    ) -> Any:
        """Copy ``src``'s ``tensor`` into ``tensor`` on every rank, in place.

        ``tensor`` may also be a Python value (any picklable object), returned
        as ``src`` holds it (ignite's ``idist.broadcast``), or a nested
        structure: its tensors (same structure, dtypes and shapes on every
        rank, or the same :class:`~commlib.errors.RemoteArgumentError`
        everywhere naming the path) are written in place, and the structure
        is returned with ``src``'s other values; a rank that passes ``None``
        (no tensor) gets ``src``'s value, new tensors included. A plain tensor
        must be passed on every rank (a rank passing ``None`` makes every
        rank raise the same ``RemoteArgumentError`` saying what to use).
        ``async_op`` takes a tensor only.

        Examples:
            >>> x = torch.tensor([comm.rank])
            >>> comm.broadcast(x, src=0)
            >>> x
            tensor([0])
        """
        if self._lanes.broadcast(tensor, src, async_op, timeout):
            return None
        engine = self._member("broadcast")
        if not isinstance(tensor, torch.Tensor):
            return _nested.broadcast(self, tensor, src, timeout, async_op=async_op)
        check.tensor(tensor, "tensor")
        check.rank_in_range(src, engine.world_size, "src")
        work_t = engine.to_device(tensor)
        world = engine.world_size
        guard = self._guard
        if "broadcast" in guard.checked:
            try:
                parts = guard.check(
                    engine,
                    "broadcast",
                    lambda: f"src={src}, {tensor.dtype}, {tuple(tensor.shape)}",
                    work_t,
                    timeout,
                    # only src's data is read: the others send their slot's header alone
                    write=None if engine.rank == src else write_nothing,
                    key=(src, tensor.dtype, tensor.shape),
                )
            except RemoteArgumentError as exc:  # a rank passed None: say so, as it does
                raise _nested.tensor_meets_no_tensor(exc, src) from None
            if parts is not None:
                if engine.rank != src:
                    host_copy(work_t, parts[src])
                return write_back(copy_back, work_t, tensor, world, async_op)
        else:  # (a checked call takes no lane: none learnt)
            learn_once(engine, "broadcast", src=src, dtype=tensor.dtype)
        return engine.broadcast(
            work_t,
            src,
            finish=None if work_t is tensor else lambda: copy_back(work_t, tensor, world),
            timeout=None if timeout is None else as_timedelta(timeout),
            async_op=async_op,
            value=[tensor],
        )

    @collective("reduce_scatter")
    def reduce_scatter(
        self,
        output: torch.Tensor,
        input: torch.Tensor | Sequence[torch.Tensor],
        op: ReduceOp | str = "sum",
        *,
        async_op: bool = False,
        timeout: Timeout = None,
    ) -> Handle | None:
        """Reduce ``input`` across ranks and leave chunk ``rank`` in ``output``.

        ``input`` is a list of ``world_size`` tensors shaped like ``output``, or
        one tensor of ``world_size`` such chunks along dim 0.

        Chunks may differ in size (MPI's ``Reduce_scatter`` with counts,
        torchcomms' ``reduce_scatter_v``): ``input[i]`` is rank ``i``'s chunk,
        every rank passes the same list of shapes, and each rank's ``output``
        is shaped like its own chunk. The engine's reduce_scatter then runs
        on chunks padded to the largest.

        Examples:
            >>> out = torch.empty(1)
            >>> comm.reduce_scatter(out, torch.ones(comm.world_size))
            >>> out
            tensor([1.])
            >>> sizes = [r + 1 for r in range(comm.world_size)]   # rank r keeps r + 1 values
            >>> out = torch.empty(comm.rank + 1)
            >>> comm.reduce_scatter(out, [torch.ones(n) for n in sizes])
            >>> out
            tensor([1.])
        """
        if self._lanes.reduce_scatter(output, input, op, async_op, timeout):
            return None
        engine = self._member("reduce_scatter")
        check.tensor(output, "output")
        world = engine.world_size
        flat = check.reduce_scatter_input(output, input, world)
        if flat is None:  # tensors of different shapes
            chunks = cast(list, input)
            return _uneven.reduce_scatter_v(
                self._guard, engine, output, chunks, op, async_op, timeout
            )
        name = check.reduce_op(op, output)
        engine_op, back = reduction(name, output, self.plugin.native_avg)
        out_t = engine.to_device(output)
        if out_t.dim() != 1:
            out_t = out_t.view(-1)  # contiguous, so a view
        in_t = engine.to_device(flat)
        guard = self._guard
        if "reduce_scatter" in guard.checked:
            # chunk j of every rank's input travels to rank j alone (in the row that goes
            # there): the parts are every rank's chunk for this rank, reduced in rank order
            parts = guard.check(
                engine,
                "reduce_scatter",
                lambda: f"op={name}, {output.dtype}, {tuple(output.shape)}",
                in_t.view(world, -1),
                timeout,
                apart=True,
                key=(name, output.dtype, output.shape),
            )
            if parts is not None:
                reduce_into(out_t, parts, engine_op)
                return write_back(back, out_t, output, world, async_op)
        elif engine_op == op:  # (a checked call takes no lane: none learnt)
            learn_once(engine, "reduce_scatter", op=engine_op, dtype=output.dtype)
        return engine.reduce_scatter(
            out_t,
            in_t,
            engine_op,
            finish=None
            if back is copy_back and out_t is output
            else lambda: back(out_t, output, world),
            timeout=None if timeout is None else as_timedelta(timeout),
            async_op=async_op,
            value=[output],
        )

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

    @collective("reduce")
    def reduce(
        self,
        tensor: torch.Tensor,
        dst: int = 0,
        op: ReduceOp | str = "sum",
        *,
        async_op: bool = False,
        timeout: Timeout = None,
    ) -> Handle | None:
        """Reduce ``tensor`` across the group into ``tensor`` on ``dst``, in place.

        ``op`` is any op :meth:`all_reduce` takes, ``mean`` included. On the
        other ranks ``tensor`` is left as it was (engines may use the buffer
        they are given there as scratch space, so they get a copy).

        Examples:
            >>> x = torch.tensor([1.0, 2.0]) * (comm.rank + 1)
            >>> comm.reduce(x, dst=0, op="sum")
            >>> x                 # on rank 0 of 2 ranks: tensor([3., 6.])
            tensor([1., 2.])
        """
        if self._lanes.reduce(tensor, dst, op, async_op, timeout):
            return None
        engine = self._member("reduce")
        check.tensor(tensor, "tensor")
        check.rank_in_range(dst, engine.world_size, "dst")
        name = check.reduce_op(op, tensor)
        engine_op, back = reduction(name, tensor, self.plugin.native_avg)
        work_t = engine.to_device(tensor)
        world = engine.world_size
        is_dst = engine.rank == dst
        guard = self._guard
        finite = _finite.flag(self.check_finite, tensor)
        if "reduce" in guard.checked:
            parts = _finite.checked(
                guard,
                engine,
                "reduce",
                lambda: f"dst={dst}, op={name}, {tensor.dtype}, {tuple(tensor.shape)}",
                work_t,
                timeout,
                finite,
                (dst, name, tensor.dtype, tensor.shape),
            )
            if parts is not None:
                if not is_dst:
                    return finished(lambda: None, async_op, [tensor]) if async_op else None
                reduce_into(work_t, parts, engine_op)
                return write_back(back, work_t, tensor, world, async_op)
        else:
            if engine_op == op:  # (a checked call takes no lane: none learnt)
                learn_once(engine, "reduce", op=engine_op, dst=dst, dtype=tensor.dtype)
            if finite is not None:
                _finite.agree_finite(engine, "reduce", finite, self._serializer, self._slot_size)
        finish = None
        if not is_dst:
            if work_t is tensor:
                work_t = tensor.clone()
        elif back is not copy_back or work_t is not tensor:
            finish = lambda: back(work_t, tensor, world)  # noqa: E731
        return engine.reduce(
            work_t,
            dst,
            engine_op,
            finish=finish,
            timeout=None if timeout is None else as_timedelta(timeout),
            async_op=async_op,
            value=[tensor],
        )

    @collective("scatter")
    def scatter(
        self,
        tensor: torch.Tensor,
        scatter_list: Sequence[torch.Tensor] | None = None,
        src: int = 0,
        *,
        async_op: bool = False,
        timeout: Timeout = None,
    ) -> Handle | None:
        """Fill ``tensor`` on each rank ``i`` with ``scatter_list[i]`` of ``src``, in place.

        ``src`` passes ``world_size`` tensors shaped like ``tensor``; the
        other ranks' ``scatter_list`` is ignored (``None`` is usual there).
        Where the arguments are checked (:attr:`checks`), a wrong list on
        ``src`` fails every rank at once, in the check's round; unchecked,
        ``src`` raises before anything is sent, and the others wait for it
        until their timeout.

        Examples:
            >>> out = torch.empty(2)
            >>> parts = [torch.full((2,), float(i)) for i in range(comm.world_size)]
            >>> comm.scatter(out, parts if comm.rank == 0 else None, src=0)
            >>> out
            tensor([0., 0.])
        """
        if self._lanes.scatter(tensor, scatter_list, src, async_op, timeout):
            return None
        engine = self._member("scatter")
        check.tensor(tensor, "tensor")
        world = engine.world_size
        check.rank_in_range(src, world, "src")
        parts = None
        if engine.rank == src:  # the others wait for src: a mistake here reaches them
            check.tensor_list(scatter_list, world, "scatter_list", like=tensor, on="src")
            parts = [engine.to_device(t) for t in scatter_list or ()]
        work_t = engine.to_device(tensor)

        def describe() -> str:
            return f"src={src}, {tensor.dtype}, {tuple(tensor.shape)}"

        guard = self._guard
        if "scatter" in guard.checked and "scatter" in guard.completed_by_check:
            # src's piece for each rank travels in the row of the check's round
            # that goes to that rank when it fits (every rank declares its size
            # alike): one round, not two
            sent = parts
            got = guard.check(
                engine,
                "scatter",
                describe,
                guard.rows(tensor.dtype, tensor.shape, world),  # (src's pieces: the writer's)
                timeout,
                write=write_nothing if sent is None else lambda rows: stack_into(rows, sent),
                apart=True,
                key=(src, tensor.dtype, tensor.shape),
            )
            if got is not None:
                host_copy(work_t, got[src])
                return write_back(copy_back, work_t, tensor, world, async_op)
        elif "scatter" in guard.checked:
            guard.check(
                engine, "scatter", describe, timeout=timeout, key=(src, tensor.dtype, tensor.shape)
            )
        else:  # (a checked call takes no lane: none learnt)
            learn_once(engine, "scatter", src=src, dtype=tensor.dtype)
        return engine.scatter(
            work_t,
            parts,
            src,
            finish=None if work_t is tensor else lambda: copy_back(work_t, tensor, world),
            timeout=None if timeout is None else as_timedelta(timeout),
            async_op=async_op,
            value=[tensor],
        )

    @collective("all_to_all")
    def all_to_all(
        self,
        output_tensor_list: Sequence[torch.Tensor],
        input_tensor_list: Sequence[torch.Tensor],
        *,
        async_op: bool = False,
        timeout: Timeout = None,
    ) -> Handle | None:
        """Send ``input_tensor_list[i]`` to rank ``i``, receive into ``output_tensor_list[i]``.

        Both lists hold ``world_size`` tensors of one dtype; the shapes may
        differ, but what rank ``j`` sends here must be shaped like
        ``output_tensor_list[j]``.

        Examples:
            >>> outs = [torch.empty(2) for _ in range(comm.world_size)]
            >>> ins = [torch.full((2,), float(comm.rank)) for _ in range(comm.world_size)]
            >>> comm.all_to_all(outs, ins)
            >>> outs              # outs[j] is rank j's
            [tensor([0., 0.])]
        """
        engine = self._member("all_to_all")
        world = engine.world_size
        # one loop over both lists where the engine takes every tensor as it is
        plain = check.plain_tensor_lists(
            output_tensor_list,
            input_tensor_list,
            world,
            None if engine.on_cpu else engine.device_obj,
        )
        if plain is None:
            check.tensor_list(output_tensor_list, world, "output_tensor_list")
            check.tensor_list(input_tensor_list, world, "input_tensor_list")
            dtype = check.same_dtype([*output_tensor_list, *input_tensor_list], "all_to_all")
        else:
            dtype = plain[0]
        guard = self._guard
        if "all_to_all" in guard.checked:
            # lists of one shape: small parts ride in the check's round, each in the row
            # that goes to its rank (one round); other lists' sizes are checked pair by pair
            parts = guard.check_all_to_all(
                engine,
                dtype,
                output_tensor_list,
                input_tensor_list,
                plain is not None and plain[1],
                timeout,
            )
            if parts is not None:
                outs = list(output_tensor_list)
                if plain is not None and plain[1] and outs[0].numel() * world < PARALLEL_FROM:
                    torch._foreach_copy_(outs, parts)  # small, one shape: one op
                else:
                    for out_t, part in zip(outs, parts):
                        host_copy(out_t, part)
                if not async_op:
                    return None
                return finished(lambda: None, async_op, list(output_tensor_list))
        if plain is not None:  # the engine writes the caller's own tensors: nothing to finish
            outs = list(output_tensor_list)
            ins = list(input_tensor_list)
            if plain[1] and not async_op and timeout is None:
                # one shape: the engine's own all_to_all where the plugin has it
                if Lanes.all_to_all(engine, outs, ins, dtype):
                    return None
            return engine.all_to_all(
                outs,
                ins,
                timeout=None if timeout is None else as_timedelta(timeout),
                async_op=async_op,
                value=list(output_tensor_list),
            )
        to_device = engine.to_device
        outs = [to_device(t) for t in output_tensor_list]
        ins = [to_device(t) for t in input_tensor_list]

        def finish() -> None:
            for out_t, target in zip(outs, output_tensor_list):
                copy_back(out_t, target, world)

        # nothing to finish when the engine writes the caller's own tensors
        written = all(map(operator.is_, outs, output_tensor_list))
        return engine.all_to_all(
            outs,
            ins,
            finish=None if written else finish,
            timeout=None if timeout is None else as_timedelta(timeout),
            async_op=async_op,
            value=list(output_tensor_list),
        )

    @collective("all_to_all_single")
    def all_to_all_single(
        self,
        output: torch.Tensor,
        input: torch.Tensor,
        output_split_sizes: Sequence[int] | None = None,
        input_split_sizes: Sequence[int] | None = None,
        *,
        async_op: bool = False,
        timeout: Timeout = None,
    ) -> Handle | None:
        """Scatter ``input``'s rows to every rank and gather theirs into ``output``.

        ``input_split_sizes[i]`` rows of ``input`` (along dim 0, in order) go
        to rank ``i``; ``output_split_sizes[i]`` rows of ``output`` come from
        rank ``i``. ``None`` splits evenly. Splits may be uneven and zero, but
        what rank ``i`` sends here must be what this rank expects from it.

        Examples:
            >>> out = torch.empty(comm.world_size)
            >>> comm.all_to_all_single(out, torch.arange(float(comm.world_size)))
            >>> out               # rank r gets element r of every rank
            tensor([0.])
            >>> # uneven: rank r sends i + 1 rows to rank i, and gets r + 1 rows from each
        """
        if self._lanes.all_to_all_single(
            output, input, output_split_sizes, input_split_sizes, async_op, timeout
        ):
            return None
        engine = self._member("all_to_all_single")
        world = engine.world_size
        check.tensor(output, "output")
        check.tensor(input, "input")
        check.same_dtype([output, input], "all_to_all_single")
        if output.dim() == 0 or input.dim() == 0 or output.shape[1:] != input.shape[1:]:
            raise ValueError(
                "all_to_all_single needs output and input of at least one dim whose rows "
                f"(dims after the first) match, got {tuple(output.shape)} and "
                f"{tuple(input.shape)}"
            )
        out_splits = check.split_sizes(output_split_sizes, world, output.shape[0], "output")
        in_splits = check.split_sizes(input_split_sizes, world, input.shape[0], "input")
        me = engine.rank
        in_t, out_t = engine.to_device(input), engine.to_device(output)
        rows_out = in_splits or [input.shape[0] // world] * world
        rows_in = out_splits or [output.shape[0] // world] * world
        even = in_splits is None and out_splits is None
        checked = self._guard.check_all_to_all_single(
            engine, in_t, out_t, rows_out, rows_in, even, timeout
        )
        if checked == "rode":
            return write_back(copy_back, out_t, output, world, async_op)
        if "all_to_all_single" not in self._guard.checked:  # (a checked call takes no lane)
            learn_once(engine, "all_to_all_single", dtype=input.dtype)
        if checked == "explicit":  # ranks passed None and explicit splits: the same call on all
            in_splits, out_splits = rows_out, rows_in
        check.self_pair(rows_out[me], rows_in[me], me)  # checked, the guard raised it
        return engine.all_to_all_single(
            out_t,
            in_t,
            out_splits,
            in_splits,
            finish=None if out_t is output else lambda: copy_back(out_t, output, world),
            timeout=None if timeout is None else as_timedelta(timeout),
            async_op=async_op,
            value=[output],
        )

    # -- point to point -------------------------------------------------------------
    @collective("send")
    def send(
        self,
        tensor: torch.Tensor,
        dst: int,
        *,
        tag: int = 0,
        async_op: bool = False,
        timeout: Timeout = None,
    ) -> Handle | None:
        """Send ``tensor`` to rank ``dst``, which receives it with :meth:`recv`.

        Sends and receives between two ranks pair up in the order they are
        posted (per ``tag``). On engines that deadlock on two ranks sending to
        each other at once (NCCL), exchange with :meth:`batch_isend_irecv`.

        Examples:
            >>> x = torch.arange(3.0) if comm.rank == 0 else torch.empty(3)
            >>> if comm.rank == 0 and comm.world_size > 1:
            ...     comm.send(x, dst=1)
            ... elif comm.rank == 1:
            ...     comm.recv(x, src=0)
        """
        return self._p2p("send", tensor, dst, tag, async_op, timeout)

    @overload
    def recv(
        self,
        tensor: torch.Tensor,
        src: int,
        *,
        tag: int = ...,
        async_op: Literal[False] = ...,
        timeout: Timeout = ...,
    ) -> int: ...
    @overload
    def recv(
        self,
        tensor: torch.Tensor,
        src: int,
        *,
        tag: int = ...,
        async_op: Literal[True],
        timeout: Timeout = ...,
    ) -> Handle: ...
    @overload
    def recv(
        self,
        tensor: torch.Tensor,
        src: int,
        *,
        tag: int = ...,
        async_op: bool = ...,
        timeout: Timeout = ...,
    ) -> int | Handle: ...
    @collective("recv")
    def recv(
        self,
        tensor: torch.Tensor,
        src: int,
        *,
        tag: int = 0,
        async_op: bool = False,
        timeout: Timeout = None,
    ) -> int | Handle:
        """Receive into ``tensor`` what rank ``src`` sends with :meth:`send`.

        Returns the sender's rank (``src``), as torch's ``recv`` does; with
        ``async_op=True``, a handle to wait on.

        Examples:
            >>> x = torch.empty(3)
            >>> if comm.rank == 1:                 # rank 0 sends it with send(x, dst=1)
            ...     sender = comm.recv(x, src=0)     # 0
        """
        handle = self._p2p("recv", tensor, src, tag, async_op, timeout)
        return src if handle is None else handle

    @collective("isend")
    def isend(
        self, tensor: torch.Tensor, dst: int, *, tag: int = 0, timeout: Timeout = None
    ) -> Handle:
        """:meth:`send` that returns at once; the handle's ``wait()`` completes it.

        Examples:
            >>> if comm.rank == 0 and comm.world_size > 1:
            ...     h = comm.isend(torch.ones(2), dst=1)
            ...     h.wait()        # the other side: irecv(x, src=0)
        """
        return cast(Handle, self._p2p("send", tensor, dst, tag, True, timeout))

    @collective("irecv")
    def irecv(
        self, tensor: torch.Tensor, src: int, *, tag: int = 0, timeout: Timeout = None
    ) -> Handle:
        """:meth:`recv` that returns at once; read ``tensor`` after the handle's ``wait()``.

        Examples:
            >>> x = torch.empty(2)
            >>> if comm.rank == 1:
            ...     h = comm.irecv(x, src=0)
            ...     h.wait()        # x holds what rank 0 sent
        """
        return cast(Handle, self._p2p("recv", tensor, src, tag, True, timeout))

    def _p2p(
        self,
        kind: str,
        tensor: torch.Tensor,
        peer: int,
        tag: int,
        async_op: bool,
        timeout: Timeout,
    ) -> Handle | None:
        if self._lanes.point_to_point(kind, tensor, peer, tag, async_op, timeout):
            return None
        engine = self._member(kind)
        check.tensor(tensor, "tensor")
        check.peer(peer, engine.world_size, engine.rank, "dst" if kind == "send" else "src")
        check.tag(tag)
        learn_once(engine, kind, dtype=tensor.dtype)
        work_t = engine.to_device(tensor)
        world = engine.world_size
        return engine.point_to_point(
            kind,
            work_t,
            peer,
            tag,
            finish=(lambda: copy_back(work_t, tensor, world))
            if kind == "recv" and work_t is not tensor
            else None,
            timeout=None if timeout is None else as_timedelta(timeout),
            async_op=async_op,
            value=[tensor],
        )

    @collective("batch_isend_irecv")
    def batch_isend_irecv(
        self, p2p_op_list: Sequence[P2POp], *, timeout: Timeout = None
    ) -> list[Handle]:
        """Post every send and receive of ``p2p_op_list`` at once; returns handles to wait on.

        What torch's ``batch_isend_irecv`` does: engines that deadlock on
        unbatched two-way exchange (NCCL) get the whole batch as one group.
        Peers are ranks within this communicator. The list holds one handle
        for the whole batch; wait on every handle before reading what was
        received.

        Examples:
            >>> n, r = comm.world_size, comm.rank
            >>> got = torch.empty(2)
            >>> if n > 1:          # each rank sends right and receives from the left
            ...     ops = [P2POp(comm.isend, torch.ones(2), (r + 1) % n),
            ...            P2POp(comm.irecv, got, (r - 1) % n)]
            ...     for h in comm.batch_isend_irecv(ops):
            ...         h.wait()
        """
        engine = self._member("batch_isend_irecv")
        world = engine.world_size
        requests = [
            P2PRequest(kind, engine.to_device(tensor), peer, tag)
            for kind, tensor, peer, tag in check.p2p_batch(p2p_op_list, world, engine.rank)
        ]

        def finish() -> None:
            for request, op in zip(requests, p2p_op_list):
                if request.kind == "recv":
                    copy_back(request.tensor, op.tensor, world)

        handle = engine.batch_isend_irecv(
            requests,
            finish=finish,
            timeout=as_timedelta(timeout),
            value=[op.tensor for op in p2p_op_list],
        )
        return [handle]

    # -- object collectives -------------------------------------------------------
    # Each takes ``timeout=`` (per round) and ``async_op=``: with it, the first
    # round is issued and a ResultHandle returned whose wait() gives the result.
    # ``weights_only=True`` loads only tensors and allowed types, as torch 2.14's
    # (the restricted loading: serialization.object_serializer), on every torch.
    def _obj_call(
        self,
        what: str,
        serializer: Serializer | None,
        weights_only: bool,
        timeout: Timeout,
        async_op: bool,
    ) -> _object_calls.ObjectCall:
        """Object collective ``what`` on this member, with its settings (see _object_calls)."""
        engine = self._member(what)
        default, slot = self._serializer, self._slot_size
        return _object_calls.ObjectCall(
            engine, serializer, default, weights_only, slot, timeout, async_op
        )

    @overload
    def all_gather_object(
        self,
        obj: Any,
        *,
        serializer: Serializer | None = ...,
        weights_only: bool = ...,
        timeout: Timeout = ...,
        async_op: Literal[False] = ...,
    ) -> list[Any]: ...
    @overload
    def all_gather_object(
        self,
        obj: Any,
        *,
        serializer: Serializer | None = ...,
        weights_only: bool = ...,
        timeout: Timeout = ...,
        async_op: Literal[True],
    ) -> ResultHandle[list[Any]]: ...
    @overload
    def all_gather_object(
        self,
        obj: Any,
        *,
        serializer: Serializer | None = ...,
        weights_only: bool = ...,
        timeout: Timeout = ...,
        async_op: bool = ...,
    ) -> list[Any] | ResultHandle[list[Any]]: ...
    @collective("all_gather_object")
    def all_gather_object(
        self,
        obj: Any,
        *,
        serializer: Serializer | None = None,
        weights_only: bool = False,
        timeout: Timeout = None,
        async_op: bool = False,
    ) -> list[Any] | ResultHandle[list[Any]]:
        """Every rank's ``obj``, as a list indexed by rank.

        If any rank fails to serialize its object, every rank raises the same
        :class:`~commlib.errors.RemoteError` naming it. This rank's own entry is
        ``obj`` itself, not a copy. With ``async_op=True`` it returns a
        :class:`~commlib.handle.ResultHandle` whose ``wait()`` gives the list.

        Examples:
            >>> comm.all_gather_object({"rank": comm.rank})
            [{'rank': 0}]
            >>> comm.all_gather_object("x", async_op=True).wait()
            ['x']
        """
        call = self._obj_call("all_gather_object", serializer, weights_only, timeout, async_op)
        return _object_calls.all_gather_object(call, obj)

    @overload
    def gather_object(
        self,
        obj: Any,
        dst: int = ...,
        *,
        serializer: Serializer | None = ...,
        weights_only: bool = ...,
        timeout: Timeout = ...,
        async_op: Literal[False] = ...,
    ) -> list[Any] | None: ...
    @overload
    def gather_object(
        self,
        obj: Any,
        dst: int = ...,
        *,
        serializer: Serializer | None = ...,
        weights_only: bool = ...,
        timeout: Timeout = ...,
        async_op: Literal[True],
    ) -> ResultHandle[list[Any] | None]: ...
    @overload
    def gather_object(
        self,
        obj: Any,
        dst: int = ...,
        *,
        serializer: Serializer | None = ...,
        weights_only: bool = ...,
        timeout: Timeout = ...,
        async_op: bool = ...,
    ) -> list[Any] | ResultHandle[list[Any] | None] | None: ...
    @collective("gather_object")
    def gather_object(
        self,
        obj: Any,
        dst: int = 0,
        *,
        serializer: Serializer | None = None,
        weights_only: bool = False,
        timeout: Timeout = None,
        async_op: bool = False,
    ) -> list[Any] | ResultHandle[list[Any] | None] | None:
        """Every rank's ``obj`` on ``dst`` (a list); other ranks get ``None``.

        Examples:
            >>> comm.gather_object(comm.rank, dst=0)
            [0]
        """
        call = self._obj_call("gather_object", serializer, weights_only, timeout, async_op)
        return _object_calls.gather_object(call, obj, dst)

    @collective("broadcast_object_list")
    def broadcast_object_list(
        self,
        object_list: list[Any],
        src: int = 0,
        *,
        serializer: Serializer | None = None,
        weights_only: bool = False,
        timeout: Timeout = None,
        async_op: bool = False,
    ) -> ResultHandle[None] | None:
        """Fill ``object_list`` on every rank with ``src``'s objects, in place.

        Every rank passes a list of the same length.

        Examples:
            >>> objs = ["foo", 12, {1: 2}] if comm.rank == 0 else [None] * 3
            >>> comm.broadcast_object_list(objs)
            >>> objs
            ['foo', 12, {1: 2}]
        """
        call = self._obj_call("broadcast_object_list", serializer, weights_only, timeout, async_op)
        return _object_calls.broadcast_object_list(call, object_list, src)

    @overload
    def broadcast_object(
        self,
        obj: Any = ...,
        src: int = ...,
        *,
        serializer: Serializer | None = ...,
        weights_only: bool = ...,
        timeout: Timeout = ...,
        async_op: Literal[False] = ...,
    ) -> Any: ...
    @overload
    def broadcast_object(
        self,
        obj: Any = ...,
        src: int = ...,
        *,
        serializer: Serializer | None = ...,
        weights_only: bool = ...,
        timeout: Timeout = ...,
        async_op: Literal[True],
    ) -> ResultHandle[Any]: ...
    @overload
    def broadcast_object(
        self,
        obj: Any = ...,
        src: int = ...,
        *,
        serializer: Serializer | None = ...,
        weights_only: bool = ...,
        timeout: Timeout = ...,
        async_op: bool = ...,
    ) -> Any: ...
    @collective("broadcast_object")
    def broadcast_object(
        self,
        obj: Any = None,
        src: int = 0,
        *,
        serializer: Serializer | None = None,
        weights_only: bool = False,
        timeout: Timeout = None,
        async_op: bool = False,
    ) -> Any:
        """Return ``src``'s ``obj`` on every rank.

        Examples:
            >>> comm.broadcast_object({"lr": 0.1} if comm.rank == 0 else None)
            {'lr': 0.1}
        """
        call = self._obj_call("broadcast_object", serializer, weights_only, timeout, async_op)
        return _object_calls.broadcast_object(call, obj, src)

    @collective("scatter_object_list")
    def scatter_object_list(
        self,
        output_list: list[Any],
        input_list: Sequence[Any] | None = None,
        src: int = 0,
        *,
        serializer: Serializer | None = None,
        weights_only: bool = False,
        timeout: Timeout = None,
        async_op: bool = False,
    ) -> ResultHandle[None] | None:
        """Put ``input_list[i]`` of ``src`` into ``output_list[0]`` on each rank ``i``.

        ``src`` passes one picklable object per rank (others pass ``None``);
        every rank passes a non-empty ``output_list`` to fill, as torch's
        ``scatter_object_list``. ``src`` keeps its own object itself, not a
        copy. Each object is serialized on its own and reaches only its rank;
        a failure on any rank (a bad list, an unpicklable object) is raised by
        every rank.

        Examples:
            >>> box = [None]
            >>> shards = [{"shard": r} for r in range(comm.world_size)]
            >>> comm.scatter_object_list(box, shards if comm.rank == 0 else None, src=0)
            >>> box
            [{'shard': 0}]
        """
        call = self._obj_call("scatter_object_list", serializer, weights_only, timeout, async_op)
        return _object_calls.scatter_object_list(call, output_list, input_list, src)

    @collective("send_object_list")
    def send_object_list(
        self,
        object_list: list[Any],
        dst: int,
        *,
        serializer: Serializer | None = None,
        weights_only: bool = False,
        timeout: Timeout = None,
        async_op: bool = False,
    ) -> ResultHandle[None] | None:
        """Send the picklable objects of ``object_list`` to ``dst`` (see :meth:`recv_object_list`).

        Small lists travel in one message of ``slot_size`` bytes; larger ones
        follow point to point, their tensors and arrays out of band. If the
        list cannot be serialized, this rank raises
        :class:`~commlib.errors.RemoteError` and ``dst`` raises the same at
        once: it never waits for a payload that will not come.

        Examples:
            >>> if comm.rank == 0 and comm.world_size > 1:
            ...     comm.send_object_list([{"step": 3}], dst=1)
        """
        call = self._obj_call("send_object_list", serializer, weights_only, timeout, async_op)
        return _object_calls.send_object_list(call, object_list, dst)

    @overload
    def recv_object_list(
        self,
        object_list: list[Any],
        src: int,
        *,
        serializer: Serializer | None = ...,
        weights_only: bool = ...,
        timeout: Timeout = ...,
        async_op: Literal[False] = ...,
    ) -> int: ...
    @overload
    def recv_object_list(
        self,
        object_list: list[Any],
        src: int,
        *,
        serializer: Serializer | None = ...,
        weights_only: bool = ...,
        timeout: Timeout = ...,
        async_op: Literal[True],
    ) -> ResultHandle[int]: ...
    @overload
    def recv_object_list(
        self,
        object_list: list[Any],
        src: int,
        *,
        serializer: Serializer | None = ...,
        weights_only: bool = ...,
        timeout: Timeout = ...,
        async_op: bool = ...,
    ) -> int | ResultHandle[int]: ...
    @collective("recv_object_list")
    def recv_object_list(
        self,
        object_list: list[Any],
        src: int,
        *,
        serializer: Serializer | None = None,
        weights_only: bool = False,
        timeout: Timeout = None,
        async_op: bool = False,
    ) -> int | ResultHandle[int]:
        """Fill ``object_list`` with what rank ``src`` sends with :meth:`send_object_list`.

        Returns the sender's rank (``src``), as torch's ``recv_object_list``
        does; with ``async_op=True``, a handle whose ``wait()`` returns it.
        ``object_list`` must have the length of the list sent; a different
        one raises ``ValueError`` after the message is received (so the
        sender never blocks).

        Examples:
            >>> box = [None]
            >>> if comm.rank == 1:
            ...     sender = comm.recv_object_list(box, src=0)   # 0; box: [{'step': 3}]
        """
        call = self._obj_call("recv_object_list", serializer, weights_only, timeout, async_op)
        return _object_calls.recv_object_list(call, object_list, src)
