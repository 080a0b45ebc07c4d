"""The Guard: which collectives a communicator checks, and each collective's check.

A :class:`Guard` is built per communicator from what does not change per call
(the checks mode, the plugin's ``completed_by_check``, the serializer, the slot
size) and runs each checked collective's argument check through the round of
:mod:`commlib._check_round` (one slot per rank, the data riding where it fits,
a steady kind of call taking its round prepared by the first): the pair checks
of the all_to_alls, the refusals, and what a call that completed within its
check returns.
"""

from __future__ import annotations

import math
import weakref
from typing import TYPE_CHECKING, Literal, NoReturn

import torch

from commlib import _catalog, _check_round, _objects, _pair_check, _ragged, _steps
from commlib import _validation as check
from commlib._host_copy import host_copy, stack_into
from commlib._rooms import rooms_of
from commlib._sent_slots import LAYOUTS
from commlib._settings import as_timedelta
from commlib.errors import RemoteArgumentError
from commlib.handle import Handle

if TYPE_CHECKING:
    from collections.abc import Callable, Hashable, Sequence

    from commlib._engine import Engine
    from commlib.serialization import Serializer
    from commlib.types import Timeout
Checks = Literal["strict", "guard", "off"]

# which collectives each mode checks
_CHECKED_IN: dict[str, frozenset[str]] = {
    "strict": _catalog.CHECKED_ROUNDS,
    "guard": _catalog.CHECKED_ROUNDS - _catalog.UNSIZED,
    "off": frozenset(),
}


def checks_mode(
    *, distributed: bool, strict: bool | None, world_size: int, mismatch_aborts: bool
) -> Checks:
    """Which collectives a communicator checks (``Communicator.checks``).

    ``"strict"``: every collective; ``"guard"``: the tensor collectives, whose
    mismatched sizes would end the process in an engine that ``mismatch_aborts``;
    ``"off"``: none (also in a world of one, which has nothing to mismatch with).

    Examples:
        >>> checks_mode(distributed=True, strict=None, world_size=2, mismatch_aborts=True)
        'guard'
    """
    if not distributed or strict is False or world_size == 1:
        return "off"
    if strict:
        return "strict"
    return "guard" if mismatch_aborts else "off"


def write_nothing(area: torch.Tensor) -> bool:
    """A slot writer (``_check_round.exchange(write=...)``) for a rank whose data nobody reads.

    Examples:
        >>> write_nothing(torch.empty(2))
        False
    """
    return False  # nothing written: nothing to copy into the slot's other rows


def finished(
    finish: Callable[[], None], async_op: bool, value: list[torch.Tensor]
) -> Handle | None:
    """A call that completed within its check: finish now, or in ``wait()``.

    Examples:
        >>> handle = finished(lambda: print("written back"), True, [torch.ones(1)])
        >>> handle.wait()
        written back
        True
    """
    if async_op:
        return Handle(None, finish, None, value=value)
    finish()
    return None


#: the largest memory a kept view of a caller's tensor may hold (_Reshaped)
_KEEP_VIEWS_UP_TO = 1 << 20


class _Reshaped:
    """``tensor.view(shape)`` for one shape, kept while the same tensor comes back.

    A loop passes the same buffers call after call; a view op costs more
    than the rest of a steady check's Python. The tensor is held weakly, and
    its data pointer read again: a tensor set to other memory gets a new
    view. Only for tensors of one shape (the kind of call names it) that are
    contiguous (:meth:`Engine.to_device`), and only in memory of up to
    :data:`_KEEP_VIEWS_UP_TO` bytes: a kept view keeps its tensor's memory.
    """

    __slots__ = ("ptr", "ref", "shape", "view")

    def __init__(self, shape: tuple[int, ...]):
        self.shape = shape
        self.ref: weakref.ref[torch.Tensor] | None = None
        self.ptr = 0
        self.view: torch.Tensor | None = None

    def of(self, tensor: torch.Tensor) -> torch.Tensor:
        """``tensor.view(shape)``: the one made last, for the same tensor at the same place."""
        ref, view = self.ref, self.view
        if ref is not None and view is not None and ref() is tensor:
            if tensor.data_ptr() == self.ptr:
                return view
        view = tensor.view(self.shape)
        if tensor.untyped_storage().nbytes() > _KEEP_VIEWS_UP_TO:
            # a kept view holds its memory: a large buffer is not kept past its user's
            # last reference (a call that moves so much pays its view gladly)
            self.ref = self.view = None
            return view
        self.view = view
        self.ref, self.ptr = weakref.ref(tensor), tensor.data_ptr()
        return view


class Guard:
    """One communicator's argument check and refusals, with what can be decided once.

    The communicator builds it from what does not change per call (the
    checks mode, the backend's ``completed_by_check``, the serializer, the
    slot size) and builds a new one when one of those is set; a call then
    asks one frozenset whether it is checked.

    Args:
        checks: the mode, from :func:`checks_mode`.
        completed_by_check: the collectives whose result the check's round
            can carry (the backend's ``completed_by_check``).
        serializer: the object-serialization strategy (for the mismatch report).
        slot_size: the communicator's slot size in bytes.
        distributed: whether the communicator runs over torch.distributed.

    Examples:
        >>> guard = Guard("off", frozenset(), serializer, 4096, distributed=False)
        >>> guard.check(engine, "all_reduce", lambda: "op=sum") is None   # off: no round
        True
    """

    __slots__ = (
        "checked",
        "checks",
        "completed_by_check",
        "declared",
        "distributed",
        "serializer",
        "slot_size",
        "views",
    )

    def __init__(
        self,
        checks: Checks,
        completed_by_check: frozenset[str],
        serializer: Serializer,
        slot_size: int,
        *,
        distributed: bool,
    ):
        self.checks: Checks = checks
        #: the collectives this communicator checks
        self.checked: frozenset[str] = _CHECKED_IN[checks]
        self.completed_by_check = completed_by_check
        self.serializer = serializer
        self.slot_size = slot_size
        self.distributed = distributed
        #: views of the callers' tensors some checks take, per kind of call
        self.views: dict[Hashable, tuple[_Reshaped, ...]] = {}
        #: tensors of no memory of their own that declare a layout, per kind of call
        self.declared: dict[Hashable, torch.Tensor] = {}

    def _keep_views(self, key: Hashable, *views: _Reshaped) -> tuple[_Reshaped, ...]:
        if len(self.views) >= LAYOUTS:
            self.views.clear()
        self.views[key] = views
        return views

    def rows(self, dtype: torch.dtype, shape: torch.Size, world: int) -> torch.Tensor:
        """A tensor of no memory of its own, ``(world, *shape)`` of ``dtype``, made once.

        What a check whose writer fills every row (``write=``, ``apart=True``)
        passes as its ``data``: it declares each row's dtype and shape.

        Examples:
            >>> guard = Guard("off", frozenset(), serializer, 4096, distributed=False)
            >>> guard.rows(torch.float32, torch.Size([3]), 2).shape
            torch.Size([2, 3])
        """
        key = (dtype, shape)
        found = self.declared.get(key)
        if found is None:
            if len(self.declared) >= LAYOUTS:
                self.declared.clear()
            found = self.declared[key] = torch.empty((), dtype=dtype).expand(world, *shape)
        return found

    def check(
        self,
        engine: Engine,
        what: str,
        describe: Callable[[], str],
        data: torch.Tensor | None = None,
        timeout: Timeout = None,
        *,
        completes: bool = True,
        write: Callable[[torch.Tensor], object] | None = None,
        apart: bool = False,
        key: Hashable | None = None,
        into: torch.Tensor | None = None,
    ) -> list[torch.Tensor] | None:
        """The argument check before ``what``, if this communicator checks it.

        ``describe`` formats what this rank passes (only when it is checked).
        Returns every rank's ``data``
        when it travelled with the check, so the caller completes from it:
        only for collectives in the plugin's ``completed_by_check``, unless
        ``completes`` is false (then the data is what is checked).
        ``write`` fills this rank's part of the slot instead of copying
        ``data``, and ``apart`` sends ``data[j]`` to rank ``j`` alone (see
        :func:`exchange`).

        ``key``: a cheap hashable value (a tuple of the op's name, the dtype,
        the shape, the root) naming everything ``describe`` formats, so that
        on this rank the same key always comes with the same description. A
        steady call (the same key as an earlier call of ``what``, data of the
        same dtype and shape, the same slot) then takes the round prepared by
        that call and never calls ``describe``; what any rank passes
        differently still shows in the headers every rank compares.
        ``into``: where every rank's part goes too, when the data rode (see
        :func:`exchange`).

        Examples:
            >>> guard = Guard("off", frozenset(), serializer, 4096, distributed=False)
            >>> print(guard.check(engine, "barrier", lambda: ""))
            None
        """
        if what not in self.checked:
            return None
        if completes and data is not None:
            if what not in self.completed_by_check:
                data = None  # the backend's own collective computes the result
            else:
                most = engine.completed_by_check_bytes
                if most is not None and data.nbytes > most:
                    data = None  # ... and moves this much data with fewer copies
        limit = None if timeout is None else as_timedelta(timeout)
        host: _check_round.HostSlots | None = None
        if key is not None:
            key = (what, key)  # the round's name among every collective's
            host = engine.kept.get("check")
        if host is not None:
            prep = host.rounds.get(key)
            # (_check_round.Round.serves, written out: a steady call's every step counts)
            if (
                prep is not None
                and prep.learnt == host.rooms.learnt
                and prep.floor == self.slot_size
                and prep.apart is apart
                and (write is None) is prep.copies
                and (
                    data is None
                    if prep.dtype is None
                    else data is not None and data.dtype is prep.dtype and data.shape == prep.shape
                )
            ):
                return _check_round.steady(
                    engine, host, prep, what, self.serializer, data, limit, write, into
                )
        return _check_round.exchange(
            engine,
            what,
            lambda: f"{what}({describe()})",
            self.serializer,
            self.slot_size,
            data,
            limit,
            write=write,
            apart=apart,
            key=key,
            into=into,
        )

    def check_pairs(
        self,
        engine: Engine,
        what: str,
        describe: Callable[[], str],
        sends: Sequence[int],
        expects: Sequence[int],
        timeout: Timeout,
    ) -> None:
        """The argument check of an exchange whose sizes must match pair by pair.

        ``sends[j]``: elements this rank sends rank ``j``; ``expects[j]``:
        elements it expects from rank ``j``. No single description is shared
        by every rank here, so the sizes travel with the check and every rank
        compares every pair of the same gathered table: all raise alike.

        Examples:
            >>> guard = Guard("off", frozenset(), serializer, 4096, distributed=False)
            >>> guard.check_pairs(engine, "all_to_all", lambda: "", [1], [1], None)
        """
        if what not in self.checked:
            return  # before building the table: hot loops turn checks off
        sizes = torch.tensor([*sends, *expects], dtype=torch.int64)
        parts = self.check(
            engine, what, describe, engine.to_device(sizes), timeout, completes=False
        )
        if parts is None:  # a world too large for one slot
            return
        _pair_check.match_pairs(what, [p.tolist() for p in parts], engine.world_size)

    def check_pairs_riding(
        self,
        engine: Engine,
        what: str,
        describe: Callable[[], str],
        chunks: Sequence[torch.Tensor],
        into: Sequence[torch.Tensor],
        timeout: Timeout,
    ) -> bool:
        """:meth:`check_pairs` with the sizes riding with the parts (:func:`_pair_check.riding`).

        ``chunks[j]``: what this rank sends rank ``j``; ``into[j]``: where the
        part from rank ``j`` goes. True where every part rode: then they are in
        ``into``; otherwise the caller runs the engine's collective.

        Examples:
            >>> guard = Guard("off", frozenset(), serializer, 4096, distributed=False)
            >>> guard.check_pairs_riding(engine, "all_to_all_single", lambda: "",
            ...                          [torch.ones(1)], [torch.empty(1)], None)
            False
        """
        if what not in self.checked:
            return False
        expects = [t.numel() for t in into]
        got = _pair_check.riding(self, engine, what, describe, chunks, expects, timeout)
        if got is None:
            return False
        for target, part in zip(into, got):
            host_copy(target, part.view(target.shape))
        return True

    def check_all_to_all(
        self,
        engine: Engine,
        dtype: torch.dtype,
        outputs: Sequence[torch.Tensor],
        inputs: Sequence[torch.Tensor],
        one_shape: bool,
        timeout: Timeout,
    ) -> list[torch.Tensor] | None:
        """all_to_all's argument check; the data too where it rides.

        Where every tensor of this rank's lists has one shape (``one_shape``,
        the common case), the check is the rank's description with that
        shape: every rank that passes the same has matching pairs, and its
        part for rank ``j`` travels in the row that goes to ``j``
        (``_check_round.exchange(apart=True)``), so a small all_to_all completes in one
        round. The result is then every rank's part for this rank, in rank
        order (views valid until the engine's next call). Other lists' sizes
        ride with their parts (:meth:`check_pairs_riding`): the result is then
        every rank's part shaped as this rank's output for it. Where
        descriptions differ because some rank's lists are of one shape while
        this rank's are not, every rank compares the sizes pair by pair
        (:meth:`check_pairs`, one round more on that path only).

        Examples:
            >>> guard = Guard("off", frozenset(), serializer, 4096, distributed=False)
            >>> print(guard.check_all_to_all(engine, torch.float32, [torch.ones(1)],
            ...                              [torch.ones(1)], True, None))
            None
        """
        what = "all_to_all"
        if what not in self.checked:
            return None
        world = engine.world_size
        try:
            if not one_shape:  # the sizes ride with the parts: all of them, if they fit
                got = _pair_check.riding(
                    self,
                    engine,
                    what,
                    lambda: f"{dtype}, {world} tensors",
                    [t.contiguous() for t in inputs],
                    [t.numel() for t in outputs],
                    timeout,
                )
                return None if got is None else [p.view(o.shape) for p, o in zip(got, outputs)]
            first = inputs[0]
            # the dtype and shape name the call (its key); a tensor of no memory of its
            # own declares each row's dtype and shape, made once per kind
            key = (dtype, first.shape)
            rows = self.rows(dtype, first.shape, world)
            return self.check(
                engine,
                what,
                lambda: f"{dtype}, {world} tensors of {tuple(first.shape)} each way",
                rows,
                timeout,
                write=lambda area: stack_into(area, list(inputs)),
                apart=True,
                key=key,
            )
        except RemoteArgumentError as exc:
            self.lists_after(exc, engine, dtype, outputs, inputs, timeout)
        return None

    def lists_after(
        self,
        exc: RemoteArgumentError,
        engine: Engine,
        dtype: torch.dtype,
        outputs: Sequence[torch.Tensor],
        inputs: Sequence[torch.Tensor],
        timeout: Timeout,
    ) -> None:
        """After all_to_all's check raised ``exc``: the sizes pair by pair, or ``exc``.

        Ranks whose lists differ in kind (one shape, or not) describe them
        differently: their pairs may still match. Every rank saw the same
        descriptions, so all compare the pairs alike (one round more) and, if
        they match, go on to the engine's all_to_all; any other difference is
        raised as it is.

        Examples:
            >>> guard.lists_after(exc, engine, torch.float32, outs, ins, None)  # doctest: +SKIP
        """
        what = "all_to_all"
        if (
            exc.refused
            or exc.summary != _check_round.DIFFERENT
            or not all(text.startswith(f"{what}(") for text in exc.failures.values())
        ):
            raise exc
        self.check_pairs(
            engine,
            what,
            lambda: f"{dtype}, {engine.world_size} tensors",
            [t.numel() for t in inputs],
            [t.numel() for t in outputs],
            timeout,
        )

    def check_all_to_all_single(
        self,
        engine: Engine,
        in_t: torch.Tensor,
        out_t: torch.Tensor,
        rows_out: Sequence[int],
        rows_in: Sequence[int],
        even: bool,
        timeout: Timeout,
    ) -> Literal["rode", "engine", "explicit"]:
        """all_to_all_single's argument check; the data too where it rides.

        ``rows_out[j]`` / ``rows_in[j]``: rows this rank sends rank ``j`` /
        expects from it; ``even``: both splits were ``None``. Even ranks
        describe their shapes (every rank that passes the same has matching
        pairs) and a small input rides, each chunk in the row that goes to
        its rank; other ranks' sizes ride with their chunks. Where some rank
        passed ``None`` and another explicit splits (torch takes both), the
        descriptions differ in kind: every rank saw the same ones, so all
        compare the sizes pair by pair instead (one round more, that path
        only). Returns ``"rode"`` (the result is in ``out_t``), ``"engine"``
        (run the engine's collective) or ``"explicit"`` (run it with explicit
        splits on every rank: an engine may serve ``None`` splits with
        another collective, MPI's ``Alltoall`` for ``Alltoallv``).

        Examples:
            >>> guard = Guard("off", frozenset(), serializer, 4096, distributed=False)
            >>> guard.check_all_to_all_single(engine, torch.ones(1), torch.empty(1), [1], [1],
            ...                               True, None)
            'engine'
        """
        what = "all_to_all_single"
        if what not in self.checked:
            return "engine"
        world, me = engine.world_size, engine.rank
        try:
            if even:
                # the pairs match exactly when every rank passes the same shapes; the
                # shapes name the call (its key) and the views it takes, made once
                key = (in_t.dtype, in_t.shape, out_t.shape)
                views = self.views.get(key)
                if views is None:
                    rest = tuple(in_t.shape[1:])
                    views = self._keep_views(
                        key,
                        _Reshaped((world, rows_out[me], *rest)),
                        _Reshaped((world, rows_in[me], *rest)),
                    )
                parts = self.check(
                    engine,
                    what,
                    lambda: (
                        f"{in_t.dtype}, input {tuple(in_t.shape)}, "
                        f"output {tuple(out_t.shape)}, even splits"
                    ),
                    views[0].of(in_t),
                    timeout,
                    apart=True,
                    key=key,
                    # (a rank whose own pair differs raises after the round, below)
                    into=views[1].of(out_t) if rows_out[me] == rows_in[me] else None,
                )
                check.self_pair(rows_out[me], rows_in[me], me)
                return "engine" if parts is None else "rode"
            rows_of = tuple(in_t.shape[1:])
            rode = self.check_pairs_riding(
                engine,
                what,
                lambda: f"{in_t.dtype}, rows of {rows_of}",
                in_t.contiguous().split(list(rows_out)),
                out_t.split(list(rows_in)),
                timeout,
            )
            check.self_pair(rows_out[me], rows_in[me], me)
            return "rode" if rode else "engine"
        except RemoteArgumentError as exc:
            self.pairs_after(exc, engine, in_t, rows_out, rows_in, timeout)
        return "explicit"

    def pairs_after(
        self,
        exc: RemoteArgumentError,
        engine: Engine,
        in_t: torch.Tensor,
        rows_out: Sequence[int],
        rows_in: Sequence[int],
        timeout: Timeout,
    ) -> None:
        """After all_to_all_single's check raised ``exc``: the sizes pair by pair, or ``exc``.

        Where some ranks passed ``None`` splits and others explicit ones, the
        descriptions differed in kind only: every rank saw the same ones, so
        all compare the sizes pair by pair (one round more); if they match the
        call goes on with explicit splits on every rank. Any other difference
        is raised as it is.

        Examples:
            >>> guard.pairs_after(exc, engine, in_t, [1, 1], [1, 1], None)  # doctest: +SKIP
        """
        what = "all_to_all_single"
        texts = list(exc.failures.values())
        if (
            exc.refused
            or exc.summary != _check_round.DIFFERENT
            or not all(text.startswith(f"{what}(") for text in texts)
            or not any(text.endswith("even splits)") for text in texts)
            or all(text.endswith("even splits)") for text in texts)
        ):
            raise exc
        rows_of = tuple(in_t.shape[1:])
        scale = math.prod(rows_of)
        self.check_pairs(
            engine,
            what,
            lambda: f"{in_t.dtype}, rows of {rows_of}",
            [n * scale for n in rows_out],
            [n * scale for n in rows_in],
            timeout,
        )

    def refuse(
        self,
        engine: Engine,
        what: str,
        error: ValueError | TypeError,
        timeout: Timeout = None,
    ) -> NoReturn:
        """Raise ``error``, a mistake in this rank's own arguments to ``what``, on every rank.

        For arguments this rank got wrong (a scatter list on src, its own
        all_to_all lists, an op or a root only it passes) while the other ranks
        may be in ``what``'s first round already, waiting for it. Where that
        round exists (a checked tensor collective; an object collective, which
        always has one), this rank joins it with its refusal as its
        description, the same number of bytes: every rank raises a
        :class:`~commlib.errors.RemoteArgumentError` (or, when every rank made
        the same mistake, its own ``error``). Otherwise (point to point, a
        collective without a first round to join) it raises here alone,
        before anything is sent.

        Examples:
            >>> guard = Guard("off", frozenset(), serializer, 4096, distributed=False)
            >>> guard.refuse(engine, "gather_object", ValueError("size must be >= 0"))
            Traceback (most recent call last):
            ...
            ValueError: size must be >= 0
        """
        try:
            limit = as_timedelta(timeout)
        except (ValueError, TypeError):
            limit = None  # the timeout may be the mistake: the communicator's then
        distributed = self.distributed and engine.world_size > 1
        if what in _catalog.OBJECT_ROUNDS:
            if distributed:
                first = rooms_of(engine).slot_bytes(self.slot_size)
                _steps.run(engine, _objects.refusal_steps(engine, what, error, first), limit)
        elif distributed and what in _catalog.RAGGED:
            # the first round is the shapes' (it is the ragged gathers' check in every mode)
            _ragged.refuse(
                engine,
                what,
                str(error),
                room=_ragged.inline_room(self.slot_size),
                timeout=limit,
                rooms=rooms_of(engine),
            )
        elif what in self.checked:
            _check_round.exchange(
                engine,
                what,
                f"{what}{_check_round.REFUSED}{error})",
                self.serializer,
                self.slot_size,
                timeout=limit,
            )
        raise error
