"""What the accelerator plugins (``nccl``, ``hccl``, ``cncl``) share.

Each vendor plugin states facts about its library (which reduce ops and dtypes
it handles, whether it has ``gather``) and :class:`AcceleratorBackend` turns
them into behaviour:

* the device runtime: ``torch.accelerator`` when the installed torch has it and
  it serves this device type, the vendor module (``torch.cuda``, ``torch.npu``,
  ``torch.mlu``) otherwise;
* device selection: the current device, set from ``LOCAL_RANK`` at init when
  the user has not chosen one;
* what the library lacks is supplied here: reductions it cannot do run as an
  all_gather plus a local reduction (exact, in rank order); dtypes it cannot
  move travel as raw bytes; ``gather`` without a native one is an all_gather
  kept on ``dst``, ``scatter`` without one a broadcast each rank keeps its
  part of; point-to-point batches are posted as one group; ``barrier`` is an
  all_reduce of one element on this process's own device (never a device
  guessed from the rank).

A simulated accelerator (:mod:`commlib.testing.simulated`) is a subclass of
the vendor plugin that keeps "device memory" in host memory: it overrides
:meth:`AcceleratorBackend.accelerator_device`, everything else is this code.
"""

from __future__ import annotations

import datetime
import functools
import importlib
import warnings
from collections.abc import Sequence
from types import ModuleType
from typing import Any, ClassVar

import torch
import torch.distributed as dist

from commlib.backend import Backend, WorkList, global_rank
from commlib.errors import BackendUnavailableError
from commlib.types import DirectCall, Group, P2PRequest
from commlib_backends.engine_gaps import EngineGaps


class DeviceRuntime:
    """The few runtime calls a plugin needs: count, current index, set index.

    Built over ``torch.accelerator`` or over a vendor module; both expose the
    same four answers here.

    Examples:
        >>> rt = DeviceRuntime("cuda", torch.cuda, via_accelerator=False)
        >>> rt.device_count()                   # a machine with 8 GPUs  # doctest: +SKIP
        8
    """

    def __init__(self, device_type: str, vendor: ModuleType, via_accelerator: bool):
        self.device_type = device_type
        self.vendor = vendor
        self.via_accelerator = via_accelerator

    def device_count(self) -> int:
        """How many devices of this type the process sees."""
        if self.via_accelerator:
            return int(torch.accelerator.device_count())
        return int(self.vendor.device_count())

    def current_index(self) -> int:
        """Index of the current device."""
        if self.via_accelerator:
            return int(torch.accelerator.current_device_index())
        return int(self.vendor.current_device())

    def synchronize(self, index: int) -> None:
        """Wait for the work queued on device ``index``."""
        if self.via_accelerator:
            torch.accelerator.synchronize(index)
        else:
            self.vendor.synchronize(index)

    def set_index(self, index: int) -> None:
        """Make device ``index`` current."""
        if self.via_accelerator:
            torch.accelerator.set_device_index(index)
        else:
            self.vendor.set_device(index)

    def __repr__(self) -> str:
        via = "torch.accelerator" if self.via_accelerator else self.vendor.__name__
        return f"<DeviceRuntime {self.device_type} via {via}>"


def _accelerator_serves(device_type: str) -> bool:
    """Whether ``torch.accelerator`` exists here and is ``device_type``'s runtime."""
    accel = torch.accelerator
    try:
        current = accel.current_accelerator()
        return current is not None and current.type == device_type and accel.is_available()
    except Exception:  # a half-registered privateuse1 device must not break selection
        return False


class _HostHeld:
    """A barrier's all_reduce (``issue``) whose wait holds the host until the device did it.

    A lane's work is waited for as torch's blocking calls are (``Work.wait()``:
    on a device, the stream waits, not the host); a barrier is the host's, so
    the wait then reads ``token`` back, as torch's own barrier synchronizes
    its stream. A hang ends at the engine's own timeout, as for every call
    on the device.
    """

    __slots__ = ("issue", "token")

    def __init__(self, issue: Any, token: torch.Tensor):
        self.issue, self.token = issue, token

    def __call__(self, options: Any) -> _HeldWork:
        # no issue: a group of one, where the all_reduce is the identity and the host
        # still waits for the device, as torch's barrier does on a group of one
        return _HeldWork(None if self.issue is None else self.issue(options), self.token)


class _HeldWork:
    """The barrier's work: ``wait()`` returns once the device has done it."""

    __slots__ = ("token", "work")

    def __init__(self, work: Any, token: torch.Tensor):
        self.work, self.token = work, token

    def wait(self, timeout: datetime.timedelta | None = None) -> bool:
        if self.work is None:
            pass
        elif timeout is None:
            self.work.wait()
        else:
            self.work.wait(timeout)
        self.token.item()  # after the all_reduce on this stream: the host waits for it
        return True


class AcceleratorBackend(EngineGaps):
    """Base of the vendor plugins; a subclass states its library's facts.

    Class attributes (besides :class:`~commlib.Backend`'s):

    * ``vendor_package``: the package that adds the device to torch
      (``"torch_npu"``), or ``None`` when torch has it built in (CUDA);
    * ``vendor_attr``: the device module's attribute on ``torch`` (``"npu"``);
    * ``device_label``: how messages name the device (``"NPU"``);
    * ``reduce_ops`` / ``reduce_dtypes``: what the library reduces itself;
    * ``wire_dtypes``: what it moves at all (others travel as bytes);
    * ``native_gather`` / ``native_scatter``: whether its ``gather`` /
      ``scatter`` may be called.

    Examples:
        >>> class Xccl(AcceleratorBackend):
        ...     name = torch_backend = "xccl"
        ...     device_type = vendor_attr = "xpu"
        ...     device_label = "XPU"
    """

    vendor_package: ClassVar[str | None] = None
    vendor_attr: ClassVar[str] = ""
    device_label: ClassVar[str] = ""
    reduce_ops: ClassVar[frozenset[str]] = frozenset({"sum", "product", "min", "max"})
    native_avg = False  # sum-and-divide: the same result on every vendor and version
    # the vendor libraries' fast path; p2p would need a communicator per peer pair
    large_payload_transport = "collective"
    # the CPU backend of a multi-device group ("gloo" in "cpu:gloo,cuda:nccl")
    cpu_part: str | None = None
    # a mismatch hangs or gives wrong results in these libraries (the hang ends
    # at the engine's timeout) rather than ending the process at once, and a
    # device-side check would cost a host synchronisation per call: unchecked
    # by default, strict=True checks
    mismatch_aborts = False

    # -- availability --------------------------------------------------------------
    def vendor_module(self) -> ModuleType:
        """The device module (``torch.cuda``, ``torch.npu``, ...), importing its package.

        Examples:
            >>> hccl = commlib.plugins.resolve_backend("hccl")
            >>> hccl.vendor_module()   # with torch_npu  # doctest: +SKIP
            <module 'torch_npu.npu' ...>
        """
        if self.vendor_package is not None:
            importlib.import_module(self.vendor_package)
        module = getattr(torch, self.vendor_attr, None)
        if module is None:
            raise BackendUnavailableError(
                f"{self.vendor_package or 'torch'} did not register torch.{self.vendor_attr}"
            )
        return module

    def unavailable_reason(self) -> str | None:
        """The first missing piece: vendor package, torch's engine, a visible device.

        Examples:
            >>> commlib.plugins.resolve_backend("cncl").unavailable_reason()
            'torch_mlu is not installed'
        """
        if self.vendor_package is not None:
            try:
                importlib.import_module(self.vendor_package)
            except ModuleNotFoundError as exc:
                if exc.name == self.vendor_package:
                    return f"{self.vendor_package} is not installed"
                return f"{self.vendor_package} failed to import: {exc}"
            except Exception as exc:  # a broken vendor install must not break `commlib info`
                return f"{self.vendor_package} failed to import: {type(exc).__name__}: {exc}"
        if not dist.is_available():
            return "torch was built without torch.distributed"
        engine = type(self).torch_backend or ""
        if not dist.is_backend_available(engine):
            if self.vendor_package is None:
                return f"torch was built without {engine.upper()}"
            return (
                f"{self.vendor_package} did not register the {engine!r} backend "
                "with torch.distributed"
            )
        try:
            count = self.runtime().device_count()
        except Exception as exc:
            return f"{self.device_label} runtime failed: {type(exc).__name__}: {exc}"
        if count < 1:
            return f"no {self.device_label} device visible"
        return None

    # -- devices -------------------------------------------------------------------
    def runtime(self) -> DeviceRuntime:
        """The runtime this plugin selects devices through.

        ``torch.accelerator`` where the installed torch has it and it serves
        this device type; the vendor module otherwise.

        Examples:
            >>> nccl = commlib.plugins.resolve_backend("nccl")
            >>> nccl.runtime()   # a CUDA build of torch  # doctest: +SKIP
            <DeviceRuntime cuda via torch.accelerator>
        """
        vendor = self.vendor_module()
        cached = self.__dict__.get("_runtime")
        if cached is None or cached.vendor is not vendor:
            cached = DeviceRuntime(self.device_type, vendor, _accelerator_serves(self.device_type))
            self.__dict__["_runtime"] = cached
        return cached

    def accelerator_device(self) -> torch.device:
        """This process's current accelerator device (e.g. ``cuda:1``).

        Examples:
            >>> nccl = commlib.plugins.resolve_backend("nccl")
            >>> nccl.accelerator_device()   # GPU rank 1  # doctest: +SKIP
            device(type='cuda', index=1)
        """
        return self.current_device()

    def waits_on_stream(self) -> bool:
        """On a device (not a simulated one): torch's blocking wait orders the stream.

        Seen on NCCL (an H200, torch 2.11): ``Work.wait(timeout)`` blocked the host
        until the GPU finished, 1 ms at a time; HCCL and CNCL mirror its ``Work``.

        Examples:
            >>> commlib.plugins.resolve_backend("nccl").waits_on_stream()  # GPU  # doctest: +SKIP
            True
        """
        return self.accelerator_device().type == self.device_type

    def current_device(self) -> torch.device:
        """The current device of this type (e.g. ``cuda:1``).

        Examples:
            >>> nccl = commlib.plugins.resolve_backend("nccl")
            >>> nccl.current_device()   # GPU rank 1  # doctest: +SKIP
            device(type='cuda', index=1)
        """
        return torch.device(self.device_type, self.runtime().current_index())

    def synchronize(self) -> None:
        """Wait for the work queued on this process's device.

        Examples:
            >>> nccl = commlib.plugins.resolve_backend("nccl")
            >>> nccl.synchronize()      # with a GPU  # doctest: +SKIP
        """
        if self.accelerator_device().type == self.device_type:
            self.runtime().synchronize(self.accelerator_index())

    def default_priority(self) -> int | None:
        """10 while a device is visible: an accelerator serves its machine before gloo.

        Examples:
            >>> nccl = commlib.plugins.resolve_backend("nccl")
            >>> nccl.default_priority()  # a GPU visible  # doctest: +SKIP
            10
        """
        return 10 if self.unavailable_reason() is None else None

    def device(self) -> torch.device:
        """Where commlib's own buffers live: the accelerator, or the CPU on a
        multi-device group (see :meth:`for_group`)."""
        if self.cpu_part is not None:
            return torch.device("cpu")
        return self.accelerator_device()

    def to_device(self, tensor: torch.Tensor) -> torch.Tensor:
        if self.cpu_part is not None and (
            tensor.device.type == "cpu" or tensor.device == self.accelerator_device()
        ):
            return tensor  # torch routes it to the group's backend for its device
        return super().to_device(tensor)

    def accelerator_index(self) -> int:
        """Index of the device this process's collectives use.

        Examples:
            >>> nccl = commlib.plugins.resolve_backend("nccl")
            >>> nccl.accelerator_index()   # GPU rank 1  # doctest: +SKIP
            1
        """
        return self.runtime().current_index()

    def setup_device(self, local_rank: int) -> None:
        """Make device ``local_rank`` (modulo the device count) current.

        A device the user already made current (any but 0) is kept.

        Examples:
            >>> plugin = commlib.plugins.resolve_backend("nccl")
            >>> plugin.setup_device(int(os.environ["LOCAL_RANK"]))   # torchrun  # doctest: +SKIP
        """
        reason = self.unavailable_reason()
        if reason is not None:
            raise BackendUnavailableError(f"backend {self.name!r} cannot run here: {reason}")
        runtime = self.runtime()
        count = runtime.device_count()
        if runtime.current_index() != 0:
            return  # the user chose one; index 0 is what an untouched runtime reports
        if local_rank >= count:
            warnings.warn(
                f"local rank {local_rank} shares {self.device_label} {local_rank % count} with "
                f"another rank: only {count} device(s) are visible",
                stacklevel=2,
            )
        runtime.set_index(local_rank % count)

    def barrier(self, group: Any, timeout: datetime.timedelta | None = None) -> None:
        """One-element all_reduce on this process's own device.

        torch's barrier on NCCL guesses the device from the rank when none is
        bound, which hangs or warns when ranks do not map to devices 1:1.
        """
        token = torch.ones(1, dtype=torch.float32, device=self.device())
        work = super().all_reduce(token, "sum", group, async_op=True)
        if work is None:
            return
        if timeout is None:
            work.wait()
        else:
            work.wait(timeout)

    def direct_call(self, collective: str, group: Group, **key: Any) -> DirectCall | None:
        """The engine's own calls (:class:`EngineGaps`); ``barrier``: its all_reduce's.

        :meth:`barrier` is a one-element all_reduce: its lane is that
        all_reduce's, on a zero token made once on :meth:`device` (as the
        engine's own device is fixed when a communicator starts), so a call
        issues one engine call and allocates nothing. Where the engine's
        blocking wait orders the stream alone (:meth:`waits_on_stream`: a
        real device), the lane's wait then reads the token back, which holds
        the host until the device has done the all_reduce, as torch's own
        barrier synchronizes its stream (:meth:`barrier` holds it with a
        timed wait); on a group of one, where the all_reduce is the identity
        and nothing is issued, the lane still reads the token back.

        Examples:
            >>> nccl = commlib.plugins.resolve_backend("nccl")
            >>> nccl.direct_call("barrier", group)  # a group of 2 GPUs  # doctest: +SKIP
            DirectCall(call=functools.partial(<bound method ProcessGroup.allreduce ...>, ...)
        """
        if collective != "barrier":
            return super().direct_call(collective, group, **key)
        found = super().direct_call("all_reduce", group, op="sum", dtype=torch.float32)
        if found is None or not found.min_bytes <= 4 <= found.max_bytes:
            return None
        held = self.cpu_part is None and self.waits_on_stream()
        if found.call is None and not held:
            return found  # a group of one: the identity
        # zeros: their sum stays zero whatever the number of calls
        token = torch.zeros(1, dtype=torch.float32, device=self.device())
        issue = None if found.call is None else functools.partial(found.call, [token])
        if held:  # a group of one too: torch's barrier waits for the device there as well
            return found._replace(call=_HostHeld(issue, token))  # type: ignore[arg-type]
        return found._replace(call=issue)

    def batch_isend_irecv(
        self, requests: Sequence[P2PRequest], group: Any, async_op: bool = False
    ) -> WorkList | None:
        """Post every send and receive as one group (torch's ``batch_isend_irecv``).

        NCCL-style libraries deadlock on unbatched two-way send/recv. (The
        object collectives use collectives on these backends anyway: each
        peer pair would need a communicator of its own.)
        """
        ops = [
            dist.P2POp(
                dist.isend if r.kind == "send" else dist.irecv,
                self._wire(r.tensor),
                global_rank(group, r.peer),
                group,
                r.tag,
            )
            for r in requests
        ]
        return WorkList(dist.batch_isend_irecv(ops) if ops else []).result(async_op)

    # -- multi-device process groups ----------------------------------------------------
    def for_group(self, torch_backend: str) -> Backend:
        """This plugin for a group started with ``torch_backend`` (e.g. ``"cpu:gloo,cuda:nccl"``).

        On such a group commlib moves no user tensor: torch sends CPU tensors
        over the CPU backend and accelerator tensors over this one. commlib's
        own traffic (object collectives, argument checks, barrier) uses the
        CPU backend, as detectron2 does with its gloo group: it costs no
        device memory and no device synchronisation.

        Examples:
            >>> commlib.plugins.resolve_backend("nccl").for_group("cpu:gloo,cuda:nccl").device()
            device(type='cpu')
        """
        parts = dict(part.split(":", 1) for part in torch_backend.split(",") if ":" in part)
        if torch_backend == self.torch_backend or "cpu" not in parts:
            return self
        variant = object.__new__(type(self))
        variant.__dict__.update(self.__dict__)
        variant.torch_backend = torch_backend
        variant.cpu_part = parts["cpu"]
        return variant
