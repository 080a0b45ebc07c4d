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

After a failure (facts from torch's ``distributed_c10d`` and ProcessGroupNCCL):

* ranks passing different sizes hang or compute garbage (NCCL has no size
  check); the hang ends at the process group's timeout, where torch's
  watchdog (``TORCH_NCCL_ASYNC_ERROR_HANDLING``, by default 3) tears the
  process down. commlib sets that timeout per call to the communicator's;
* ``ProcessGroup.abort()`` is ``ncclCommAbort``: it ends pending kernels;
* ``torch.distributed.shrink_group`` (in torch 2.13, with NCCL >= 2.27 where
  the backend reports ``supports_shrinking``) shrinks the communicator in
  place (``ncclCommShrink``, aborting what is pending): the plugin uses it,
  and leaves the broken communicator un-aborted until then, since an
  aborted one cannot shrink. Not with NCCL >= 2.31.2: torch 2.13 then
  destroys the parent communicator after shrinking, and NCCL's destroy waits
  for the excluded ranks, which never come (pytorch/pytorch#194679). Without
  it, the survivors' new group is a new NCCL communicator made through the
  store, unless the world was started with ``device_id`` (its groups are
  split from the world's, which needs every rank): then shrink says it
  cannot;
* ``Work.wait(timeout)`` aborts the communicator in blocking-wait mode, so
  waits are not sliced (``interruptible_wait`` stays false).

torch 2.14 adds a second NCCL engine, nccl2 (``ProcessGroupNCCL2``), which
``"nccl"`` means with ``TORCH_DIST_USE_NCCL2=1``, and torch 2.15 by default
(``torch_build.nccl_engine``). nccl2 binds one device to a group when it
starts: without ``device_id`` it guesses one from the rank, which puts two
ranks on one GPU when ranks do not map to devices 1:1 ("Duplicate GPU
detected"). The plugin names the engine it got (:meth:`NcclBackend.engine`)
and, for nccl2, starts the world with ``device_id`` set to this process's
current device (chosen from ``LOCAL_RANK`` before, as for the legacy engine).
"""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist

from commlib import _torch_facts as torch_facts
from commlib.hookspecs import hookimpl
from commlib_backends.accelerator import AcceleratorBackend
from commlib_backends.engine_gaps import STANDARD_DTYPES
from commlib_backends.torch_build import nccl_engine

_MOVES = STANDARD_DTYPES | {torch.float64}
# ncclCommShrink appeared in 2.27; from 2.31.2 torch 2.13's shrink_group hangs
_SHRINK_FROM, _SHRINK_HANGS_FROM = (2, 27, 0), (2, 31, 2)


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

    def engine(self, group: Any = None) -> str:
        """The NCCL engine serving ``group`` (``None``: the one a new world gets).

        ``"nccl2"`` (torch's ProcessGroupNCCL2) or ``"nccl"`` (the legacy
        ProcessGroupNCCL), read from the group's CUDA backend where it has one.

        Examples:
            >>> commlib.plugins.resolve_backend("nccl").engine() in ("nccl", "nccl2")
            True
        """
        if group is not None:
            try:
                found = torch_facts.group_backend(group, torch.device(self.device_type))
                return "nccl2" if "NCCL2" in type(found).__name__ else "nccl"
            except Exception:  # no CUDA part in this group, or no such method
                pass
        return nccl_engine()

    def init_process_group(self, **kwargs: Any) -> None:
        """Start the world; on nccl2, bound to this process's CUDA device (``device_id``).

        Examples:
            >>> commlib.plugins.resolve_backend("nccl").init_process_group()  # doctest: +SKIP
        """
        if "device_id" not in kwargs and self.engine() == "nccl2":
            device = self.accelerator_device()
            if device.type == self.device_type:  # not a simulated device in host memory
                kwargs["device_id"] = device
        super().init_process_group(**kwargs)

    def can_shrink(self, group: Any) -> bool:
        """Whether torch and NCCL here shrink ``group``'s communicator in place.

        Examples:
            >>> commlib.plugins.resolve_backend("nccl").can_shrink(None)  # no group here
            False
        """
        if not torch_facts.SHRINK_GROUP or group is None:
            return False
        try:
            version = tuple(torch.cuda.nccl.version())
            if not _SHRINK_FROM <= version < _SHRINK_HANGS_FROM:
                return False
            engine = torch_facts.group_backend(group, torch.device(self.device_type))
            return bool(engine.supports_shrinking)
        except Exception:  # no NCCL here, no NCCL part in this group, or an older torch
            return False

    def abort(self, group: Any) -> None:
        """``ncclCommAbort``, unless shrink_group will need the communicator (it aborts it)."""
        if not self.can_shrink(group):
            super().abort(group)

    def shrink_group(
        self, group: Any, keep: Sequence[int], name: str, timeout: datetime.timedelta
    ) -> Any:
        """``torch.distributed.shrink_group`` where it works; a new communicator otherwise."""
        gone = [r for r in range(self.world_size(group)) if r not in keep]
        if gone and self.can_shrink(group):
            flags = dist.distributed_c10d.SHRINK_ABORT
            return dist.shrink_group(gone, group=group, shrink_flags=flags)
        world = dist.group.WORLD
        if world is not None and getattr(world, "bound_device_id", None) is not None:
            raise NotImplementedError(
                "this torch/NCCL has no shrink_group (torch >= 2.10, NCCL >= 2.27), and the "
                "world was started with device_id, so new groups split from the world's "
                "communicator, which needs every rank: restart the job instead"
            )
        return super().shrink_group(group, keep, name, timeout)


@hookimpl
def commlib_backends():
    return [NcclBackend]
