"""``P2POp``: one send or receive of a batch, as ``torch.distributed.P2POp`` describes it.

A batch (:func:`commlib.batch_isend_irecv`, :meth:`commlib.Communicator.batch_isend_irecv`)
posts all its sends and receives at once, which engines that deadlock on
unbatched two-way exchange (NCCL) need.

Examples:
    >>> op = P2POp(commlib.isend, torch.ones(2), peer=1)
    >>> op.kind
    'send'
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import torch

_SENDS = ("isend", "send")
_RECVS = ("irecv", "recv")


def p2p_kind(op: Any) -> Literal["send", "recv"]:
    """``"send"`` or ``"recv"``: what ``op`` names.

    ``op`` is ``commlib.isend`` / ``commlib.irecv``, a communicator's
    ``isend`` / ``irecv``, torch.distributed's, or one of the names
    ``"isend"``, ``"irecv"``, ``"send"``, ``"recv"``.

    Examples:
        >>> p2p_kind(commlib.irecv), p2p_kind("send")
        ('recv', 'send')
        >>> p2p_kind(print)
        Traceback (most recent call last):
        ...
        ValueError: P2POp.op must be isend or irecv (or send / recv), got <built-in ...>
    """
    name = op if isinstance(op, str) else getattr(op, "__name__", None)
    if name in _SENDS:
        return "send"
    if name in _RECVS:
        return "recv"
    raise ValueError(f"P2POp.op must be isend or irecv (or send / recv), got {op!r}")


@dataclass(frozen=True)
class P2POp:
    """One point-to-point operation of a batch: send ``tensor`` to ``peer`` or receive from it.

    The fields mirror ``torch.distributed.P2POp``: with ``group`` a torch
    ProcessGroup, ``peer`` is a world rank and ``group_peer`` a rank within
    the group; with a :class:`~commlib.Communicator` (or no group) both are
    ranks within it.

    Examples:
        >>> send = P2POp(commlib.isend, torch.ones(2), peer=1)
        >>> recv = P2POp(commlib.irecv, torch.empty(2), peer=1)
        >>> (send.kind, recv.kind)
        ('send', 'recv')
    """

    op: Any
    tensor: torch.Tensor
    peer: int | None = None
    group: Any = None
    tag: int = 0
    group_peer: int | None = None

    @property
    def kind(self) -> Literal["send", "recv"]:
        """``"send"`` or ``"recv"``."""
        return p2p_kind(self.op)
