"""Point to point: ``send``, ``recv``, ``isend``, ``irecv``, ``batch_isend_irecv``.

Methods of :class:`~commlib.Communicator`, which derives from
:class:`PointToPoint`: each is the public method itself. No first round: a
send or receive involves two ranks, checked on this one before anything is
posted.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Literal, cast, overload

import torch

from commlib import _validation as check
from commlib._collective import collective
from commlib._engine import Engine
from commlib._lanes import Lanes, learn_once
from commlib._settings import as_timedelta
from commlib.handle import Handle
from commlib.p2p import P2POp
from commlib.reductions import copy_back
from commlib.types import P2PRequest, Timeout


class PointToPoint:
    """Sends and receives between two ranks of a :class:`~commlib.Communicator`."""

    # what the Communicator holds (its __init__ sets them)
    _lanes: Lanes
    _member: Callable[[str], Engine]

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
