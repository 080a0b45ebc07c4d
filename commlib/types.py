"""The types of the backend contract, for plugin authors and type checkers.

Examples:
    >>> from commlib.types import ReduceOp, Work
    >>> op: ReduceOp = "mean"
"""

from __future__ import annotations

import datetime
from typing import Literal, NamedTuple, Protocol, runtime_checkable

import torch
from torch.distributed import ProcessGroup

#: The reductions users name (``all_reduce(x, op="mean")``).
ReduceOp = Literal["sum", "mean", "product", "min", "max", "band", "bor", "bxor"]

#: The reductions a backend receives: ``mean`` arrives as ``avg`` when the
#: backend averages natively (:attr:`commlib.Backend.native_avg`), else as ``sum``
#: followed by commlib's own division.
EngineOp = Literal["sum", "avg", "product", "min", "max", "band", "bor", "bxor"]

#: The process group a backend is handed: a ``torch.distributed.ProcessGroup``,
#: or ``None`` for backends without one (``single``).
Group = ProcessGroup | None

#: A timeout as users give it: a timedelta, seconds, or ``None`` for the default.
Timeout = datetime.timedelta | float | None


@runtime_checkable
class Work(Protocol):
    """What an asynchronous collective returns; torch's ``Work`` is one.

    Examples:
        >>> gloo = commlib.plugins.resolve_backend("gloo")
        >>> work = gloo.all_reduce(torch.ones(2), "sum", None, async_op=True)  # doctest: +SKIP
        >>> work.wait(datetime.timedelta(seconds=30))   # in a gloo world  # doctest: +SKIP
        True
        >>> isinstance(comm.all_reduce(torch.ones(2), async_op=True), Work)  # a Handle is one
        True
    """

    def wait(self, timeout: datetime.timedelta = ...) -> bool:
        """Block until the operation completes (at most ``timeout``); raise if it failed."""
        ...

    def is_completed(self) -> bool:
        """Whether the operation has completed, without blocking."""
        ...


class P2PRequest(NamedTuple):
    """One transfer of a batch of point-to-point operations, as a backend receives it.

    ``peer`` is a rank within the group; ``kind`` says whether this rank sends
    ``tensor`` to it or receives into ``tensor`` from it.

    Examples:
        >>> P2PRequest("send", torch.ones(2), peer=1).kind
        'send'
    """

    kind: Literal["send", "recv"]
    tensor: torch.Tensor
    peer: int
    tag: int = 0
