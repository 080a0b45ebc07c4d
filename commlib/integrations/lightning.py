"""Lightning Fabric: a ``Collective`` over a commlib Communicator.

Fabric chooses its communication through the ``Collective`` interface
(``lightning_fabric.plugins.collectives``). :class:`CommlibCollective` is one
on commlib, a drop-in for Fabric's ``TorchCollective``: the same methods,
arguments and return values, the same group life cycle (``setup``,
``create_group``, ``teardown``), and ranks as ``TorchCollective`` reads them
(``src``/``dst`` are world ranks, ``rank``/``world_size`` are the group's).
Underneath, every commlib backend serves it, with commlib's checks (a bad
argument raises before anything is sent), every dtype and its timeouts.

Its group is a :class:`~commlib.Communicator` (the world until
``create_group`` makes one). The class is a registered (virtual) subclass of
Fabric's ``Collective``: ``lightning_fabric`` is imported when the first one
is made, not when this module is.

Examples:
    >>> from lightning_fabric import Fabric                        # doctest: +SKIP
    >>> fabric = Fabric(accelerator="cpu", devices=2, strategy="ddp_spawn")  # doctest: +SKIP
    >>> def main(fabric):
    ...     collective = CommlibCollective()       # the world Fabric started
    ...     pair = CommlibCollective().create_group(ranks=[0, 1])
    ...     x = collective.all_reduce(torch.ones(2) * fabric.global_rank, op="max")
    ...     pair.teardown()
    >>> fabric.launch(main)                                        # doctest: +SKIP
"""

from __future__ import annotations

import atexit
import datetime
import functools
import os
from typing import Any, get_args

import torch
import torch.distributed as dist

from commlib import _torch_facts as torch_facts
from commlib import ranks as rank_args
from commlib.communicator import Communicator
from commlib.functional import (
    forget_communicators,
    get_communicator,
    is_distributed,
    set_default_communicator,
)
from commlib.integrations._clients import require
from commlib.plugins import backend_for_group, resolve_backend
from commlib.types import ReduceOp

# what TorchCollective passes on to torch.distributed.new_group that commlib takes
_NEW_GROUP_ARGS = {"ranks", "timeout", "backend"}


@functools.lru_cache(maxsize=1)
def _register_with_fabric() -> None:
    """Make :class:`CommlibCollective` a ``Collective`` for ``isinstance`` / ``issubclass``."""
    module = require(
        "lightning_fabric.plugins.collectives",
        "lightning-fabric",
        "commlib.integrations.lightning",
    )
    module.Collective.register(CommlibCollective)


class CommlibCollective:
    """Lightning Fabric's ``Collective`` on a commlib :class:`~commlib.Communicator`.

    Args:
        group: the communicator this collective owns; by default none, and
            :attr:`group` is the world until :meth:`create_group` makes one.

    ``src``/``dst`` are world ranks, as with Fabric's ``TorchCollective``; a
    rank outside the group raises ``ValueError`` before anything is sent. Ops
    are commlib's names or Fabric's (``"avg"``, ``torch.distributed.ReduceOp``
    members), case-insensitive. A process outside the group passes
    :meth:`barrier` at once (as ``TorchCollective`` does) and gets
    :class:`~commlib.errors.NotInGroupError` from every other collective.

    Examples:
        >>> c = CommlibCollective()          # needs lightning-fabric  # doctest: +SKIP
        >>> c.all_gather([torch.zeros(1) for _ in range(c.world_size)],
        ...              torch.ones(1) * c.rank)                    # doctest: +SKIP
        [tensor([0.]), tensor([1.])]
    """

    #: whether a ``setup()`` of this class started the default process group
    #: (then the last ``teardown()`` of a member destroys it, as Fabric's does)
    manages_default_group = False
    addr_key = "MASTER_ADDR"
    port_key = "MASTER_PORT"

    def __init__(self, group: Communicator | None = None) -> None:
        _register_with_fabric()
        if group is not None and not isinstance(group, Communicator):
            raise TypeError(
                f"CommlibCollective owns a commlib Communicator, got {type(group).__name__}"
            )
        self._group: Communicator | None = group

    # -- the group ---------------------------------------------------------------------
    @property
    def group(self) -> Communicator:
        """The communicator this collective runs on; the world when it owns none yet."""
        if self._group is None:
            self._group = get_communicator()
        return self._group

    @property
    def rank(self) -> int:
        """This process's rank in the group (-1 outside it)."""
        return self.group.rank

    @property
    def world_size(self) -> int:
        """The number of ranks in the group (-1 outside it)."""
        return self.group.world_size

    def _group_rank(self, call: str, name: str, rank: int) -> int:
        # Fabric's TorchCollective hands src/dst to torch.distributed: world ranks
        # the other ranks may be in call's first round already: the refusal joins it
        with self.group.refusing(call):
            return rank_args.group_rank(self.group, call, name, rank, None, world_ranks=True)

    # -- tensor collectives -----------------------------------------------------------
    def broadcast(self, tensor: torch.Tensor, src: int) -> torch.Tensor:
        """Copy world rank ``src``'s ``tensor`` into ``tensor`` on every rank; returns it.

        Examples:
            >>> c.broadcast(torch.tensor([c.rank]), src=0)     # doctest: +SKIP
            tensor([0])
        """
        self.group.broadcast(tensor, self._group_rank("broadcast", "src", src))
        return tensor

    def all_reduce(self, tensor: torch.Tensor, op: Any = "sum") -> torch.Tensor:
        """Reduce ``tensor`` in place across the group; returns it.

        Examples:
            >>> c.all_reduce(torch.tensor([c.rank + 1]), op="max")   # 2 ranks  # doctest: +SKIP
            tensor([2])
        """
        self.group.all_reduce(tensor, self._convert_to_native_op(op))
        return tensor

    def reduce(self, tensor: torch.Tensor, dst: int, op: Any = "sum") -> torch.Tensor:
        """Reduce into ``tensor`` on world rank ``dst``; the others' stay as they were.

        Examples:
            >>> c.reduce(torch.tensor([c.rank + 1]), dst=0)   # rank 0 of 2  # doctest: +SKIP
            tensor([3])
        """
        group_dst = self._group_rank("reduce", "dst", dst)
        self.group.reduce(tensor, group_dst, self._convert_to_native_op(op))
        return tensor

    def all_gather(
        self, tensor_list: list[torch.Tensor], tensor: torch.Tensor
    ) -> list[torch.Tensor]:
        """Fill ``tensor_list[i]`` with rank ``i``'s ``tensor``; returns ``tensor_list``.

        Examples:
            >>> outs = [torch.zeros(1), torch.zeros(1)]              # 2 ranks
            >>> c.all_gather(outs, torch.ones(1) * c.rank)          # doctest: +SKIP
            [tensor([0.]), tensor([1.])]
        """
        with self.group.refusing("all_gather"):
            _check_outputs(tensor_list, self.world_size, "all_gather", "tensor_list", tensor)
            mine = f"tensor_list[{self.rank}]"
            _check_output(tensor_list[self.rank], tensor, "all_gather", mine)
        _fill(tensor_list, self.group.all_gather(tensor), "all_gather", "tensor_list")
        return tensor_list

    def gather(
        self, tensor: torch.Tensor, gather_list: list[torch.Tensor] | None, dst: int = 0
    ) -> list[torch.Tensor] | None:
        """Fill ``gather_list`` on world rank ``dst`` with every rank's ``tensor``; returns it.

        Other ranks' ``gather_list`` is left as it is (``None`` is usual there).

        Examples:
            >>> outs = [torch.zeros(1), torch.zeros(1)] if c.rank == 0 else None  # doctest: +SKIP
            >>> c.gather(torch.ones(1) * c.rank, outs, dst=0)       # doctest: +SKIP
            [tensor([0.]), tensor([1.])]
        """
        group_dst = self._group_rank("gather", "dst", dst)
        if self.rank == group_dst:
            with self.group.refusing("gather"):
                _check_outputs(gather_list, self.world_size, "gather", "gather_list", tensor)
                for i, out in enumerate(gather_list or []):
                    _check_output(out, tensor, "gather", f"gather_list[{i}]")
        got = self.group.gather(tensor, group_dst)
        if got:
            _fill(gather_list or [], got, "gather", "gather_list")
        return gather_list

    def scatter(
        self, tensor: torch.Tensor, scatter_list: list[torch.Tensor] | None, src: int = 0
    ) -> torch.Tensor:
        """Fill ``tensor`` on rank ``i`` with world rank ``src``'s ``scatter_list[i]``; returns it.

        Examples:
            >>> c.scatter(torch.zeros(1), [torch.ones(1) * i for i in range(2)])  # doctest: +SKIP
            tensor([1.])
        """
        group_src = self._group_rank("scatter", "src", src)
        parts = scatter_list if self.rank == group_src else None
        self.group.scatter(tensor, parts, group_src)
        return tensor

    def reduce_scatter(
        self, output: torch.Tensor, input_list: list[torch.Tensor], op: Any = "sum"
    ) -> torch.Tensor:
        """Reduce ``input_list`` across ranks; ``output`` gets entry ``rank``; returns it.

        Examples:
            >>> chunks = [torch.ones(1), torch.ones(1) * 2]         # 2 ranks
            >>> c.reduce_scatter(torch.zeros(1), chunks)            # doctest: +SKIP
            tensor([2.])
        """
        self.group.reduce_scatter(output, input_list, self._convert_to_native_op(op))
        return output

    def all_to_all(
        self, output_tensor_list: list[torch.Tensor], input_tensor_list: list[torch.Tensor]
    ) -> list[torch.Tensor]:
        """Send ``input_tensor_list[i]`` to rank ``i``, receive into ``output_tensor_list``.

        Examples:
            >>> c.all_to_all([torch.zeros(1)] * 2, [torch.ones(1) * c.rank] * 2)  # doctest: +SKIP
            [tensor([0.]), tensor([1.])]
        """
        self.group.all_to_all(output_tensor_list, input_tensor_list)
        return output_tensor_list

    # -- point to point ---------------------------------------------------------------
    def send(self, tensor: torch.Tensor, dst: int, tag: int = 0) -> None:
        """Send ``tensor`` to world rank ``dst``.

        Examples:
            >>> c.send(torch.ones(2), dst=1)          # on rank 0  # doctest: +SKIP
        """
        self.group.send(tensor, self._group_rank("send", "dst", dst), tag=tag)

    def recv(self, tensor: torch.Tensor, src: int | None = None, tag: int = 0) -> torch.Tensor:
        """Receive into ``tensor`` what world rank ``src`` sends; returns it.

        commlib receives from a named rank only: ``src=None`` (any rank) raises
        ``ValueError``.

        Examples:
            >>> c.recv(torch.empty(2), src=0)         # on rank 1  # doctest: +SKIP
            tensor([1., 1.])
        """
        if src is None:
            raise ValueError(
                "recv: commlib receives from a named rank only; pass src= (a world rank)"
            )
        self.group.recv(tensor, self._group_rank("recv", "src", src), tag=tag)
        return tensor

    # -- object collectives -----------------------------------------------------------
    def all_gather_object(self, object_list: list[Any], obj: Any) -> list[Any]:
        """Fill ``object_list[i]`` with rank ``i``'s ``obj``; returns ``object_list``.

        Examples:
            >>> c.all_gather_object([None, None], {"rank": c.rank})  # doctest: +SKIP
            [{'rank': 0}, {'rank': 1}]
        """
        with self.group.refusing("all_gather_object"):
            _check_list_length(object_list, self.world_size, "all_gather_object", "object_list")
        object_list[:] = self.group.all_gather_object(obj)
        return object_list

    def broadcast_object_list(
        self, object_list: list[Any], src: int, device: torch.device | None = None
    ) -> list[Any]:
        """Fill ``object_list`` with world rank ``src``'s objects; returns it.

        ``device`` is accepted for Fabric's signature; commlib's backend picks
        the device the objects travel on.

        Examples:
            >>> box = ["a", 1] if c.rank == 0 else [None, None]  # doctest: +SKIP
            >>> c.broadcast_object_list(box, src=0)                 # doctest: +SKIP
            ['a', 1]
        """
        group_src = self._group_rank("broadcast_object_list", "src", src)
        self.group.broadcast_object_list(object_list, group_src)
        return object_list

    def gather_object(
        self, obj: Any, object_gather_list: list[Any] | None, dst: int = 0
    ) -> list[Any] | None:
        """Fill ``object_gather_list`` on world rank ``dst`` with every rank's ``obj``.

        Returns ``object_gather_list``; other ranks' is left as it is.

        Examples:
            >>> c.gather_object(c.rank, [None, None] if c.rank == 0 else None)  # doctest: +SKIP
            [0, 1]
        """
        group_dst = self._group_rank("gather_object", "dst", dst)
        if self.rank == group_dst:
            with self.group.refusing("gather_object"):
                _check_list_length(
                    object_gather_list, self.world_size, "gather_object", "object_gather_list"
                )
        got = self.group.gather_object(obj, group_dst)
        if got is not None and object_gather_list is not None:
            object_gather_list[:] = got
        return object_gather_list

    def scatter_object_list(
        self,
        scatter_object_output_list: list[Any],
        scatter_object_input_list: list[Any] | None,
        src: int = 0,
    ) -> list[Any]:
        """Put world rank ``src``'s ``scatter_object_input_list[i]`` into rank ``i``'s output list.

        Returns ``scatter_object_output_list`` (its first entry is filled).

        Examples:
            >>> c.scatter_object_list([None], ["a", "b"], src=0)     # doctest: +SKIP
            ['a']
        """
        group_src = self._group_rank("scatter_object_list", "src", src)
        inputs = scatter_object_input_list if self.rank == group_src else None
        self.group.scatter_object_list(scatter_object_output_list, inputs, group_src)
        return scatter_object_output_list

    # -- synchronisation ----------------------------------------------------------------
    def barrier(self, device_ids: list[int] | None = None) -> None:
        """Wait for every rank of the group; a process outside the group passes at once.

        ``device_ids`` is accepted for Fabric's signature; commlib's backend
        picks the device.

        Examples:
            >>> c.barrier()                                        # doctest: +SKIP
        """
        if not self.group.is_member:
            return
        self.group.barrier()

    def monitored_barrier(
        self, timeout: datetime.timedelta | None = None, wait_all_ranks: bool = False
    ) -> None:
        """A barrier that fails after ``timeout``, naming the ranks that did not arrive.

        A process outside the group passes at once, as in :meth:`barrier`.

        commlib's timeout errors always name every missing rank, so
        ``wait_all_ranks`` changes nothing.

        Examples:
            >>> c.monitored_barrier(datetime.timedelta(seconds=60))   # doctest: +SKIP
        """
        if not self.group.is_member:
            return
        self.group.barrier(timeout=timeout)

    # -- the group life cycle, as Fabric drives it ---------------------------------------
    def setup(
        self, main_address: str | None = None, main_port: int | str | None = None, **kwargs: Any
    ) -> CommlibCollective:
        """Start the default process group unless it runs; returns ``self``.

        ``main_address`` / ``main_port`` stand in for ``MASTER_ADDR`` /
        ``MASTER_PORT`` while the group starts (when those are unset);
        ``kwargs`` go to :meth:`init_group`. The class then manages the
        default group: the last :meth:`teardown` of a member destroys it.

        Examples:
            >>> c = CommlibCollective().setup(main_address="127.0.0.1", main_port=29500,
            ...                               world_size=2, rank=rank)   # doctest: +SKIP
        """
        if self.is_initialized():
            return self
        added = []
        for key, value in ((self.addr_key, main_address), (self.port_key, main_port)):
            if value is not None and key not in os.environ:
                os.environ[key] = str(value)
                added.append(key)
        try:
            self.init_group(**kwargs)
        finally:
            for key in added:
                os.environ.pop(key, None)
        CommlibCollective.manages_default_group = True
        return self

    def create_group(self, **kwargs: Any) -> CommlibCollective:
        """Make and own a new group (:meth:`new_group`'s arguments); returns ``self``.

        Every rank of the world calls it, members or not.

        Examples:
            >>> left = CommlibCollective().create_group(ranks=[0, 1])   # doctest: +SKIP
        """
        if self._group is not None:
            raise RuntimeError(f"`{type(self).__name__}` already owns a group.")
        self._group = self.new_group(**kwargs)
        return self

    def teardown(self) -> CommlibCollective:
        """Destroy the group this collective owns; returns ``self``.

        When a :meth:`setup` of this class started the default group and no
        other group is left, a member's teardown destroys the default group
        too, as Fabric's ``TorchCollective`` does.

        Examples:
            >>> left.teardown()                                         # doctest: +SKIP
        """
        if self._group is None:
            raise RuntimeError(f"`{type(self).__name__}` does not own a group to destroy.")
        member = self._group.is_member
        self.destroy_group(self._group)
        self._group = None
        if not CommlibCollective.manages_default_group:
            return self
        if not is_distributed():
            CommlibCollective.manages_default_group = False
        elif member and len(torch_facts.group_map()) == 1:
            self.destroy_group(get_communicator())
            CommlibCollective.manages_default_group = False
        return self

    @classmethod
    def is_available(cls) -> bool:
        """Whether torch.distributed is built in (commlib's single backend runs without it).

        Examples:
            >>> CommlibCollective.is_available()                        # doctest: +SKIP
            True
        """
        return dist.is_available()

    @classmethod
    def is_initialized(cls) -> bool:
        """Whether the default process group is up.

        Examples:
            >>> CommlibCollective.is_initialized()    # a plain process  # doctest: +SKIP
            False
        """
        return is_distributed()

    @classmethod
    def init_group(cls, **kwargs: Any) -> None:
        """Start the default process group: ``torch.distributed.init_process_group``'s arguments.

        ``backend`` is a commlib backend, a torch backend (``"cpu:...,..."``
        too) or a device type; by default this machine's. The backend's plugin
        starts the group and serves commlib's default communicator.

        Examples:
            >>> CommlibCollective.init_group(init_method="tcp://127.0.0.1:29500",
            ...                              world_size=2, rank=rank)   # doctest: +SKIP
        """
        backend = kwargs.pop("backend", None)
        plugin = backend_for_group() if backend is None else resolve_backend(backend)
        plugin.init_process_group(**kwargs)
        _destroy_at_exit()
        set_default_communicator(Communicator(backend=plugin))

    @classmethod
    def new_group(cls, **kwargs: Any) -> Communicator:
        """A communicator for world ``ranks`` (all by default); every world rank calls it.

        Takes ``ranks``, ``timeout`` and ``backend`` (a commlib backend name; by
        default the world's); other ``torch.distributed.new_group`` arguments
        raise ``TypeError``.

        Examples:
            >>> CommlibCollective.new_group(ranks=[1, 2]).ranks          # doctest: +SKIP
            [1, 2]
        """
        unknown = sorted(set(kwargs) - _NEW_GROUP_ARGS)
        if unknown:
            raise TypeError(f"new_group: commlib takes {sorted(_NEW_GROUP_ARGS)}, not {unknown}")
        world = get_communicator()
        backend = kwargs.get("backend")
        if backend is not None:
            world = Communicator(world.group, backend=backend, timeout=world.timeout)
        ranks = kwargs.get("ranks")
        members = range(world.world_size) if ranks is None else ranks
        return world.new_group(members, kwargs.get("timeout"))

    @classmethod
    def destroy_group(cls, group: Communicator) -> None:
        """Free ``group``'s process group; the world's destroys the default group.

        Every process may call it, members or not; a group already destroyed
        is left alone.

        Examples:
            >>> CommlibCollective.destroy_group(pair)                    # doctest: +SKIP
        """
        if not isinstance(group, Communicator):
            raise TypeError(f"destroy_group takes a commlib Communicator, got {type(group)}")
        pg = group.group
        if not is_distributed() or pg not in torch_facts.group_map():
            return
        if pg is dist.group.WORLD:
            # the cached communicators hold the world's groups: drop them first
            forget_communicators()
            dist.destroy_process_group()
        else:
            dist.destroy_process_group(pg)

    @classmethod
    def _convert_to_native_op(cls, op: Any) -> str:
        """commlib's name for a Fabric op: a name (any case, ``"avg"`` too) or a ``ReduceOp``.

        Examples:
            >>> CommlibCollective._convert_to_native_op("AVG")
            'mean'
            >>> CommlibCollective._convert_to_native_op(dist.ReduceOp.MAX)
            'max'
        """
        if isinstance(op, str):
            name = op.lower()
        elif isinstance(op, (dist.ReduceOp, dist.ReduceOp.RedOpType)):
            name = str(getattr(op, "name", op)).rsplit(".", 1)[-1].lower()
        else:
            raise ValueError(f"Unsupported op {op!r} of type {type(op).__name__}")
        name = "mean" if name == "avg" else name
        if name not in _OPS:
            raise ValueError(f"op {op!r} is not supported by commlib; use one of {_OPS}")
        return name


_OPS: tuple[str, ...] = get_args(ReduceOp)


def _check_list_length(items: Any, size: int, call: str, name: str) -> None:
    if not isinstance(items, list):
        raise TypeError(f"{call}: {name} must be a list, got {type(items).__name__}")
    if len(items) != size:
        raise ValueError(f"{call}: {name} has {len(items)} entries; the group has {size} ranks")


def _check_outputs(items: Any, size: int, call: str, name: str, like: torch.Tensor) -> None:
    """``items`` is a list of ``size`` tensors of ``like``'s dtype (as torch requires)."""
    _check_list_length(items, size, call, name)
    for i, out in enumerate(items):
        if not isinstance(out, torch.Tensor):
            got = type(out).__name__
            raise TypeError(f"{call}: {name}[{i}] must be a torch.Tensor, got {got}")
        if out.dtype != like.dtype:
            raise ValueError(
                f"{call}: {name}[{i}] is {out.dtype}; the tensor sent is {like.dtype} "
                "(outputs take the dtype of what is sent)"
            )


def _check_output(out: torch.Tensor, like: torch.Tensor, call: str, name: str) -> None:
    if out.shape != like.shape:
        raise ValueError(
            f"{call}: {name} has shape {tuple(out.shape)}; the tensor it receives has "
            f"shape {tuple(like.shape)}"
        )


def _fill(outputs: list[torch.Tensor], got: list[torch.Tensor], call: str, name: str) -> None:
    """Copy ``got`` into ``outputs``, all or nothing; outside autograd, as torch's outputs are.

    Ranks may gather tensors of different shapes in commlib; an output that
    does not fit the tensor its rank sent raises ``ValueError`` on the ranks
    whose outputs are wrong (the collective itself completed on every rank).
    """
    for i, (out, t) in enumerate(zip(outputs, got)):
        _check_output(out, t, call, f"{name}[{i}]")
    with torch.no_grad():
        for out, t in zip(outputs, got):
            out.copy_(t.detach())


@functools.lru_cache(maxsize=1)
def _destroy_at_exit() -> None:
    # a group still up when the interpreter exits can abort it from the engine's
    # threads: destroy it while Python still runs, unless teardown() did
    def destroy() -> None:
        if is_distributed():
            forget_communicators()
            dist.destroy_process_group()

    atexit.register(destroy)
