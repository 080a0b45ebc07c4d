"""Where data lives and where it goes: mmengine.dist's device helpers.

Device names are resolved through the registered backend plugins, never a list
of vendors here: any device type a registered backend serves (``cuda``,
``npu``, ``mlu``, a third party's) is accepted, and ``"gpu"`` means the current
accelerator. A device whose backend cannot run here is a
:class:`~commlib.errors.BackendUnavailableError` with the plugin's reason, not
a crash inside torch.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import torch

from commlib import plugins
from commlib.backend import Backend
from commlib.errors import BackendUnavailableError

# mmengine's name for "the accelerator this process uses, whichever it is"
ACCELERATOR_ALIAS = "gpu"


def accelerator_types() -> list[str]:
    """Device types served by registered backends that drive a process group, CPU excluded.

    Examples:
        >>> accelerator_types()
        ['cuda', 'mlu', 'npu']
    """
    return sorted(
        {b.device_type for b in plugins.list_backends() if b.torch_backend and b.device_type}
        - {"cpu"}
    )


def _serving(kind: str) -> list[Backend]:
    """Registered plugins for device type ``kind``, those that can run here first."""
    infos = [b for b in plugins.list_backends() if b.torch_backend and b.device_type == kind]
    infos.sort(key=lambda b: (not b.available, b.name))
    return [plugins.resolve_backend(b.name) for b in infos]


def _unavailable(device: Any, serving: list[Backend]) -> BackendUnavailableError:
    reasons = "; ".join(f"{b.name}: {b.unavailable_reason()}" for b in serving)
    return BackendUnavailableError(
        f"device {str(device)!r} is not available here (the backend that serves it cannot "
        f"run: {reasons})"
    )


def _parse(device: Any) -> tuple[str, int | None]:
    if isinstance(device, torch.device):
        return device.type, device.index
    if not isinstance(device, str):
        raise TypeError(f"device must be a str or torch.device, got {type(device).__name__}")
    kind, _, index = device.strip().partition(":")
    if not kind or (index and not index.isdigit()):
        raise ValueError(f"not a device: {device!r}")
    return kind, int(index) if index else None


def resolve_device(device: str | torch.device, current: Backend | None = None) -> torch.device:
    """The ``torch.device`` that ``device`` names, checked against the registered backends.

    ``"gpu"`` is the current accelerator: ``current``'s (the communicator's
    plugin) when it serves one, otherwise the first available registered
    accelerator backend's. An accelerator type without an index is that
    plugin's current device. Types no registered backend serves (``"meta"``,
    ``"mps"``) are left to torch.

    Examples:
        >>> resolve_device("cpu")
        device(type='cpu')
        >>> resolve_device("cuda")               # rank 1 of a GPU machine  # doctest: +SKIP
        device(type='cuda', index=1)
        >>> resolve_device("npu")                # without torch_npu
        Traceback (most recent call last):
        ...
        commlib.errors.BackendUnavailableError: device 'npu' is not available here (...)
    """
    kind, index = _parse(device)
    if kind == "cpu":
        return torch.device("cpu")
    if kind == ACCELERATOR_ALIAS:
        if index is not None:
            raise ValueError(f"{ACCELERATOR_ALIAS!r} takes no index, got {device!r}")
        kinds = accelerator_types()
        if current is not None and current.device_type in kinds:
            # the group's own accelerator comes first
            kinds.remove(current.device_type)
            kinds.insert(0, current.device_type)
        for candidate in kinds:
            serving = _serving(candidate)
            if serving and serving[0].is_available():
                return serving[0].device()
        reasons = "; ".join(
            f"{b.name}: {b.reason}"
            for b in plugins.list_backends()
            if b.torch_backend and b.device_type in kinds
        )
        raise BackendUnavailableError(
            f"device {ACCELERATOR_ALIAS!r} asks for the current accelerator, but none is "
            f"available here ({reasons or 'no accelerator backend is registered'})"
        )
    serving = _serving(kind)
    if not serving:
        try:
            return torch.device(device)
        except (RuntimeError, TypeError):
            raise ValueError(
                f"not a device: {device!r}; commlib's backends serve cpu, "
                f"{', '.join(accelerator_types())} (and {ACCELERATOR_ALIAS!r} for the current one)"
            ) from None
    plugin = serving[0]
    if not plugin.is_available():
        raise _unavailable(device, serving)
    home = plugin.device()
    # a plugin may keep this device type's data elsewhere (simulated devices: host memory)
    if index is None or home.type != kind:
        return home
    return torch.device(kind, index)


def get_data_device(data: torch.Tensor | Mapping | Iterable) -> torch.device:
    """The device of ``data``: a tensor, or a (nested) sequence or mapping of tensors.

    Every tensor must be on the same device; empty containers and other types
    are an error, as in mmengine.

    Examples:
        >>> get_data_device({"a": torch.zeros(1), "b": [torch.ones(2)]})
        device(type='cpu')
        >>> get_data_device([torch.zeros(1), torch.zeros(1, device="meta")])
        Traceback (most recent call last):
        ValueError: device type in data should be consistent, got meta and cpu
    """
    if isinstance(data, torch.Tensor):
        return data.device
    if isinstance(data, Mapping):
        items: Iterable = data.values()
    elif isinstance(data, Iterable) and not isinstance(data, (str, bytes)):
        items = data
    else:
        raise TypeError(
            f"data should be a Tensor, a sequence of tensors or a dict, got {type(data).__name__}"
        )
    found = None
    for item in items:
        device = get_data_device(item)
        if found is not None and device != found:
            raise ValueError(f"device type in data should be consistent, got {device} and {found}")
        found = device
    if found is None:
        raise ValueError("data should not be empty")
    return found


def _rebuild(template: Any, items: list) -> Any:
    if hasattr(template, "_fields"):  # a namedtuple takes its fields one by one
        return type(template)(*items)
    return type(template)(items)


def move_to(data: Any, device: torch.device, out: Any = None) -> Any:
    """``data`` with every tensor on ``device`` (already there: not copied); mmengine's rules.

    Containers keep their type. With ``out`` (of ``data``'s type, not a set),
    the moved values are also copied into ``out``'s tensors, in place. Empty
    containers and non-tensor leaves are an error.

    Examples:
        >>> move_to({"a": torch.ones(1)}, torch.device("meta"))
        {'a': tensor(..., device='meta', size=(1,))}
    """
    if out is not None:
        if type(data) is not type(out):
            raise TypeError(
                f"out should be of data's type, got data {type(data).__name__} and out "
                f"{type(out).__name__}"
            )
        if isinstance(out, (set, frozenset)):
            raise TypeError("out should not be a set (it has no order to fill)")
    if isinstance(data, torch.Tensor):
        moved = data if data.device == device else data.to(device)
        if out is not None:
            out.copy_(moved)
        return moved
    if isinstance(data, Mapping):
        if out is not None and len(out) != len(data):
            raise ValueError(
                f"length of data and out should be the same, got {len(data)} and {len(out)}"
            )
        moved_map = {
            k: move_to(v, device, None if out is None else out[k]) for k, v in data.items()
        }
        if not moved_map:
            raise ValueError("data should not be empty")
        if isinstance(data, defaultdict):
            return type(data)(data.default_factory, moved_map)
        return type(data)(moved_map)  # type: ignore[call-arg]
    if isinstance(data, Iterable) and not isinstance(data, (str, bytes, np.ndarray)):
        if out is None:
            moved_items = [move_to(v, device) for v in data]
        else:
            moved_items = [move_to(v, device, o) for v, o in zip(data, out)]
        if not moved_items:
            raise ValueError("data should not be empty")
        return _rebuild(data, moved_items)
    raise TypeError(
        f"data should be a Tensor, a list of tensors or a dict, got {type(data).__name__}"
    )
