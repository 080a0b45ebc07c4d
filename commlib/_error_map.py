"""Error translation: what an engine raised becomes the commlib error for it, in one place.

:meth:`commlib._engine.Engine.map_errors` hands every engine failure here
(:class:`MapErrors`). A timeout becomes :class:`~commlib.errors.CommTimeoutError`
naming the ranks that did not arrive (:mod:`commlib._failure_notes`); a
failure where a peer is gone (named by the backend, or its process ended) a
:class:`~commlib.errors.RankLostError` naming it; a failed store call, or an
engine that refused a call with every rank there, a plain
:class:`~commlib.errors.CommError` (:func:`error_type`). Each breaks the
group (:mod:`commlib._health`); :meth:`~commlib.Communicator.shrink` is what
recovers from the first two.

Read only on the failure path. torch 2.13 raises its ``DistError`` family
(all of them ``RuntimeError``) from its stores and some of its engines, and
a plain ``RuntimeError`` from others (gloo's "Timed out waiting ..." and
"Connection closed by peer ..." are plain ``RuntimeError``). The type decides
first; only where the type cannot tell a timeout from another failure does
the backend that owns the engine read its own text
(:meth:`commlib.Backend.is_timeout`). No engine's wording lives here.

Measured with torch 2.13, gloo, 127.0.0.1:

============================  ==============================  =================
what happened                 what torch raises               commlib raises
============================  ==============================  =================
gloo collective timed out     ``RuntimeError`` "Timed out"    CommTimeoutError
peer process died             ``RuntimeError`` "closed by"    RankLostError
store key wait timed out      ``DistStoreError``              CommTimeoutError
store host died               ``DistNetworkError``            RankLostError
============================  ==============================  =================
"""

from __future__ import annotations

import datetime
import time
from typing import Any, Literal

import torch.distributed as dist

from commlib import _failure_notes, _survivors, _waiting
from commlib._world import default_store, store_failed
from commlib.errors import CommError, CommTimeoutError, RankLostError

#: what a failure is to commlib: ``None`` passes through unchanged
Kind = Literal["timeout", "store", "network", "engine"]


def _dist(name: str) -> type[BaseException] | None:
    # torch built without torch.distributed has none of these
    found = getattr(dist, name, None)
    return found if isinstance(found, type) else None


_ROWS: tuple[tuple[type[BaseException] | None, Kind | None], ...] = (
    (CommError, None),  # commlib's own errors: already what the caller sees
    (_dist("DistStoreError"), "store"),  # a store call failed (QueueEmptyError too)
    (_dist("DistNetworkError"), "network"),  # a connection (to a peer, the store) lost
    (_dist("DistBackendError"), "engine"),  # the engine (NCCL, ...) reported a failure
    (_dist("DistError"), "engine"),
    (TimeoutError, "timeout"),
    (ConnectionError, "network"),
    (RuntimeError, "engine"),  # engines that raise plain RuntimeError (gloo)
)
#: most specific first: the first row whose type matches decides
TABLE: tuple[tuple[type[BaseException], Kind | None], ...] = tuple(
    (kind_type, kind) for kind_type, kind in _ROWS if kind_type is not None
)


def kind_of(exc: BaseException) -> Kind | None:
    """What ``exc`` is to commlib by its type; ``None``: not an engine failure, pass it on.

    Examples:
        >>> kind_of(torch.distributed.DistNetworkError("Broken pipe"))
        'network'
        >>> kind_of(TimeoutError())
        'timeout'
        >>> kind_of(ValueError("bad argument")) is None
        True
    """
    for kind_type, kind in TABLE:
        if isinstance(exc, kind_type):
            return kind
    return None


# a wait that raised within this much of its limit ran out of time, whatever
# the engine's message says
_TIMEOUT_SLACK = 0.05


# how long a failure looks for a peer process of this machine that ended
_ENDED_GRACE = 0.5


class MapErrors:
    """The context manager :meth:`Engine.map_errors` returns (a class: it runs on every call)."""

    __slots__ = ("engine", "limit", "seq", "started", "what")

    def __init__(self, engine: Any, what: str, seq: int, limit: datetime.timedelta):
        self.engine, self.what, self.seq, self.limit = engine, what, seq, limit

    def __enter__(self) -> None:
        self.started = time.monotonic()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: Any
    ) -> None:
        if exc is None:
            return
        # by type (TABLE): commlib's own errors and the caller's pass through
        kind = kind_of(exc)
        if kind is None:
            return
        waited = time.monotonic() - self.started
        late = is_timeout(self.engine, exc, kind, waited, self.limit)
        error = translate(self.engine, self.what, self.seq, self.limit, exc, late)
        if isinstance(error, CommTimeoutError):
            # the engine's own timeout errors (torch chains two) say nothing the message does not
            raise error from None
        raise error from exc


def is_timeout(
    engine: Any, exc: BaseException, kind: Kind, waited: float, limit: datetime.timedelta
) -> bool:
    """Whether the failure ``exc`` (of ``kind``) is a timeout: by type, by time, by its text.

    The text is the backend's to read (:meth:`~commlib.Backend.is_timeout`):
    only it knows how its engine words a timeout.
    """
    return (
        kind == "timeout"
        or waited >= limit.total_seconds() * (1 - _TIMEOUT_SLACK)
        or engine.is_timeout(exc)
    )


def translate(
    engine: Any,
    what: str,
    seq: int,
    limit: datetime.timedelta,
    exc: BaseException,
    timed_out: bool,
) -> CommError:
    """The commlib error for ``engine``'s call ``what`` (number ``seq``) failing with ``exc``.

    A failure another rank announced first is named as that rank's; a timeout
    names the ranks that did not arrive; the group is marked broken (and the
    engine's pending operations aborted) by the first failure.
    """
    if isinstance(exc, _waiting.PeerFailed):
        earlier: tuple[str, bool, bool] | None = (exc.reason, exc.timed_out, exc.lost)
    elif timed_out:
        earlier = None
    else:
        # a closed connection may be a peer that gave up or failed first: say why
        earlier = _failure_notes.broken_elsewhere(engine.group)
    error: CommError
    if earlier is not None:
        text, timed_out, lost = earlier
        how = "timed out" if timed_out else "failed"
        _failure_notes.record(engine.group, engine.rank, seq, what, how)
        if timed_out:
            error = CommTimeoutError(
                f"{what} did not complete on rank {engine.rank} of {engine.world_size}: "
                f"another rank gave up on it first: {text}"
            )
        else:
            # lost only where the rank that failed first lost one: an engine that refused
            # a call (every rank alive) is not what shrink recovers from
            error = (RankLostError if lost else CommError)(
                f"{what} failed on rank {engine.rank}: another rank failed first: {text}"
            )
    elif timed_out:
        missing = _failure_notes.missing_ranks(
            engine.group, engine.rank, engine.world_size, seq, what
        )
        if missing:  # a rank that did not arrive may be one that died: say so
            for r in _ended_ranks(engine, grace=0.0):
                if r in missing:
                    missing[r] += ": its process has exited"
        detail = "; ".join(f"{rank_label(engine, r)}: {w}" for r, w in sorted(missing.items()))
        error = CommTimeoutError(
            f"{what} did not complete within {limit.total_seconds():g}s on "
            f"{rank_label(engine, engine.rank)} of {engine.world_size}"
            + (f" ({detail})" if detail else "")
        )
    else:
        _failure_notes.record(engine.group, engine.rank, seq, what, "failed")
        text, peer_gone = _describe(engine, exc)
        error = error_type(exc, peer_gone)(f"{what} failed on rank {engine.rank}: {text}")
    # the group's state is unknown now: a later call must not pair with this one
    if engine.health.mark_broken(f"{what} #{seq}: {error}"):
        timed_out = isinstance(error, CommTimeoutError)
        lost = isinstance(error, RankLostError)
        _failure_notes.announce_broken(engine.group, str(error), timed_out, lost)
        engine.abort()
    return error


def _describe(engine: Any, exc: BaseException) -> tuple[str, bool]:
    """The engine's failure in words, naming the rank at fault where it can be told.

    The backend may know the peer whose connection its engine lost
    (:meth:`~commlib.Backend.failed_peer`); otherwise a rank of the group
    whose process on this machine has ended is named. The second value says
    whether a rank was named gone. Only on the failure path: the call path
    records nothing for it.
    """
    text = engine.describe_failure(exc)
    peer = _failed_peer(engine, exc)
    if peer is not None:
        return (
            f"lost the connection to {rank_label(engine, peer)}, which exited, crashed or "
            f"gave up: see its output ({text})"
        ), True
    gone = _ended_ranks(engine)
    if gone:
        names = ", ".join(rank_label(engine, r) for r in gone)
        verb = "has" if len(gone) == 1 else "have"
        return f"{names} {verb} exited (its process ended); see its output ({text})", True
    return text, engine.lost_peer(exc)


def _ended_ranks(engine: Any, grace: float = _ENDED_GRACE) -> list[int]:
    """The ranks of this group whose process on this machine ended (waiting a moment).

    A peer killed a moment ago closes its connections before the kernel
    reports its process as ended: look again for up to ``grace`` seconds.
    """
    if engine.group is None:
        return []
    try:
        world_ranks = dist.get_process_group_ranks(engine.group)
    except Exception:  # a group torch cannot describe any more
        return []
    deadline = time.monotonic() + grace
    while True:
        gone = [r for r in _survivors.ended(world_ranks) if r != engine.rank]
        if gone or time.monotonic() >= deadline or default_store() is None:
            return gone
        time.sleep(0.05)


def _failed_peer(engine: Any, exc: BaseException) -> int | None:
    """The rank of this group the backend says ``exc`` lost, if it can tell."""
    if engine.group is None or default_store() is None:
        return None  # backends map addresses to ranks through the store: not a dead one
    try:
        peer = engine.failed_peer(exc)
    except Exception as lookup:  # naming the peer is a courtesy; the error goes up anyway
        store_failed(lookup)
        return None
    if peer is None or peer == engine.rank or not 0 <= peer < engine.world_size:
        return None
    return peer


def rank_label(engine: Any, rank: int) -> str:
    """``rank 1``, or in a subgroup ``rank 1 (world rank 2)``: messages give both."""
    if engine.group is None or engine.group is dist.GroupMember.WORLD:
        return f"rank {rank}"
    try:
        world = dist.get_process_group_ranks(engine.group)[rank]
    except Exception:  # a group torch cannot describe any more: the group rank alone
        return f"rank {rank}"
    return f"rank {rank} (world rank {world})"


def error_type(exc: BaseException, peer_gone: bool = False) -> type[CommError]:
    """The commlib error for ``exc``, an engine failure under a call that is not a timeout.

    :class:`~commlib.errors.RankLostError` where a rank of the group is gone:
    the backend named the peer whose connection was lost, or a rank's
    process ended (``peer_gone``), or torch reports a lost connection (the
    store's host is a rank too, with ``env://``). A failed store call, or an
    engine that refused the call with every rank still there (a dtype it
    cannot reduce, say), is a plain :class:`~commlib.errors.CommError`:
    shrinking would only meet it again.

    Examples:
        >>> error_type(RuntimeError("Connection closed by peer"), peer_gone=True).__name__
        'RankLostError'
        >>> error_type(torch.distributed.DistNetworkError("Connection reset")).__name__
        'RankLostError'
        >>> error_type(RuntimeError("Invalid scalar type")).__name__
        'CommError'
        >>> error_type(torch.distributed.DistStoreError("Broken pipe")).__name__
        'CommError'
    """
    kind = kind_of(exc)
    if kind == "store":
        return CommError
    return RankLostError if peer_gone or kind == "network" else CommError
