"""What a launcher's environment says, and the warning when it started ranks without init_dist.

Below the communicator (which warns on its first collective) and the launch
module (which re-exports these names).
"""

from __future__ import annotations

import os
import sys
import warnings

import torch.distributed as dist

from commlib._world import world


def launched_world_size() -> int:
    """``WORLD_SIZE`` as a launcher set it (1 when unset or not a number).

    Examples:
        >>> launched_world_size()       # python train.py
        1
        >>> launched_world_size()       # under torchrun --nproc-per-node 4  # doctest: +SKIP
        4
    """
    try:
        return int(os.environ.get("WORLD_SIZE", "1"))
    except ValueError:
        return 1


def warn_if_launched_without_init() -> None:
    """Warn once when a launcher started several ranks but torch.distributed is not up.

    Without :func:`commlib.init_dist` every function acts as a world of one process,
    so each rank would silently compute its own answer. Plain single-process
    runs (no ``WORLD_SIZE``, or 1) stay silent.

    Examples:
        >>> # torchrun --nproc-per-node 2, no init_dist
        >>> commlib.all_reduce(torch.ones(2))  # doctest: +SKIP
        UserWarning: WORLD_SIZE=2: a launcher started 2 ranks, but torch.distributed ...
    """
    if world.launch_warning_decided or (dist.is_available() and dist.is_initialized()):
        return
    # decided once: every collective of a single-process run asks
    world.launch_warning_decided = True
    size = launched_world_size()
    if size <= 1:
        return
    warnings.warn(
        f"WORLD_SIZE={size}: a launcher started {size} ranks, but torch.distributed is not "
        "initialised, so commlib acts as a world of one process and every rank computes "
        "alone. Call commlib.init_dist() (e.g. init_dist('pytorch')) before the first "
        "collective.",
        UserWarning,
        stacklevel=_caller_level(),
    )


def _caller_level() -> int:
    """The stack level of the first frame outside commlib: the user's line."""
    here = os.path.dirname(os.path.abspath(__file__))
    frame, level = sys._getframe(1), 1
    while frame.f_back is not None and frame.f_code.co_filename.startswith(here):
        frame, level = frame.f_back, level + 1
    return level


def launcher_local(variable: str, alone: int, distributed: bool) -> int:
    """What the launcher says of this machine's ranks; a guess would be wrong silently.

    Under ``mp.spawn`` or a hand-made ``init_process_group`` nothing says how
    many ranks share the machine: as mmengine, that is an error naming the ways out.
    """
    if not distributed:
        return alone
    value = os.environ.get(variable)
    if value is None:
        raise RuntimeError(
            f"{variable} is not set (no launcher such as torchrun said it) and the local "
            "process group is not created: call init_local_group(node_rank, "
            f"num_gpus_per_node) first, or set {variable}"
        )
    return int(value)
