"""``cncl``: Cambricon MLU collectives through torch_mlu's CNCL.

Facts from torch_mlu (``torch_mlu/csrc/framework/distributed/process_group_cncl.cpp``)
and what the plugin does about them:

* ``import torch_mlu`` renames torch's private device to ``mlu``, registers
  ``torch.mlu`` and the ``"cncl"`` backend;
* CNCL maps int8, uint8, int32, int64, float16, float32, bfloat16 and bool;
  float64 is handed to CNCL *as float32* (half the bytes, wrong values) and
  other dtypes are refused: those tensors move as raw bytes and reduce
  locally after an all_gather;
* reductions take sum, product, min, max (``band``/``bor``/``bxor`` raise
  "Cannot use ReduceOp.BAND with CNCL"); the rest reduce locally;
* older torch_mlu raises "Not supported yet" for gather and scatter: the
  plugin gathers with all_gather and keeps the result on ``dst``, and
  scatters with a broadcast each rank keeps its part of, on every version.
"""

from __future__ import annotations

from commlib.hookspecs import hookimpl
from commlib_backends.accelerator import AcceleratorBackend
from commlib_backends.engine_gaps import STANDARD_DTYPES

# float64 is not among them: CNCL would send it as float32
_MOVES = STANDARD_DTYPES


class CnclBackend(AcceleratorBackend):
    """CNCL on the current Cambricon MLU."""

    name = "cncl"
    torch_backend = "cncl"
    device_type = "mlu"
    description = "Cambricon MLU collectives (torch_mlu CNCL)"
    vendor_package = "torch_mlu"
    vendor_attr = "mlu"
    device_label = "MLU"
    wire_dtypes = _MOVES
    reduce_dtypes = _MOVES
    native_gather = False
    native_scatter = False  # older torch_mlu raises "Not supported yet"


@hookimpl
def commlib_backends():
    return [CnclBackend]
