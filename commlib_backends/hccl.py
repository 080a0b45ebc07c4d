"""``hccl``: Ascend NPU collectives through torch_npu's HCCL.

Facts from torch_npu (``torch_npu/csrc/distributed/ProcessGroupHCCL.cpp``) and
the CANN HCCL reference, and what the plugin does about them:

* ``import torch_npu`` registers ``torch.npu`` and the ``"hccl"`` backend
  (device ``npu``);
* ProcessGroupHCCL raises "does not support gather" (torch_npu's Python layer
  falls back to all_gather with a warning): the plugin gathers with all_gather
  and keeps the result on ``dst``; older versions also raise "does not support
  scatter": the plugin scatters with a broadcast each rank keeps its part of;
* reductions take sum, product, min, max only (``band``/``bor``/``bxor``
  raise "Cannot use ReduceOp.BAND with HCCL"), and only int8, int16, int32,
  int64, float16, float32 and bfloat16 ("HCCL AllReduce & Reduce:
  Unsupported data type at::kByte/at::kBool"): other ops and dtypes (bool,
  uint8, float64) reduce locally after an all_gather;
* ``ReduceOp.AVG`` is a sum then a divide inside torch_npu anyway.
"""

from __future__ import annotations

import torch

from commlib.hookspecs import hookimpl
from commlib_backends.accelerator import AcceleratorBackend


class HcclBackend(AcceleratorBackend):
    """HCCL on the current Ascend NPU."""

    name = "hccl"
    torch_backend = "hccl"
    device_type = "npu"
    description = "Ascend NPU collectives (torch_npu HCCL)"
    vendor_package = "torch_npu"
    vendor_attr = "npu"
    device_label = "NPU"
    wire_dtypes = frozenset(
        {
            torch.bool,
            torch.uint8,
            torch.int8,
            torch.int16,
            torch.int32,
            torch.int64,
            torch.float16,
            torch.bfloat16,
            torch.float32,
            torch.float64,
        }
    )
    reduce_dtypes = frozenset(
        {
            torch.int8,
            torch.int16,
            torch.int32,
            torch.int64,
            torch.float16,
            torch.bfloat16,
            torch.float32,
        }
    )
    native_gather = False
    native_scatter = False  # older torch_npu raises "does not support scatter"


@hookimpl
def commlib_backends():
    return [HcclBackend]
