"""``nccl``: CUDA collectives through torch.distributed's NCCL.

What the plugin adds to torch's NCCL (facts from torch's ProcessGroupNCCL):

* NCCL reduces with sum, product, min and max only (``band``/``bor``/``bxor``
  raise "Cannot use ReduceOp.BAND with NCCL"): commlib runs those as an
  all_gather plus a local reduction;
* NCCL has no int16 / unsigned 16-64 bit types: such tensors move as raw bytes
  and reduce locally;
* ``barrier`` reduces one element on this process's current device instead of
  letting torch guess a device from the rank;
* point-to-point payloads are posted as one batched group (NCCL deadlocks on
  two-way unbatched send/recv); object payloads use collectives.
"""

from __future__ import annotations

import torch

from commlib.hookspecs import hookimpl
from commlib_backends.accelerator import AcceleratorBackend
from commlib_backends.engine_gaps import STANDARD_DTYPES

_MOVES = STANDARD_DTYPES | {torch.float64}


class NcclBackend(AcceleratorBackend):
    """NCCL on the current CUDA device (ROCm builds: RCCL under the same name)."""

    name = "nccl"
    torch_backend = "nccl"
    device_type = "cuda"
    description = "CUDA collectives (torch.distributed NCCL)"
    vendor_package = None  # CUDA support is built into torch
    vendor_attr = "cuda"
    device_label = "CUDA"
    wire_dtypes = _MOVES
    reduce_dtypes = _MOVES
    native_gather = True  # torch >= 1.11 builds gather from grouped send/recv


@hookimpl
def commlib_backends():
    return [NcclBackend]
