"""The plugin manager: a backend name maps to an implementation.

Built-in backends and third-party ones arrive the same way: pluggy loads every
entry point of the ``commlib.backends`` group and asks each plugin for its
backends through the ``commlib_backends`` hook (see :mod:`commlib.hookspecs`).
:func:`register_backend` adds one at run time.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

import pluggy

from commlib import hookspecs
from commlib.backend import Backend

_lock = threading.RLock()
_pm: pluggy.PluginManager | None = None
_registry: dict[str, Backend] | None = None
_runtime: dict[str, Backend] = {}


@dataclass(frozen=True)
class BackendInfo:
    """What :func:`list_backends` reports about one backend."""

    name: str
    torch_backend: str | None
    device_type: str
    available: bool
    reason: str | None
    plugin: str


def plugin_manager() -> pluggy.PluginManager:
    """The process-wide pluggy manager, with entry points loaded.

    Examples:
        >>> pm = plugin_manager()
        >>> pm.register(my_plugin_module)
        >>> commlib.plugins.refresh()
    """
    global _pm
    with _lock:
        if _pm is None:
            pm = pluggy.PluginManager(hookspecs.PROJECT)
            pm.add_hookspecs(hookspecs)
            pm.load_setuptools_entrypoints(hookspecs.ENTRY_POINT_GROUP)
            _pm = pm
        return _pm


def _instantiate(item: type[Backend] | Backend) -> Backend:
    backend = item() if isinstance(item, type) else item
    if not isinstance(backend, Backend):
        raise TypeError(f"a commlib backend must subclass commlib.Backend, got {item!r}")
    if not backend.name or not isinstance(backend.name, str):
        raise ValueError(f"backend {item!r} has no name")
    return backend


def _collect() -> dict[str, Backend]:
    pm = plugin_manager()
    found: dict[str, Backend] = {}
    owner: dict[str, str] = {}
    dists = {id(plugin): dist for plugin, dist in pm.list_plugin_distinfo()}
    # pluggy calls hooks newest-registered first; walk the implementations
    # ourselves so a duplicate name can name both plugins.
    for impl in pm.hook.commlib_backends.get_hookimpls():
        plugin_name = pm.get_name(impl.plugin) or repr(impl.plugin)
        dist = dists.get(id(impl.plugin))
        if dist is not None and dist.metadata["name"] != "commlib":
            plugin_name += f" ({dist.metadata['name']} {dist.version})"
        for item in impl.function() or ():
            backend = _instantiate(item)
            if backend.name in found:
                raise ValueError(
                    f"backend {backend.name!r} is registered twice: by {owner[backend.name]!r} "
                    f"and by {plugin_name!r}"
                )
            found[backend.name] = backend
            owner[backend.name] = plugin_name
            backend._commlib_plugin = plugin_name  # type: ignore[attr-defined]
    return found


def _backends() -> dict[str, Backend]:
    global _registry
    with _lock:
        if _registry is None:
            _registry = _collect()
        return {**_registry, **_runtime}


def refresh() -> None:
    """Forget the cached registry, so newly registered pluggy plugins are seen."""
    global _registry
    with _lock:
        _registry = None


def register_backend(backend: type[Backend] | Backend, *, replace: bool = False) -> Backend:
    """Register a backend at run time and return its instance.

    Registering a name that exists is an error unless ``replace=True``.

    Examples:
        >>> from commlib_backends.gloo import GlooBackend
        >>> class Traced(GlooBackend):
        ...     name = "traced"
        >>> commlib.register_backend(Traced)
        <Traced 'traced' torch_backend='gloo'>
    """
    instance = _instantiate(backend)
    with _lock:
        if instance.name in _backends() and not replace:
            raise ValueError(
                f"a backend named {instance.name!r} is already registered; "
                "pass replace=True to replace it"
            )
        instance._commlib_plugin = "register_backend"  # type: ignore[attr-defined]
        _runtime[instance.name] = instance
    return instance


def unregister_backend(name: str) -> None:
    """Remove a backend added with :func:`register_backend`.

    Examples:
        >>> commlib.unregister_backend("traced")
    """
    with _lock:
        if name not in _runtime:
            raise ValueError(f"{name!r} was not registered with register_backend()")
        del _runtime[name]


def get_backend_plugin(name: str) -> Backend:
    """The registered backend called ``name``.

    Examples:
        >>> get_backend_plugin("gloo").torch_backend
        'gloo'
    """
    backends = _backends()
    try:
        return backends[name]
    except KeyError:
        raise ValueError(
            f"unknown commlib backend {name!r}; registered: {sorted(backends)}"
        ) from None


def backend_for_torch(torch_backend: str) -> Backend:
    """The plugin that drives torch.distributed backend ``torch_backend``.

    A plugin whose own name equals ``torch_backend`` wins over others that
    drive the same engine (e.g. a tracing wrapper around gloo).

    Examples:
        >>> backend_for_torch("gloo").name
        'gloo'
    """
    backends = _backends()
    if torch_backend in backends and backends[torch_backend].torch_backend == torch_backend:
        return backends[torch_backend]
    for backend in backends.values():
        if backend.torch_backend == torch_backend:
            return backend
    raise ValueError(
        f"no commlib backend drives the torch.distributed backend {torch_backend!r}; "
        f"registered: {sorted(backends)}"
    )


def backend_for_group(torch_backend: str) -> Backend:
    """The plugin serving a process group started with ``torch_backend``.

    A multi-device spec (``"cpu:gloo,cuda:nccl"``) is served by the plugin of
    its accelerator part, which decides through :meth:`Backend.for_group` how
    to use the CPU part.

    Examples:
        >>> backend_for_group("cpu:gloo,cuda:nccl").name
        'nccl'
    """
    if "," not in torch_backend and ":" not in torch_backend:
        return backend_for_torch(torch_backend).for_group(torch_backend)
    pairs = [part.split(":", 1) for part in torch_backend.split(",")]
    if any(len(p) != 2 for p in pairs):
        raise ValueError(f"not a device:backend list: {torch_backend!r}")
    ordered = [b for d, b in pairs if d != "cpu"] + [b for d, b in pairs if d == "cpu"]
    for name in ordered:
        try:
            return backend_for_torch(name).for_group(torch_backend)
        except ValueError:
            continue
    raise ValueError(
        f"no commlib backend drives any part of {torch_backend!r}; "
        f"registered: {sorted(_backends())}"
    )


def backend_for_device(device: Any) -> Backend:
    """The plugin for ``device`` (``"cuda"``, ``torch.device("npu", 1)``, ...).

    torch's own choice (``torch.distributed.get_default_backend_for_device``)
    decides; without it, an available plugin whose ``device_type`` matches.

    Examples:
        >>> backend_for_device("cpu").name
        'gloo'
    """
    import torch
    import torch.distributed as dist

    try:
        kind = torch.device(device).type
    except (RuntimeError, TypeError):
        raise ValueError(f"not a device: {device!r}") from None
    getter = getattr(dist, "get_default_backend_for_device", None)
    if getter is not None:
        try:
            return backend_for_group(getter(kind))
        except (ValueError, RuntimeError):
            pass
    matches = [b for b in _backends().values() if b.torch_backend and b.device_type == kind]
    for backend in matches:
        if backend.is_available():
            return backend
    if matches:
        return matches[0]
    raise ValueError(f"no commlib backend serves device type {kind!r}")


def resolve_backend(name: str) -> Backend:
    """A plugin from a plugin name, a torch backend (or multi-device spec) or a device type.

    Examples:
        >>> resolve_backend("gloo").name, resolve_backend("cpu").name
        ('gloo', 'gloo')
        >>> resolve_backend("cpu:gloo,cuda:nccl").torch_backend
        'cpu:gloo,cuda:nccl'
    """
    backends = _backends()
    if name in backends:
        return backends[name]
    try:
        return backend_for_group(name)
    except ValueError:
        pass
    try:
        return backend_for_device(name)
    except ValueError:
        raise ValueError(
            f"unknown commlib backend {name!r}: not a plugin, torch.distributed backend "
            f"or device; registered: {sorted(backends)}"
        ) from None


def list_backends() -> list[BackendInfo]:
    """Every registered backend with its availability.

    Examples:
        >>> [(b.name, b.available) for b in list_backends()]
        [('gloo', True), ('single', True)]
    """
    out = []
    for name, backend in sorted(_backends().items()):
        try:
            reason = backend.unavailable_reason()
        except Exception as exc:  # a broken plugin must not break `commlib info`
            reason = f"availability check failed: {type(exc).__name__}: {exc}"
        out.append(
            BackendInfo(
                name=name,
                torch_backend=backend.torch_backend,
                device_type=backend.device_type,
                available=reason is None,
                reason=reason,
                plugin=getattr(backend, "_commlib_plugin", "?"),
            )
        )
    return out


def _reset_for_tests(pm: Any = None) -> None:
    global _pm, _registry
    with _lock:
        _pm, _registry = pm, None
        _runtime.clear()
