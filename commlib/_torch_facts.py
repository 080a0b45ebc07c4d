"""What the installed torch has: the one place where torch releases differ.

commlib supports torch >= 2.12 (:data:`FLOOR`), CPU and CUDA builds. Code
that depends on the release asks a fact here (``SET_TIMEOUT``,
``WORK_TIMEOUT_READ_ONLY``, ...), probed from torch itself rather than read
off its version number, so a backport or a nightly answers truly. Where
commlib must reach a private torch name, it goes through one guard here,
which names what is missing and on which torch when a release takes it away
(:class:`TorchInternalMissing`), instead of an ``AttributeError`` deep in a
collective.

Releases, as these facts were found (torch's PyPI wheels, run on CPU):

==========================  ======  ======  ======
fact                        2.12    2.13    2.14
==========================  ======  ======  ======
gloo list ``all_to_all``,   yes     yes     yes
``new_group(sort_ranks=)``,
``LaunchConfig(shutdown_
timeout=)`` (the floor)
``all_gather_single``       no      yes     yes
``set_timeout(t, group)``   no      no      yes
process-group hooks         no      no      yes
``init_process_group(       no      no      yes
enable_reconfigure=)``
``Work.timeout`` read-only  no      no      yes
``weights_only=`` on the    no      no      yes
object collectives
``gather_into_tensor``      no      no      yes
``torch.distributed.        no      no      yes
backends`` entry points
==========================  ======  ======  ======

Examples:
    >>> from commlib import _torch_facts as facts
    >>> facts.VERSION >= facts.FLOOR
    True
    >>> isinstance(facts.SET_TIMEOUT, bool)
    True
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable, MutableMapping
from typing import Any

import torch
import torch.distributed as dist

__all__ = [
    "ALL_GATHER_SINGLE",
    "BACKEND_ENTRY_POINTS",
    "FLOOR",
    "GATHER_INTO_TENSOR",
    "GROUP_HOOKS",
    "OBJECT_WEIGHTS_ONLY",
    "OPTIONS_ASYNC_OP",
    "RECONFIGURE",
    "RELEASE",
    "SET_TIMEOUT",
    "SHRINK_GROUP",
    "VERSION",
    "WORK_TIMEOUT_READ_ONLY",
    "TorchInternalMissing",
    "all_gather_single",
    "c10d_world",
    "coalescing_groups",
    "default_store",
    "fake_store",
    "group_backend",
    "group_map",
    "new_process_group_helper",
    "reduce_scatter_single",
    "register_device_module",
    "registered_backends",
    "set_timeout",
    "supported",
    "torchcomms_installed",
    "torchcomms_mode",
]

#: the oldest torch commlib supports: gloo's list ``all_to_all``, ``new_group(sort_ranks=)``
#: and ``LaunchConfig(shutdown_timeout=)`` arrive in 2.12 (2.4.1 lacks even ``asyncOp`` on
#: the collectives' option classes, which the direct calls set)
FLOOR = (2, 12)

#: ``torch.__version__`` as installed (``"2.14.1+cu130"``)
RELEASE: str = str(torch.__version__)


def _release(text: str) -> tuple[int, int, int]:
    numbers = [int(n) for n in re.findall(r"\d+", text.split("+")[0])[:3]]
    return tuple(([*numbers, 0, 0, 0])[:3])  # type: ignore[return-value]


#: the installed release as numbers, ``(2, 14, 1)``; for messages and the floor only
VERSION: tuple[int, int, int] = _release(RELEASE)


def _takes(fn: Any, name: str) -> bool:
    try:
        return name in inspect.signature(fn).parameters
    except (TypeError, ValueError):  # a C function without a signature
        return False


def _options_have_async_op() -> bool:
    try:
        from torch.distributed.distributed_c10d import BroadcastOptions

        return hasattr(BroadcastOptions(), "asyncOp")
    except ImportError:  # torch without torch.distributed
        return False


_DIST = dist.is_available()

#: ``torch.distributed.set_timeout(timeout, group)``, public from 2.14 (before it, the
#: group's own ``ProcessGroup.set_timeout``)
_public_set_timeout: Callable[..., None] | None = getattr(dist, "set_timeout", None)
SET_TIMEOUT: bool = _DIST and _public_set_timeout is not None

#: ``ProcessGroup.register_pre_hook`` / ``register_post_hook`` / ``register_abort_hook``
#: (2.14): torch calls them around every collective of any backend
GROUP_HOOKS: bool = _DIST and hasattr(dist.ProcessGroup, "register_pre_hook")

#: ``init_process_group(enable_reconfigure=True)`` and ``ProcessGroup.reconfigure`` (2.14)
RECONFIGURE: bool = _DIST and _takes(dist.init_process_group, "enable_reconfigure")

#: ``Work.timeout`` is a read-only property (2.14): a ``Work`` written in Python must
#: keep its own timeout under another name
WORK_TIMEOUT_READ_ONLY: bool = _DIST and isinstance(
    inspect.getattr_static(dist.Work, "timeout", None), property
)

#: the collectives' option classes take ``asyncOp`` (the direct calls set it)
OPTIONS_ASYNC_OP: bool = _DIST and _options_have_async_op()

#: ``all_gather_single`` / ``reduce_scatter_single`` (2.13 deprecates the ``_tensor`` names)
ALL_GATHER_SINGLE: bool = _DIST and hasattr(dist, "all_gather_single")

#: ``gather_into_tensor`` / ``gather_single`` (2.14)
GATHER_INTO_TENSOR: bool = _DIST and hasattr(dist, "gather_into_tensor")

#: ``weights_only=`` on torch's six object collectives (2.14); commlib's take it on every
#: supported torch (:mod:`commlib.serialization`)
OBJECT_WEIGHTS_ONLY: bool = _DIST and _takes(dist.all_gather_object, "weights_only")

#: ``torch.distributed.shrink_group`` (NCCL's in-place shrink)
SHRINK_GROUP: bool = _DIST and hasattr(dist, "shrink_group")

#: torch finds a backend by name through the entry-point group
#: ``torch.distributed.backends`` (2.14): ``init_process_group(name)`` / ``new_group``
#: load the entry point called ``name`` (case-insensitive) and call it with no arguments;
#: it must call ``Backend.register_backend(name, ...)`` (else RuntimeError). torch's own
#: gloo, nccl, nccl2, nccl-legacy, mpi, ucc and xccl register this way in 2.14.
BACKEND_ENTRY_POINTS: bool = _DIST and hasattr(dist.Backend, "_ensure_backend_registered")


def _flat(new: str, old: str) -> Callable[..., Any] | None:
    if not _DIST:
        return None
    return getattr(dist, new, None) or getattr(dist, old)


#: ``all_gather_single`` where torch has it (2.13 renamed it and warns on every call of
#: the old name), ``all_gather_into_tensor`` before
all_gather_single: Callable[..., Any] = _flat("all_gather_single", "all_gather_into_tensor")  # type: ignore[assignment]
#: ``reduce_scatter_single``, or ``reduce_scatter_tensor`` before 2.13
reduce_scatter_single: Callable[..., Any] = _flat("reduce_scatter_single", "reduce_scatter_tensor")  # type: ignore[assignment]


def set_timeout(group: Any, timeout: Any) -> None:
    """Give ``group``'s operations issued from now on ``timeout``.

    torch 2.14's public ``torch.distributed.set_timeout(timeout, group)`` (it
    also reaches every backend of a multi-device group); the group's own
    ``ProcessGroup.set_timeout`` before it.

    Examples:
        >>> set_timeout(group, datetime.timedelta(seconds=30))  # doctest: +SKIP
    """
    if _public_set_timeout is not None:
        _public_set_timeout(timeout, group)
    else:
        group.set_timeout(timeout)


def supported() -> bool:
    """Whether the installed torch is one commlib supports (:data:`FLOOR` or newer).

    Examples:
        >>> supported()
        True
    """
    return VERSION[:2] >= FLOOR


# -- private torch names, one guard each ----------------------------------------------------
class TorchInternalMissing(AttributeError):
    """A private torch name commlib relies on is not in the installed torch.

    An ``AttributeError`` (what reaching the name would have raised), whose
    message names the name, the torch release and what commlib needed it for.

    Examples:
        >>> raise TorchInternalMissing("c10d._world", "the group registry")
        Traceback (most recent call last):
        ...
        commlib._torch_facts.TorchInternalMissing: torch ... has no c10d._world (commlib ...
    """

    def __init__(self, name: str, purpose: str):
        super().__init__(
            f"torch {RELEASE} has no {name} (commlib uses this private name for {purpose}); "
            f"commlib is tested on torch {FLOOR[0]}.{FLOOR[1]} and newer"
        )
        self.torch_name = name


def _private(owner: Any, attr: str, label: str, purpose: str) -> Any:
    found = getattr(owner, attr, _MISSING)
    if found is _MISSING:
        raise TorchInternalMissing(label, purpose)
    return found


_MISSING = object()


def _c10d() -> Any:
    from torch.distributed import distributed_c10d

    return distributed_c10d


def c10d_world() -> Any:
    """torch's process-group registry (``distributed_c10d._world``).

    Examples:
        >>> c10d_world().pg_map is not None  # doctest: +SKIP
        True
    """
    return _private(_c10d(), "_world", "distributed_c10d._world", "the process-group registry")


def group_map() -> MutableMapping[Any, Any]:
    """Every live process group torch knows, to its ``(backend, store)``.

    Examples:
        >>> group in group_map()       # not yet destroyed  # doctest: +SKIP
        True
    """
    return _private(c10d_world(), "pg_map", "_world.pg_map", "the live process groups")


def coalescing_groups() -> Any:
    """The groups with an open ``_coalescing_manager`` (``_world.pg_coalesce_state``).

    ``None`` on a torch without it: no group is ever coalescing there.

    Examples:
        >>> group in coalescing_groups()   # inside torch's coalescing manager  # doctest: +SKIP
        True
    """
    return getattr(getattr(_c10d(), "_world", None), "pg_coalesce_state", None)


def torchcomms_installed() -> bool:
    """Whether torchcomms is installed (``distributed_c10d._TORCHCOMM_AVAILABLE``).

    Its mode may then be switched on at any time (no collective is decided once).

    Examples:
        >>> isinstance(torchcomms_installed(), bool)
        True
    """
    return bool(getattr(_c10d(), "_TORCHCOMM_AVAILABLE", False))


def torchcomms_mode() -> Callable[[], bool] | None:
    """torch's "is torchcomms' mode on" (``_use_torchcomms_enabled``), ``None`` without it.

    Examples:
        >>> mode = torchcomms_mode()
        >>> mode is None or mode() in (True, False)
        True
    """
    return getattr(_c10d(), "_use_torchcomms_enabled", None)


def default_store() -> Any:
    """The default group's store (``distributed_c10d._get_default_store()``).

    Examples:
        >>> default_store().set("key", "value")  # doctest: +SKIP
    """
    get = _private(
        _c10d(), "_get_default_store", "distributed_c10d._get_default_store", "the job's store"
    )
    return get()


def new_process_group_helper() -> Callable[..., Any]:
    """torch's group builder (``_new_process_group_helper``): a group of chosen ranks only.

    ``new_group`` needs every rank of the world; a shrink after a lost rank
    cannot have them.

    Examples:
        >>> build = new_process_group_helper()  # doctest: +SKIP
    """
    return _private(
        _c10d(),
        "_new_process_group_helper",
        "distributed_c10d._new_process_group_helper",
        "a group built without the lost ranks (shrink)",
    )


def group_backend(group: Any, device: torch.device) -> Any:
    """The engine serving ``device`` in ``group`` (``ProcessGroup._get_backend``).

    Examples:
        >>> type(group_backend(group, torch.device("cuda"))).__name__  # doctest: +SKIP
        'ProcessGroupNCCL'
    """
    get = _private(group, "_get_backend", "ProcessGroup._get_backend", "a group's engine")
    return get(device)


def registered_backends() -> MutableMapping[str, Any]:
    """The backends registered with torch by name (``Backend._plugins``, upper-case keys).

    Examples:
        >>> isinstance(registered_backends(), dict)
        True
    """
    return _private(dist.Backend, "_plugins", "Backend._plugins", "registered backends")


def fake_store() -> Any:
    """torch's fake process group's store class (``torch.testing._internal...FakeStore``).

    Raises ``ImportError`` where torch was built without its testing package.

    Examples:
        >>> fake_store()()  # doctest: +SKIP
    """
    from torch.testing._internal.distributed import fake_pg

    return _private(fake_pg, "FakeStore", "fake_pg.FakeStore", "commlib bench's fake world")


def register_device_module(device_type: str, module: Any) -> None:
    """Make ``torch.<device_type>`` ``module``, as a vendor package does at import.

    Examples:
        >>> register_device_module("npu", torch_npu.npu)  # for good  # doctest: +SKIP
    """
    register = _private(
        torch, "_register_device_module", "torch._register_device_module", "simulated devices"
    )
    register(device_type, module)
