"""The lanes of an engine torch.distributed drives: the ProcessGroup's own methods.

:class:`~commlib.Backend`'s collective methods call torch.distributed's
functions (``dist.all_reduce``, ...). Each of those, past its checks (which
the Communicator has made already: validated arguments, contiguous tensors on
the plugin's device, ranks within the group, membership), calls one method of
the ProcessGroup with an options object and waits on its work. That call is
the collective's *lane* (:class:`~commlib.backend.DirectCall`):
:func:`process_group_lane` builds it once per key, and the engine issues it on
every later call that matches, past the Python layer both of commlib's method
and of torch's function. So every plugin whose method is the default one (the
base ``Backend``'s, ``EngineGaps``' where it passes through, the accelerators',
a plugin written as docs/plugins.md's minimum) gets the lane; a plugin that
overrides a method keeps its method called (``Engine.learn`` asks only where
the class that wrote ``direct_call`` derives from the one that wrote it).

What torch's function does besides that call, and what the lane does about it
(torch 2.13's ``distributed_c10d``; the same in the older torch supported):

* a tensor subclass with ``__torch_function__`` decides the call itself: the
  engine takes a lane for plain tensors only (``Engine.serves``);
* a group with an open ``_coalescing_manager`` collects the call instead of
  issuing it (on NCCL the manager then issues the batch as one coalesced
  NCCL group): ``unless_in`` names torch's coalescing state, and the plugin's
  method is called while the group is in it;
* a complex tensor travels as its real pairs: no lane for complex dtypes;
* an FP8 broadcast on CUDA travels as bytes: no lane serves FP8 on an
  accelerator (their ``wire_dtypes`` leave it out, so ``EngineGaps`` offers none);
* the device and stream: the function picks neither; it tells the
  ProcessGroup whether the call is blocking (``asyncOp``), and a blocking
  call on NCCL (torch >= 2.7) runs on the tensor's device's current stream
  (an async one on NCCL's own stream, joined back by ``wait``). A lane
  serves blocking calls only, with ``asyncOp=False`` as torch's function
  passes for them, so NCCL runs it where ``dist.all_reduce(t)`` would; the
  engine serves a lane only tensors on the plugin's device;
  ``barrier`` is the exception (torch guesses a device from the rank on an
  accelerator): its lane is offered on CPU engines only;
* torchcomms, where installed, may take a call over at any time: no lanes;
* a vendor package that replaced torch's function (``torch_npu`` patches
  some) changes what the default method does: no lane for that collective.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from commlib import _torch_facts as torch_facts
from commlib.types import DirectCall

if TYPE_CHECKING:
    from commlib.types import Group

#: torch's open coalescing managers, keyed by group (``None`` on a torch without them)
COALESCING = torch_facts.coalescing_groups()
#: whether torchcomms' mode may be switched on: then no call is decided once
TORCHCOMMS_INSTALLED = torch_facts.torchcomms_installed()
#: whether the options carry ``asyncOp`` (torch >= 2.7)
HAS_ASYNC_OP = torch_facts.OPTIONS_ASYNC_OP


def _method(*names: str) -> str | None:
    """The ProcessGroup method among ``names`` this torch has (it renamed some)."""
    return next((n for n in names if hasattr(dist.ProcessGroup, n)), None)


ALL_GATHER_SINGLE = _method("all_gather_single", "_allgather_base")
ALL_TO_ALL_SINGLE = _method("all_to_all_single", "alltoall_base")
REDUCE_SCATTER_SINGLE = _method("reduce_scatter_single", "_reduce_scatter_base")

# a lane serves blocking calls only (Engine.direct): its options say so, as torch's
# function's do for async_op=False; ProcessGroupNCCL (torch >= 2.7) then runs the
# collective on the caller's current stream, with no stream join and no tensor stash
_BLOCKING = False

# what torch's options take as a reduction (an op, or a premultiplied sum)
_TORCH_OPS = (dist.ReduceOp, dist.ReduceOp.RedOpType)

# the torch.distributed function the base Backend's method calls, per collective
# (the first this torch has)
_FUNCTIONS = {
    "all_reduce": ("all_reduce",),
    "broadcast": ("broadcast",),
    "reduce": ("reduce",),
    "barrier": ("barrier",),
    "scatter": ("scatter",),
    "send": ("isend",),
    "recv": ("irecv",),
    "all_gather_into_tensor": ("all_gather_single", "all_gather_into_tensor"),
    "reduce_scatter": ("reduce_scatter_single", "reduce_scatter_tensor"),
    "all_to_all": ("all_to_all",),
    "all_to_all_single": ("all_to_all_single",),
}


def torch_own(collective: str) -> bool:
    """Whether torch.distributed's function for ``collective`` is torch's own.

    ``False`` where a vendor package put its own in its place, or for a
    collective with no lane.

    Examples:
        >>> torch_own("all_reduce"), torch_own("gather")
        (True, False)
    """
    for name in _FUNCTIONS.get(collective, ()):
        function = getattr(dist, name, None)
        if function is not None:
            return getattr(function, "__module__", None) == c10d.__name__
    return False


def build_options(kind: Any, async_op: bool, **fields: Any) -> Any:
    """An options object of ``kind`` with ``fields`` set (and ``asyncOp``, where torch has it).

    Examples:
        >>> build_options(c10d.BroadcastOptions, _BLOCKING, rootRank=1).rootRank
        1
    """
    opts = kind()
    for name, value in fields.items():
        setattr(opts, name, value)
    if HAS_ASYNC_OP:
        opts.asyncOp = async_op
    return opts


def process_group_lane(
    plugin: Any, collective: str, group: Group, key: dict[str, Any], base: type[Any]
) -> DirectCall | None:
    """The ProcessGroup call torch.distributed's function makes for ``collective`` and ``key``.

    What :meth:`commlib.Backend.direct_call` returns by default (``plugin`` a
    Backend, ``base`` the class whose methods are the defaults: ``Backend``,
    handed in so this module stays below ``commlib.backend``); the options
    are built here, once per key. A group of one rank issues nothing for the
    reductions, broadcast and barrier (``call=None``); on a CPU engine its
    gathers and exchanges copy, in the plugin's methods (no lane), on an
    accelerator they take the engine's call as at any size. ``None`` where the
    default method does more than that one call (see the module's notes), or
    for a group that is not a ProcessGroup.

    Examples:
        >>> gloo = commlib.plugins.resolve_backend("gloo")
        >>> process_group_lane(gloo, "all_reduce", group, {"op": "sum"}, commlib.Backend)
        ... # doctest: +SKIP
        DirectCall(call=<bound method ProcessGroup.allreduce ...>, ...)
    """
    if collective == "all_gather_slots":
        # the default gathers the first row with all_gather_into_tensor: its lane,
        # where both methods are the default's
        cls = type(plugin)
        if key.get("apart") or cls.all_gather_slots is not base.all_gather_slots:
            return None
        if cls.all_gather_into_tensor is not base.all_gather_into_tensor:
            return None
        found = process_group_lane(plugin, "all_gather_into_tensor", group, {}, base)
        return None if found is None or found.call is None else found
    dtype = key.get("dtype")
    if TORCHCOMMS_INSTALLED or (dtype is not None and dtype.is_complex):
        return None
    if not torch_own(collective):
        return None
    pg = dist.GroupMember.WORLD if group is None else group
    if not isinstance(pg, dist.ProcessGroup):
        return None
    reduce_op = plugin.torch_reduce_op(key["op"]) if "op" in key else None
    if reduce_op is not None and not isinstance(reduce_op, _TORCH_OPS):
        # the plugin maps ops to another engine's (mpi4py's): its methods are not torch's
        return None
    alone = pg.size() == 1
    if collective in ("all_reduce", "reduce"):
        fields: dict[str, Any] = {"reduceOp": reduce_op}
        if collective == "reduce":
            fields["rootRank"] = key["dst"]
        kind = c10d.AllreduceOptions if collective == "all_reduce" else c10d.ReduceOptions
        call = None if alone else (pg.allreduce if collective == "all_reduce" else pg.reduce)
        return DirectCall(call, build_options(kind, _BLOCKING, **fields), unless_in=COALESCING)
    if collective == "broadcast":
        opts = build_options(c10d.BroadcastOptions, _BLOCKING, rootRank=key["src"], rootTensor=0)
        return DirectCall(None if alone else pg.broadcast, opts, unless_in=COALESCING)
    if collective == "barrier":
        # torch's own barrier on a CPU engine (on an accelerator torch picks a device)
        if type(plugin).barrier is not base.barrier or plugin.device_type != "cpu":
            return None
        opts = build_options(c10d.BarrierOptions, _BLOCKING, device=torch.device("cpu"))
        return DirectCall(None if alone else pg.barrier, opts, unless_in=COALESCING)
    if alone and plugin.device_type == "cpu":
        # a copy: the plugin's method (an accelerator's engine call is cheaper than its
        # method's async issue, and orders on the caller's stream)
        return None
    if collective == "scatter":
        opts = build_options(c10d.ScatterOptions, _BLOCKING, rootRank=key["src"])
        return DirectCall(pg.scatter, opts, unless_in=COALESCING)
    if collective in ("send", "recv"):
        return DirectCall(getattr(pg, collective), None, unless_in=COALESCING)
    if collective == "all_gather_into_tensor" and ALL_GATHER_SINGLE:
        opts = build_options(c10d.AllgatherOptions, _BLOCKING)
        return DirectCall(getattr(pg, ALL_GATHER_SINGLE), opts, unless_in=COALESCING)
    if collective == "reduce_scatter" and REDUCE_SCATTER_SINGLE:
        opts = build_options(c10d.ReduceScatterOptions, _BLOCKING, reduceOp=reduce_op)
        return DirectCall(getattr(pg, REDUCE_SCATTER_SINGLE), opts, unless_in=COALESCING)
    if collective == "all_to_all":
        opts = build_options(c10d.AllToAllOptions, _BLOCKING)
        return DirectCall(pg.alltoall, opts, unless_in=COALESCING)
    if collective == "all_to_all_single" and ALL_TO_ALL_SINGLE:
        opts = build_options(c10d.AllToAllOptions, _BLOCKING)
        return DirectCall(getattr(pg, ALL_TO_ALL_SINGLE), opts, unless_in=COALESCING)
    return None
