"""PyTorch-Ignite: ``ignite.distributed`` (idist) on a commlib Communicator.

idist chooses its communication through a *computation model* (ignite's
``ComputationModel``: native torch.distributed, Horovod, XLA).
:class:`CommlibModel` is one over a commlib :class:`~commlib.Communicator`, and
:func:`use_commlib` makes it idist's active model, so code written against
``idist`` (``idist.all_reduce``, ``idist.all_gather``, ``idist.broadcast``,
``idist.barrier``, ``idist.new_group``, ``idist.one_rank_only``, ignite's
metrics and handlers) runs on any commlib backend unchanged, with commlib's
timeouts and every dtype.

It behaves as ignite's native model does: it *is* one of ignite's
computation models, and ignite's own base class turns Python numbers,
strings and paths into tensors and back (``all_reduce(10)`` is an ``int``,
``all_gather("abc")`` a list of strings, ``broadcast(None, safe_mode=True)``
on the ranks that are not the source), so the results have the same values
and types. Where it differs, and why, is in the docs' integrations page.

ignite is imported when the first model is made, not when this module is:
the class is written against ignite's ``ComputationModel`` and becomes a real
subclass of it then.

Examples:
    >>> import ignite.distributed as idist                        # doctest: +SKIP
    >>> commlib.init_dist("pytorch")    # under torchrun          # doctest: +SKIP
    >>> use_commlib()                   # every rank              # doctest: +SKIP
    >>> idist.all_reduce(10), idist.model_name()   # 2 ranks      # doctest: +SKIP
    (20, 'commlib')
"""

from __future__ import annotations

import functools
import os
import socket
import warnings
from collections.abc import Sequence
from numbers import Number
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch
import torch.distributed as dist

from commlib.communicator import Communicator
from commlib.functional import forget_communicators, get_communicator
from commlib.integrations._clients import require
from commlib.launch import infer_launcher, init_dist

if TYPE_CHECKING:
    from ignite.distributed.comp_models.base import ComputationModel
else:
    # ignite's class joins as the real base when the first model is made (_model_class)
    ComputationModel = object

_CLIENT = ("pytorch-ignite", "commlib.integrations.ignite")

#: idist's op names (those of its native model) -> commlib's
_OPS = {
    "SUM": "sum",
    "PRODUCT": "product",
    "MIN": "min",
    "MAX": "max",
    "AND": "band",
    "OR": "bor",
}


@functools.cache
def _model_class() -> type[CommlibModel]:
    """:class:`CommlibModel` with ignite's ``ComputationModel`` as its base (imports ignite)."""
    base = require("ignite.distributed.comp_models.base", *_CLIENT).ComputationModel
    namespace: dict[str, Any] = {"__module__": __name__, "__qualname__": "CommlibModel"}
    namespace["__doc__"] = CommlibModel.__doc__
    # ignite's base is an ABC: its metaclass builds the class and checks nothing is abstract
    return cast("type[CommlibModel]", type(base)("CommlibModel", (CommlibModel, base), namespace))


class CommlibModel(ComputationModel):
    """ignite's computation model over a commlib :class:`~commlib.Communicator`.

    Args:
        comm: the communicator idist runs on; commlib's default (the world)
            when ``None``. This process must be a member.

    Every rank makes its model (it agrees on the number of processes per
    node with the others, as ignite's native model does). Ranks, ``src``
    and ``group=`` lists are ranks of ``comm``. ``group=`` is a list of
    ranks, a commlib :class:`~commlib.Communicator` (what :meth:`new_group`
    returns) or a torch ``ProcessGroup``.

    Examples:
        >>> model = CommlibModel()                     # needs ignite  # doctest: +SKIP
        >>> model.all_gather("abc"), model.broadcast(3.5)   # doctest: +SKIP
        (['abc'], 3.5)
    """

    #: what ``idist.model_name()`` answers
    name = "commlib"
    #: none for ``idist.initialize``/``spawn``, which never choose this model:
    #: :func:`use_commlib` installs it
    available_backends: tuple[str, ...] = ()

    def __new__(cls, *args: Any, **kwargs: Any) -> CommlibModel:
        # the class as written has no ignite base (this module imports no ignite):
        # a model is an instance of the subclass that has it
        return super().__new__(_model_class() if cls is CommlibModel else cls)

    def __init__(self, comm: Communicator | None = None) -> None:
        super().__init__()
        comm = get_communicator() if comm is None else comm
        if not isinstance(comm, Communicator):
            raise TypeError(
                f"CommlibModel runs on a commlib Communicator, got {type(comm).__name__}"
            )
        if not comm.is_member:
            raise ValueError("CommlibModel: this process is not a member of the communicator")
        self.comm = comm
        # group= given as a list of ranks: the communicator made for that list, reused
        self._groups: dict[tuple[int, ...], Communicator] = {}
        self._local_rank = self._find_local_rank()
        self._setup_attrs()

    # -- where am I ---------------------------------------------------------------------
    def _find_local_rank(self) -> int:
        # native's order: slurm's, the launcher's, idist.set_local_rank's, the hostnames'
        if "SLURM_JOB_ID" in os.environ and "SLURM_LOCALID" in os.environ:
            return int(os.environ["SLURM_LOCALID"])
        if "LOCAL_RANK" in os.environ:
            return int(os.environ["LOCAL_RANK"])
        if self._ext_local_rank is not None:
            return self._ext_local_rank
        if self.comm.world_size == 1:
            return 0
        hosts = self.comm.all_gather_object(socket.gethostname())
        me = self.comm.rank
        self._node = list(dict.fromkeys(hosts)).index(hosts[me])
        return hosts[:me].count(hosts[me])

    def _compute_nproc_per_node(self) -> int:
        most = torch.tensor([self._local_rank + 1])
        self.comm.all_reduce(most, "max")
        return int(most.item())

    def get_local_rank(self) -> int:
        """This process's rank on its machine, found as ignite's native model finds it."""
        return self._local_rank

    def get_rank(self) -> int:
        """This process's rank in the communicator."""
        return self.comm.rank

    def get_world_size(self) -> int:
        """The number of ranks in the communicator."""
        return self.comm.world_size

    def get_nproc_per_node(self) -> int:
        """The number of ranks per machine (the largest local rank, plus one)."""
        return cast(int, self._nproc_per_node)

    def get_nnodes(self) -> int:
        """The number of machines: ``world_size // nproc_per_node``."""
        return cast(int, self._nnodes)

    def get_node_rank(self) -> int:
        """This machine's index: ``rank // nproc_per_node``."""
        return cast(int, self._node)

    def device(self) -> torch.device:
        """The device the communicator's backend computes on (``Communicator.device``)."""
        return self.comm.device

    def backend(self) -> str | None:
        """The torch.distributed backend under the communicator, else commlib's backend name.

        Examples:
            >>> CommlibModel().backend()      # a world of one  # doctest: +SKIP
            'single'
        """
        return self.comm.plugin.torch_backend or self.comm.backend

    def finalize(self) -> None:
        """End the distributed run, as ignite's native model does: destroy the process group.

        ``idist.finalize()`` calls it; commlib's communicators are forgotten first.
        """
        self._groups.clear()
        forget_communicators()
        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()

    @staticmethod
    def create_from_context() -> CommlibModel | None:
        """A model over commlib's default communicator (a world of one without a launcher)."""
        return CommlibModel()

    @staticmethod
    def create_from_backend(backend: str, **kwargs: Any) -> CommlibModel:
        """Start the ranks' process group with commlib's ``init_dist`` on ``backend``; its model.

        ``backend`` is a commlib backend name; ``kwargs`` go to :func:`commlib.init_dist`.
        """
        launcher = infer_launcher()
        if launcher == "none":
            raise ValueError(
                "CommlibModel.create_from_backend: no launcher started this process "
                "(torchrun, slurm or mpi); start the ranks with one first"
            )
        init_dist(launcher, backend=backend, **kwargs)
        return CommlibModel()

    @staticmethod
    def spawn(*args: Any, **kwargs: Any) -> None:
        """Not supported: commlib's ranks are started by a launcher (torchrun, slurm, mpi)."""
        raise NotImplementedError(
            "CommlibModel does not spawn processes: start the ranks with torchrun (or "
            "slurm / mpiexec), then call commlib.integrations.ignite.use_commlib() in each"
        )

    # -- groups -------------------------------------------------------------------------
    def _group_comm(self, group: Any) -> Communicator:
        """The communicator for idist's ``group=`` argument."""
        if group is None:
            return self.comm
        if isinstance(group, Communicator):
            return group
        if isinstance(group, list) and all(isinstance(r, int) for r in group):
            made = self._groups.get(tuple(group))
            return made if made is not None else self._do_new_group(group)
        if isinstance(group, dist.ProcessGroup) or group is dist.GroupMember.NON_GROUP_MEMBER:
            return get_communicator(group)
        raise ValueError(
            "Argument group should be list of int or ProcessGroup (or a commlib "
            f"Communicator), got {type(group)}, group={group}"
        )

    def _do_new_group(self, ranks: list[int], **kwargs: Any) -> Communicator:
        # torch's new_group arguments that commlib has no use for, left at their defaults
        timeout = kwargs.pop("timeout", None)
        unknown = sorted(k for k, v in kwargs.items() if v is not None)
        if unknown:
            raise TypeError(
                f"new_group: commlib takes ranks and timeout only, got {unknown} "
                "(the communicator's backend serves its subgroups)"
            )
        # torch's new_group([]) is the whole world
        wanted: Sequence[int] = ranks or range(self.comm.world_size)
        group = self.comm.new_group(wanted, timeout)
        self._groups[tuple(ranks)] = group
        return group

    def _rank_not_in_group(self, group: Any) -> bool:
        return group is not None and not self._group_comm(group).is_member

    # -- idist's collectives: ignite's base class, after the arguments are agreed ---------
    def all_reduce(
        self, tensor: torch.Tensor | float, op: str = "SUM", group: Any | None = None
    ) -> torch.Tensor | float:
        """Reduce a tensor (in place) or a number across the group; returns the result.

        Examples:
            >>> model.all_reduce(10)            # 2 ranks  # doctest: +SKIP
            20
        """
        if group is None:
            # a mistake only this rank made reaches the others, waiting in all_reduce
            with self.comm.refusing("all_reduce"):
                if not isinstance(tensor, (torch.Tensor, Number)):
                    raise TypeError(f"Unhandled input type {type(tensor)}")
                if op not in _OPS:
                    raise ValueError(f"Unsupported reduction operation: '{op}'")
        return super().all_reduce(tensor, op, group=group)

    def broadcast(
        self,
        tensor: torch.Tensor | float | str | Path | None,
        src: int = 0,
        safe_mode: bool = False,
    ) -> torch.Tensor | float | str | Path:
        """``src``'s tensor, number, string or path, on every rank.

        With ``safe_mode``, the other ranks may pass ``None`` (or anything).

        Examples:
            >>> mine = "abc" if model.get_rank() == 0 else None  # doctest: +SKIP
            >>> model.broadcast(mine, safe_mode=True)    # doctest: +SKIP
            'abc'
        """
        # the first collective the others are in: where a refusal of this rank's joins them
        textual = isinstance(tensor, (str, Path))
        with self.comm.refusing("all_reduce" if safe_mode or textual else "broadcast"):
            if not (isinstance(tensor, (torch.Tensor, Number, str, Path)) or tensor is None):
                raise TypeError(f"Unhandled input type {type(tensor)}")
            if tensor is None and self.get_rank() == src:
                raise ValueError("Source data can not be None")
            if tensor is None and not safe_mode:
                raise ValueError(
                    "Argument safe_mode should be True if None is passed for non src rank"
                )
        return super().broadcast(tensor, src, safe_mode)

    # -- the collectives ignite's base class builds on ----------------------------------
    def _do_all_reduce(
        self, tensor: torch.Tensor, op: str = "SUM", group: Any | None = None
    ) -> torch.Tensor:
        if op not in _OPS:
            raise ValueError(f"Unsupported reduction operation: '{op}'")
        comm = self._group_comm(group)
        if not comm.is_member:
            # as torch.distributed does for a rank outside the group
            warnings.warn(
                f"all_reduce on rank {self.get_rank()}, which is not a member of the given "
                "group: the tensor is returned unreduced",
                stacklevel=4,
            )
            return tensor
        comm.all_reduce(tensor, _OPS[op])
        return tensor

    def _do_all_gather(self, tensor: torch.Tensor, group: Any | None = None) -> torch.Tensor:
        comm = self._group_comm(group)
        if not comm.is_member:
            return tensor
        if tensor.dim() == 0:
            tensor = tensor.unsqueeze(0)
        # commlib gathers tensors whose first dims differ too: they concatenate alike
        return torch.cat(comm.all_gather(tensor), dim=0)

    def _do_all_gather_object(self, tensor: Any, group: Any | None = None) -> list[Any]:
        comm = self._group_comm(group)
        if not comm.is_member:
            return cast(list[Any], tensor)  # as ignite's native model: the rank's own input
        return comm.all_gather_object(tensor)

    def _do_broadcast(self, tensor: torch.Tensor, src: int) -> torch.Tensor:
        self.comm.broadcast(tensor, src)
        return tensor

    def barrier(self) -> None:
        """Wait until every rank of the communicator arrives."""
        self.comm.barrier()


def use_commlib(comm: Communicator | None = None) -> CommlibModel:
    """Make idist run on commlib: a :class:`CommlibModel` over ``comm`` becomes its model.

    Every rank calls it, after commlib's world is up (``commlib.init_dist``
    under a launcher; nothing in a single process). ``idist.sync()`` goes back
    to ignite's own model; ``idist.finalize()`` ends the run.

    Args:
        comm: the communicator; commlib's default (the world) when ``None``.

    Returns:
        The model idist now uses.

    Examples:
        >>> model = use_commlib()               # needs ignite  # doctest: +SKIP
        >>> import ignite.distributed as idist  # doctest: +SKIP
        >>> idist.model_name(), idist.get_world_size()   # doctest: +SKIP
        ('commlib', 1)
    """
    utils = require("ignite.distributed.utils", *_CLIENT)
    model = CommlibModel(comm)
    # idist has no public way to install a model; _set_model is the one its own
    # initialize, spawn and Parallel use
    utils._set_model(model)
    return model
