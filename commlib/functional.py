"""Module-level API with mmengine.dist's names, signatures and return conventions.

Every function runs on the communicator for ``group``: ``None`` for the world
(a world of one when torch.distributed is not initialised), a
``torch.distributed.ProcessGroup``, or a :class:`~commlib.Communicator`. Code
written for ``mmengine.dist`` runs after ``import commlib as dist``.

Ranks follow torch.distributed (see :mod:`commlib.ranks`): with a torch
ProcessGroup, ``src``/``dst`` are world ranks and ``group_src``/``group_dst``
ranks within the group; with a Communicator (or the world) both are group ranks.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable, Generator, Iterable, Mapping, Sequence
from typing import Any, TypeVar

import torch
import torch.distributed as dist

import commlib.data_device as data_device
import commlib.ranks as rank_args
from commlib import _communicators, helpers, results
from commlib._launched import launcher_local, warn_if_launched_without_init
from commlib._torch_groups import dist_ready
from commlib._world import world
from commlib.communicator import Communicator, Handle, ResultHandle
from commlib.p2p import P2POp
from commlib.results import collect_results as collect_through
from commlib.types import Timeout

F = TypeVar("F", bound=Callable[..., Any])


def get_communicator(group: Any = None) -> Communicator:
    """The communicator for ``group`` (cached: one per process group).

    Examples:
        >>> comm = get_communicator()          # the world
        >>> comm.backend, comm.world_size      # 4 ranks under torchrun: ('gloo', 4)
        ('single', 1)
    """
    return _communicators.communicator_for(group)


def forget_communicators() -> None:
    """Drop the cached communicators (and with them their process groups).

    Call it before ``torch.distributed.destroy_process_group()`` so the groups
    are freed then, not during interpreter shutdown.

    Examples:
        >>> forget_communicators()
        >>> torch.distributed.destroy_process_group()   # after init  # doctest: +SKIP
    """
    world.forget_communicators()


def _collective_comm(group: Any) -> Communicator:
    """The communicator for a call that communicates; warns once under a launcher without init."""
    if group is None and not is_distributed():
        warn_if_launched_without_init()
    return get_communicator(group)


def set_default_communicator(comm: Communicator) -> None:
    """Use ``comm`` (e.g. one with a custom serializer) for ``group=None`` calls.

    Examples:
        >>> set_default_communicator(Communicator(serializer=commlib.RestrictedSerializer()))
    """
    _communicators.set_default(comm)


def new_group(
    ranks: Sequence[int],
    timeout: datetime.timedelta | float | None = None,
    *,
    use_local_synchronization: bool = False,
) -> Communicator:
    """A communicator for the world ranks ``ranks``; every rank must call it.

    With ``use_local_synchronization=True`` (torch's argument) only the
    members call it (see :meth:`Communicator.new_group`).

    The result can be passed as ``group=`` to every function here.

    Examples:
        >>> x = torch.ones(2)
        >>> pair = new_group([0, 1])           # every rank of a world of 2+  # doctest: +SKIP
        >>> if pair.is_member:                 # doctest: +SKIP
        ...     all_reduce(x, group=pair)
    """
    return get_communicator().new_group(
        ranks, timeout, use_local_synchronization=use_local_synchronization
    )


def shrink(
    exclude: Sequence[int] | None = None, timeout: datetime.timedelta | float | None = None
) -> Communicator:
    """Shrink the default communicator to the ranks still alive, and make the result the default.

    Every surviving rank calls it after a failure; ranks are renumbered in
    order (see :meth:`Communicator.shrink`). Later calls with ``group=None``
    run on the survivors.

    Examples:
        >>> try:  # doctest: +SKIP
        ...     all_reduce(loss)
        ... except (RankLostError, CommTimeoutError):
        ...     shrink(timeout=60)
        >>> get_world_size()  # doctest: +SKIP
        3
    """
    comm = get_communicator().shrink(exclude, timeout)
    set_default_communicator(comm)
    return comm


def grow(
    count: int | None = None,
    wait: datetime.timedelta | float = 0.0,
    timeout: datetime.timedelta | float | None = None,
) -> Communicator:
    """Grow the default communicator by the newcomers that asked to join; it becomes the default.

    Every member calls it; newcomers call :func:`commlib.join`. Members keep
    their ranks, newcomers follow (see :meth:`Communicator.grow`); when
    nobody asked within ``wait``, nothing changes.

    Examples:
        >>> comm = grow(count=1, wait=60)  # doctest: +SKIP
        >>> get_world_size()  # doctest: +SKIP
        4
    """
    comm = get_communicator().grow(count, wait, timeout)
    set_default_communicator(comm)
    return comm


def init_local_group(node_rank: int, num_gpus_per_node: int) -> None:
    """Make the group of this machine's ranks; every rank calls it, with its own ``node_rank``.

    Machine ``i`` holds world ranks ``i * num_gpus_per_node`` up to the next
    machine's first (the last machine may hold fewer). All machines' groups
    are made on every rank, as torch requires. Arguments that disagree across
    ranks (a ``node_rank`` that does not hold this rank, different
    ``num_gpus_per_node``) raise the same ``ValueError`` on every rank, before
    any group is made. Not distributed, it only checks its arguments.

    Examples:
        >>> # 2 machines x 4 ranks, under torchrun; on world rank 5:
        >>> node = int(os.environ["GROUP_RANK"])                  # doctest: +SKIP
        >>> init_local_group(node_rank=node, num_gpus_per_node=4)  # doctest: +SKIP
        >>> get_local_rank(), get_local_size()                    # doctest: +SKIP
        (1, 4)
    """
    _communicators.init_local_group(
        node_rank, num_gpus_per_node, get_communicator() if is_distributed() else None
    )


def get_local_group() -> Any:
    """The torch ProcessGroup of this machine's ranks (``None`` when not distributed).

    Made by :func:`init_local_group`; a ``RuntimeError`` says so when it was
    not called. Like any torch group, ``src``/``dst`` given with it are world ranks.

    Examples:
        >>> init_local_group(node_rank=0, num_gpus_per_node=2)
        >>> all_reduce(torch.ones(2), group=get_local_group())   # this machine's ranks
    """
    return _communicators.local_group() if is_distributed() else None


# -- who am I -------------------------------------------------------------------
def get_rank(group: Any = None) -> int:
    """Rank of this process in ``group`` (0 when not distributed, -1 when not a member).

    Examples:
        >>> get_rank()
        0
    """
    return get_communicator(group).rank


def get_world_size(group: Any = None) -> int:
    """Number of processes in ``group`` (1 when not distributed).

    Examples:
        >>> get_world_size()
        1
    """
    return get_communicator(group).world_size


def get_local_rank() -> int:
    """Rank of this process on its machine (0 when not distributed).

    The rank in :func:`init_local_group`'s group when it was made, otherwise
    the launcher's ``LOCAL_RANK``; without either, a ``RuntimeError``, as in mmengine.

    Examples:
        >>> get_local_rank()
        0
    """
    local = _communicators.local_communicator()
    return local.rank if local is not None else launcher_local("LOCAL_RANK", 0, is_distributed())


def get_local_size() -> int:
    """Number of processes on this machine (1 when not distributed).

    The size of :func:`init_local_group`'s group when it was made, otherwise
    the launcher's ``LOCAL_WORLD_SIZE``; without either, a ``RuntimeError``, as in mmengine.

    Examples:
        >>> get_local_size()
        1
    """
    local = _communicators.local_communicator()
    return (
        local.world_size
        if local is not None
        else launcher_local("LOCAL_WORLD_SIZE", 1, is_distributed())
    )


def get_dist_info(group: Any = None) -> tuple[int, int]:
    """``(rank, world_size)`` of ``group``.

    Examples:
        >>> get_dist_info()
        (0, 1)
    """
    comm = get_communicator(group)
    return comm.rank, comm.world_size


def get_backend(group: Any = None) -> str | None:
    """The torch.distributed backend of ``group``, or ``None`` when not distributed.

    Examples:
        >>> print(get_backend())   # not distributed
        None
        >>> get_backend()          # under torchrun with gloo  # doctest: +SKIP
        'gloo'
    """
    return get_communicator(group).plugin.torch_backend


def get_default_group() -> Any:
    """The default process group (``None`` when not distributed).

    Examples:
        >>> print(get_default_group())        # not distributed
        None
    """
    return dist.group.WORLD if dist_ready() else None


def get_comm_device(group: Any = None) -> torch.device:
    """The device ``group``'s collectives run on (its backend plugin decides).

    Examples:
        >>> get_comm_device()
        device(type='cpu')
    """
    return get_communicator(group).device


def get_data_device(data: torch.Tensor | Mapping | Iterable) -> torch.device:
    """The device of ``data``: a tensor or a (nested) sequence or dict of tensors.

    Every tensor must be on one device; an empty container or a non-tensor
    leaf is an error (``ValueError`` / ``TypeError``), as in mmengine.

    Examples:
        >>> get_data_device([torch.zeros(1), {"a": torch.ones(2)}])
        device(type='cpu')
    """
    return data_device.get_data_device(data)


def cast_data_device(
    data: torch.Tensor | Mapping | Iterable,
    device: torch.device | str,
    out: torch.Tensor | Mapping | Iterable | None = None,
) -> torch.Tensor | Mapping | Iterable:
    """``data`` with every tensor moved to ``device`` (containers keep their type).

    Tensors already there are returned as they are. With ``out`` (of
    ``data``'s type), the values are also copied into ``out``'s tensors.
    ``device`` may name any device type a registered backend serves, or
    ``"gpu"`` for the current accelerator; one that is not available here
    raises :class:`~commlib.errors.BackendUnavailableError` with the reason.

    Examples:
        >>> batch = {"x": torch.ones(2)}
        >>> cast_data_device(batch, torch.device("cpu"))
        {'x': tensor([1., 1.])}
        >>> cast_data_device(batch, "gpu")   # the current CUDA/NPU/MLU device  # doctest: +SKIP
    """
    current = get_communicator().plugin if device == data_device.ACCELERATOR_ALIAS else None
    return data_device.move_to(data, data_device.resolve_device(device, current), out)


def is_distributed() -> bool:
    """Whether torch.distributed is initialised.

    Examples:
        >>> is_distributed()
        False
    """
    return dist_ready()


def is_main_process(group: Any = None) -> bool:
    """Whether this process is rank 0 of ``group``.

    Examples:
        >>> is_main_process()
        True
    """
    return get_rank(group) == 0


# the main process is the world's rank 0: master_only is rank_zero_only (as mmengine's)
master_only = helpers.rank_zero_only
rank_zero_only = helpers.rank_zero_only
obj2tensor = helpers.obj2tensor
tensor2obj = helpers.tensor2obj


def barrier(
    group: Any = None, timeout: datetime.timedelta | float | None = None, async_op: bool = False
) -> Handle | None:
    """Block until every process of ``group`` has arrived (at most ``timeout`` seconds).

    With ``async_op=True``, a :class:`~commlib.Handle` whose ``wait()`` returns
    once every process has arrived.

    Examples:
        >>> barrier()
        >>> barrier(timeout=60)     # CommTimeoutError naming the missing ranks after 60 s
        >>> barrier(async_op=True).wait()
        True
    """
    return _collective_comm(group).barrier(timeout=timeout, async_op=async_op)


# -- tensor collectives ----------------------------------------------------------
def all_reduce(data: Any, op: str = "sum", group: Any = None, async_op: bool = False) -> Any:
    """Reduce ``data`` in place across ``group``.

    A tensor is reduced in place (``None`` returned, or a handle with
    ``async_op``), as torch and mmengine do. A Python number comes back
    reduced, as ignite's ``idist.all_reduce``; a nested structure (dicts,
    lists, tuples, namedtuples) of tensors and numbers is reduced leaf by
    leaf, tensors in place, and returned (see :meth:`Communicator.all_reduce`).

    Examples:
        >>> data = torch.arange(2) + 1 + 2 * get_rank()
        >>> all_reduce(data)
        >>> data                    # 2 ranks: tensor([4, 6]) everywhere
        tensor([1, 2])
        >>> all_reduce(0.5 * (get_rank() + 1))             # 2 ranks: 1.5
        0.5
        >>> all_reduce({"loss": torch.tensor(2.0), "n": 4}, op="mean")
        {'loss': tensor(2.), 'n': 4.0}
    """
    return _collective_comm(group).all_reduce(data, op, async_op=async_op)


def all_gather(data: Any, group: Any = None) -> list[Any]:
    """Every rank's ``data``, as a list (shapes may differ across ranks).

    ``data`` may also be a Python value (a number, a string: ignite's
    ``idist.all_gather``) or a nested structure of tensors and values.

    Examples:
        >>> all_gather(torch.tensor([get_rank()]))   # 2 ranks: [tensor([0]), tensor([1])]
        [tensor([0])]
        >>> all_gather("a")                           # 2 ranks: ['a', 'a']
        ['a']
    """
    return _collective_comm(group).all_gather(data)


def all_gather_cat(data: Any, dim: int = 0, group: Any = None) -> Any:
    """Every rank's ``data`` (a tensor or a nested structure) concatenated along ``dim``.

    Lengths along ``dim`` may differ across ranks and come back exactly (see
    :meth:`Communicator.all_gather_cat`).

    Examples:
        >>> all_gather_cat({"pred": torch.arange(2)})   # 2 ranks: {'pred': tensor([0, 1, 0, 1])}
        {'pred': tensor([0, 1])}
    """
    return _collective_comm(group).all_gather_cat(data, dim)


def all_gather_into_tensor(
    output: torch.Tensor, data: torch.Tensor, group: Any = None, async_op: bool = False
) -> Handle | None:
    """Concatenate every rank's ``data`` along dim 0 into ``output``.

    Examples:
        >>> out = torch.empty(2 * get_world_size())
        >>> all_gather_into_tensor(out, torch.ones(2))
        >>> out
        tensor([1., 1.])
    """
    return _collective_comm(group).all_gather_into_tensor(output, data, async_op=async_op)


def gather(
    data: torch.Tensor, dst: int | None = None, group: Any = None, *, group_dst: int | None = None
) -> list[torch.Tensor]:
    """Every rank's ``data`` on ``dst`` (a list); other ranks get ``[]``.

    ``dst`` is a world rank when ``group`` is a torch ProcessGroup (as torch),
    ``group_dst`` a rank within it; by default the group's first rank.

    Examples:
        >>> gather(torch.tensor([get_rank()]))   # 2 ranks: [tensor([0]), tensor([1])] on rank 0
        [tensor([0])]
        >>> pg = dist.new_group([1, 2])          # a world of 3 or more  # doctest: +SKIP
        >>> gather(torch.ones(1), dst=2, group=pg)   # lands on world rank 2  # doctest: +SKIP
    """
    comm = _collective_comm(group)
    root = rank_args.root(comm, "gather", "dst", dst, group_dst, group)
    with rank_args.world_ranks_in_errors(comm):
        return comm.gather(data, root)


def gather_into_tensor(
    tensor: torch.Tensor,
    gather_tensor: torch.Tensor | None = None,
    dst: int | None = None,
    group: Any = None,
    *,
    group_dst: int | None = None,
) -> None:
    """Every rank's ``tensor`` into ``gather_tensor`` on ``dst``, rank after rank (torch 2.14's).

    ``dst`` is a world rank when ``group`` is a torch ProcessGroup (as torch),
    ``group_dst`` a rank within it; by default the group's first rank.

    Examples:
        >>> out = torch.zeros(get_world_size())
        >>> gather_into_tensor(torch.tensor([1.0]), out)   # 2 ranks: tensor([1., 1.]) on rank 0
        >>> out
        tensor([1.])
    """
    comm = _collective_comm(group)
    root = rank_args.root(comm, "gather_into_tensor", "dst", dst, group_dst, group)
    with rank_args.world_ranks_in_errors(comm):
        comm.gather_into_tensor(tensor, gather_tensor, root)


def broadcast(
    data: Any,
    src: int | None = None,
    group: Any = None,
    async_op: bool = False,
    *,
    group_src: int | None = None,
) -> Any:
    """Copy ``src``'s ``data`` into ``data`` on every rank.

    A Python value (a number, a string, any picklable object) or a nested
    structure is returned as ``src`` holds it (ignite's ``idist.broadcast``);
    tensors inside are written in place.

    ``src`` is a world rank when ``group`` is a torch ProcessGroup (as torch),
    ``group_src`` a rank within it; by default the group's first rank.

    Examples:
        >>> data = torch.tensor([get_rank()])
        >>> broadcast(data)
        >>> data                     # tensor([0]) everywhere
        tensor([0])
        >>> pg = dist.new_group([1, 2])          # a world of 3 or more  # doctest: +SKIP
        >>> broadcast(data, src=2, group=pg)     # world rank 2's data  # doctest: +SKIP
    """
    comm = _collective_comm(group)
    root = rank_args.root(comm, "broadcast", "src", src, group_src, group)
    with rank_args.world_ranks_in_errors(comm):
        return comm.broadcast(data, root, async_op=async_op)


def reduce_scatter(
    output: torch.Tensor, data: Any, op: str = "sum", group: Any = None, async_op: bool = False
) -> Handle | None:
    """Reduce ``data`` across ranks; this rank keeps its chunk in ``output``.

    Examples:
        >>> out = torch.empty(1)
        >>> reduce_scatter(out, torch.ones(get_world_size()))
        >>> out                      # 2 ranks: tensor([2.]) on each
        tensor([1.])
    """
    return _collective_comm(group).reduce_scatter(output, data, op, async_op=async_op)


def reduce(
    tensor: torch.Tensor,
    dst: int | None = None,
    op: str = "sum",
    group: Any = None,
    async_op: bool = False,
    *,
    group_dst: int | None = None,
    timeout: Timeout = None,
) -> Handle | None:
    """Reduce ``tensor`` across ``group`` into ``tensor`` on ``dst`` (torch's signature).

    ``op`` is any op :func:`all_reduce` takes, ``mean`` included; the other
    ranks' ``tensor`` is left as it was. ``dst`` is a world rank when
    ``group`` is a torch ProcessGroup, ``group_dst`` a rank within it; by
    default the group's first rank.

    Examples:
        >>> x = torch.tensor([1.0, 2.0])
        >>> reduce(x, dst=0, op="max")
        >>> x
        tensor([1., 2.])
    """
    comm = _collective_comm(group)
    root = rank_args.root(comm, "reduce", "dst", dst, group_dst, group)
    with rank_args.world_ranks_in_errors(comm):
        return comm.reduce(tensor, root, op, async_op=async_op, timeout=timeout)


def scatter(
    tensor: torch.Tensor,
    scatter_list: Sequence[torch.Tensor] | None = None,
    src: int | None = None,
    group: Any = None,
    async_op: bool = False,
    *,
    group_src: int | None = None,
    timeout: Timeout = None,
) -> Handle | None:
    """Fill ``tensor`` on each rank ``i`` with ``scatter_list[i]`` of ``src`` (torch's signature).

    ``src`` is a world rank when ``group`` is a torch ProcessGroup,
    ``group_src`` a rank within it; by default the group's first rank.

    Examples:
        >>> out = torch.empty(2)
        >>> scatter(out, [torch.ones(2)], src=0)
        >>> out
        tensor([1., 1.])
    """
    comm = _collective_comm(group)
    root = rank_args.root(comm, "scatter", "src", src, group_src, group)
    with rank_args.world_ranks_in_errors(comm):
        return comm.scatter(tensor, scatter_list, root, async_op=async_op, timeout=timeout)


def all_to_all(
    output_tensor_list: Sequence[torch.Tensor],
    input_tensor_list: Sequence[torch.Tensor],
    group: Any = None,
    async_op: bool = False,
    *,
    timeout: Timeout = None,
) -> Handle | None:
    """Send ``input_tensor_list[i]`` to rank ``i``, receive into ``output_tensor_list[i]``.

    Examples:
        >>> outs = [torch.empty(2)]
        >>> all_to_all(outs, [torch.ones(2)])
        >>> outs
        [tensor([1., 1.])]
    """
    return _collective_comm(group).all_to_all(
        output_tensor_list, input_tensor_list, async_op=async_op, timeout=timeout
    )


def all_to_all_single(
    output: torch.Tensor,
    input: torch.Tensor,
    output_split_sizes: Sequence[int] | None = None,
    input_split_sizes: Sequence[int] | None = None,
    group: Any = None,
    async_op: bool = False,
    *,
    timeout: Timeout = None,
) -> Handle | None:
    """Split ``input``'s rows among the ranks, gather theirs into ``output`` (uneven too).

    Examples:
        >>> out = torch.empty(3)
        >>> all_to_all_single(out, torch.arange(3.0), [3], [3])
        >>> out
        tensor([0., 1., 2.])
    """
    return _collective_comm(group).all_to_all_single(
        output,
        input,
        output_split_sizes,
        input_split_sizes,
        async_op=async_op,
        timeout=timeout,
    )


# -- point to point --------------------------------------------------------------
def send(
    tensor: torch.Tensor,
    dst: int | None = None,
    group: Any = None,
    tag: int = 0,
    *,
    group_dst: int | None = None,
    timeout: Timeout = None,
) -> None:
    """Send ``tensor`` to ``dst``, which receives it with :func:`recv` (torch's signature).

    ``dst`` is a world rank when ``group`` is a torch ProcessGroup,
    ``group_dst`` a rank within it.

    Examples:
        >>> if get_rank() == 0 and get_world_size() > 1:
        ...     send(torch.arange(3.0), dst=1)
    """
    comm = _collective_comm(group)
    peer = rank_args.peer(comm, "send", "dst", dst, group_dst, group)
    comm.send(tensor, peer, tag=tag, timeout=timeout)


def recv(
    tensor: torch.Tensor,
    src: int | None = None,
    group: Any = None,
    tag: int = 0,
    *,
    group_src: int | None = None,
    timeout: Timeout = None,
) -> int:
    """Receive into ``tensor`` what ``src`` sends with :func:`send`; returns the sender's rank.

    The rank is numbered as ``src`` is: a world rank with a torch
    ProcessGroup. Receiving from any rank (``src=None`` in torch) is not
    offered: not every engine can.

    Examples:
        >>> x = torch.empty(3)
        >>> if get_rank() == 1:
        ...     sender = recv(x, src=0)      # 0
    """
    comm = _collective_comm(group)
    peer = rank_args.peer(comm, "recv", "src", src, group_src, group)
    comm.recv(tensor, peer, tag=tag, timeout=timeout)
    return comm.ranks[peer] if rank_args.is_torch_group(group) else peer


def isend(
    tensor: torch.Tensor,
    dst: int | None = None,
    group: Any = None,
    tag: int = 0,
    *,
    group_dst: int | None = None,
    timeout: Timeout = None,
) -> Handle:
    """:func:`send` that returns at once; the handle's ``wait()`` completes it.

    Examples:
        >>> if get_rank() == 0 and get_world_size() > 1:
        ...     isend(torch.ones(2), dst=1).wait()
    """
    comm = _collective_comm(group)
    peer = rank_args.peer(comm, "isend", "dst", dst, group_dst, group)
    return comm.isend(tensor, peer, tag=tag, timeout=timeout)


def irecv(
    tensor: torch.Tensor,
    src: int | None = None,
    group: Any = None,
    tag: int = 0,
    *,
    group_src: int | None = None,
    timeout: Timeout = None,
) -> Handle:
    """:func:`recv` that returns at once; read ``tensor`` after the handle's ``wait()``.

    Examples:
        >>> x = torch.empty(2)
        >>> if get_rank() == 1:
        ...     irecv(x, src=0).wait()
    """
    comm = _collective_comm(group)
    peer = rank_args.peer(comm, "irecv", "src", src, group_src, group)
    return comm.irecv(tensor, peer, tag=tag, timeout=timeout)


def batch_isend_irecv(p2p_op_list: Sequence[P2POp], *, timeout: Timeout = None) -> list[Handle]:
    """Post every send and receive of ``p2p_op_list`` at once (torch's ``batch_isend_irecv``).

    Every op names the same ``group`` (a torch ProcessGroup: ``peer`` is a
    world rank, ``group_peer`` a rank within it). Engines that deadlock on
    unbatched two-way exchange (NCCL) get the batch as one group. Wait on
    every returned handle before reading what was received.

    Examples:
        >>> n, r = get_world_size(), get_rank()
        >>> got = torch.empty(2)
        >>> if n > 1:
        ...     ops = [P2POp(isend, torch.ones(2), (r + 1) % n), P2POp(irecv, got, (r - 1) % n)]
        ...     for h in batch_isend_irecv(ops):
        ...         h.wait()
    """
    group = rank_args.batch_group(p2p_op_list)
    comm = _collective_comm(group)
    ops = rank_args.batch_in_group(comm, p2p_op_list, group)
    return comm.batch_isend_irecv(ops, timeout=timeout)


# -- object collectives ----------------------------------------------------------
# Each also takes timeout= (per round) and async_op=: a ResultHandle whose
# wait() gives what the blocking call returns; and weights_only= as torch 2.14's:
# True loads only tensors and allowed types (docs/serialization.md), on every torch.
def all_gather_object(
    data: Any,
    group: Any = None,
    *,
    timeout: Timeout = None,
    async_op: bool = False,
    weights_only: bool = False,
) -> Any:
    """Every rank's picklable ``data``, as a list indexed by rank.

    Examples:
        >>> all_gather_object({"rank": get_rank()})   # 2 ranks: [{'rank': 0}, {'rank': 1}]
        [{'rank': 0}]
        >>> all_gather_object("x", async_op=True).wait()
        ['x']
    """
    comm = _collective_comm(group)
    with rank_args.world_ranks_in_errors(comm):
        return comm.all_gather_object(
            data, timeout=timeout, async_op=async_op, weights_only=weights_only
        )


def gather_object(
    data: Any,
    dst: int | None = None,
    group: Any = None,
    *,
    group_dst: int | None = None,
    timeout: Timeout = None,
    async_op: bool = False,
    weights_only: bool = False,
) -> Any:
    """Every rank's ``data`` on ``dst`` (a list); other ranks get ``None``.

    ``dst`` is a world rank when ``group`` is a torch ProcessGroup (as torch),
    ``group_dst`` a rank within it; by default the group's first rank.

    Examples:
        >>> gather_object(get_rank())     # 2 ranks: [0, 1] on rank 0, None on rank 1
        [0]
    """
    comm = _collective_comm(group)
    root = rank_args.root(comm, "gather_object", "dst", dst, group_dst, group)
    with rank_args.world_ranks_in_errors(comm):
        return comm.gather_object(
            data, root, timeout=timeout, async_op=async_op, weights_only=weights_only
        )


def broadcast_object_list(
    data: list[Any],
    src: int | None = None,
    group: Any = None,
    *,
    group_src: int | None = None,
    timeout: Timeout = None,
    async_op: bool = False,
    weights_only: bool = False,
) -> ResultHandle[None] | None:
    """Fill ``data`` on every rank with ``src``'s objects, in place.

    ``src`` is a world rank when ``group`` is a torch ProcessGroup (as torch),
    ``group_src`` a rank within it; by default the group's first rank.

    Examples:
        >>> data = ["foo", 12, {1: 2}] if get_rank() == 0 else [None] * 3
        >>> broadcast_object_list(data)
        >>> data
        ['foo', 12, {1: 2}]
    """
    comm = _collective_comm(group)
    root = rank_args.root(comm, "broadcast_object_list", "src", src, group_src, group)
    with rank_args.world_ranks_in_errors(comm):
        return comm.broadcast_object_list(
            data, root, timeout=timeout, async_op=async_op, weights_only=weights_only
        )


def broadcast_object(
    data: Any = None,
    src: int | None = None,
    group: Any = None,
    *,
    group_src: int | None = None,
    timeout: Timeout = None,
    async_op: bool = False,
    weights_only: bool = False,
) -> Any:
    """Return ``src``'s ``data`` on every rank.

    ``src`` is a world rank when ``group`` is a torch ProcessGroup (as torch),
    ``group_src`` a rank within it; by default the group's first rank.

    Examples:
        >>> cfg = {"lr": 0.1} if get_rank() == 0 else None
        >>> broadcast_object(cfg)          # rank 0's object, on every rank
        {'lr': 0.1}
    """
    comm = _collective_comm(group)
    root = rank_args.root(comm, "broadcast_object", "src", src, group_src, group)
    with rank_args.world_ranks_in_errors(comm):
        return comm.broadcast_object(
            data, root, timeout=timeout, async_op=async_op, weights_only=weights_only
        )


def scatter_object_list(
    scatter_object_output_list: list[Any],
    scatter_object_input_list: Sequence[Any] | None = None,
    src: int | None = None,
    group: Any = None,
    *,
    group_src: int | None = None,
    timeout: Timeout = None,
    async_op: bool = False,
    weights_only: bool = False,
) -> ResultHandle[None] | None:
    """On each rank ``i``, ``scatter_object_output_list[0]`` gets ``src``'s input ``i``.

    torch's signature: ``src`` passes ``scatter_object_input_list``, one
    picklable object per rank. ``src`` is a world rank when ``group`` is a torch
    ProcessGroup, ``group_src`` a rank within it; by default the group's first
    rank.

    Examples:
        >>> box = [None]
        >>> scatter_object_list(box, [{"shard": 0}], src=0)
        >>> box
        [{'shard': 0}]
    """
    comm = _collective_comm(group)
    root = rank_args.root(comm, "scatter_object_list", "src", src, group_src, group)
    with rank_args.world_ranks_in_errors(comm):
        return comm.scatter_object_list(
            scatter_object_output_list,
            scatter_object_input_list,
            root,
            timeout=timeout,
            async_op=async_op,
            weights_only=weights_only,
        )


def send_object_list(
    object_list: list[Any],
    dst: int | None = None,
    group: Any = None,
    *,
    group_dst: int | None = None,
    timeout: Timeout = None,
    async_op: bool = False,
    weights_only: bool = False,
) -> ResultHandle[None] | None:
    """Send the picklable objects of ``object_list`` to ``dst`` (see :func:`recv_object_list`).

    torch's signature. If the list cannot be serialized, this rank raises
    and ``dst`` raises the same error at once.

    Examples:
        >>> if get_rank() == 0 and get_world_size() > 1:
        ...     send_object_list([{"step": 3}], dst=1)
    """
    comm = _collective_comm(group)
    peer = rank_args.peer(comm, "send_object_list", "dst", dst, group_dst, group)
    return comm.send_object_list(
        object_list, peer, timeout=timeout, async_op=async_op, weights_only=weights_only
    )


def recv_object_list(
    object_list: list[Any],
    src: int | None = None,
    group: Any = None,
    *,
    group_src: int | None = None,
    timeout: Timeout = None,
    async_op: bool = False,
    weights_only: bool = False,
) -> Any:
    """Fill ``object_list`` with what ``src`` sends with :func:`send_object_list`.

    Returns the sender's rank, numbered as ``src`` is (a world rank with a
    torch ProcessGroup), or with ``async_op=True`` a handle whose ``wait()``
    returns it.

    Examples:
        >>> box = [None]
        >>> if get_rank() == 1:
        ...     sender = recv_object_list(box, src=0)   # 0; box: [{'step': 3}]
    """
    comm = _collective_comm(group)
    peer = rank_args.peer(comm, "recv_object_list", "src", src, group_src, group)
    sender = comm.ranks[peer] if rank_args.is_torch_group(group) else peer
    if async_op:
        handle = comm.recv_object_list(
            object_list, peer, timeout=timeout, async_op=True, weights_only=weights_only
        )
        return handle if sender == peer else rank_args.SenderHandle(handle, sender)
    comm.recv_object_list(object_list, peer, timeout=timeout, weights_only=weights_only)
    return sender


# -- helpers ---------------------------------------------------------------------
def all_reduce_dict(data: dict[str, torch.Tensor], op: str = "sum", group: Any = None) -> None:
    """Reduce every tensor of ``data`` across ranks (values are replaced).

    Examples:
        >>> d = {"loss": torch.tensor(1.0)}
        >>> all_reduce_dict(d, op="mean")
        >>> d
        {'loss': tensor(1.)}
    """
    helpers.all_reduce_dict(_collective_comm(group), data, op)


def all_reduce_params(
    params: list | Generator[torch.Tensor, None, None] | Iterable,
    coalesce: bool = True,
    bucket_size_mb: float = -1,
    op: str = "sum",
    group: Any = None,
) -> None:
    """Reduce parameters in place, coalesced into per-dtype buckets.

    Examples:
        >>> model = torch.nn.Linear(2, 1)
        >>> all_reduce_params(model.parameters(), op="mean")
    """
    helpers.all_reduce_params(_collective_comm(group), params, coalesce, bucket_size_mb, op)


def sync_random_seed(group: Any = None) -> int:
    """Rank 0's ``np.random.randint(2**31)`` on every rank.

    Examples:
        >>> seed = sync_random_seed()
    """
    return helpers.sync_random_seed(_collective_comm(group))


def reduce_mean(tensor: torch.Tensor, group: Any = None) -> torch.Tensor:
    """The mean of ``tensor`` over ranks, as a new tensor.

    Examples:
        >>> reduce_mean(torch.tensor([1.0]))
        tensor([1.])
    """
    return helpers.reduce_mean(_collective_comm(group), tensor)


def pad_to_largest_tensor(
    tensor: torch.Tensor, group: Any = None
) -> tuple[list[int], torch.Tensor]:
    """Every rank's dim-0 size and ``tensor`` zero-padded to the largest.

    Examples:
        >>> sizes, padded = pad_to_largest_tensor(torch.ones(get_rank() + 1))
        >>> sizes, padded.shape        # 2 ranks, on rank 0: ([1, 2], torch.Size([2]))
        ([1], torch.Size([1]))
    """
    return helpers.pad_to_largest_tensor(_collective_comm(group), tensor)


def collect_results(
    results: list,
    size: int,
    device: str = "cpu",
    tmpdir: str | None = None,
    group: Any = None,
) -> list | None:
    """Collect per-rank results on rank 0 in dataset order (others get ``None``).

    ``device="cpu"`` goes through files in ``tmpdir`` (a unique directory by
    default; a given one is removed when collecting leaves it empty).
    ``device="gpu"`` (the group's own device) or an accelerator type a
    registered backend serves (``"cuda"``, ``"npu"``, ``"mlu"``) goes through
    the backend's object collective. As in mmengine, where the device only
    chooses that path over files, an accelerator that is not available here
    (``device="npu"`` without ``torch_npu``) still collects through the
    group's own backend, with a ``RuntimeWarning`` naming what is missing.

    Examples:
        >>> part = [get_rank() * 10]         # this rank's results
        >>> collect_results(part, size=1, device="cpu")   # 2 ranks, size=2: [0, 10] on rank 0
        [0]
        >>> collect_results(part, size=1, device="npu")   # HCCL users  # doctest: +SKIP
    """
    return collect_through(_collective_comm(group), results, size, device, tmpdir)


def collect_results_cpu(
    result_part: list, size: int, tmpdir: str | None = None, group: Any = None
) -> list | None:
    """Collect results on rank 0 through files in a shared directory.

    Examples:
        >>> collect_results_cpu([0, 2, 4], size=2)   # one rank: its part, cut to size
        [0, 2]
    """
    return results.collect_results_cpu(_collective_comm(group), result_part, size, tmpdir)


def collect_results_gpu(result_part: list, size: int, group: Any = None) -> list | None:
    """Collect results on rank 0 through the backend's object collective.

    Examples:
        >>> collect_results_gpu([0, 2, 4], size=2)   # one rank: its part, cut to size
        [0, 2]
    """
    return results.collect_results_gpu(_collective_comm(group), result_part, size)
