"""The exceptions commlib raises.

User mistakes are plain ``ValueError`` / ``TypeError`` raised before anything is
sent. Everything that goes wrong *between* ranks is a :class:`CommError`, so a
caller can catch the whole family with one ``except``.

What recovers an error is in its type. :meth:`~commlib.Communicator.shrink`
serves the failures that break the group: :class:`RankLostError` (a rank died,
left or lost its connection), :class:`CommTimeoutError` (a rank did not take
part in time) and :class:`CommBrokenError` (a later call on a group one of them
broke). The others (:class:`RemoteArgumentError`, :class:`RemoteError`,
:class:`NonFiniteError`, :class:`NotInGroupError`, ...) leave the group usable
and every rank alive: the program's arguments or data are what must change,
and shrink refuses (``ValueError``) when no rank was lost.

Examples:
    >>> try:  # doctest: +SKIP
    ...     comm.all_reduce(loss)
    ... except (commlib.RankLostError, commlib.CommTimeoutError):
    ...     comm = comm.shrink()    # the ranks still alive go on
"""

from __future__ import annotations

import json
import re

#: how a nested collective describes a structure in the argument check's round:
#: ``all_reduce(["dict{'a': _}", [["['a']", "tensor", "torch.float32", [1]]]])``
_STRUCTURE = re.compile(r"^(\w+)\((\[\s*\".*\])\)$", re.S)


def _readable(text: str) -> str:
    """A rank's description as a reader reads it: a structure's JSON becomes its leaves.

    Examples:
        >>> _readable('all_reduce(["list[_]", [["[0]", "tensor", "torch.float32", [1]]]])')
        'all_reduce of a structure: [0] torch.float32 (1,)'
        >>> _readable("all_reduce(op=sum, torch.float32, (1,))")
        'all_reduce(op=sum, torch.float32, (1,))'
    """
    found = _STRUCTURE.match(text)
    if found is None:
        return text
    try:
        described = json.loads(found.group(2))
        leaves = described[1]
        shown = [
            f"{path} {dtype or kind} {tuple(shape)}" if kind == "tensor" else f"{path} {kind}"
            for path, kind, dtype, shape in leaves
        ]
    except (ValueError, TypeError, IndexError, KeyError):
        return text
    return f"{found.group(1)} of a structure: {', '.join(shown) or 'no leaves'}"


class CommError(RuntimeError):
    """Base class of the errors that concern more than the calling rank."""


class BackendUnavailableError(CommError):
    """A backend plugin was asked for but cannot run here (the reason says why)."""


class NotInGroupError(CommError, ValueError):
    """The calling rank is not a member of the communicator's process group.

    It is also a ``ValueError``: calling a collective on a group one does not
    belong to is a usage error, and it is raised before anything is sent.
    """


class RemoteError(CommError):
    """One or more ranks failed; every rank of the collective raises this.

    Attributes:
        failures (dict[int, str]): group rank -> ``"ExcType: message"`` of each
            rank that failed.
        collective (str): name of the collective that was aborted.

    Examples:
        >>> obj = (lambda: 0) if comm.rank == 1 else None   # rank 1 cannot pickle it
        >>> try:                                          # on 2 ranks  # doctest: +SKIP
        ...     comm.all_gather_object(obj)
        ... except RemoteError as err:
        ...     print(err.failures)
        {1: "PicklingError: Can't pickle <function <lambda> at 0x...>: ..."}
    """

    def __init__(self, collective: str, failures: dict[int, str], summary: str | None = None):
        self.collective = collective
        self.failures = dict(sorted(failures.items()))
        self.summary = summary
        lines = "; ".join(f"rank {r}: {_readable(msg)}" for r, msg in self.failures.items())
        head = summary or f"failed on rank(s) {sorted(self.failures)}"
        super().__init__(f"{collective} {head}: {lines}")

    def __reduce__(self):
        return (type(self), (self.collective, self.failures, self.summary))


class RemoteArgumentError(RemoteError, ValueError, TypeError):
    """Some rank passed a bad argument, or the ranks passed arguments that disagree.

    Raised on every rank alike. It is also a ``ValueError`` and a ``TypeError``,
    so code that guards a call with either keeps working.

    Attributes:
        refused (bool): some rank refused its own arguments (a bad op, a root
            out of range), as opposed to ranks whose arguments or collectives
            disagree with each other.

    Examples:
        >>> err = RemoteArgumentError("all_reduce", {1: "refused: op 'nope'"}, refused=True)
        >>> err.refused, isinstance(err, ValueError)
        (True, True)
    """

    def __init__(
        self,
        collective: str,
        failures: dict[int, str],
        summary: str | None = None,
        *,
        refused: bool = False,
    ):
        super().__init__(collective, failures, summary)
        self.refused = refused

    def __reduce__(self):
        fields = (self.collective, self.failures, self.summary, self.refused)
        return (_remote_argument_error, fields)


def _remote_argument_error(
    collective: str, failures: dict[int, str], summary: str | None, refused: bool
) -> RemoteArgumentError:
    return RemoteArgumentError(collective, failures, summary, refused=refused)


class NonFiniteError(RemoteError, ValueError):
    """A rank's tensor holds NaN or Inf before a reduction (``check_finite``); nothing was reduced.

    Raised on every rank alike, naming the ranks and the line that called the
    collective.

    Attributes:
        ranks (list[int]): the group ranks whose tensors are not finite.
        where (str): `` at train.py:88 (step)``, or empty when unknown.

    Examples:
        >>> err = NonFiniteError("all_reduce", [1], " at train.py:88 (step)")
        >>> print(err)
        all_reduce at train.py:88 (step): rank 1 passes NaN or Inf; nothing was reduced
    """

    def __init__(self, collective: str, ranks: list[int], where: str = ""):
        self.ranks, self.where = list(ranks), where
        one = len(self.ranks) == 1
        who = ("rank " if one else "ranks ") + ", ".join(map(str, self.ranks))
        who += " passes" if one else " pass"
        failures = dict.fromkeys(self.ranks, "NaN or Inf")
        super().__init__(collective, failures, f"{where}: {who} NaN or Inf")
        self.args = (f"{collective}{where}: {who} NaN or Inf; nothing was reduced",)

    def __str__(self) -> str:
        return str(self.args[0])

    def __reduce__(self):
        return (type(self), (self.collective, self.ranks, self.where))


class CommTimeoutError(CommError, TimeoutError):
    """A collective did not complete within the communicator's timeout.

    The group is broken afterwards (a late peer's message would pair with the
    next call): the ranks still alive call :meth:`~commlib.Communicator.shrink`.
    """


class RankLostError(CommError):
    """A rank of the group died, left or lost its connection; the group is broken.

    The engine failed under a collective because a peer is gone (its process
    ended, its connection closed) or failed first; the message names the rank
    where it can be told. The ranks still alive recover with
    :meth:`~commlib.Communicator.shrink` (this and :class:`CommTimeoutError`
    are the failures it serves); the other ``CommError`` s are not fixed by it.

    Examples:
        >>> issubclass(RankLostError, CommError)
        True
        >>> try:  # doctest: +SKIP
        ...     comm.all_reduce(loss)
        ... except (RankLostError, CommTimeoutError):
        ...     comm = comm.shrink()
    """


class CommBrokenError(CommError):
    """The communicator's process group failed earlier and cannot be used again.

    After a :class:`CommTimeoutError` or a peer's failure the engine's state is
    unknown (a late peer's message would pair with the next call), so every
    later call raises this at once, saying what broke it. The surviving ranks
    call :meth:`~commlib.Communicator.shrink` for a communicator over the ranks
    still alive; or the job ends and restarts.

    Examples:
        >>> try:  # doctest: +SKIP
        ...     comm.all_reduce(x)
        ... except (RankLostError, CommTimeoutError, CommBrokenError):
        ...     comm = comm.shrink()
    """


class DeserializationError(CommError):
    """An object received from another rank could not be loaded on this rank."""
