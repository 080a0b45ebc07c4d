"""The engine: the one layer every collective passes through on its way to a backend.

One :class:`Engine` per :class:`~commlib.Communicator`. It owns what the
communicator's collectives share and nothing else:

* the backend plugin and the process group it serves (the plugin's methods
  are handed the group here, never by callers);
* sequence numbers, one per call, that name a collective in error messages:
  the same on every rank for the collectives; point-to-point calls, which only
  the ranks involved make, are numbered apart (:data:`commlib._catalog.POINT_TO_POINT`);
* timeouts: the communicator's, or a call's own, which also bound the
  engine's own wait (:meth:`~commlib.Backend.set_timeout`), so an abandoned
  operation ends inside the engine too and the process can exit;
* :meth:`Engine.map_errors`, the one place where what an engine raises
  (torch's ``DistError`` family, gloo's and NCCL's ``RuntimeError``) becomes a
  commlib error, by type first (:mod:`commlib._error_map`), then by the
  backend's reading of its own engine's text
  (:meth:`~commlib.Backend.is_timeout`, :meth:`~commlib.Backend.failed_peer`):
  :class:`~commlib.errors.CommTimeoutError` naming the ranks that held the
  call up, or :class:`~commlib.errors.CommError` naming the rank whose
  connection was lost where the backend can tell;
* the group's health (:mod:`commlib._health`): the first engine failure marks
  the group broken, and every later call raises
  :class:`~commlib.errors.CommBrokenError` before anything is sent;
* shrink and grow live in :mod:`commlib._membership`: the surviving ranks
  agree on who goes on (:mod:`commlib._survivors`) and the plugin builds
  their new group.

The communicator calls the typed methods (and :meth:`Engine.direct` for a
lane); the protocols (:mod:`commlib._objects`, :mod:`commlib._ragged`,
:mod:`commlib._guard`, ...) start each round as one step, naming the
plugin's method, and never reach the plugin themselves::

    engine.run("all_gather", "all_gather_into_tensor", out, inp)
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist

from commlib import _catalog, _survivors, _waiting
from commlib._error_map import MapErrors
from commlib._health import health_of
from commlib.backend import Backend, DirectCall
from commlib.handle import Handle
from commlib.types import EngineOp, Group, P2PRequest, Work

# the engine's own limit on an operation: a little after commlib's, so each
# rank's wait ends first (naming the ranks it waited for), and soon enough
# after it that the process can exit
_ENGINE_SLACK, _ENGINE_SLACK_SHARE, _ENGINE_SLACK_MAX = 2.0, 0.05, 60.0
# a direct call's argument not passed (its lane's call takes fewer)
_NO_ARG: Any = object()


def engine_limit(limit: datetime.timedelta) -> datetime.timedelta:
    """How long the engine itself may take on an operation commlib waits ``limit`` for.

    Examples:
        >>> engine_limit(datetime.timedelta(seconds=10))
        datetime.timedelta(seconds=12, microseconds=500000)
    """
    seconds = limit.total_seconds()
    return datetime.timedelta(
        seconds=seconds + min(_ENGINE_SLACK + _ENGINE_SLACK_SHARE * seconds, _ENGINE_SLACK_MAX)
    )


class Pending:
    """An engine call in flight: its work, and the name and number errors will use."""

    __slots__ = ("seq", "what", "work")

    def __init__(self, work: Work | None, what: str, seq: int):
        self.work = work
        self.what = what
        self.seq = seq


class Engine:
    """A backend plugin bound to one process group, with timeouts and error mapping.

    Args:
        plugin: the backend serving the group.
        group: the process group (``None`` for backends without one).
        timeout: how long a call may wait for its peers unless it says otherwise.

    Examples:
        >>> plugin = commlib.plugins.resolve_backend("single")   # a world of one
        >>> engine = Engine(plugin, None, timeout=datetime.timedelta(seconds=30))
        >>> t = torch.ones(2)
        >>> engine.run("all_reduce", "all_reduce", t, "sum")
        >>> engine.seq, engine.rank, engine.world_size
        (1, 0, 1)

    ``seq`` counts the collectives' engine calls, the same on every rank;
    ``p2p_seq`` this rank's point-to-point calls.
    """

    def __init__(self, plugin: Backend, group: Group, timeout: datetime.timedelta):
        self.plugin = plugin
        self.group = group
        self.timeout = timeout
        self.seq = 0
        self.p2p_seq = 0
        self.rank = plugin.rank(group)
        self.world_size = plugin.world_size(group)
        self.health = health_of(group)
        if group is not None:
            _survivors.record_process()
        # commlib.observe: the user-level collective in progress, and who to tell
        # when it makes its first engine call (None: nobody observes)
        self.observed: Any = None
        self.on_call: Callable[[str], None] | None = None
        # what the protocols keep per engine between calls (the learnt rooms, host
        # slots): an attribute lookup, where a weak dictionary keyed by the engine
        # costs microseconds a call
        self.kept: dict[str, Any] = {}
        # the device the plugin's direct calls take tensors on (commlib._lanes.serves)
        self.device_obj = plugin.device()
        self.on_cpu = self.device_obj.type == "cpu"
        # whether the plugin averages itself (mean as avg), else commlib divides a sum
        self.native_avg = bool(plugin.native_avg)
        # how the object collectives move what does not fit the first round
        self.large_payload_transport = plugin.large_payload_transport
        # up to how many bytes the check's round completes a call (None: what the slot learns)
        self.completed_by_check_bytes = plugin.completed_by_check_bytes
        # the backend's name, for messages
        self.backend_name = plugin.name
        # decided once: whether waits go in slices, watching for a failure announced
        self._sliced = bool(plugin.interruptible_wait) and group is not None
        # or order the caller's stream, as torch's blocking call does (a timeout
        # there would block the host until the device is done)
        self._on_stream = not self._sliced and bool(plugin.waits_on_stream())
        # and whether a point-to-point wait may be ended by another thread's timed-out wait
        self._interrupt_p2p = bool(plugin.p2p_timeout_ends_group)
        # the plugin's methods the typed calls make, bound once
        self._all_reduce = plugin.all_reduce
        self._broadcast = plugin.broadcast
        self._all_gather_into_tensor = plugin.all_gather_into_tensor
        self._all_gather = plugin.all_gather
        self._gather = plugin.gather
        self._reduce = plugin.reduce
        self._reduce_scatter = plugin.reduce_scatter
        self._scatter = plugin.scatter
        self._all_to_all = plugin.all_to_all
        self._all_to_all_single = plugin.all_to_all_single
        self._send = plugin.send
        self._recv = plugin.recv
        self._batch_isend_irecv = plugin.batch_isend_irecv
        #: the plugin's direct calls learnt so far (:func:`commlib._lanes.learn`):
        #: (collective, *key) -> the call, or None where the plugin's method must run
        self.lanes: dict[tuple[Any, ...], DirectCall | None] = {}

    # -- devices ---------------------------------------------------------------------
    def device(self) -> torch.device:
        """The device the plugin's collectives need."""
        return self.plugin.device()

    def to_device(self, tensor: torch.Tensor) -> torch.Tensor:
        """``tensor`` as the plugin needs it: on its device, contiguous, outside autograd."""
        # a tensor already on the device is itself (Backend.to_device): no call for it
        moved = tensor if self.on_cpu and tensor.is_cpu else self.plugin.to_device(tensor)
        if moved.requires_grad:
            # collectives write in place outside autograd, as torch.distributed's do: a
            # loss averaged for logging, a leaf parameter (an out= reduction refuses both)
            moved = moved.detach()
        return moved if moved.is_contiguous() else moved.contiguous()

    # -- what the plugin says, asked by the protocols and the error map ----------------
    def sends_slot_rows_apart(self, slot_bytes: int) -> bool:
        """Whether the plugin's ``all_gather_slots`` here sends row ``j`` to rank ``j``."""
        return self.plugin.sends_slot_rows_apart(self.world_size, slot_bytes)

    def direct_call(self, collective: str, **key: Any) -> DirectCall | None:
        """The plugin's direct call for ``collective`` and ``key`` on this group, if any."""
        return self.plugin.direct_call(collective, self.group, **key)

    def shrink_group(self, keep: Sequence[int], name: str, timeout: datetime.timedelta) -> Group:
        """The plugin's new process group over ``keep`` (ranks of this one), made by them alone."""
        return self.plugin.shrink_group(self.group, keep, name, timeout)

    # read on the failure path only (commlib._error_map): the backend reads its engine's text
    def is_timeout(self, exc: BaseException) -> bool:
        """Whether the plugin reads ``exc`` as its engine running out of time."""
        return self.plugin.is_timeout(exc)

    def describe_failure(self, exc: BaseException) -> str:
        """The engine's failure ``exc`` in the plugin's words."""
        return self.plugin.describe_failure(exc)

    def failed_peer(self, exc: BaseException) -> int | None:
        """The rank whose connection ``exc`` says was lost, where the plugin can tell."""
        return self.plugin.failed_peer(exc, self.group)

    def lost_peer(self, exc: BaseException) -> bool:
        """Whether ``exc`` says a peer's connection was lost (no rank named)."""
        return self.plugin.lost_peer(exc)

    def abort(self) -> None:
        """Stop what is in flight on the group (once, when it broke)."""
        shared = self.kept.get("shared")
        if shared is not None:  # a late rank must not complete a round the others left
            shared.abort()
        self.plugin.abort(self.group)

    # -- errors ----------------------------------------------------------------------
    def map_errors(self, what: str, seq: int, limit: datetime.timedelta) -> MapErrors:
        """Turn an engine failure inside the block into the commlib error for it.

        A timeout becomes :class:`~commlib.errors.CommTimeoutError` naming where
        the other ranks are; a failure where a peer is gone a
        :class:`~commlib.errors.RankLostError`; any other a ``CommError``.
        commlib's own errors pass through.

        The failure also breaks the group: later calls raise
        :class:`~commlib.errors.CommBrokenError` before anything is sent.

        Examples:
            >>> scratch = Engine(engine.plugin, None, engine.timeout)
            >>> with scratch.map_errors("all_reduce", 7, scratch.timeout):
            ...     raise ConnectionResetError("connection reset by peer")
            Traceback (most recent call last):
            ...
            commlib.errors.RankLostError: all_reduce failed on rank 0: connection reset by peer
            >>> scratch.health.broken
            'all_reduce #7: all_reduce failed on rank 0: connection reset by peer'
        """
        return MapErrors(self, what, seq, limit)

    def _raise_mapped(
        self, what: str, seq: int, limit: datetime.timedelta, started: float, exc: BaseException
    ) -> None:
        """Raise the commlib error for ``exc``, an engine call's failure (see :meth:`map_errors`).

        What the calls that issue and wait in one ``try`` do with what they
        caught; returns for an exception that is not the engine's (the caller
        re-raises it).
        """
        mapping = self.map_errors(what, seq, limit)
        mapping.started = started
        mapping.__exit__(type(exc), exc, exc.__traceback__)

    def bound_engine_wait(self, limit: datetime.timedelta) -> None:
        """Make the engine itself give up on operations issued from now on, soon after ``limit``.

        A little later than commlib does (:func:`engine_limit`), so that every
        rank's own wait ends first and names the ranks it waited for.

        Examples:
            >>> engine.bound_engine_wait(datetime.timedelta(seconds=30))
        """
        if self.health.engine_timeout != limit:
            self.plugin.set_timeout(self.group, engine_limit(limit))
            self.health.engine_timeout = limit

    def _wait_work(self, work: Work, limit: datetime.timedelta) -> None:
        """``work.wait(limit)``, ended early when another rank announces the group broke."""
        if self._sliced:
            _waiting.wait_watching(work, limit, self.group, self._interrupt_p2p)
        elif self._on_stream:
            work.wait()
        else:
            work.wait(limit)

    def start(self, what: str, method: str, *args: Any, **kwargs: Any) -> Pending:
        """Issue the plugin's ``method`` as one step of a protocol; wait with :meth:`wait`.

        ``method`` names the plugin's method (``"broadcast"``, ``"exchange"``,
        ``"all_gather_slots"``, ...), called as ``method(*args, group=...,
        async_op=True, **kwargs)``; ``what`` names the collective in errors.
        The protocols start every engine call here (or through :meth:`run`),
        never on the plugin itself.

        Examples:
            >>> t = torch.ones(2)
            >>> pending = engine.start("broadcast", "broadcast", t, 0)
            >>> engine.wait(pending)
        """
        call = getattr(self.plugin, method)
        seq = self._next(what)
        with self.map_errors(what, seq, self.timeout):
            work = call(*args, group=self.group, async_op=True, **kwargs)
        return Pending(work, what, seq)

    def start_lane(self, what: str, lane: DirectCall, *args: Any) -> Pending:
        """Issue ``lane`` (a direct call: ``lane.call(*args, lane.options)``) as one step.

        What :meth:`start` does for a plugin's method; wait with :meth:`wait`.

        Examples:
            >>> engine.wait(engine.start_lane("all_reduce", DirectCall(None, None)))
        """
        seq = self._next(what)
        call = lane.call
        if call is None:
            return Pending(None, what, seq)  # a group of one: the identity
        with self.map_errors(what, seq, self.timeout):
            work = call(*args, lane.options)
        return Pending(work, what, seq)

    def _next(self, what: str) -> int:
        """The next engine call's sequence number, once the group is known healthy."""
        self.health.check(what)
        if what in _catalog.POINT_TO_POINT:
            self.p2p_seq += 1
            seq = self.p2p_seq
        else:
            self.seq += 1
            seq = self.seq
        if self.on_call is not None:
            self.on_call(what)
        return seq

    def wait(self, pending: Pending, timeout: datetime.timedelta | None = None) -> None:
        """Wait for a started call at most ``timeout`` (the engine's by default)."""
        if pending.work is None:
            return
        limit = timeout or self.timeout
        with self.map_errors(pending.what, pending.seq, limit):
            self._wait_work(pending.work, limit)

    def run(
        self,
        what: str,
        method: str,
        *args: Any,
        timeout: datetime.timedelta | None = None,
        **kwargs: Any,
    ) -> None:
        """Start the plugin's ``method`` (see :meth:`start`) and wait for it: one blocking step.

        Examples:
            >>> out, t = torch.empty(engine.world_size * 2), torch.ones(2)
            >>> engine.run("all_gather", "all_gather_into_tensor", out, t)
            >>> out
            tensor([1., 1.])
        """
        call = getattr(self.plugin, method)
        limit = timeout or self.timeout
        if self.health.engine_timeout != limit:
            self.bound_engine_wait(limit)
        seq = self._next(what)
        # start and wait in one block, map_errors' work without its context manager
        # on the way: a try costs nothing until something is raised
        started = time.monotonic()
        try:
            work = call(*args, group=self.group, async_op=True, **kwargs)
            if work is not None:
                self._wait_work(work, limit)
        except BaseException as exc:
            self._raise_mapped(what, seq, limit, started, exc)
            raise

    # -- the collectives, one typed method each ------------------------------------------
    # Each hands its arguments to _issue with the plugin's method bound once
    # (__init__): nothing is looked up by name nor packed into keywords per call.
    # -- direct calls: the plugin's engine call, issued here --------------------------
    def direct(
        self,
        what: str,
        lane: DirectCall,
        first: Any = _NO_ARG,
        second: Any = _NO_ARG,
        *more: Any,
        limit: datetime.timedelta | None = None,
    ) -> None:
        """``lane.call(first, second, *more, lane.options)``, blocking: :meth:`_issue`, fewer.

        The lane's arguments before its options, as many as its call takes
        (none for a barrier).

        For a blocking call with the communicator's timeout whose
        arguments :func:`commlib._lanes.serves` took: one frame between the communicator and
        the engine's own method. Sequence number, health, the engine's bound
        wait, observers' first-call hook, sliced wait and error mapping as
        for every other call.

        Examples:
            >>> engine.direct("all_reduce", DirectCall(None, None))   # nothing to issue
        """
        health = self.health
        if health.broken is not None:
            health.check(what)
        if limit is None:
            limit = self.timeout
        if health.engine_timeout is not limit:
            self.bound_engine_wait(limit)
        self.seq += 1
        seq = self.seq
        if self.on_call is not None:
            self.on_call(what)
        call = lane.call
        if call is None:
            return  # a group of one: the identity
        started = time.monotonic()
        try:
            # the call's arity spelt out: a call through *args costs a list, a tuple and
            # an interpreter frame of its own (a tenth of a microsecond, of a few)
            if more:
                work = call(first, second, *more, lane.options)
            elif second is not _NO_ARG:
                work = call(first, second, lane.options)
            elif first is not _NO_ARG:
                work = call(first, lane.options)
            else:
                work = call(lane.options)
            if work is not None:
                if not self._sliced:
                    if self._on_stream:
                        work.wait()
                    else:
                        work.wait(limit)
                elif limit > _waiting.FIRST_SLICE:
                    try:  # the one slice most waits need, inline
                        work.wait(_waiting.FIRST_SLICE)
                    except RuntimeError:
                        # the slice ran out, or the work failed: waiting again on it
                        # raises its error at once, or goes on in slices
                        _waiting.wait_watching(work, limit, self.group)
                else:
                    _waiting.wait_watching(work, limit, self.group)
        except BaseException as exc:
            self._raise_mapped(what, seq, limit, started, exc)
            raise

    def direct_p2p(
        self, kind: str, lane: DirectCall, tensor: torch.Tensor, peer: int, tag: int
    ) -> None:
        """A blocking ``send`` or ``recv`` (``kind``): ``lane.call([tensor], peer, tag)``.

        What :meth:`direct` does for a collective, numbered as point to point
        and waited on as one (watched, see :mod:`commlib._waiting`; in slices
        only where the work says its wait only waits, as MPI's requests do).

        Examples:
            >>> engine.direct_p2p("send", lane, torch.ones(2), 1, 0)  # 2 ranks  # doctest: +SKIP
        """
        health = self.health
        if health.broken is not None:
            health.check(kind)
        limit = self.timeout
        if health.engine_timeout is not limit:
            self.bound_engine_wait(limit)
        self.p2p_seq += 1
        seq = self.p2p_seq
        if self.on_call is not None:
            self.on_call(kind)
        started = time.monotonic()
        try:
            work = lane.call([tensor], peer, tag)  # type: ignore[misc]
            if work is not None:
                if self._sliced:
                    _waiting.wait_point_to_point(work, limit, self.group, self._interrupt_p2p)
                elif self._on_stream:
                    work.wait()
                else:
                    work.wait(limit)
        except BaseException as exc:
            self._raise_mapped(kind, seq, limit, started, exc)
            raise

    def _issue(
        self,
        what: str,
        call: Callable[..., Work | None],
        args: tuple[Any, ...],
        finish: Callable[[], None] | None,
        timeout: datetime.timedelta | None,
        async_op: bool,
        value: list[torch.Tensor] | None,
        tail: tuple[Any, ...] = (),
    ) -> Handle | None:
        """``call(*args, group, True, *tail)``, waited for unless ``async_op``, then ``finish``.

        A user-facing collective's engine call, its plugin method bound
        already: the steps of :meth:`run` (bounded engine wait, sequence
        number, error mapping, sliced wait) in one frame, a ``try`` in place
        of :meth:`map_errors`' context manager (it costs nothing until
        something is raised).
        """
        limit = timeout or self.timeout
        if self.health.engine_timeout != limit:
            self.bound_engine_wait(limit)
        seq = self._next(what)
        started = time.monotonic()
        try:
            work = call(*args, self.group, True, *tail)
            if async_op:
                pending = Pending(work, what, seq)
                return Handle(
                    lambda t: self.wait(pending, t or timeout), finish, work, value=value
                )
            if work is not None:
                self._wait_work(work, limit)
        except BaseException as exc:
            self._raise_mapped(what, seq, limit, started, exc)
            raise
        if finish is not None:
            finish()
        return None

    def all_reduce(
        self,
        tensor: torch.Tensor,
        op: EngineOp,
        *,
        what: str = "all_reduce",
        finish: Callable[[], None] | None = None,
        timeout: datetime.timedelta | None = None,
        async_op: bool = False,
        value: list[torch.Tensor] | None = None,
    ) -> Handle | None:
        """The plugin's all_reduce of ``tensor`` with ``op``, as :meth:`_issue` runs a call.

        Blocking unless ``async_op`` (then a :class:`~commlib.Handle` whose
        ``wait()`` also runs ``finish``); ``finish`` runs after the engine's
        part; ``value`` is what the handle's future holds; ``what`` names
        the collective in errors (an async ``barrier`` is an all_reduce).
        The other typed methods take the same keywords.

        Examples:
            >>> t = torch.ones(2)
            >>> engine.all_reduce(t, "sum")
            >>> t
            tensor([1., 1.])
        """
        return self._issue(what, self._all_reduce, (tensor, op), finish, timeout, async_op, value)

    def broadcast(
        self,
        tensor: torch.Tensor,
        src: int,
        *,
        finish: Callable[[], None] | None = None,
        timeout: datetime.timedelta | None = None,
        async_op: bool = False,
        value: list[torch.Tensor] | None = None,
    ) -> Handle | None:
        """The plugin's broadcast of ``src``'s ``tensor`` (keywords: :meth:`all_reduce`).

        Examples:
            >>> t = torch.ones(2)
            >>> engine.broadcast(t, 0)
        """
        return self._issue(
            "broadcast", self._broadcast, (tensor, src), finish, timeout, async_op, value
        )

    def all_gather_into_tensor(
        self,
        output: torch.Tensor,
        tensor: torch.Tensor,
        *,
        what: str = "all_gather_into_tensor",
        finish: Callable[[], None] | None = None,
        timeout: datetime.timedelta | None = None,
        async_op: bool = False,
        value: list[torch.Tensor] | None = None,
    ) -> Handle | None:
        """Every rank's ``tensor`` into ``output`` (keywords: :meth:`all_reduce`).

        ``what`` names the collective in errors (``all_gather`` gathers through it).

        Examples:
            >>> out = torch.empty(engine.world_size * 2)
            >>> engine.all_gather_into_tensor(out, torch.ones(2))
            >>> out
            tensor([1., 1.])
        """
        return self._issue(
            what, self._all_gather_into_tensor, (output, tensor), finish, timeout, async_op, value
        )

    def all_gather(
        self,
        tensor_list: list[torch.Tensor],
        tensor: torch.Tensor,
        *,
        finish: Callable[[], None] | None = None,
        timeout: datetime.timedelta | None = None,
        async_op: bool = False,
        value: list[torch.Tensor] | None = None,
    ) -> Handle | None:
        """Every rank's ``tensor`` into ``tensor_list`` (keywords: :meth:`all_reduce`).

        Examples:
            >>> outs = [torch.empty(2) for _ in range(engine.world_size)]
            >>> engine.all_gather(outs, torch.ones(2))
            >>> outs
            [tensor([1., 1.])]
        """
        return self._issue(
            "all_gather", self._all_gather, (tensor_list, tensor), finish, timeout, async_op, value
        )

    def gather(
        self,
        tensor: torch.Tensor,
        gather_list: list[torch.Tensor] | None,
        dst: int,
        *,
        finish: Callable[[], None] | None = None,
        timeout: datetime.timedelta | None = None,
        async_op: bool = False,
        value: list[torch.Tensor] | None = None,
    ) -> Handle | None:
        """Every rank's ``tensor`` into ``gather_list`` on ``dst`` (keywords: :meth:`all_reduce`).

        Examples:
            >>> outs = [torch.empty(2) for _ in range(engine.world_size)]
            >>> engine.gather(torch.ones(2), outs, 0)
            >>> outs
            [tensor([1., 1.])]
        """
        return self._issue(
            "gather", self._gather, (tensor, gather_list, dst), finish, timeout, async_op, value
        )

    def reduce(
        self,
        tensor: torch.Tensor,
        dst: int,
        op: EngineOp,
        *,
        finish: Callable[[], None] | None = None,
        timeout: datetime.timedelta | None = None,
        async_op: bool = False,
        value: list[torch.Tensor] | None = None,
    ) -> Handle | None:
        """``tensor`` reduced with ``op`` into ``dst``'s (keywords: :meth:`all_reduce`).

        Examples:
            >>> t = torch.ones(2)
            >>> engine.reduce(t, 0, "sum")
        """
        return self._issue(
            "reduce", self._reduce, (tensor, dst, op), finish, timeout, async_op, value
        )

    def reduce_scatter(
        self,
        output: torch.Tensor,
        input: torch.Tensor,
        op: EngineOp,
        *,
        finish: Callable[[], None] | None = None,
        timeout: datetime.timedelta | None = None,
        async_op: bool = False,
        value: list[torch.Tensor] | None = None,
    ) -> Handle | None:
        """``input`` reduced with ``op``; this rank's chunk into ``output`` (see ``all_reduce``).

        Examples:
            >>> out = torch.empty(2)
            >>> engine.reduce_scatter(out, torch.ones(engine.world_size * 2), "sum")
            >>> out
            tensor([1., 1.])
        """
        return self._issue(
            "reduce_scatter", self._reduce_scatter, (output, input, op), finish, timeout,
            async_op, value,
        )  # fmt: skip

    def scatter(
        self,
        tensor: torch.Tensor,
        scatter_list: list[torch.Tensor] | None,
        src: int,
        *,
        finish: Callable[[], None] | None = None,
        timeout: datetime.timedelta | None = None,
        async_op: bool = False,
        value: list[torch.Tensor] | None = None,
    ) -> Handle | None:
        """``src``'s ``scatter_list[rank]`` into ``tensor`` (keywords: :meth:`all_reduce`).

        Examples:
            >>> t = torch.empty(2)
            >>> engine.scatter(t, [torch.ones(2)], 0)
            >>> t
            tensor([1., 1.])
        """
        return self._issue(
            "scatter", self._scatter, (tensor, scatter_list, src), finish, timeout, async_op, value
        )

    def all_to_all(
        self,
        output_list: list[torch.Tensor],
        input_list: list[torch.Tensor],
        *,
        finish: Callable[[], None] | None = None,
        timeout: datetime.timedelta | None = None,
        async_op: bool = False,
        value: list[torch.Tensor] | None = None,
    ) -> Handle | None:
        """``input_list[i]`` to rank ``i``, into ``output_list`` (keywords: :meth:`all_reduce`).

        Examples:
            >>> outs = [torch.empty(2)]
            >>> engine.all_to_all(outs, [torch.ones(2)])
            >>> outs
            [tensor([1., 1.])]
        """
        return self._issue(
            "all_to_all", self._all_to_all, (output_list, input_list), finish, timeout,
            async_op, value,
        )  # fmt: skip

    def all_to_all_single(
        self,
        output: torch.Tensor,
        input: torch.Tensor,
        output_split_sizes: list[int] | None,
        input_split_sizes: list[int] | None,
        *,
        finish: Callable[[], None] | None = None,
        timeout: datetime.timedelta | None = None,
        async_op: bool = False,
        value: list[torch.Tensor] | None = None,
    ) -> Handle | None:
        """``input``'s rows to every rank, theirs into ``output`` (keywords: :meth:`all_reduce`).

        Examples:
            >>> out = torch.empty(2)
            >>> engine.all_to_all_single(out, torch.ones(2), None, None)
            >>> out
            tensor([1., 1.])
        """
        return self._issue(
            "all_to_all_single", self._all_to_all_single,
            (output, input, output_split_sizes, input_split_sizes), finish, timeout, async_op,
            value,
        )  # fmt: skip

    def point_to_point(
        self,
        kind: str,
        tensor: torch.Tensor,
        peer: int,
        tag: int,
        *,
        finish: Callable[[], None] | None = None,
        timeout: datetime.timedelta | None = None,
        async_op: bool = False,
        value: list[torch.Tensor] | None = None,
    ) -> Handle | None:
        """The plugin's send (``kind="send"``) or recv of ``tensor`` with ``peer``.

        Examples:
            >>> engine.point_to_point("send", torch.ones(2), 1, 0)  # 2 ranks  # doctest: +SKIP
        """
        call = self._send if kind == "send" else self._recv
        return self._issue(kind, call, (tensor, peer), finish, timeout, async_op, value, (tag,))

    def batch_isend_irecv(
        self,
        requests: list[P2PRequest],
        *,
        finish: Callable[[], None] | None = None,
        timeout: datetime.timedelta | None = None,
        value: list[torch.Tensor] | None = None,
    ) -> Handle:
        """Every send and receive of ``requests`` posted at once; a handle to wait on.

        Examples:
            >>> engine.batch_isend_irecv([P2PRequest("send", torch.ones(2), 1, 0)])
            ... # doctest: +SKIP
        """
        handle = self._issue(
            "batch_isend_irecv", self._batch_isend_irecv, (requests,), finish, timeout, True,
            value,
        )  # fmt: skip
        assert handle is not None
        return handle

    def barrier(self, timeout: datetime.timedelta | None = None) -> None:
        """The plugin's barrier, bounded by ``timeout`` (the engine's by default).

        torch's own barrier (a plugin that keeps :meth:`Backend.barrier`) on
        an engine whose waits can be sliced is waited for like every other
        collective: a rank that another rank announced failed learns it
        within moments, not at its own timeout.
        """
        seq = self._next("barrier")
        limit = timeout or self.timeout
        self.bound_engine_wait(limit)
        with self.map_errors("barrier", seq, limit):
            if self._sliced_barrier:
                work = dist.barrier(group=self.group, async_op=True)
                if work is not None:
                    self._wait_work(work, limit)
            else:
                self.plugin.barrier(self.group, timeout=limit)

    @property
    def _sliced_barrier(self) -> bool:
        plugin = self.plugin
        return (
            plugin.interruptible_wait
            and self.group is not None
            and type(plugin).barrier is Backend.barrier
        )

    # -- recovery --------------------------------------------------------------------
