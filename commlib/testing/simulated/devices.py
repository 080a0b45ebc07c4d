"""Simulated device runtimes: what ``torch.cuda`` / ``torch.npu`` / ``torch.mlu`` answer.

A :class:`SimulatedDevices` holds one process's device state (how many
devices are visible, which is current, every ``set_device`` call); the
vendor modules built here expose it under the names the real runtimes use.
"""

from __future__ import annotations

import sys
import types
from typing import Any

import torch


class SimulatedDevices:
    """One process's view of ``count`` devices of ``device_type``.

    Examples:
        >>> devs = SimulatedDevices("npu", 4)
        >>> devs.set_device(2)
        >>> devs.current_device(), devs.history
        (2, [2])
    """

    def __init__(self, device_type: str, count: int, current: int = 0):
        self.device_type = device_type
        self.count = count
        self.current = current
        self.history: list[int] = []

    def is_available(self) -> bool:
        return self.count > 0

    def device_count(self) -> int:
        return self.count

    def current_device(self) -> int:
        return self.current

    def set_device(self, device: Any) -> None:
        index = _index(device)
        if index < 0:
            return  # torch treats negative indices as "leave it"
        if index >= self.count:
            raise RuntimeError(
                f"invalid {self.device_type} device ordinal {index}: "
                f"{self.count} simulated device(s) visible"
            )
        self.current = index
        self.history.append(index)

    def __repr__(self) -> str:
        return f"<SimulatedDevices {self.device_type} x{self.count} current={self.current}>"


def _index(device: Any) -> int:
    if isinstance(device, int):
        return device
    if isinstance(device, str):
        device = torch.device(device)
    if isinstance(device, torch.device):
        return 0 if device.index is None else device.index
    raise TypeError(f"not a device: {device!r}")


def device_module(name: str, devices: SimulatedDevices) -> types.ModuleType:
    """A module with a vendor runtime's device calls, bound to ``devices``.

    Examples:
        >>> mod = device_module("torch_npu.npu", SimulatedDevices("npu", 2))
        >>> mod.device_count()
        2
    """
    module = types.ModuleType(name, f"simulated {devices.device_type} runtime (commlib.testing)")
    module.devices = devices  # type: ignore[attr-defined]
    for call in ("is_available", "device_count", "current_device", "set_device"):
        setattr(module, call, getattr(devices, call))
    module.is_initialized = lambda: True  # type: ignore[attr-defined]
    module.synchronize = lambda device=None: None  # type: ignore[attr-defined]
    return module


def vendor_package(package: str, attr: str, devices: SimulatedDevices) -> types.ModuleType:
    """A stand-in vendor package (``torch_npu``) with its device module, in ``sys.modules``.

    Examples:
        >>> # in a rank or a subprocess: sys.modules keeps it
        >>> pkg = vendor_package("torch_npu", "npu", SimulatedDevices("npu", 2))  # doctest: +SKIP
        >>> import torch_npu                    # doctest: +SKIP
        >>> torch_npu.npu.device_count()        # doctest: +SKIP
        2
    """
    pkg = types.ModuleType(package, f"simulated {package} (commlib.testing.simulated)")
    pkg.__path__ = []  # a package, so "torch_npu.npu" imports
    pkg.__version__ = "0+simulated"  # type: ignore[attr-defined]
    sub = device_module(f"{package}.{attr}", devices)
    setattr(pkg, attr, sub)
    sys.modules[package] = pkg
    sys.modules[f"{package}.{attr}"] = sub
    return pkg


def patch_module(module: types.ModuleType, devices: SimulatedDevices) -> None:
    """Point an existing runtime module's device calls (``torch.cuda``) at ``devices``.

    Examples:
        >>> patch_module(torch.cuda, SimulatedDevices("cuda", 4))  # for good  # doctest: +SKIP
        >>> torch.cuda.device_count()           # doctest: +SKIP
        4
    """
    for call in ("is_available", "device_count", "current_device", "set_device"):
        setattr(module, call, getattr(devices, call))
    module.devices = devices  # type: ignore[attr-defined]


def patch_accelerator(devices: SimulatedDevices, whole: bool) -> None:
    """Make ``torch.accelerator`` answer from ``devices``.

    ``whole=False`` patches only the current-index calls: a renamed private
    device (npu, mlu) is already the current accelerator, but its C++ device
    guard, which a real vendor package registers, is missing here.

    Examples:
        >>> patch_accelerator(SimulatedDevices("cuda", 2), whole=True)  # doctest: +SKIP
        >>> torch.accelerator.current_accelerator()  # doctest: +SKIP
        device(type='cuda')
    """
    accel = torch.accelerator
    for name in ("current_device_index", "current_device_idx"):
        if hasattr(accel, name):
            setattr(accel, name, devices.current_device)
    for name in ("set_device_index", "set_device_idx"):
        if hasattr(accel, name):
            setattr(accel, name, devices.set_device)
    if whole:
        kind = torch.device(devices.device_type)
        accel.current_accelerator = lambda check_available=False: kind
        accel.is_available = devices.is_available
        accel.device_count = devices.device_count


def register_private_hooks(devices: SimulatedDevices) -> None:
    """Register the private device's C++ hooks, as a vendor package's import does.

    ``torch._C._get_accelerator()`` (which torch's own ``barrier`` asks for its
    device) answers the renamed private device only once its hooks are
    registered; without them it raises. A torch without the Python hook API
    keeps going without them.

    Examples:
        >>> register_private_hooks(SimulatedDevices("npu", 2))  # for good  # doctest: +SKIP
        >>> torch._C._get_accelerator()  # doctest: +SKIP
        device(type='npu')
    """
    acc = getattr(torch._C, "_acc", None)
    if acc is None or not hasattr(acc, "register_python_privateuseone_hook"):
        return

    class Hooks(acc.PrivateUse1Hooks):  # type: ignore[name-defined]
        def is_available(self) -> bool:
            return devices.is_available()

        def is_built(self) -> bool:
            return True

        def has_primary_context(self, device_index: int) -> bool:
            return True

    acc.register_python_privateuseone_hook(Hooks())


def built_accelerator() -> str | None:
    """The device type ``torch.accelerator`` serves, GPU present or not (``None``: none).

    A CUDA build answers ``"cuda"`` on a machine without a GPU, and its device
    calls there reach the CUDA driver.

    Examples:
        >>> built_accelerator()   # a CUDA build  # doctest: +SKIP
        'cuda'
    """
    try:
        found = torch.accelerator.current_accelerator(check_available=False)
    except Exception:  # a half-registered private device
        return None
    return None if found is None else str(found.type)


def hide_accelerator() -> None:
    """Make ``torch.accelerator`` serve no device, as on torch's CPU build.

    A CUDA build's ``torch.accelerator`` serves CUDA whether or not a GPU is
    there, and its device calls reach the CUDA driver: a simulation that does
    not simulate ``torch.accelerator`` hides it instead, so it runs the same on
    every build.

    Examples:
        >>> hide_accelerator()                  # for good  # doctest: +SKIP
        >>> torch.accelerator.current_accelerator() is None  # doctest: +SKIP
        True
    """
    accel = torch.accelerator
    accel.current_accelerator = lambda check_available=False: None
    accel.is_available = lambda: False
    accel.device_count = lambda: 0
