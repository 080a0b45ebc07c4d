"""The object collectives: picklable objects gathered, broadcast, scattered, sent.

Methods of :class:`~commlib.Communicator`, which derives from
:class:`ObjectCollectives`: each is the public method itself, whose body
hands its settings to :mod:`commlib._object_calls` (a world of one at once,
else the protocol's steps: :mod:`commlib._objects` and its kin).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Literal, overload

from commlib import _object_calls
from commlib._collective import collective
from commlib._engine import Engine
from commlib.handle import ResultHandle
from commlib.serialization import Serializer
from commlib.types import Timeout


class ObjectCollectives:
    """``all_gather_object`` and its kin of a :class:`~commlib.Communicator`."""

    # what the Communicator holds (its __init__ sets them)
    _serializer: Serializer
    _slot_size: int
    _member: Callable[[str], Engine]

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
