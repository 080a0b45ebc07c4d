"""The types of the backend contract, for plugin authors and type checkers.

Examples:
    >>> from commlib.types import ReduceOp, Work
    >>> op: ReduceOp = "mean"
"""

from __future__ import annotations

import datetime
from collections.abc import Callable
from typing import Any, Literal, NamedTuple, Protocol, runtime_checkable

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


class DirectCall(NamedTuple):
    """A collective the engine issues on the process group itself: decided once, called often.

    What :meth:`Backend.direct_call` returns. ``call`` is the engine's own
    method, bound (a ``ProcessGroup`` method for a torch.distributed engine),
    called as torch calls that method for a blocking call (the engine issues
    lanes for blocking calls only: options built with ``asyncOp=False``, as
    torch's functions build them), with ``options`` last: for
    ``all_reduce`` ``call([tensor], options)``, ``broadcast`` and ``reduce``
    the same, ``all_gather_into_tensor`` ``call(output, tensor, options)``,
    ``reduce_scatter`` ``call(output, input, options)``,
    ``all_to_all_single`` ``call(output, input, [], [], options)``,
    ``scatter`` ``call([tensor], [scatter_list] on src else [], options)``,
    ``all_to_all`` ``call(output_list, input_list, options)``,
    ``all_gather_slots`` ``call(output, slots[0], options)``, or with
    ``apart`` (rows sent apart) ``call(output, slots, [], [], options)``,
    ``barrier`` ``call(options)``; ``send`` and ``recv`` ``call([tensor],
    peer, tag)`` (no options). It
    returns the operation's work, or ``None`` where the operation has
    completed already (mpi tests a fresh request a few times). ``call=None``: the collective is the
    identity here (a group of one rank): nothing to issue.

    It serves tensors of ``min_bytes`` to ``max_bytes`` bytes (this rank's
    tensor: the input of a gather, the output of a reduce_scatter): outside
    that range the plugin's own method takes another path (a small gather
    through an all_to_all, a large one point to point). While the process
    group is a key of ``unless_in`` (torch's open coalescing managers) the
    plugin's method is called instead.

    ``via="shared"``: the slot round through shared memory (:mod:`commlib._shared_rows`),
    which waits with any timeout. Otherwise ``via``: the one engine call is
    another collective's, which the plugin's method composes this one from:
    ``"broadcast"`` for a ``scatter`` its engine lacks (the root's list
    broadcast whole, each rank keeping its part; ``call`` and ``options``
    then are the broadcast's from ``src``).

    Examples:
        >>> lane = DirectCall(None, None)   # a group of one: nothing to send
        >>> lane.min_bytes, lane.max_bytes
        (0, 9223372036854775807)
    """

    call: Callable[..., Work | None] | None
    options: Any
    min_bytes: int = 0
    max_bytes: int = 2**63 - 1
    unless_in: Any = None
    via: str | None = None
