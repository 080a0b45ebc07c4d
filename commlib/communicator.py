"""``Communicator``: one per process group; validates, then dispatches to a backend.

The communicator owns what is the same on every backend: argument checks, the
reduce-op names (``mean`` by sum-and-divide where the engine has no average),
moving data to the backend's device and back, tensors of different shapes in
``all_gather``, and the object collectives (:mod:`commlib._objects`). The backend
plugin owns the device and the engine calls.
"""

from __future__ import annotations

import datetime
import functools
import os
import threading
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist

from commlib import _agreement as agreement
from commlib import _objects as objects
from commlib import _ragged as ragged
from commlib import _validation as check
from commlib import plugins
from commlib._agreement import as_timedelta
from commlib.backend import Backend
from commlib.errors import CommError, CommTimeoutError, NotInGroupError
from commlib.serialization import Serializer

# as torch.distributed's own default; COMMLIB_TIMEOUT (seconds) overrides it
DEFAULT_TIMEOUT = datetime.timedelta(minutes=30)


def _default_timeout() -> datetime.timedelta:
    env = os.environ.get("COMMLIB_TIMEOUT")
    return as_timedelta(float(env)) if env else DEFAULT_TIMEOUT


def _env_strict() -> bool:
    return os.environ.get("COMMLIB_STRICT", "").lower() in ("1", "true", "yes", "on")


class Handle:
    """What an ``async_op=True`` collective returns: ``wait()`` for its result.

    ``wait()`` also finishes commlib's own part of the call (the division of
    ``mean``, the copy back to the caller's device), so read the tensor only
    after it. It waits at most the communicator's timeout (or ``timeout``).

    Examples:
        >>> h = comm.all_reduce(x, async_op=True)
        >>> h.wait()
        True
    """

    def __init__(
        self,
        wait: Callable[[datetime.timedelta | None], None] | None = None,
        finish: Callable[[], None] | None = None,
        work: Any = None,
    ):
        self._wait = wait
        self._finish = finish
        self._work = work
        self._done = False

    def wait(self, timeout: datetime.timedelta | float | None = None) -> bool:
        if not self._done:
            if self._wait is not None:
                self._wait(as_timedelta(timeout))
            if self._finish is not None:
                self._finish()
            self._done = True
        return True

    def is_completed(self) -> bool:
        return self._done or (self._work is not None and self._work.is_completed())


def _dist_ready() -> bool:
    return dist.is_available() and dist.is_initialized()


def _torch_backend_name(group: Any) -> str:
    return str(dist.get_backend(group if group is not dist.GroupMember.WORLD else None))


def _pick_plugin(torch_backend: str) -> Backend:
    """Plugin for a group's torch backend; ``"cpu:gloo,cuda:nccl"`` goes to the accelerator's."""
    return plugins.backend_for_group(torch_backend)


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
            collective; objects that fit complete in that one round.
        strict: before each collective the ranks agree on a fingerprint of
            what they pass (collective, dtypes, shapes, op, src/dst); a
            mismatch raises on every rank with what each rank passed. Costs
            one 8-byte all_gather per call. ``COMMLIB_STRICT=1`` turns it on.

    ``src`` and ``dst`` arguments are ranks *within* the group.

    Examples:
        >>> comm = Communicator()            # the world (or a world of one)
        >>> x = torch.ones(2) * comm.rank
        >>> comm.all_reduce(x, op="mean")
        >>> sub = comm.new_group([0, 1])     # every rank calls it
        >>> if sub.is_member:
        ...     sub.all_gather_object({"rank": sub.rank})
    """

    def __init__(
        self,
        group: Any = None,
        *,
        backend: str | Backend | None = None,
        serializer: Serializer | None = None,
        timeout: datetime.timedelta | float | None = None,
        slot_size: int = 4096,
        strict: bool | None = None,
    ):
        if slot_size < 64:
            raise ValueError(f"slot_size must be at least 64 bytes, got {slot_size}")
        self.timeout: datetime.timedelta = as_timedelta(timeout) or _default_timeout()
        self.slot_size = slot_size
        self.strict = _env_strict() if strict is None else bool(strict)
        self._seq = 0
        self._distributed = group is not None or _dist_ready()
        if group is not None and not _dist_ready():
            raise ValueError("a process group was given but torch.distributed is not initialised")
        if self._distributed and group is None:
            group = dist.group.WORLD
        self.group = group
        self.is_member = not (self._distributed and group is dist.GroupMember.NON_GROUP_MEMBER)

        if isinstance(backend, Backend):
            self.plugin = backend
        elif backend is not None:
            # a plugin name, a torch backend ("cpu:gloo,cuda:nccl") or a device ("npu")
            self.plugin = plugins.resolve_backend(backend)
        elif not self._distributed:
            self.plugin = plugins.get_backend_plugin("single")
        else:
            # a non-member cannot ask its group; the world's engine is the best answer
            self.plugin = _pick_plugin(_torch_backend_name(group if self.is_member else None))
        self.serializer: Serializer = serializer or self.plugin.serializer()
        self._lock = threading.Lock()

    # -- who am I ----------------------------------------------------------------
    @property
    def backend(self) -> str:
        """Name of the backend plugin serving this communicator (``"gloo"``, ...)."""
        return self.plugin.name

    @functools.cached_property
    def rank(self) -> int:
        """This process's rank in the group; -1 when it is not a member (fixed per group)."""
        return self.plugin.rank(self.group) if self.is_member else -1

    @functools.cached_property
    def world_size(self) -> int:
        """Number of ranks in the group; -1 when this process is not a member (fixed per group)."""
        return self.plugin.world_size(self.group) if self.is_member else -1

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
    def ranks(self) -> list[int]:
        """World ranks of the group's members, in group order."""
        if not self._distributed:
            return [0]
        if not self.is_member:
            raise NotInGroupError("this process is not a member of the group")
        return dist.get_process_group_ranks(self.group)

    def __repr__(self) -> str:
        who = f"rank={self.rank}/{self.world_size}" if self.is_member else "not a member"
        return f"<Communicator backend={self.backend!r} {who}>"

    # -- groups ------------------------------------------------------------------
    def new_group(
        self, ranks: Sequence[int], timeout: datetime.timedelta | float | None = None
    ) -> Communicator:
        """A communicator for a subgroup; ``ranks`` are ranks of *this* group.

        Like ``torch.distributed.new_group``, every rank of the world must call
        it with the same ``ranks``, members or not. Non-members get a
        communicator with ``is_member=False`` whose collectives raise
        :class:`~commlib.errors.NotInGroupError`.

        Examples:
            >>> evens = comm.new_group(range(0, comm.world_size, 2))
        """
        ranks = list(ranks)
        if not ranks:
            raise ValueError("new_group needs at least one rank")
        size = self.world_size if self.is_member else None
        for r in ranks:
            if size is not None:
                check.rank_in_range(r, size, "rank")
        if len(set(ranks)) != len(ranks):
            raise ValueError(f"new_group got duplicate ranks: {ranks}")
        timeout = as_timedelta(timeout) or self.timeout
        if not self._distributed:
            self.plugin.new_group(ranks, timeout)
            return Communicator(backend=self.plugin, serializer=self.serializer, timeout=timeout)
        world_ranks = [self.ranks[r] for r in ranks] if self.is_member else ranks
        group = self.plugin.new_group(world_ranks, timeout)
        return Communicator(
            group,
            backend=self.plugin,
            serializer=self.serializer,
            timeout=timeout,
            slot_size=self.slot_size,
        )

    # -- plumbing ----------------------------------------------------------------
    def _require_member(self, what: str) -> None:
        if not self.is_member:
            raise NotInGroupError(
                f"{what}: this process (world rank {dist.get_rank()}) is not a member of the "
                "communicator's group"
            )

    def _on_device(self, tensor: torch.Tensor) -> torch.Tensor:
        """``tensor`` as the backend needs it: on its device and contiguous."""
        moved = self.plugin.to_device(tensor)
        return moved if moved.is_contiguous() else moved.contiguous()

    def _wait(
        self, work: Any, what: str, seq: int, timeout: datetime.timedelta | None = None
    ) -> None:
        """Wait for ``work`` at most ``timeout``; failures become commlib errors."""
        if work is None or not hasattr(work, "wait"):
            return
        limit = timeout or self.timeout
        try:
            work.wait(limit)
        except RuntimeError as exc:
            raise self._failure(what, seq, limit, exc) from exc

    def _failure(
        self, what: str, seq: int, limit: datetime.timedelta, exc: BaseException
    ) -> CommError:
        """The commlib error for an engine failure: a timeout names who is missing."""
        text = str(exc)
        if "timed out" in text.lower() or "timeout" in text.lower():
            missing = agreement.missing_ranks(self, seq, what)
            detail = "; ".join(f"rank {r}: {w}" for r, w in sorted(missing.items()))
            return CommTimeoutError(
                f"{what} did not complete within {limit.total_seconds():g}s on rank "
                f"{self.rank} of {self.world_size}" + (f" ({detail})" if detail else "")
            )
        agreement.record_failure(self, seq, what, "failed")
        return CommError(f"{what} failed on rank {self.rank}: {text}")

    def _collective(
        self,
        what: str,
        method: str,
        *args: Any,
        timeout: datetime.timedelta | None = None,
        async_op: bool = False,
        **kwargs: Any,
    ) -> Any:
        """Call ``plugin.<method>`` asynchronously; wait for it unless ``async_op``.

        Returns ``(work, seq)`` when ``async_op``; the sequence number names the
        collective in the store if it times out.
        """
        self._seq += 1
        seq = self._seq
        try:
            work = getattr(self.plugin, method)(*args, group=self.group, async_op=True, **kwargs)
        except RuntimeError as exc:
            raise CommError(f"{what} failed on rank {self.rank}: {exc}") from exc
        if async_op:
            return work, seq
        self._wait(work, what, seq, timeout)
        return None

    def _run(
        self,
        what: str,
        method: str,
        *args: Any,
        async_op: bool,
        finish: Callable[[], None] | None,
        timeout: Any = None,
        **kwargs: Any,
    ) -> Handle | None:
        """A tensor collective: the engine call, then commlib's ``finish`` step."""
        limit = as_timedelta(timeout)
        if not async_op:
            self._collective(what, method, *args, timeout=limit, **kwargs)
            if finish is not None:
                finish()
            return None
        work, seq = self._collective(what, method, *args, async_op=True, **kwargs)
        return Handle(lambda t: self._wait(work, what, seq, t or limit), finish, work)

    def _strict(self, what: str, description: str) -> None:
        if self.strict and self._distributed:
            # the title must not be this rank's own view: every rank raises alike
            agreement.agree(self, "strict mode", f"{what}({description})")

    # -- tensor collectives -------------------------------------------------------
    def all_reduce(
        self,
        tensor: torch.Tensor,
        op: str = "sum",
        *,
        async_op: bool = False,
        timeout: datetime.timedelta | float | None = None,
    ) -> Handle | None:
        """Reduce ``tensor`` across the group, in place.

        ``op`` is one of ``sum mean product min max band bor bxor``. ``mean`` of
        an integer tensor is computed in floating point and written back into
        the integer tensor (truncated), as mmengine does.

        Examples:
            >>> x = torch.tensor([1.0, 2.0]) * (comm.rank + 1)
            >>> comm.all_reduce(x, op="mean")   # 2 ranks: tensor([1.5, 3.0])
        """
        self._require_member("all_reduce")
        check.tensor(tensor, "tensor")
        op = check.reduce_op(op, tensor)
        self._strict("all_reduce", f"op={op}, {tensor.dtype}, {tuple(tensor.shape)}")
        native = op != "mean" or (
            self.plugin.native_avg and (tensor.is_floating_point() or tensor.is_complex())
        )
        work_t = self._on_device(tensor)
        world = self.world_size

        def finish() -> None:
            if not native:
                if work_t.is_floating_point() or work_t.is_complex():
                    work_t.div_(world)
                else:
                    tensor.copy_(torch.true_divide(work_t, world))
                    return
            if work_t is not tensor:
                tensor.copy_(work_t)

        engine_op = "avg" if (op == "mean" and native) else ("sum" if op == "mean" else op)
        return self._run(
            "all_reduce",
            "all_reduce",
            work_t,
            engine_op,
            async_op=async_op,
            finish=finish,
            timeout=timeout,
        )

    def all_gather(
        self, tensor: torch.Tensor, *, timeout: datetime.timedelta | float | None = None
    ) -> list[torch.Tensor]:
        """Every rank's ``tensor``, as a list indexed by rank.

        Ranks may pass tensors of different shapes (same number of dims, same
        dtype); each rank receives every rank's true tensor. Results are on the
        caller's device. Tensors that fit the communicator's ``slot_size`` travel
        with their shapes in one round; larger ones take a second round.

        Examples:
            >>> comm.all_gather(torch.arange(comm.rank + 1))   # 2 ranks
            [tensor([0]), tensor([0, 1])]
        """
        self._require_member("all_gather")
        check.tensor(tensor, "tensor")
        world = self.world_size
        self._strict("all_gather", f"{tensor.dtype}, ndim={tensor.dim()}")
        work_t = self._on_device(tensor)
        limit = as_timedelta(timeout)
        shapes, out = ragged.exchange(self, work_t, "all_gather", timeout=limit)
        if out is not None:  # small: the data came with the shapes, one round
            pass
        elif all(s == shapes[0] for s in shapes):
            # one flat buffer: cheaper on the engines than a list of outputs
            flat = torch.empty((world, *work_t.shape), dtype=work_t.dtype, device=work_t.device)
            self._collective(
                "all_gather",
                "all_gather_into_tensor",
                flat.view(-1),
                work_t.reshape(-1),
                timeout=limit,
            )
            out = list(flat.unbind(0))
        else:
            max_shape = [max(dims) for dims in zip(*shapes)]
            padded = work_t.new_zeros(max_shape)
            padded[tuple(slice(0, d) for d in work_t.shape)] = work_t
            buf = [torch.empty_like(padded) for _ in range(world)]
            self._collective("all_gather", "all_gather", buf, padded, timeout=limit)
            out = [b[tuple(slice(0, d) for d in s)] for b, s in zip(buf, shapes)]
        return [t.to(tensor.device) for t in out]

    def all_gather_into_tensor(
        self,
        output: torch.Tensor,
        tensor: torch.Tensor,
        *,
        async_op: bool = False,
        timeout: datetime.timedelta | float | None = None,
    ) -> Handle | None:
        """Concatenate every rank's ``tensor`` along dim 0 into ``output``.

        ``output`` must hold ``world_size`` times ``tensor``'s elements.

        Examples:
            >>> out = torch.empty(comm.world_size * 2)
            >>> comm.all_gather_into_tensor(out, torch.ones(2) * comm.rank)
        """
        self._require_member("all_gather_into_tensor")
        check.tensor(output, "output")
        check.tensor(tensor, "tensor")
        if output.numel() != tensor.numel() * self.world_size:
            raise ValueError(
                f"output has {output.numel()} elements; all_gather_into_tensor needs "
                f"world_size ({self.world_size}) x {tensor.numel()}"
            )
        if output.dtype != tensor.dtype:
            raise TypeError(
                f"output dtype {output.dtype} differs from tensor dtype {tensor.dtype}"
            )
        self._strict("all_gather_into_tensor", f"{tensor.dtype}, {tuple(tensor.shape)}")
        out_t = self._on_device(output)
        in_t = self._on_device(tensor)

        def finish() -> None:
            if out_t is not output:
                output.copy_(out_t)

        return self._run(
            "all_gather_into_tensor",
            "all_gather_into_tensor",
            # flat views: engines such as gloo insist on matching shapes, and
            # the contract is about element counts
            out_t.reshape(-1),
            in_t.reshape(-1),
            async_op=async_op,
            finish=finish,
            timeout=timeout,
        )

    def gather(
        self,
        tensor: torch.Tensor,
        dst: int = 0,
        *,
        timeout: datetime.timedelta | float | None = None,
    ) -> list[torch.Tensor]:
        """Every rank's ``tensor`` on ``dst`` (a list); other ranks get ``[]``.

        All ranks must pass tensors of the same shape and dtype.

        Examples:
            >>> comm.gather(torch.tensor([comm.rank]), dst=0)
            [tensor([0]), tensor([1])]   # rank 0
            []                           # rank 1
        """
        self._require_member("gather")
        check.tensor(tensor, "tensor")
        check.rank_in_range(dst, self.world_size, "dst")
        self._strict("gather", f"dst={dst}, {tensor.dtype}, {tuple(tensor.shape)}")
        work_t = self._on_device(tensor)
        is_dst = self.rank == dst
        out = [torch.empty_like(work_t) for _ in range(self.world_size)] if is_dst else None
        self._collective("gather", "gather", work_t, out, dst, timeout=as_timedelta(timeout))
        return [t.to(tensor.device) for t in out] if is_dst else []

    def broadcast(
        self,
        tensor: torch.Tensor,
        src: int = 0,
        *,
        async_op: bool = False,
        timeout: datetime.timedelta | float | None = None,
    ) -> Handle | None:
        """Copy ``src``'s ``tensor`` into ``tensor`` on every rank, in place.

        Examples:
            >>> x = torch.tensor([comm.rank])
            >>> comm.broadcast(x, src=1)     # every rank: tensor([1])
        """
        self._require_member("broadcast")
        check.tensor(tensor, "tensor")
        check.rank_in_range(src, self.world_size, "src")
        self._strict("broadcast", f"src={src}, {tensor.dtype}, {tuple(tensor.shape)}")
        work_t = self._on_device(tensor)

        def finish() -> None:
            if work_t is not tensor:
                tensor.copy_(work_t)

        return self._run(
            "broadcast",
            "broadcast",
            work_t,
            src,
            async_op=async_op,
            finish=finish,
            timeout=timeout,
        )

    def reduce_scatter(
        self,
        output: torch.Tensor,
        input: torch.Tensor | Sequence[torch.Tensor],
        op: str = "sum",
        *,
        async_op: bool = False,
        timeout: datetime.timedelta | float | None = None,
    ) -> Handle | None:
        """Reduce ``input`` across ranks and leave chunk ``rank`` in ``output``.

        ``input`` is a list of ``world_size`` tensors shaped like ``output``, or
        one tensor of ``world_size`` such chunks along dim 0.

        Examples:
            >>> out = torch.empty(1)
            >>> comm.reduce_scatter(out, torch.ones(comm.world_size))
            >>> out                            # tensor([2.]) on 2 ranks
        """
        self._require_member("reduce_scatter")
        check.tensor(output, "output")
        world = self.world_size
        if isinstance(input, (list, tuple)):
            if len(input) != world:
                raise ValueError(f"reduce_scatter needs {world} input tensors, got {len(input)}")
            for t in input:
                check.tensor(t, "input[i]")
                if t.shape != output.shape:
                    raise ValueError(
                        f"each input tensor must be shaped like output {tuple(output.shape)}, "
                        f"got {tuple(t.shape)}"
                    )
            flat = torch.cat([t.reshape(-1) for t in input])
        else:
            check.tensor(input, "input")
            if input.numel() != output.numel() * world:
                raise ValueError(
                    f"input has {input.numel()} elements; reduce_scatter needs world_size "
                    f"({world}) x output's {output.numel()}"
                )
            flat = input.reshape(-1)
        if flat.dtype != output.dtype:
            raise TypeError(f"input dtype {flat.dtype} differs from output dtype {output.dtype}")
        op = check.reduce_op(op, output)
        self._strict("reduce_scatter", f"op={op}, {output.dtype}, {tuple(output.shape)}")
        native = op != "mean" or (self.plugin.native_avg and output.is_floating_point())
        engine_op = "avg" if (op == "mean" and native) else ("sum" if op == "mean" else op)
        out_t = self._on_device(output).view(-1)  # contiguous, so a view
        in_t = self._on_device(flat)

        def finish() -> None:
            if not native:
                if out_t.is_floating_point() or out_t.is_complex():
                    out_t.div_(world)
                else:
                    output.copy_(torch.true_divide(out_t, world).view(output.shape))
                    return
            if out_t.data_ptr() != output.data_ptr() or out_t.device != output.device:
                output.copy_(out_t.view(output.shape))

        return self._run(
            "reduce_scatter",
            "reduce_scatter",
            out_t,
            in_t,
            engine_op,
            async_op=async_op,
            finish=finish,
            timeout=timeout,
        )

    def barrier(self, *, timeout: datetime.timedelta | float | None = None) -> None:
        """Block until every rank of the group has arrived (at most ``timeout``).

        Examples:
            >>> comm.barrier(timeout=60)
        """
        self._require_member("barrier")
        self._strict("barrier", "")
        limit = as_timedelta(timeout) or self.timeout
        self._seq += 1
        try:
            self.plugin.barrier(self.group, timeout=limit)
        except RuntimeError as exc:
            raise self._failure("barrier", self._seq, limit, exc) from exc

    # -- object collectives -------------------------------------------------------
    def all_gather_object(self, obj: Any, *, serializer: Serializer | None = None) -> list[Any]:
        """Every rank's ``obj``, as a list indexed by rank.

        If any rank fails to serialize its object, every rank raises the same
        :class:`~commlib.errors.RemoteError` naming it.

        Examples:
            >>> comm.all_gather_object({"rank": comm.rank})
            [{'rank': 0}, {'rank': 1}]
        """
        self._require_member("all_gather_object")
        if self.world_size == 1:  # as mmengine: nothing to serialize in a world of one
            return [obj]
        return objects.all_gather_object(self, obj, serializer or self.serializer)

    def gather_object(
        self, obj: Any, dst: int = 0, *, serializer: Serializer | None = None
    ) -> list[Any] | None:
        """Every rank's ``obj`` on ``dst`` (a list); other ranks get ``None``.

        Examples:
            >>> comm.gather_object(comm.rank, dst=0)
            [0, 1]    # rank 0
            None      # rank 1
        """
        self._require_member("gather_object")
        if self.world_size == 1:
            check.rank_in_range(dst, 1, "dst")
            return [obj]
        return objects.gather_object(self, obj, dst, serializer or self.serializer)

    def broadcast_object_list(
        self, object_list: list[Any], src: int = 0, *, serializer: Serializer | None = None
    ) -> None:
        """Fill ``object_list`` on every rank with ``src``'s objects, in place.

        Every rank passes a list of the same length.

        Examples:
            >>> objs = ["foo", 12, {1: 2}] if comm.rank == 0 else [None] * 3
            >>> comm.broadcast_object_list(objs)
            >>> objs                                 # every rank
            ['foo', 12, {1: 2}]
        """
        self._require_member("broadcast_object_list")
        if self.world_size == 1:
            if not isinstance(object_list, list):
                raise TypeError(
                    f"broadcast_object_list needs a list, got {type(object_list).__name__}"
                )
            check.rank_in_range(src, 1, "src")
            return
        objects.broadcast_object_list(self, object_list, src, serializer or self.serializer)

    def broadcast_object(
        self, obj: Any = None, src: int = 0, *, serializer: Serializer | None = None
    ) -> Any:
        """Return ``src``'s ``obj`` on every rank.

        Examples:
            >>> cfg = comm.broadcast_object(load_config() if comm.rank == 0 else None)
        """
        box = [obj]
        self.broadcast_object_list(box, src, serializer=serializer)
        return box[0]
