"""commlib: a backend-pluggable communication layer for PyTorch.

``import commlib as dist`` gives mmengine.dist's functions; :class:`Communicator`
gives the same collectives on one process group; backends are pluggy plugins.

Examples:
    >>> import commlib as dist
    >>> dist.init_dist("pytorch")              # under torchrun; skip for one process
    >>> dist.all_gather_object({"rank": dist.get_rank()})
"""

from commlib.backend import Backend
from commlib.communicator import Communicator, Handle
from commlib.errors import (
    BackendUnavailableError,
    CommError,
    CommTimeoutError,
    DeserializationError,
    NotInGroupError,
    RemoteArgumentError,
    RemoteError,
)
from commlib.functional import (
    all_gather,
    all_gather_into_tensor,
    all_gather_object,
    all_reduce,
    all_reduce_dict,
    all_reduce_params,
    barrier,
    broadcast,
    broadcast_object,
    broadcast_object_list,
    collect_results,
    collect_results_cpu,
    collect_results_gpu,
    forget_communicators,
    gather,
    gather_object,
    get_backend,
    get_comm_device,
    get_communicator,
    get_default_group,
    get_dist_info,
    get_local_rank,
    get_local_size,
    get_rank,
    get_world_size,
    is_distributed,
    is_main_process,
    master_only,
    new_group,
    obj2tensor,
    pad_to_largest_tensor,
    rank_zero_only,
    reduce_mean,
    reduce_scatter,
    set_default_communicator,
    sync_random_seed,
    tensor2obj,
)
from commlib.hookspecs import hookimpl
from commlib.launch import init_dist
from commlib.plugins import list_backends, register_backend, unregister_backend
from commlib.serialization import (
    OutOfBandSerializer,
    Payload,
    PickleSerializer,
    RefusedClassError,
    RestrictedSerializer,
    Serializer,
)

__version__ = "0.1.0"

__all__ = [
    "Backend",
    "BackendUnavailableError",
    "CommError",
    "CommTimeoutError",
    "Communicator",
    "DeserializationError",
    "Handle",
    "NotInGroupError",
    "OutOfBandSerializer",
    "Payload",
    "PickleSerializer",
    "RefusedClassError",
    "RemoteArgumentError",
    "RemoteError",
    "RestrictedSerializer",
    "Serializer",
    "__version__",
    "all_gather",
    "all_gather_into_tensor",
    "all_gather_object",
    "all_reduce",
    "all_reduce_dict",
    "all_reduce_params",
    "barrier",
    "broadcast",
    "broadcast_object",
    "broadcast_object_list",
    "collect_results",
    "collect_results_cpu",
    "collect_results_gpu",
    "forget_communicators",
    "gather",
    "gather_object",
    "get_backend",
    "get_comm_device",
    "get_communicator",
    "get_default_group",
    "get_dist_info",
    "get_local_rank",
    "get_local_size",
    "get_rank",
    "get_world_size",
    "hookimpl",
    "init_dist",
    "is_distributed",
    "is_main_process",
    "list_backends",
    "master_only",
    "new_group",
    "obj2tensor",
    "pad_to_largest_tensor",
    "rank_zero_only",
    "reduce_mean",
    "reduce_scatter",
    "register_backend",
    "set_default_communicator",
    "sync_random_seed",
    "tensor2obj",
    "unregister_backend",
]
