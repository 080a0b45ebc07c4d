"""The plugin ``commlib bench --backend NAME`` names: registered, a torch backend, or a class.

``NAME`` is a registered plugin's name, a torch.distributed backend (or device)
one serves, or ``module:Class``: a plugin class (or instance) to import, as a
user's plugin under development is, registered here under its own name. For
the dispatch kind alone (torch's fake process group sends nothing), an
accelerator plugin that cannot run here (``nccl``, ``hccl``, ``cncl`` on a
machine without the device) is timed over simulated devices
(:mod:`commlib.testing.simulated`): its own class and call path, host memory
for device memory.
"""

from __future__ import annotations

import importlib
import re
import sys

from commlib import plugins
from commlib.backend import Backend
from commlib.testing import simulated

_CLASS_PATH = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")


def load_named(name: str) -> Backend:
    """The plugin ``name`` means (see the module); ``ValueError`` when none.

    Examples:
        >>> load_named("gloo").name
        'gloo'
        >>> load_named("commlib_backends.gloo:GlooBackend").name   # registered already
        'gloo'
        >>> load_named("mypkg.plugin:MyBackend")   # a user's plugin  # doctest: +SKIP
        <MyBackend 'mine' torch_backend='gloo'>
    """
    try:
        return plugins.resolve_backend(name)
    except ValueError:
        if not _CLASS_PATH.match(name):
            raise
    module_name, attr = name.split(":")
    try:
        found = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"--backend {name!r}: cannot import it: {exc}") from None
    if isinstance(found, type) and issubclass(found, Backend):
        instance = found()
    elif isinstance(found, Backend):
        instance = found
    else:
        raise ValueError(f"--backend {name!r} is not a commlib.Backend subclass or instance")
    registered = _registered(instance.name)
    if registered is not None and type(registered) is type(instance):
        return registered
    return plugins.register_backend(instance)  # a name taken by another class: its error


def as_registered(name: str | None) -> str | None:
    """``name`` as ``init_dist(backend=...)`` takes it: a ``module:Class`` loaded, by its name.

    Examples:
        >>> as_registered("cpu:gloo"), as_registered(None)
        ('cpu:gloo', None)
        >>> as_registered("commlib_backends.gloo:GlooBackend")
        'gloo'
    """
    if name is None or not _CLASS_PATH.match(name) or _registered(name) is not None:
        return name
    try:
        plugins.resolve_backend(name)  # a torch backend or device spec ("cpu:gloo")
        return name
    except ValueError:
        return load_named(name).name


def _registered(name: str) -> Backend | None:
    try:
        found = plugins.resolve_backend(name)
    except ValueError:
        return None
    return found if found.name == name else None


def simulated_if_absent(plugin: Backend) -> Backend:
    """``plugin``, or where it cannot run here and commlib simulates it, its simulated self.

    Installing the simulation changes torch for the rest of the process: for
    the dispatch benchmark's own process only. A line on stderr says so.

    Examples:
        >>> simulated_if_absent(load_named("gloo")).name
        'gloo'
        >>> simulated_if_absent(load_named("hccl"))   # no torch_npu here  # doctest: +SKIP
        <SimulatedHcclBackend 'hccl' torch_backend='hccl'>
    """
    reason = plugin.unavailable_reason()
    if reason is None or plugin.name not in simulated.KINDS:
        return plugin
    simulated.install(plugin.name, devices=1)
    print(
        f"commlib bench: {plugin.name} cannot run here ({reason}): the dispatch cases time "
        f"its plugin over simulated devices (commlib.testing.simulated)",
        file=sys.stderr,
    )
    return plugins.resolve_backend(plugin.name)


def simulates(plugin: Backend) -> bool:
    """Whether :func:`simulated_if_absent` would simulate ``plugin``.

    Examples:
        >>> simulates(load_named("gloo")), simulates(load_named("cncl"))  # no torch_mlu
        (False, True)
    """
    return plugin.name in simulated.KINDS and plugin.unavailable_reason() is not None
