"""Starting the process group from a launcher's environment (torchrun, slurm, mpi)."""

from __future__ import annotations

import datetime
import multiprocessing
import os
import subprocess
from typing import Any

import torch.distributed as dist

from commlib import _communicators, _newcomers, plugins, torch_backend
from commlib._launched import launched_world_size, warn_if_launched_without_init
from commlib._settings import as_timedelta, default_timeout
from commlib._world import world
from commlib.backend import Backend
from commlib.communicator import Communicator

__all__ = [
    "default_torch_backend",
    "infer_launcher",
    "init_dist",
    "is_newcomer",
    "join",
    "launched_world_size",
    "plugin_of_started_world",
    "teardown_at_exit",
    "warn_if_launched_without_init",
]

# what each launcher calls rank, world size and local rank
_LAUNCHER_ENV = {
    "pytorch": ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"),
    "slurm": ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE"),
    "mpi": (
        "OMPI_COMM_WORLD_RANK",
        "OMPI_COMM_WORLD_SIZE",
        "OMPI_COMM_WORLD_LOCAL_RANK",
        "OMPI_COMM_WORLD_LOCAL_SIZE",
    ),
}


# MPICH's hydra (and Intel MPI) names them so; the other launcher names are Open MPI's
# what a process started by hand is told: the launcher sets the variables
_HOW_TO_START = {
    "pytorch": "start the ranks with torchrun (or `commlib run`), or set RANK, WORLD_SIZE, "
    "MASTER_ADDR and MASTER_PORT yourself",
    "slurm": "start the ranks with srun",
    "mpi": "start the ranks with `mpiexec -n N python SCRIPT` (MPICH sets PMI_RANK and "
    "PMI_SIZE, Open MPI OMPI_COMM_WORLD_RANK and OMPI_COMM_WORLD_SIZE)",
}
_MPICH_ENV = ("PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS")
_MPI_RANK_NAMES = ("OMPI_COMM_WORLD_LOCAL_RANK", "PMI_RANK")


def default_torch_backend() -> str:
    """The torch.distributed backend ``init_dist`` uses when none is named.

    The plugins decide (:func:`commlib.plugins.backend_for_group`): an
    accelerator backend whose device is visible, gloo otherwise.

    Examples:
        >>> default_torch_backend()      # on a CPU-only machine  # doctest: +SKIP
        'gloo'
    """
    return str(plugins.backend_for_group().torch_backend)


def infer_launcher() -> str:
    """The launcher this process's environment shows: ``pytorch``, ``slurm``, ``mpi`` or ``none``.

    As mmengine: torchrun's ``WORLD_SIZE`` first, then slurm's ``SLURM_NTASKS``,
    then an MPI launcher's rank (Open MPI's ``OMPI_COMM_WORLD_LOCAL_RANK``,
    MPICH hydra's ``PMI_RANK``). Pass the answer to
    :func:`init_dist` unless it is ``"none"`` (a plain single process).

    Examples:
        >>> infer_launcher()            # python train.py
        'none'
        >>> infer_launcher()            # torchrun --nproc-per-node 2 train.py  # doctest: +SKIP
        'pytorch'
    """
    if "WORLD_SIZE" in os.environ:
        return "pytorch"
    if "SLURM_NTASKS" in os.environ:
        return "slurm"
    if any(name in os.environ for name in _MPI_RANK_NAMES):
        return "mpi"
    return "none"


def init_dist(
    launcher: str = "pytorch",
    backend: str | Backend | None = None,
    init_backend: str = "torch",
    timeout: datetime.timedelta | float | None = None,
    *,
    serve_torch: bool = False,
    **kwargs: Any,
) -> None:
    """Initialise torch.distributed from a launcher's environment.

    ``launcher`` is ``"pytorch"`` (torchrun: ``RANK``, ``WORLD_SIZE``,
    ``MASTER_ADDR``, ``MASTER_PORT``), ``"slurm"`` or ``"mpi"`` (their rank
    variables are mapped onto torchrun's). As mmengine: under slurm ``port=``
    (else ``MASTER_PORT``, else 29500) is the port and ``MASTER_ADDR`` defaults
    to the first host of ``SLURM_NODELIST`` (``scontrol show hostname``); under
    mpi (Open MPI's ``OMPI_COMM_WORLD_*`` or MPICH hydra's ``PMI_RANK``,
    ``PMI_SIZE``) ``MASTER_PORT`` defaults to 29500 and ``MASTER_ADDR`` must
    be set, except for a plugin that finds its ranks itself
    (:attr:`~commlib.Backend.own_rendezvous`: ``mpi`` takes rank and size
    from MPI under any launcher name); the multiprocessing start method
    becomes ``"spawn"`` unless one is already set (forked workers of a
    process that started an accelerator break). ``backend`` is a commlib
    plugin name, a torch backend name (also multi-device,
    ``"cpu:gloo,cuda:nccl"``) or a device type (``"npu"``: the backend torch
    registers for it); by default the one the plugins pick for this machine
    (an accelerator's; under ``mpiexec`` with mpi4py installed, ``mpi``; else
    gloo). The plugin selects the device from ``LOCAL_RANK``
    before the group starts. ``init_backend`` is mmengine's: only ``"torch"``
    (torch.distributed itself) is supported. ``serve_torch=True`` makes the
    world's torch group one commlib serves (torch backend ``commlib-NAME``,
    :mod:`commlib.torch_backend`): torch's own collectives, DDP's and FSDP's
    included, then go through the same communicator as commlib's calls, with
    its checks, timeout and recorder.

    Examples:
        >>> # torchrun --nproc-per-node 2 train.py
        >>> import commlib as dist
        >>> dist.init_dist("pytorch")   # doctest: +SKIP
        >>> dist.get_world_size()       # doctest: +SKIP
        2
    """
    if launcher not in _LAUNCHER_ENV:
        raise ValueError(f"launcher must be one of {sorted(_LAUNCHER_ENV)}, got {launcher!r}")
    if init_backend != "torch":
        raise ValueError(
            f"init_backend={init_backend!r} is not supported: commlib starts the process group "
            "with torch.distributed only (init_backend='torch')"
        )
    if dist.is_initialized():
        raise RuntimeError("torch.distributed is already initialised")
    if is_newcomer():
        raise RuntimeError(
            "init_dist: this process replaces a lost rank (COMMLIB_NEWCOMER=1, set by "
            "`commlib run`): it joins the running ranks with commlib.join(), not init_dist()"
        )
    plugin = _plugin(backend)
    if serve_torch:
        if plugin.torch_backend is None:
            raise ValueError(f"serve_torch: backend {plugin.name!r} drives no torch engine")
        kwargs["backend"] = torch_backend.commlib_name(plugin.name)
    if isinstance(timeout, (int, float)):
        timeout = datetime.timedelta(seconds=timeout)
    if timeout is not None:
        kwargs["timeout"] = timeout
    if plugin.own_rendezvous and plugin.torch_backend is not None:
        if "port" in kwargs:
            raise TypeError(f"init_dist: backend {plugin.name!r} finds its ranks itself; no port=")
        _start(plugin, _launcher_env(launcher, required=False), kwargs)
        return
    values = _launcher_env(launcher, required=True)
    for torch_name, value in zip(_LAUNCHER_ENV["pytorch"], values):
        if value is not None:
            os.environ[torch_name] = value
    if launcher == "slurm" and "," in os.environ.get("LOCAL_WORLD_SIZE", ""):
        os.environ["LOCAL_WORLD_SIZE"] = os.environ["LOCAL_WORLD_SIZE"].split("(")[0]
    port = kwargs.pop("port", None)
    if port is not None:
        if launcher != "slurm":
            raise TypeError(f"init_dist: port= is for the slurm launcher, not {launcher!r}")
        os.environ["MASTER_PORT"] = str(port)
    if launcher != "pytorch":
        os.environ.setdefault("MASTER_PORT", "29500")  # torch.distributed's default, as mmengine
    if launcher == "slurm" and "MASTER_ADDR" not in os.environ:
        os.environ["MASTER_ADDR"] = _first_slurm_host()
    for needed in ("MASTER_ADDR", "MASTER_PORT"):
        if needed not in os.environ:
            raise ValueError(f"init_dist: {needed} is not set")
    if plugin.torch_backend is None:
        raise ValueError(f"backend {plugin.name!r} runs without a process group")
    kwargs.setdefault("init_method", "env://")
    _start(plugin, values, kwargs)


def _launcher_env(launcher: str, required: bool) -> list[str | None]:
    """Rank, world size, local rank and local world size as ``launcher`` set them."""
    names = _LAUNCHER_ENV[launcher]
    values = [os.environ.get(n) for n in names]
    if launcher == "mpi" and values[0] is None:
        names, values = _MPICH_ENV, [os.environ.get(n) for n in _MPICH_ENV]
    if required and (values[0] is None or values[1] is None):
        raise ValueError(
            f"launcher {launcher!r}: {names[0]} and {names[1]} are not set: "
            f"{_HOW_TO_START[launcher]}"
        )
    return values


def _start(plugin: Backend, launched: list[str | None], kwargs: dict[str, Any]) -> None:
    """Start the world with ``plugin``; the default communicator serves it."""
    if multiprocessing.get_start_method(allow_none=True) is None:
        multiprocessing.set_start_method("spawn")
    plugin.setup_device(int(launched[2] or os.environ.get("LOCAL_RANK") or 0))
    plugin.init_process_group(**kwargs)
    if plugin.own_rendezvous:
        # what torchrun would have set, for code that reads it
        found = [str(dist.get_rank()), str(dist.get_world_size()), launched[2], launched[3]]
        for torch_name, value in zip(_LAUNCHER_ENV["pytorch"], found):
            if value is not None:
                os.environ.setdefault(torch_name, value)
    world.started(plugin)
    world.teardown_at_exit()
    # the plugin that started the world serves it, even if another one drives
    # the same torch backend; a world commlib serves to torch has its communicator
    served = dist.group.WORLD
    if torch_backend.is_served(served):
        _communicators.set_default(torch_backend.communicator_of(served))
    else:
        _communicators.set_default(Communicator(backend=plugin))


NEWCOMER_ENV = "COMMLIB_NEWCOMER"


def is_newcomer() -> bool:
    """Whether this process was started to replace a lost rank (``commlib run`` says so).

    Such a process calls :func:`join` instead of :func:`init_dist`.

    Examples:
        >>> is_newcomer()           # python train.py, or a rank commlib run started first
        False
    """
    return os.environ.get(NEWCOMER_ENV) == "1"


def join(
    backend: str | Backend | None = None,
    timeout: datetime.timedelta | float | None = None,
) -> Communicator:
    """Join a running job as a newcomer; returns the communicator of the grown job.

    Started with the job's rendezvous settings (``MASTER_ADDR``,
    ``MASTER_PORT``: ``commlib run`` gives them to the replacement it
    starts, with ``COMMLIB_NEWCOMER=1``; any other process is refused at
    once with a ``RuntimeError``), the process asks to join in the job's store and waits up to
    ``timeout`` (default: ``COMMLIB_TIMEOUT``, else 30 minutes) until the
    members call :meth:`Communicator.grow`. It then becomes a member: its
    rank follows the members' (``comm.world_size - 1`` for the one newcomer
    of a grow; several take the next ranks in the order they asked). The
    backend is the members' (``backend`` overrides it, e.g. a plugin
    instance), and so is the communicator's timeout; the result is the
    default communicator, as after :func:`init_dist`.

    Examples:
        >>> if commlib.is_newcomer():  # doctest: +SKIP
        ...     comm = commlib.join()
        ...     state = comm.broadcast_object(None, src=0)  # the members send theirs
    """
    if dist.is_initialized():
        raise RuntimeError("join: torch.distributed is already initialised in this process")
    if not is_newcomer():
        # a rank of the job (or any other process) would wait the whole timeout for a
        # place no grow offers it
        raise RuntimeError(
            f"join: this process is not a newcomer ({NEWCOMER_ENV} is not 1): join is for the "
            "replacement `commlib run --max-restarts` starts in a lost rank's place; the "
            "job's own ranks call commlib.init_dist(), and the members take newcomers in "
            "with comm.grow()"
        )
    limit = as_timedelta(timeout) or default_timeout()
    address = _newcomers.store_address()
    kv = _newcomers.client(address, limit)
    place = _newcomers.await_place(kv, _newcomers.ask(kv), limit)
    plugin = _plugin(backend if backend is not None else place.plugin)
    plugin.setup_device(int(os.environ.get("LOCAL_RANK", 0)))
    forming = datetime.timedelta(seconds=place.timeout)
    _newcomers.form(plugin, _newcomers.client(address, forming), place, forming)
    comm = Communicator(backend=plugin, timeout=place.limit)
    _communicators.set_default(comm)
    return comm


def plugin_of_started_world(torch_backend: str) -> Backend | None:
    """The plugin :func:`init_dist` started this world with, for a group of ``torch_backend``.

    So a ``Communicator()`` made later is served by the plugin the user chose
    (their own subclass of gloo's, say), not by the first one registered for
    the torch backend. ``None`` when init_dist did not start the current world
    or the group runs another torch backend.

    Examples:
        >>> plugin_of_started_world("gloo") is None    # no init_dist in this process
        True
    """
    plugin: Backend | None = world.started_plugin(torch_backend)
    return plugin


def _first_slurm_host() -> str:
    """The first host of ``SLURM_NODELIST``, where the slurm job's rank 0 runs."""
    nodes = os.environ.get("SLURM_NODELIST")
    if not nodes:
        raise ValueError("init_dist: MASTER_ADDR is not set (nor SLURM_NODELIST to take it from)")
    try:
        shown = subprocess.run(
            ["scontrol", "show", "hostname", nodes],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        ).stdout.split()
    except (OSError, subprocess.SubprocessError) as exc:
        raise ValueError(
            f"init_dist: MASTER_ADDR is not set and `scontrol show hostname {nodes}` failed "
            f"({exc}); set MASTER_ADDR"
        ) from None
    if not shown:
        raise ValueError(f"init_dist: `scontrol show hostname {nodes}` named no host")
    return shown[0]


def teardown_at_exit(holder: Any = None) -> None:
    """Destroy the process groups while Python still runs at exit (registered once).

    torch 2.13's gloo can abort the interpreter at exit ("terminate called
    without an active exception") when a group is still up, or when the last
    reference to a destroyed one goes only during C++ static teardown: a
    plain exit, even an error exit, turns into SIGABRT. :func:`init_dist` and
    every communicator over a process group call this; a ``holder`` (a
    communicator, held weakly) lets go of its group first, through its
    ``_release_at_exit()``.

    Examples:
        >>> teardown_at_exit()  # doctest: +SKIP
    """
    # the holder's method is this function's documented contract
    world.teardown_at_exit(None if holder is None else holder._release_at_exit)


def _plugin(backend: str | Backend | None) -> Backend:
    if isinstance(backend, Backend):
        return backend
    if backend is None:
        return plugins.backend_for_group()
    # a plugin name, a torch backend ("nccl", "cpu:gloo,cuda:nccl") or a device ("npu")
    return plugins.resolve_backend(backend)
