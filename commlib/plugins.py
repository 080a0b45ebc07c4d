"""The backend registry: a backend name maps to an implementation.

Built-in backends and third-party ones arrive the same way: every entry point
of the ``commlib.backends`` group is loaded and asked for its backends through
the ``commlib_backends`` hook (see :mod:`commlib.hookspecs`).
:func:`register_backend` adds one at run time.

A plugin that cannot be imported, whose hook raises, or that offers a name
another plugin offers too breaks nothing else: it becomes a row of
:func:`list_backends` (and ``commlib info``) that says why, and an error only
for whoever selects that backend.

Two resolvers pick a backend: :func:`resolve_backend` from what a user
names (a plugin, a torch backend or multi-device spec, a device type) and
:func:`backend_for_group` for a process group's torch backend, or this
machine's default when there is none.

The pluggy manager and the entry points are :mod:`commlib._manager`; the same
manager serves observers (plugins that implement the ``commlib_collective_*``
hooks, :mod:`commlib.observe`), which notice a change of registrations by
themselves: this module never calls them.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, cast

import pluggy
import torch
import torch.distributed as dist

from commlib import _manager, serialization
from commlib._manager import lock as _lock
from commlib.backend import Backend
from commlib.errors import BackendUnavailableError
from commlib.observe.builtin import started_manager

_registry: _Registry | None = None
_runtime: dict[str, Backend] = {}


@dataclass(frozen=True)
class BackendInfo:
    """What :func:`list_backends` reports about one backend.

    ``plugin`` names who provided it: the plugin (and its distribution), or
    ``"register_backend"``. A plugin that failed to load has a row too, with
    ``available=False`` and the failure as ``reason``.
    """

    name: str
    torch_backend: str | None
    device_type: str
    available: bool
    reason: str | None
    plugin: str
    description: str = ""


@dataclass
class _Registry:
    """What the hook calls produced: backends, who owns each, and the broken ones."""

    backends: dict[str, Backend]
    owners: dict[str, str]
    broken: dict[str, tuple[str, str]]  # name -> (owner, reason)


def plugin_manager() -> pluggy.PluginManager:
    """The process-wide pluggy manager: entry points and built-in observers registered.

    An entry point that fails to import is remembered (see
    :func:`list_backends`) instead of breaking the others.

    Examples:
        >>> pm = plugin_manager()
        >>> pm.get_plugin("gloo")                  # each entry point, by its name
        <module 'commlib_backends.gloo' from '...'>
        >>> pm.register(my_plugin_module)   # with a commlib_backends hook  # doctest: +SKIP
        >>> commlib.plugins.refresh()
    """
    return cast(pluggy.PluginManager, started_manager())


def _instantiate(item: type[Backend] | Backend) -> Backend:
    backend = item() if isinstance(item, type) else item
    if not isinstance(backend, Backend):
        raise TypeError(f"a commlib backend must subclass commlib.Backend, got {item!r}")
    if not backend.name or not isinstance(backend.name, str):
        raise ValueError(f"backend {item!r} has no name")
    return backend


def _collect() -> _Registry:
    pm = plugin_manager()
    reg = _Registry({}, {}, {})
    for name, reason in _manager.load_failures().items():
        reg.broken[name] = (reason.split(":", 1)[0], f"plugin failed to load: {reason}")
    # pluggy calls hooks newest-registered first; walk the implementations
    # ourselves so that one failing hook, or a duplicate name, names its plugin
    for impl in pm.hook.commlib_backends.get_hookimpls():
        owner = _manager.plugin_label(impl.plugin) or "?"
        try:
            items = cast(Iterable[Any], impl.function() or ())
            offered = [_instantiate(item) for item in items]
        except Exception as exc:
            reg.broken[owner.split(" ", 1)[0]] = (
                owner,
                f"plugin {owner!r} failed to list its backends: {type(exc).__name__}: {exc}",
            )
            continue
        for backend in offered:
            if backend.name in reg.broken:
                first, reason = reg.broken[backend.name]
                if reason.startswith("registered twice"):
                    reg.broken[backend.name] = (first, f"{reason} and by {owner!r}")
                continue
            if backend.name in reg.backends:
                first = reg.owners.pop(backend.name)
                del reg.backends[backend.name]
                reg.broken[backend.name] = (
                    first,
                    f"registered twice: by {first!r} and by {owner!r}; uninstall one",
                )
                continue
            reg.backends[backend.name] = backend
            reg.owners[backend.name] = owner
    return reg


def _current() -> _Registry:
    global _registry
    with _lock:
        if _registry is None:
            _registry = _collect()
        return _registry


def _backends() -> dict[str, Backend]:
    with _lock:
        return {**_current().backends, **_runtime}


def refresh() -> None:
    """Forget the cached registry, so newly registered pluggy plugins are seen.

    Examples:
        >>> refresh()
    """
    global _registry
    with _lock:
        _registry = None


def register_backend(backend: type[Backend] | Backend, *, replace: bool = False) -> Backend:
    """Register a backend at run time and return its instance.

    Registering a name that exists is an error unless ``replace=True``.

    Examples:
        >>> from commlib_backends.gloo import GlooBackend
        >>> class LoudGloo(GlooBackend):
        ...     name = "loud-gloo"
        >>> commlib.register_backend(LoudGloo)
        <LoudGloo 'loud-gloo' torch_backend='gloo'>
        >>> commlib.init_dist("pytorch", backend="loud-gloo")    # under torchrun  # doctest: +SKIP
        >>> commlib.unregister_backend("loud-gloo")
    """
    instance = _instantiate(backend)
    with _lock:
        if instance.name in _backends() and not replace:
            raise ValueError(
                f"a backend named {instance.name!r} is already registered; "
                "pass replace=True to replace it"
            )
        _runtime[instance.name] = instance
    return instance


def registered_at_run_time(name: str) -> type[Backend] | None:
    """The class of backend ``name`` if :func:`register_backend` added it, else ``None``.

    Processes this one starts (the test harness's ranks, the conformance
    kit's) register it again from the class, so that they know it too.

    Examples:
        >>> registered_at_run_time("gloo") is None   # an entry point's
        True
    """
    with _lock:
        instance = _runtime.get(name)
    return None if instance is None else type(instance)


def unregister_backend(name: str) -> None:
    """Remove a backend added with :func:`register_backend`.

    Examples:
        >>> from commlib_backends.gloo import GlooBackend
        >>> class LoudGloo(GlooBackend):
        ...     name = "loud-gloo"
        >>> loud = commlib.register_backend(LoudGloo)
        >>> commlib.unregister_backend("loud-gloo")
        >>> commlib.unregister_backend("gloo")   # an entry point's: uninstall it instead
        Traceback (most recent call last):
        ...
        ValueError: 'gloo' was not registered with register_backend()
    """
    with _lock:
        if name not in _runtime:
            raise ValueError(f"{name!r} was not registered with register_backend()")
        del _runtime[name]


def _refuse_broken(name: str) -> None:
    broken = _current().broken
    if name in broken and name not in _runtime:
        raise BackendUnavailableError(f"backend {name!r} cannot be used: {broken[name][1]}")


def resolve_backend(name: str | torch.device) -> Backend:
    """A plugin from a plugin name, a torch backend (or multi-device spec) or a device.

    Tried in that order: a registered plugin called ``name``; the plugin serving
    a process group of torch backend ``name`` (``"gloo"``, ``"cpu:gloo,cuda:nccl"``,
    see :func:`backend_for_group`); the plugin for the device (type) ``name``
    (``"cuda"``, ``"npu:1"``, ``torch.device("cpu")``): torch's own choice for
    the device decides, else an available plugin whose ``device_type`` matches.
    A backend whose plugin is broken raises
    :class:`~commlib.errors.BackendUnavailableError` saying why.

    Examples:
        >>> resolve_backend("gloo").name, resolve_backend("cpu").name
        ('gloo', 'gloo')
        >>> resolve_backend("cpu:gloo,cuda:nccl").torch_backend
        'cpu:gloo,cuda:nccl'
        >>> resolve_backend("npu:1").name      # without torch_npu too
        'hccl'
    """
    backends = _backends()
    if not isinstance(name, str):
        return _for_device(name)
    if name in backends:
        return backends[name]
    _refuse_broken(name)
    try:
        return backend_for_group(name)
    except ValueError:
        pass
    try:
        return _for_device(name)
    except ValueError:
        raise ValueError(
            f"unknown commlib backend {name!r}: not a plugin, torch.distributed backend "
            f"or device; registered: {sorted(backends)}"
        ) from None


def get_backend_plugin(name: str) -> Backend:
    """Deprecated: use :func:`resolve_backend` (which looks a plugin name up first).

    Kept because plugins written against the plugin guide before it named
    :func:`resolve_backend` call it. As before, only a plugin's name is looked
    up: a torch backend or device that is no plugin's name is an error here.

    Examples:
        >>> import warnings
        >>> with warnings.catch_warnings(record=True) as caught:
        ...     warnings.simplefilter("always")
        ...     get_backend_plugin("gloo") is resolve_backend("gloo")
        True
        >>> caught[0].category.__name__
        'DeprecationWarning'
    """
    warnings.warn(
        "commlib.plugins.get_backend_plugin is deprecated; use commlib.plugins.resolve_backend",
        DeprecationWarning,
        stacklevel=2,
    )
    return _plugin_named(name, _backends())


def _plugin_named(name: str, backends: dict[str, Backend]) -> Backend:
    """The registered plugin called ``name``; a broken one's reason, else ValueError."""
    if name in backends:
        return backends[name]
    _refuse_broken(name)
    raise ValueError(f"unknown commlib backend {name!r}; registered: {sorted(backends)}")


def backend_for_group(torch_backend: str | None = None) -> Backend:
    """The plugin serving a process group started with ``torch_backend``; None: the default.

    A plugin whose own name equals the torch backend wins over others that
    drive the same engine (e.g. a tracing wrapper around gloo). A multi-device
    spec (``"cpu:gloo,cuda:nccl"``) is served by the plugin of its accelerator
    part, which decides through :meth:`Backend.for_group` how to use the CPU
    part. Without a torch backend, the backend for this machine: each
    available backend says how strongly it claims the machine
    (:meth:`Backend.default_priority`: an accelerator whose device is visible
    above gloo); the highest wins, and among equals the one whose name is the
    torch backend it drives (gloo over a wrapper of gloo), then by name.

    Examples:
        >>> backend_for_group("cpu:gloo,cuda:nccl").name
        'nccl'
        >>> backend_for_group("gloo").name
        'gloo'
        >>> backend_for_group().name        # a machine without accelerators  # doctest: +SKIP
        'gloo'
    """
    if torch_backend is None:
        return _default()
    if "," not in torch_backend and ":" not in torch_backend:
        return _driver(torch_backend).for_group(torch_backend)
    pairs = [part.split(":", 1) for part in torch_backend.split(",")]
    if any(len(p) != 2 for p in pairs):
        raise ValueError(f"not a device:backend list: {torch_backend!r}")
    ordered = [b for d, b in pairs if d != "cpu"] + [b for d, b in pairs if d == "cpu"]
    for name in ordered:
        try:
            return _driver(name).for_group(torch_backend)
        except ValueError:
            continue
    raise ValueError(
        f"no commlib backend drives any part of {torch_backend!r}; "
        f"registered: {sorted(_backends())}"
    )


def _driver(torch_backend: str) -> Backend:
    """The plugin that drives torch.distributed backend ``torch_backend`` (its name's first)."""
    backends = _backends()
    if torch_backend in backends and backends[torch_backend].torch_backend == torch_backend:
        return backends[torch_backend]
    for backend in backends.values():
        if backend.torch_backend == torch_backend:
            return backend
    _refuse_broken(torch_backend)
    raise ValueError(
        f"no commlib backend drives the torch.distributed backend {torch_backend!r}; "
        f"registered: {sorted(backends)}"
    )


def _for_device(device: Any) -> Backend:
    """The plugin for ``device``: torch's choice, else an available plugin of its type."""
    try:
        kind = torch.device(device).type
    except (RuntimeError, TypeError):
        # torch learns "npu" / "mlu" only when torch_npu / torch_mlu is imported: the
        # plugin serving that device type still answers, and says why it cannot run
        served = {b.device_type for b in _backends().values() if b.torch_backend}
        if not isinstance(device, str) or device.split(":", 1)[0] not in served:
            raise ValueError(f"not a device: {device!r}") from None
        kind = device.split(":", 1)[0]
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


def _default() -> Backend:
    """The backend for this machine when the user names none (see :func:`backend_for_group`)."""
    ranked = []
    for name, backend in _backends().items():
        try:
            priority = backend.default_priority()
            if priority is None or not backend.is_available():
                continue
        except Exception:  # a broken plugin must not decide for the working ones
            continue
        ranked.append((-priority, name != backend.torch_backend, name, backend))
    if not ranked:
        raise BackendUnavailableError("no available commlib backend drives a torch backend")
    return min(ranked, key=lambda r: r[:3])[3]


def _serving(device_type: str) -> Backend | None:
    """The available backend whose device is ``device_type``, if any."""
    matches = [b for b in _backends().values() if b.device_type == device_type and b.torch_backend]
    matches.sort(key=lambda b: b.name != b.torch_backend)
    for backend in matches:
        try:
            if backend.is_available():
                return backend
        except Exception:
            continue
    return None


def _current_device(device_type: str) -> torch.device | None:
    backend = _serving(device_type)
    return None if backend is None else backend.current_device()


# the receiver's device for a tensor arriving for ``device_type``: the backend serving it
# knows which one is current (serialization asks through this, never importing the registry)
serialization.set_current_device_lookup(_current_device)


def list_backends() -> list[BackendInfo]:
    """Every registered backend with its availability, broken plugins included.

    Examples:
        >>> {"gloo", "nccl", "single"} <= {b.name for b in list_backends()}   # built in
        True
        >>> [(b.name, b.reason) for b in list_backends() if not b.available]  # doctest: +SKIP
        [('cncl', 'torch_mlu is not installed'), ('hccl', ...), ('nccl', ...)]
    """
    reg = _current()
    rows = []
    for name, backend in _backends().items():
        try:
            reason = backend.unavailable_reason()
        except Exception as exc:  # a broken plugin must not break `commlib info`
            reason = f"availability check failed: {type(exc).__name__}: {exc}"
        rows.append(
            BackendInfo(
                name=name,
                torch_backend=backend.torch_backend,
                device_type=backend.device_type,
                available=reason is None,
                reason=reason,
                plugin="register_backend" if name in _runtime else reg.owners.get(name, "?"),
                description=backend.description,
            )
        )
    for name, (owner, reason) in reg.broken.items():
        if name not in _runtime:
            rows.append(BackendInfo(name, None, "-", False, reason, owner))
    return sorted(rows, key=lambda b: b.name)


def list_observers() -> list[str]:
    """The plugins that observe collectives, each as ``commlib info`` names it.

    Examples:
        >>> list_observers()   # nothing installed, no COMMLIB_TRACE_DIR  # doctest: +SKIP
        []
        >>> all(isinstance(name, str) for name in list_observers())
        True
    """
    pm = plugin_manager()
    seen: set[int] = set()
    names = []
    for caller in (pm.hook.commlib_collective_start, pm.hook.commlib_collective_end):
        for impl in caller.get_hookimpls():
            if id(impl.plugin) not in seen:
                seen.add(id(impl.plugin))
                name = _manager.plugin_label(impl.plugin)
                if not name or name == str(id(impl.plugin)):  # registered without a name
                    name = type(impl.plugin).__name__
                names.append(name)
    return names


@dataclass(frozen=True)
class RegistryState:
    """What :func:`saved_state` keeps: the plugins' backends and those added at run time.

    ``runtime`` is name -> instance of every :func:`register_backend` backend.
    """

    registry: Any
    runtime: dict[str, Backend]


def saved_state() -> RegistryState:
    """The registry as it is now, to put back with :func:`restore_state` (for tests).

    Examples:
        >>> state = saved_state()
        >>> refresh()                       # the next lookup makes new plugin instances
        >>> restore_state(state)            # the same instances again
        >>> resolve_backend("gloo") is state.registry.backends["gloo"]
        True
    """
    with _lock:
        return RegistryState(_current(), dict(_runtime))


def restore_state(state: RegistryState) -> None:
    """Put back the registry :func:`saved_state` returned: its backends and its run-time ones.

    Examples:
        >>> state = saved_state()
        >>> gloo = type(resolve_backend("gloo"))
        >>> _ = register_backend(type("Scratch", (gloo,), {"name": "scratch"}))
        >>> restore_state(state)
        >>> "scratch" in {b.name for b in list_backends()}
        False
    """
    global _registry
    with _lock:
        _registry = state.registry
        _runtime.clear()
        _runtime.update(state.runtime)
