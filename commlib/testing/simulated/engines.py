"""Simulated collective engines: the vendor's torch.distributed backend, run by gloo.

* ``hccl`` / ``cncl`` are registered the way torch_npu / torch_mlu register
  them, ``Backend.register_backend(name, creator, devices=[...])``, with a
  creator that returns a ``ProcessGroupGloo``;
* ``nccl`` is built into torch and its name cannot be registered again (torch
  dispatches it before any registered backend), so the simulation stands in
  for torch's NCCL build instead: ``is_nccl_available()`` answers yes and
  ``ProcessGroupNCCL`` is a ``ProcessGroupGloo`` subclass.

The simulated "device" tensors are CPU tensors, so every engine also serves
the ``cpu`` device.
"""

from __future__ import annotations

import datetime
from typing import Any

import torch.distributed as dist

from commlib._torch_facts import TorchInternalMissing, registered_backends

try:
    from torch.distributed import ProcessGroupGloo
except ImportError:  # pragma: no cover - torch without gloo
    ProcessGroupGloo = None  # type: ignore[assignment,misc]


def gloo_engine(store: Any, rank: int, size: int, timeout: datetime.timedelta) -> Any:
    """A ``Backend.register_backend`` creator whose collectives gloo performs.

    Examples:
        >>> devices = ["npu", "cpu"]          # as torch_npu registers HCCL, for good:
        >>> dist.Backend.register_backend("hccl", gloo_engine, devices=devices)  # doctest: +SKIP
    """
    return ProcessGroupGloo(store, rank, size, timeout)


class _NcclOptions:
    """What torch sets on ``ProcessGroupNCCL.Options`` before creating a group."""

    def __init__(self) -> None:
        self._timeout = datetime.timedelta(minutes=10)
        self.is_high_priority_stream = False
        self.global_ranks_in_group: list[int] = []
        self.group_name = ""


if ProcessGroupGloo is not None:

    class SimulatedProcessGroupNCCL(ProcessGroupGloo):
        """torch's NCCL process group, played by gloo."""

        Options = _NcclOptions  # type: ignore[assignment]
        uid = -1

        def __init__(self, store: Any, rank: int, size: int, options: Any = None):
            timeout = getattr(options, "_timeout", None) or datetime.timedelta(minutes=10)
            super().__init__(store, rank, size, timeout)

        def _group_start(self) -> None:
            pass

        def _group_end(self) -> None:
            pass


def register_vendor_engine(name: str, device_type: str) -> None:
    """Register ``name`` as the torch.distributed backend for ``device_type`` (and cpu).

    Examples:
        >>> register_vendor_engine("hccl", "npu")   # for good  # doctest: +SKIP
        >>> dist.get_default_backend_for_device("npu")   # doctest: +SKIP
        'hccl'
    """
    if name.upper() not in registered_backends():
        dist.Backend.register_backend(name, gloo_engine, devices=[device_type, "cpu"])
    setattr(dist, f"is_{name}_available", lambda: True)


def stand_in_for_nccl() -> None:
    """Make this torch's ``"nccl"`` backend exist, played by gloo.

    Examples:
        >>> stand_in_for_nccl()                     # for good  # doctest: +SKIP
        >>> dist.is_nccl_available()                # doctest: +SKIP
        True
    """
    c10d = dist.distributed_c10d
    if not hasattr(c10d, "_NCCL_AVAILABLE"):  # the one private name this stand-in sets
        raise TorchInternalMissing("distributed_c10d._NCCL_AVAILABLE", "simulated NCCL")
    c10d._NCCL_AVAILABLE = True
    # torch's nccl creator reads the module's ProcessGroupNCCL when a group starts
    c10d.ProcessGroupNCCL = SimulatedProcessGroupNCCL  # type: ignore[misc,assignment]
    dist.Backend.backend_capability["nccl"] = ["cuda", "cpu"]
