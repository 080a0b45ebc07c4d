"""Simulated accelerators, so the nccl, hccl and cncl plugins run in CI without hardware.

What is simulated is what sits *below* a plugin: the vendor package
(``torch_npu``, ``torch_mlu`` or torch's own CUDA runtime), its device
runtime (device count, current device, ``set_device``) and its
torch.distributed engine, which gloo plays (see
:mod:`~commlib.testing.simulated.engines`). Everything above, the plugin's
availability check, device selection, ``torch.accelerator`` or vendor-module
choice, backend selection and all of its collectives, is the real code path.

The one liberty: "device memory" is host memory. :func:`install` registers a
subclass of the real plugin (``replace=True``) whose only change is that
:meth:`~commlib_backends.accelerator.AcceleratorBackend.accelerator_device` is
the CPU, and whose dtype facts are narrowed to what gloo, the engine standing
in, can do. No flag in production code tells a simulation from hardware.

Install it in each rank before the process group starts, through the
:class:`~commlib.testing.World` ``setup=`` hook:

Examples:
    >>> from commlib.testing import World, simulated
    >>> setup = simulated.setup("hccl", devices=4)
    >>> with World(3, backend="hccl", setup=setup) as world:   # doctest: +SKIP
    ...     world.run(fn)

Installing changes torch process-wide for good (a private device can be
renamed only once per process), so install it in worker processes, not in a
test session's main process.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from commlib._torch_facts import register_device_module
from commlib.backend import Backend
from commlib.plugins import register_backend, resolve_backend
from commlib.testing.simulated.devices import (
    SimulatedDevices,
    built_accelerator,
    hide_accelerator,
    patch_accelerator,
    patch_module,
    register_private_hooks,
    vendor_package,
)
from commlib.testing.simulated.engines import register_vendor_engine, stand_in_for_nccl

__all__ = [
    "KINDS",
    "SimulatedDevices",
    "install",
    "installed",
    "setup",
    "setup_cncl",
    "setup_hccl",
    "setup_nccl",
    "simulated_plugin",
]

# the accelerator backends commlib ships; their facts (device type, vendor
# package and module) are read from the plugin classes themselves
KINDS = ("nccl", "hccl", "cncl")

_installed: dict[str, SimulatedDevices] = {}


def install(
    kind: str,
    devices: int = 4,
    current: int = 0,
    accelerator_api: bool = False,
) -> SimulatedDevices:
    """Simulate the accelerator behind backend ``kind`` in this process.

    Args:
        kind: ``"nccl"``, ``"hccl"`` or ``"cncl"``.
        devices: how many devices are visible (0: none, as on a machine
            without the accelerator).
        current: the device made current before commlib runs, as a user's
            own ``set_device`` call would.
        accelerator_api: for ``nccl``, also make ``torch.accelerator`` serve
            CUDA (npu and mlu always go through it, as with the real
            packages on a torch that has it). Without it ``torch.accelerator``
            serves no device, on a CUDA build too (as on the CPU build).

    Returns:
        The device state, for assertions (``history`` of ``set_device`` calls).

    Examples:
        >>> # in a rank or a subprocess: it changes torch for good
        >>> devs = install("cncl", devices=2)   # doctest: +SKIP
        >>> import torch_mlu                    # doctest: +SKIP
        >>> torch.mlu.device_count(), dist.get_default_backend_for_device("mlu")  # doctest: +SKIP
        (2, 'cncl')
    """
    if kind not in KINDS:
        raise ValueError(f"cannot simulate {kind!r}; simulated backends: {sorted(KINDS)}")
    if kind in _installed:
        return _installed[kind]
    real: Any = type(resolve_backend(kind))  # an AcceleratorBackend subclass
    state = SimulatedDevices(real.device_type, devices, current)
    if real.vendor_package is None:  # built into torch: CUDA
        patch_module(getattr(torch, real.vendor_attr), state)
        stand_in_for_nccl()
        if accelerator_api:
            patch_accelerator(state, whole=True)
        elif built_accelerator() is not None:
            # a CUDA build: its torch.accelerator would reach the CUDA driver
            hide_accelerator()
    else:
        # what `import torch_npu` / `import torch_mlu` does to torch
        pkg = vendor_package(real.vendor_package, real.vendor_attr, state)
        torch.utils.rename_privateuse1_backend(real.device_type)
        register_device_module(real.device_type, getattr(pkg, real.vendor_attr))
        register_private_hooks(state)
        # torch's CPU build now serves the renamed device through torch.accelerator, as
        # with the real package; a CUDA build still serves CUDA there, so answer for it
        patch_accelerator(state, whole=built_accelerator() != real.device_type)
        register_vendor_engine(kind, real.device_type)
    assert dist.is_backend_available(kind)
    register_backend(simulated_plugin(real), replace=True)
    _installed[kind] = state
    return state


def simulated_plugin(real: Any) -> type[Backend]:
    """``real``'s plugin with host memory for device memory, limited to gloo's dtypes.

    The real library may reduce or move a dtype that gloo cannot (HCCL reduces
    int16); the plugin must then supply it, exactly as for the vendor's own gaps.
    How the engine fails is gloo's too (a size mismatch aborts, waits can be
    sliced), since gloo is the engine underneath.

    Examples:
        >>> cls = simulated_plugin(type(resolve_backend("hccl")))
        >>> cls.name, cls().accelerator_device()
        ('hccl', device(type='cpu'))
    """
    gloo: Any = resolve_backend("gloo")  # an EngineGaps: it states its dtype facts

    def accelerator_device(self: Backend) -> torch.device:
        return torch.device("cpu")

    return type(
        f"Simulated{real.__name__}",
        (real,),
        {
            "__doc__": f"{real.__name__} over simulated devices (host memory, gloo engine).",
            "__module__": __name__,
            "accelerator_device": accelerator_device,
            "wire_dtypes": real.wire_dtypes & gloo.wire_dtypes,
            "reduce_dtypes": real.reduce_dtypes & gloo.reduce_dtypes,
            "mismatch_aborts": gloo.mismatch_aborts,
            "interruptible_wait": gloo.interruptible_wait,
            "p2p_timeout_ends_group": gloo.p2p_timeout_ends_group,
        },
    )


def installed(kind: str) -> SimulatedDevices | None:
    """The device state :func:`install` created for ``kind`` in this process.

    Examples:
        >>> print(installed("hccl"))            # not installed in this process
        None
        >>> installed("hccl").history           # after install("hccl", ...)  # doctest: +SKIP
        [1]
    """
    return _installed.get(kind)


def _setup_rank(kind: str, options: dict, rank: int, size: int) -> None:
    install(kind, **options)


def setup(kind: str, **options: object) -> Callable[[int, int], None]:
    """A picklable ``setup(rank, size)`` for :class:`~commlib.testing.World`: installs ``kind``.

    Examples:
        >>> from commlib.testing import World
        >>> world = World(2, backend="nccl", setup=setup("nccl", devices=2))  # starts on use
    """
    return functools.partial(_setup_rank, kind, dict(options))


def setup_nccl(rank: int, size: int) -> None:
    """Install simulated CUDA + NCCL (for ``--commlib-setup``).

    Examples:
        $ pytest --commlib-backend nccl --commlib-setup commlib.testing.simulated:setup_nccl
    """
    install("nccl", devices=max(size, 1))


def setup_hccl(rank: int, size: int) -> None:
    """Install simulated torch_npu + HCCL (for ``--commlib-setup``).

    Examples:
        $ pytest --commlib-backend hccl --commlib-setup commlib.testing.simulated:setup_hccl
    """
    install("hccl", devices=max(size, 1))


def setup_cncl(rank: int, size: int) -> None:
    """Install simulated torch_mlu + CNCL (for ``--commlib-setup``).

    Examples:
        $ pytest --commlib-backend cncl --commlib-setup commlib.testing.simulated:setup_cncl
    """
    install("cncl", devices=max(size, 1))
