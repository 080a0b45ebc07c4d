"""``Communicator``: one per process group; validates arguments and composes collectives.

The communicator owns what is the same on every backend: argument checks, the
reduce-op names (``mean`` by sum-and-divide where the engine has no average),
moving data to the backend's device and back, tensors of different shapes in
``all_gather`` (:mod:`commlib._ragged`) and the object collectives
(:mod:`commlib._objects`). Every call to the backend goes through its
:class:`~commlib._engine.Engine`, which owns the plugin, the group, timeouts and
the translation of engine failures into commlib errors.
"""

from __future__ import annotations

import datetime
import os
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import torch
import torch.distributed as dist

from commlib import _agreement, _objects, _ragged, plugins
from commlib import _validation as check
from commlib._engine import Engine
from commlib._settings import as_timedelta, default_timeout, strict_from_env
from commlib.backend import Backend
from commlib.errors import NotInGroupError
from commlib.handle import Handle
from commlib.observe.dispatch import observed
from commlib.serialization import Serializer
from commlib.types import EngineOp, Group, ReduceOp, Timeout

__all__ = ["Communicator", "Handle", "dist_ready"]

_Method = TypeVar("_Method", bound=Callable[..., Any])


def dist_ready() -> bool:
    """Whether torch.distributed is available and initialised.

    Examples:
        >>> dist_ready()          # a plain single-process run
        False
    """
    return dist.is_available() and dist.is_initialized()


def _torch_backend_name(group: Group) -> str:
    return str(dist.get_backend(group if group is not dist.GroupMember.WORLD else None))


def _reduction(
    op: str, tensor: torch.Tensor, native_avg: bool
) -> tuple[EngineOp, Callable[[torch.Tensor, torch.Tensor, int], None]]:
    """What the engine reduces with, and how the result reaches the caller's tensor.

    ``mean`` is the engine's ``avg`` where it averages floating (and complex)
    tensors natively; otherwise a ``sum`` that commlib divides, in floating
    point, writing an integer tensor back truncated, as mmengine does.
    """
    floating = tensor.is_floating_point() or tensor.is_complex()
    if op != "mean":
        return op, _copy_back  # type: ignore[return-value]
    if native_avg and floating:
        return "avg", _copy_back
    return "sum", _divide_back


def _copy_back(result: torch.Tensor, target: torch.Tensor, world: int) -> None:
    if result is target:
        return
    if result.data_ptr() != target.data_ptr() or result.device != target.device:
        target.copy_(result.view(target.shape))


def _divide_back(result: torch.Tensor, target: torch.Tensor, world: int) -> None:
    if result.is_floating_point() or result.is_complex():
        result.div_(world)
        _copy_back(result, target, world)
    else:
        target.copy_(torch.true_divide(result, world).view(target.shape))


def _engine_of(comm: Communicator) -> Engine | None:
    return comm._engine


def _collective(name: str, **facts: Any) -> Callable[[_Method], _Method]:
    """A public collective: observers and ``torch.profiler`` see it (:mod:`commlib.observe`)."""
    return observed(name, _engine_of, **facts)


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
        >>> x = torch.ones(2) * (comm.rank + 1)
        >>> comm.all_reduce(x, op="mean")
        >>> x
        tensor([1., 1.])
        >>> comm.all_gather_object({"rank": comm.rank})
        [{'rank': 0}]
    """

    def __init__(
        self,
        group: Group = None,
        *,
        backend: str | Backend | None = None,
        serializer: Serializer | None = None,
        timeout: Timeout = None,
        slot_size: int = 4096,
        strict: bool | None = None,
    ):
        if slot_size < 64:
            raise ValueError(f"slot_size must be at least 64 bytes, got {slot_size}")
        self.timeout: datetime.timedelta = as_timedelta(timeout) or default_timeout()
        self.slot_size = slot_size
        self.strict = strict_from_env() if strict is None else bool(strict)
        self._distributed = group is not None or dist_ready()
        if group is not None and not dist_ready():
            raise ValueError("a process group was given but torch.distributed is not initialised")
        if self._distributed and group is None:
            group = dist.group.WORLD
        self.group: Group = group
        self.is_member = not (self._distributed and group is dist.GroupMember.NON_GROUP_MEMBER)

        if isinstance(backend, Backend):
            plugin = backend
        elif backend is not None:
            # a plugin name, a torch backend ("cpu:gloo,cuda:nccl") or a device ("npu")
            plugin = plugins.resolve_backend(backend)
        elif not self._distributed:
            plugin = plugins.get_backend_plugin("single")
        else:
            # a non-member cannot ask its group; the world's engine is the best answer
            torch_backend = _torch_backend_name(group if self.is_member else None)
            plugin = plugins.backend_for_group(torch_backend)
        self.plugin: Backend = plugin
        self.serializer: Serializer = serializer or plugin.serializer()
        self._engine: Engine | None = (
            Engine(plugin, group, self.timeout) if self.is_member else None
        )

    # -- who am I ----------------------------------------------------------------
    @property
    def backend(self) -> str:
        """Name of the backend plugin serving this communicator (``"gloo"``, ...)."""
        return self.plugin.name

    @property
    def rank(self) -> int:
        """This process's rank in the group; -1 when it is not a member."""
        return self._engine.rank if self._engine is not None else -1

    @property
    def world_size(self) -> int:
        """Number of ranks in the group; -1 when this process is not a member."""
        return self._engine.world_size if self._engine is not None else -1

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
    def new_group(self, ranks: Sequence[int], timeout: Timeout = None) -> Communicator:
        """A communicator for a subgroup; ``ranks`` are ranks of *this* group.

        Like ``torch.distributed.new_group``, every rank of the world must call
        it with the same ``ranks``, members or not. Non-members get a
        communicator with ``is_member=False`` whose collectives raise
        :class:`~commlib.errors.NotInGroupError`.

        Examples:
            >>> evens = comm.new_group(range(0, comm.world_size, 2))
            >>> evens.is_member, evens.world_size
            (True, 1)
        """
        ranks = list(ranks)
        if not ranks:
            raise ValueError("new_group needs at least one rank")
        if self.is_member:
            for r in ranks:
                check.rank_in_range(r, self.world_size, "rank")
        if len(set(ranks)) != len(ranks):
            raise ValueError(f"new_group got duplicate ranks: {ranks}")
        limit = as_timedelta(timeout) or self.timeout
        if not self._distributed:
            self.plugin.new_group(ranks, limit)
            return Communicator(backend=self.plugin, serializer=self.serializer, timeout=limit)
        world_ranks = [self.ranks[r] for r in ranks] if self.is_member else ranks
        group = self.plugin.new_group(world_ranks, limit)
        return Communicator(
            group,
            backend=self.plugin,
            serializer=self.serializer,
            timeout=limit,
            slot_size=self.slot_size,
        )

    # -- composition helpers --------------------------------------------------------
    def _member(self, what: str) -> Engine:
        """The engine, for a member; a non-member gets :class:`NotInGroupError`."""
        if self._engine is None:
            raise NotInGroupError(
                f"{what}: this process (world rank {dist.get_rank()}) is not a member of the "
                "communicator's group"
            )
        return self._engine

    @property
    def _agreeing(self) -> bool:
        """Strict mode is on and there are peers to agree with."""
        return self.strict and self._distributed

    def _strict(self, engine: Engine, what: str, description: str) -> None:
        if self._agreeing:
            # the title must not be this rank's own view: every rank raises alike
            _agreement.agree(
                engine, "strict mode", f"{what}({description})", self.serializer, self.slot_size
            )

    @_collective("ensure_same")
    def ensure_same(self, what: str, description: str) -> None:
        """Raise the same error on every rank unless all ranks pass the same ``description``.

        One 8-byte all_gather when the ranks agree; when they do not, every
        rank raises :class:`~commlib.errors.RemoteArgumentError` showing what
        each rank passed. Use it before a collective whose arguments must
        match, so a mismatch is an error instead of a hang.

        Examples:
            >>> state = {"loss": torch.tensor(0.5), "acc": torch.tensor(0.9)}
            >>> comm.ensure_same("my_sync", f"keys={sorted(state)}")
        """
        engine = self._member(what)
        if self._distributed:
            _agreement.agree(engine, what, description, self.serializer, self.slot_size)

    @_collective("all_gather_shapes", payload="tensor")
    def all_gather_shapes(
        self, tensor: torch.Tensor, *, timeout: Timeout = None
    ) -> list[list[int]]:
        """Every rank's shape of ``tensor`` (same dtype and number of dims everywhere).

        Examples:
            >>> comm.all_gather_shapes(torch.zeros(3, 2))
            [[3, 2]]
        """
        engine = self._member("all_gather_shapes")
        check.tensor(tensor, "tensor")
        shapes, _ = _ragged.exchange(
            engine,
            engine.to_device(tensor),
            "all_gather_shapes",
            room=0,
            timeout=as_timedelta(timeout),
        )
        return shapes

    # -- tensor collectives -------------------------------------------------------
    @_collective("all_reduce", payload="tensor", op="op", uniform=True)
    def all_reduce(
        self,
        tensor: torch.Tensor,
        op: ReduceOp | str = "sum",
        *,
        async_op: bool = False,
        timeout: Timeout = None,
    ) -> Handle | None:
        """Reduce ``tensor`` across the group, in place.

        ``op`` is one of ``sum mean product min max band bor bxor``. ``mean`` of
        an integer tensor is computed in floating point and written back into
        the integer tensor (truncated), as mmengine does.

        Examples:
            >>> x = torch.tensor([1.0, 2.0]) * (comm.rank + 1)
            >>> comm.all_reduce(x, op="mean")   # 2 ranks: tensor([1.5, 3.0])
        """
        engine = self._member("all_reduce")
        check.tensor(tensor, "tensor")
        name = check.reduce_op(op, tensor)
        if self._agreeing:
            self._strict(engine, "all_reduce", f"op={name}, {tensor.dtype}, {tuple(tensor.shape)}")
        engine_op, back = _reduction(name, tensor, self.plugin.native_avg)
        work_t = engine.to_device(tensor)
        world = engine.world_size
        return engine.submit(
            "all_reduce",
            self.plugin.all_reduce,
            work_t,
            engine_op,
            finish=lambda: back(work_t, tensor, world),
            timeout=as_timedelta(timeout),
            async_op=async_op,
        )

    @_collective("all_gather", payload="tensor")
    def all_gather(self, tensor: torch.Tensor, *, timeout: Timeout = None) -> list[torch.Tensor]:
        """Every rank's ``tensor``, as a list indexed by rank.

        Ranks may pass tensors of different shapes (same number of dims, same
        dtype); each rank receives every rank's true tensor. Results are on the
        caller's device. Tensors that fit the communicator's ``slot_size`` travel
        with their shapes in one round; larger ones take a second round.

        Examples:
            >>> comm.all_gather(torch.arange(comm.rank + 1))
            [tensor([0])]
            >>> # on 2 ranks, each rank gets: [tensor([0]), tensor([0, 1])]
        """
        engine = self._member("all_gather")
        check.tensor(tensor, "tensor")
        world = engine.world_size
        if self._agreeing:
            self._strict(engine, "all_gather", f"{tensor.dtype}, ndim={tensor.dim()}")
        work_t = engine.to_device(tensor)
        limit = as_timedelta(timeout)
        shapes, out = _ragged.exchange(
            engine, work_t, "all_gather", room=_ragged.inline_room(self.slot_size), timeout=limit
        )
        if out is not None:  # small: the data came with the shapes, one round
            pass
        elif all(s == shapes[0] for s in shapes):
            # one flat buffer: cheaper on the engines than a list of outputs
            flat = torch.empty((world, *work_t.shape), dtype=work_t.dtype, device=work_t.device)
            engine.run(
                "all_gather",
                self.plugin.all_gather_into_tensor,
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
            engine.run("all_gather", self.plugin.all_gather, buf, padded, timeout=limit)
            out = [b[tuple(slice(0, d) for d in s)] for b, s in zip(buf, shapes)]
        return [t.to(tensor.device) for t in out]

    @_collective("all_gather_into_tensor", payload="tensor", uniform=True)
    def all_gather_into_tensor(
        self,
        output: torch.Tensor,
        tensor: torch.Tensor,
        *,
        async_op: bool = False,
        timeout: Timeout = None,
    ) -> Handle | None:
        """Concatenate every rank's ``tensor`` along dim 0 into ``output``.

        ``output`` must hold ``world_size`` times ``tensor``'s elements.

        Examples:
            >>> out = torch.empty(comm.world_size * 2)
            >>> comm.all_gather_into_tensor(out, torch.ones(2) * comm.rank)
        """
        engine = self._member("all_gather_into_tensor")
        check.tensor(output, "output")
        check.tensor(tensor, "tensor")
        if output.numel() != tensor.numel() * engine.world_size:
            raise ValueError(
                f"output has {output.numel()} elements; all_gather_into_tensor needs "
                f"world_size ({engine.world_size}) x {tensor.numel()}"
            )
        if output.dtype != tensor.dtype:
            raise TypeError(
                f"output dtype {output.dtype} differs from tensor dtype {tensor.dtype}"
            )
        if self._agreeing:
            self._strict(
                engine, "all_gather_into_tensor", f"{tensor.dtype}, {tuple(tensor.shape)}"
            )
        out_t = engine.to_device(output)
        in_t = engine.to_device(tensor)
        world = engine.world_size
        return engine.submit(
            "all_gather_into_tensor",
            self.plugin.all_gather_into_tensor,
            # flat views: engines such as gloo insist on matching shapes, and
            # the contract is about element counts
            out_t.reshape(-1),
            in_t.reshape(-1),
            finish=lambda: _copy_back(out_t, output, world),
            timeout=as_timedelta(timeout),
            async_op=async_op,
        )

    @_collective("gather", payload="tensor", peer="dst", uniform=True)
    def gather(
        self, tensor: torch.Tensor, dst: int = 0, *, timeout: Timeout = None
    ) -> list[torch.Tensor]:
        """Every rank's ``tensor`` on ``dst`` (a list); other ranks get ``[]``.

        All ranks must pass tensors of the same shape and dtype.

        Examples:
            >>> comm.gather(torch.tensor([comm.rank]), dst=0)
            [tensor([0])]
            >>> # on 2 ranks: [tensor([0]), tensor([1])] on rank 0, [] on rank 1
        """
        engine = self._member("gather")
        check.tensor(tensor, "tensor")
        check.rank_in_range(dst, engine.world_size, "dst")
        if self._agreeing:
            self._strict(engine, "gather", f"dst={dst}, {tensor.dtype}, {tuple(tensor.shape)}")
        work_t = engine.to_device(tensor)
        is_dst = engine.rank == dst
        out = [torch.empty_like(work_t) for _ in range(engine.world_size)] if is_dst else None
        engine.run("gather", self.plugin.gather, work_t, out, dst, timeout=as_timedelta(timeout))
        return [t.to(tensor.device) for t in out] if out is not None else []

    @_collective("broadcast", payload="tensor", peer="src", uniform=True)
    def broadcast(
        self,
        tensor: torch.Tensor,
        src: int = 0,
        *,
        async_op: bool = False,
        timeout: Timeout = None,
    ) -> Handle | None:
        """Copy ``src``'s ``tensor`` into ``tensor`` on every rank, in place.

        Examples:
            >>> x = torch.tensor([comm.rank])
            >>> comm.broadcast(x, src=0)
            >>> x
            tensor([0])
        """
        engine = self._member("broadcast")
        check.tensor(tensor, "tensor")
        check.rank_in_range(src, engine.world_size, "src")
        if self._agreeing:
            self._strict(engine, "broadcast", f"src={src}, {tensor.dtype}, {tuple(tensor.shape)}")
        work_t = engine.to_device(tensor)
        world = engine.world_size
        return engine.submit(
            "broadcast",
            self.plugin.broadcast,
            work_t,
            src,
            finish=lambda: _copy_back(work_t, tensor, world),
            timeout=as_timedelta(timeout),
            async_op=async_op,
        )

    @_collective("reduce_scatter", payload="output", op="op", uniform=True)
    def reduce_scatter(
        self,
        output: torch.Tensor,
        input: torch.Tensor | Sequence[torch.Tensor],
        op: ReduceOp | str = "sum",
        *,
        async_op: bool = False,
        timeout: Timeout = None,
    ) -> Handle | None:
        """Reduce ``input`` across ranks and leave chunk ``rank`` in ``output``.

        ``input`` is a list of ``world_size`` tensors shaped like ``output``, or
        one tensor of ``world_size`` such chunks along dim 0.

        Examples:
            >>> out = torch.empty(1)
            >>> comm.reduce_scatter(out, torch.ones(comm.world_size))
            >>> out
            tensor([1.])
        """
        engine = self._member("reduce_scatter")
        check.tensor(output, "output")
        world = engine.world_size
        if isinstance(input, torch.Tensor):
            if input.numel() != output.numel() * world:
                raise ValueError(
                    f"input has {input.numel()} elements; reduce_scatter needs world_size "
                    f"({world}) x output's {output.numel()}"
                )
            flat = input.reshape(-1)
        elif isinstance(input, (list, tuple)):
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
            raise TypeError(
                f"input must be a torch.Tensor or a list of them, got {type(input).__name__}"
            )
        if flat.dtype != output.dtype:
            raise TypeError(f"input dtype {flat.dtype} differs from output dtype {output.dtype}")
        name = check.reduce_op(op, output)
        if self._agreeing:
            self._strict(
                engine, "reduce_scatter", f"op={name}, {output.dtype}, {tuple(output.shape)}"
            )
        engine_op, back = _reduction(name, output, self.plugin.native_avg)
        out_t = engine.to_device(output).view(-1)  # contiguous, so a view
        in_t = engine.to_device(flat)
        return engine.submit(
            "reduce_scatter",
            self.plugin.reduce_scatter,
            out_t,
            in_t,
            engine_op,
            finish=lambda: back(out_t, output, world),
            timeout=as_timedelta(timeout),
            async_op=async_op,
        )

    @_collective("barrier")
    def barrier(self, *, timeout: Timeout = None) -> None:
        """Block until every rank of the group has arrived (at most ``timeout``).

        Examples:
            >>> comm.barrier(timeout=60)
        """
        engine = self._member("barrier")
        if self._agreeing:
            self._strict(engine, "barrier", "")
        engine.barrier(as_timedelta(timeout))

    # -- object collectives -------------------------------------------------------
    @_collective("all_gather_object", payload="obj")
    def all_gather_object(self, obj: Any, *, serializer: Serializer | None = None) -> list[Any]:
        """Every rank's ``obj``, as a list indexed by rank.

        If any rank fails to serialize its object, every rank raises the same
        :class:`~commlib.errors.RemoteError` naming it. This rank's own entry is
        ``obj`` itself, not a copy.

        Examples:
            >>> comm.all_gather_object({"rank": comm.rank})
            [{'rank': 0}]
        """
        engine = self._member("all_gather_object")
        if engine.world_size == 1:  # as mmengine: nothing to serialize in a world of one
            return [obj]
        return _objects.all_gather_object(
            engine, obj, serializer or self.serializer, self.slot_size
        )

    @_collective("gather_object", payload="obj", peer="dst")
    def gather_object(
        self, obj: Any, dst: int = 0, *, serializer: Serializer | None = None
    ) -> list[Any] | None:
        """Every rank's ``obj`` on ``dst`` (a list); other ranks get ``None``.

        Examples:
            >>> comm.gather_object(comm.rank, dst=0)
            [0]
        """
        engine = self._member("gather_object")
        if engine.world_size == 1:
            check.rank_in_range(dst, 1, "dst")
            return [obj]
        return _objects.gather_object(
            engine, obj, dst, serializer or self.serializer, self.slot_size
        )

    @_collective("broadcast_object_list", payload="object_list", peer="src")
    def broadcast_object_list(
        self, object_list: list[Any], src: int = 0, *, serializer: Serializer | None = None
    ) -> None:
        """Fill ``object_list`` on every rank with ``src``'s objects, in place.

        Every rank passes a list of the same length.

        Examples:
            >>> objs = ["foo", 12, {1: 2}] if comm.rank == 0 else [None] * 3
            >>> comm.broadcast_object_list(objs)
            >>> objs
            ['foo', 12, {1: 2}]
        """
        engine = self._member("broadcast_object_list")
        if engine.world_size == 1:
            if not isinstance(object_list, list):
                raise TypeError(
                    f"broadcast_object_list needs a list, got {type(object_list).__name__}"
                )
            check.rank_in_range(src, 1, "src")
            return
        _objects.broadcast_object_list(
            engine, object_list, src, serializer or self.serializer, self.slot_size
        )

    @_collective("broadcast_object", payload="obj", peer="src")
    def broadcast_object(
        self, obj: Any = None, src: int = 0, *, serializer: Serializer | None = None
    ) -> Any:
        """Return ``src``'s ``obj`` on every rank.

        Examples:
            >>> comm.broadcast_object({"lr": 0.1} if comm.rank == 0 else None)
            {'lr': 0.1}
        """
        box = [obj]
        self.broadcast_object_list(box, src, serializer=serializer)
        return box[0]
