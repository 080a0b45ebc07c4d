"""Module-level API with mmengine.dist's names, signatures and return conventions.

Every function runs on the communicator for ``group``: ``None`` for the world
(a world of one when torch.distributed is not initialised), a
``torch.distributed.ProcessGroup``, or a :class:`~commlib.Communicator`. Code
written for ``mmengine.dist`` runs after ``import commlib as dist``.
"""

from __future__ import annotations

import atexit
import datetime
import functools
import threading
from collections.abc import Callable, Generator, Iterable, Sequence
from typing import Any, TypeVar

import torch
import torch.distributed as dist

from commlib import helpers, results
from commlib.communicator import Communicator, Handle, dist_ready

F = TypeVar("F", bound=Callable[..., Any])

_lock = threading.Lock()
_cache: dict[Any, Communicator] = {}
_cache_world: list[Any] = [None]


def get_communicator(group: Any = None) -> Communicator:
    """The communicator for ``group`` (cached: one per process group).

    Examples:
        >>> comm = get_communicator()          # the world
        >>> comm.backend, comm.world_size
        ('gloo', 4)
    """
    if isinstance(group, Communicator):
        return group
    world = dist.group.WORLD if dist_ready() else None
    with _lock:
        if _cache_world[0] is not world:  # the world was (re)initialised or destroyed
            _cache.clear()
            _cache_world[0] = world
        key = world if group is None else group
        comm = _cache.get(key)
        if comm is None:
            comm = _cache[key] = Communicator(group)
            _forget_at_exit()
        return comm


@functools.lru_cache(maxsize=1)
def _forget_at_exit() -> None:
    # groups kept alive by this cache past interpreter shutdown abort the
    # process from gloo's threads; free them while Python still runs
    atexit.register(forget_communicators)


def forget_communicators() -> None:
    """Drop the cached communicators (and with them their process groups).

    Call it before ``torch.distributed.destroy_process_group()`` so the groups
    are freed then, not during interpreter shutdown.

    Examples:
        >>> forget_communicators()
        >>> torch.distributed.destroy_process_group()
    """
    with _lock:
        _cache.clear()
        _cache_world[0] = None


def set_default_communicator(comm: Communicator) -> None:
    """Use ``comm`` (e.g. one with a custom serializer) for ``group=None`` calls.

    Examples:
        >>> set_default_communicator(Communicator(serializer=RestrictedSerializer()))
    """
    get_communicator()  # bring the cache up to date with the current world
    with _lock:
        _cache[_cache_world[0]] = comm


def new_group(
    ranks: Sequence[int], timeout: datetime.timedelta | float | None = None
) -> Communicator:
    """A communicator for the world ranks ``ranks``; every rank must call it.

    The result can be passed as ``group=`` to every function here.

    Examples:
        >>> pair = new_group([0, 1])
        >>> if pair.is_member:
        ...     all_reduce(x, group=pair)
    """
    return get_communicator().new_group(ranks, timeout)


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

    Examples:
        >>> get_local_rank()
        0
    """
    return get_communicator().local_rank


def get_local_size() -> int:
    """Number of processes on this machine (1 when not distributed).

    Examples:
        >>> get_local_size()
        1
    """
    return get_communicator().local_size


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
        >>> get_backend()          # not distributed
        >>> get_backend()          # under torchrun with gloo
        'gloo'
    """
    return get_communicator(group).plugin.torch_backend


def get_default_group() -> Any:
    """The default process group (``None`` when not distributed).

    Examples:
        >>> get_default_group()
    """
    return dist.group.WORLD if dist_ready() else None


def get_comm_device(group: Any = None) -> torch.device:
    """The device ``group``'s collectives run on.

    Examples:
        >>> get_comm_device()
        device(type='cpu')
    """
    return get_communicator(group).device


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


def master_only(func: F) -> F:
    """Run ``func`` on the main process only; other ranks get ``None``.

    Examples:
        >>> @master_only
        ... def save(path):
        ...     torch.save(model.state_dict(), path)
    """

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if is_main_process():
            return func(*args, **kwargs)
        return None

    return wrapper  # type: ignore[return-value]


rank_zero_only = helpers.rank_zero_only
obj2tensor = helpers.obj2tensor
tensor2obj = helpers.tensor2obj


def barrier(group: Any = None, timeout: datetime.timedelta | float | None = None) -> None:
    """Block until every process of ``group`` has arrived (at most ``timeout`` seconds).

    Examples:
        >>> barrier()
        >>> barrier(timeout=60)     # CommTimeoutError naming the missing ranks after 60 s
    """
    get_communicator(group).barrier(timeout=timeout)


# -- tensor collectives ----------------------------------------------------------
def all_reduce(
    data: torch.Tensor, op: str = "sum", group: Any = None, async_op: bool = False
) -> Handle | None:
    """Reduce ``data`` in place across ``group``.

    Examples:
        >>> data = torch.arange(2) + 1 + 2 * get_rank()
        >>> all_reduce(data)        # 2 ranks: tensor([4, 6]) everywhere
    """
    return get_communicator(group).all_reduce(data, op, async_op=async_op)


def all_gather(data: torch.Tensor, group: Any = None) -> list[torch.Tensor]:
    """Every rank's ``data``, as a list (shapes may differ across ranks).

    Examples:
        >>> all_gather(torch.tensor([get_rank()]))
        [tensor([0]), tensor([1])]
    """
    return get_communicator(group).all_gather(data)


def all_gather_into_tensor(
    output: torch.Tensor, data: torch.Tensor, group: Any = None, async_op: bool = False
) -> Handle | None:
    """Concatenate every rank's ``data`` along dim 0 into ``output``.

    Examples:
        >>> out = torch.empty(2 * get_world_size())
        >>> all_gather_into_tensor(out, torch.ones(2))
    """
    return get_communicator(group).all_gather_into_tensor(output, data, async_op=async_op)


def gather(data: torch.Tensor, dst: int = 0, group: Any = None) -> list[torch.Tensor]:
    """Every rank's ``data`` on ``dst`` (a list); other ranks get ``[]``.

    Examples:
        >>> gather(torch.tensor([get_rank()]))
        [tensor([0]), tensor([1])]     # rank 0
    """
    return get_communicator(group).gather(data, dst)


def broadcast(
    data: torch.Tensor, src: int = 0, group: Any = None, async_op: bool = False
) -> Handle | None:
    """Copy ``src``'s ``data`` into ``data`` on every rank.

    Examples:
        >>> data = torch.tensor([get_rank()])
        >>> broadcast(data)          # tensor([0]) everywhere
    """
    return get_communicator(group).broadcast(data, src, async_op=async_op)


def reduce_scatter(
    output: torch.Tensor, data: Any, op: str = "sum", group: Any = None, async_op: bool = False
) -> Handle | None:
    """Reduce ``data`` across ranks; this rank keeps its chunk in ``output``.

    Examples:
        >>> out = torch.empty(1)
        >>> reduce_scatter(out, torch.ones(get_world_size()))
    """
    return get_communicator(group).reduce_scatter(output, data, op, async_op=async_op)


# -- object collectives ----------------------------------------------------------
def all_gather_object(data: Any, group: Any = None) -> list[Any]:
    """Every rank's picklable ``data``, as a list indexed by rank.

    Examples:
        >>> all_gather_object({"rank": get_rank()})
        [{'rank': 0}, {'rank': 1}]
    """
    return get_communicator(group).all_gather_object(data)


def gather_object(data: Any, dst: int = 0, group: Any = None) -> list[Any] | None:
    """Every rank's ``data`` on ``dst`` (a list); other ranks get ``None``.

    Examples:
        >>> gather_object(get_rank())
        [0, 1]    # rank 0
    """
    return get_communicator(group).gather_object(data, dst)


def broadcast_object_list(data: list[Any], src: int = 0, group: Any = None) -> None:
    """Fill ``data`` on every rank with ``src``'s objects, in place.

    Examples:
        >>> data = ["foo", 12, {1: 2}] if get_rank() == 0 else [None] * 3
        >>> broadcast_object_list(data)
    """
    get_communicator(group).broadcast_object_list(data, src)


def broadcast_object(data: Any = None, src: int = 0, group: Any = None) -> Any:
    """Return ``src``'s ``data`` on every rank.

    Examples:
        >>> cfg = broadcast_object(cfg if get_rank() == 0 else None)
    """
    return get_communicator(group).broadcast_object(data, src)


# -- helpers ---------------------------------------------------------------------
def all_reduce_dict(data: dict[str, torch.Tensor], op: str = "sum", group: Any = None) -> None:
    """Reduce every tensor of ``data`` across ranks (values are replaced).

    Examples:
        >>> d = {"loss": torch.tensor(1.0)}
        >>> all_reduce_dict(d, op="mean")
    """
    helpers.all_reduce_dict(get_communicator(group), data, op)


def all_reduce_params(
    params: list | Generator[torch.Tensor, None, None] | Iterable,
    coalesce: bool = True,
    bucket_size_mb: float = -1,
    op: str = "sum",
    group: Any = None,
) -> None:
    """Reduce parameters in place, coalesced into per-dtype buckets.

    Examples:
        >>> all_reduce_params(model.parameters(), op="mean")
    """
    helpers.all_reduce_params(get_communicator(group), params, coalesce, bucket_size_mb, op)


def sync_random_seed(group: Any = None) -> int:
    """Rank 0's ``np.random.randint(2**31)`` on every rank.

    Examples:
        >>> seed = sync_random_seed()
    """
    return helpers.sync_random_seed(get_communicator(group))


def reduce_mean(tensor: torch.Tensor, group: Any = None) -> torch.Tensor:
    """The mean of ``tensor`` over ranks, as a new tensor.

    Examples:
        >>> reduce_mean(torch.tensor([1.0]))
        tensor([1.])
    """
    return helpers.reduce_mean(get_communicator(group), tensor)


def pad_to_largest_tensor(
    tensor: torch.Tensor, group: Any = None
) -> tuple[list[int], torch.Tensor]:
    """Every rank's dim-0 size and ``tensor`` zero-padded to the largest.

    Examples:
        >>> sizes, padded = pad_to_largest_tensor(torch.ones(get_rank() + 1))
    """
    return helpers.pad_to_largest_tensor(get_communicator(group), tensor)


def collect_results(
    results_part: list,
    size: int,
    device: str = "cpu",
    tmpdir: str | None = None,
    group: Any = None,
) -> list | None:
    """Collect per-rank results on rank 0 in dataset order (others get ``None``).

    ``device="cpu"`` goes through files in ``tmpdir`` (a unique directory by
    default); ``device="gpu"`` through the backend's object collective.

    Examples:
        >>> results = collect_results(part, size=len(dataset), device="cpu")
    """
    if device not in ("cpu", "gpu"):
        raise ValueError(f"device must be 'cpu' or 'gpu', got {device!r}")
    if device == "gpu":
        if tmpdir is not None:
            raise ValueError("tmpdir is only used with device='cpu'")
        return collect_results_gpu(results_part, size, group=group)
    return collect_results_cpu(results_part, size, tmpdir, group=group)


def collect_results_cpu(
    result_part: list, size: int, tmpdir: str | None = None, group: Any = None
) -> list | None:
    """Collect results on rank 0 through files in a shared directory.

    Examples:
        >>> collect_results_cpu(part, size=100)
    """
    return results.collect_results_cpu(get_communicator(group), result_part, size, tmpdir)


def collect_results_gpu(result_part: list, size: int, group: Any = None) -> list | None:
    """Collect results on rank 0 through the backend's object collective.

    Examples:
        >>> collect_results_gpu(part, size=100)
    """
    return results.collect_results_gpu(get_communicator(group), result_part, size)
