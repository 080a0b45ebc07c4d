"""How torch finds the torch.distributed backends commlib provides: one mechanism for all.

commlib provides torch backends of two kinds: the ``commlib`` family, whose
groups serve torch.distributed through a :class:`~commlib.Communicator`
(:mod:`commlib.torch_backend.process_group`), and an engine's own Python
group, such as the mpi plugin's ``mpi4py``
(:mod:`commlib_backends.mpi_group`). Each reaches torch through
:func:`register`, and torch calls its creator when a group is made. torch
learns the names two ways:

* torch 2.14 and later read the entry-point group ``torch.distributed.backends``
  when ``init_process_group`` or ``new_group`` meets a backend name they do not
  know (``Backend._ensure_backend_registered``): this distribution lists each
  name there (``pyproject.toml``), so a program that never imports commlib
  finds them;
* torch 2.13 reads no such group: ``import commlib`` registers the
  ``commlib`` names (:func:`register_all`), and importing the mpi plugin
  registers ``mpi4py``, as its world's start did before.

Names: torch reads ``"device:backend"`` (``"cpu:gloo,cuda:nccl"``) from a
backend string, so a name cannot hold a colon; ``commlib-NAME`` names the
plugin with a hyphen, as torch's own ``nccl-legacy`` does.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable, Sequence
from importlib.metadata import entry_points
from typing import Any

import torch.distributed as dist

__all__ = ["PREFIX", "commlib_name", "commlib_names", "plugin_of", "register", "register_all"]

#: the torch backend name serving the machine's default plugin; ``PREFIX + "-" + plugin``
#: names one plugin
PREFIX = "commlib"

# the plugin that drives no engine: no torch backend serves it
_NO_ENGINE = "single"

#: where the ``commlib`` backends' creator lives, imported when torch first makes a group
_CREATOR = "commlib.torch_backend.process_group"


def commlib_name(plugin: str | None) -> str:
    """The torch backend name under which commlib serves ``plugin`` (``None``: the default).

    Examples:
        >>> commlib_name("mpi"), commlib_name(None)
        ('commlib-mpi', 'commlib')
    """
    return PREFIX if plugin is None else f"{PREFIX}-{plugin}"


def plugin_of(torch_backend: str) -> str | None:
    """The plugin a ``commlib`` torch backend name serves (``None``: the default plugin).

    Examples:
        >>> plugin_of("commlib-mpi"), plugin_of("commlib")
        ('mpi', None)
    """
    name = str(torch_backend).lower()
    if name == PREFIX:
        return None
    if not name.startswith(PREFIX + "-"):
        raise ValueError(f"{torch_backend!r} is not a commlib torch backend name")
    return name[len(PREFIX) + 1 :]


@functools.cache
def commlib_names() -> tuple[str, ...]:
    """The ``commlib`` torch backend names: the default's, and one per installed plugin.

    The plugins are read from the names of their entry points (the built-in
    ones register the same way): nothing is imported.

    Examples:
        >>> commlib_names()[0], "commlib-mpi" in commlib_names()
        ('commlib', True)
    """
    plugins = {ep.name for ep in entry_points(group="commlib.backends")} - {_NO_ENGINE}
    return (PREFIX, *(commlib_name(p) for p in sorted(plugins)))


def register(
    name: str,
    creator: Callable[[Any, Any], Any],
    devices: Sequence[str] = ("cpu",),
) -> None:
    """Tell torch about backend ``name``, made by ``creator``; once, later calls do nothing.

    ``creator(options, backend_options)`` is torch's extended creator. The
    devices do not become torch's default backend for a device that has none:
    ``init_process_group()`` without a backend keeps choosing torch's own.

    Examples:
        >>> register("commlib-gloo", lambda options, backend_options: None)  # known: kept
        >>> "commlib-gloo" in dist.Backend.backend_list
        True
    """
    if name.upper() in dist.Backend._plugins:
        return
    defaults = dict(dist.Backend.default_device_backend_map)
    dist.Backend.register_backend(name, creator, extended_api=True, devices=list(devices))
    # a backend torch picks for a device by itself stays torch's choice
    dist.Backend.default_device_backend_map.clear()
    dist.Backend.default_device_backend_map.update(defaults)


def _create(name: str, options: Any, backend_options: Any) -> Any:
    # the creator's module is imported when a group is made, not when the name is registered
    create = importlib.import_module(_CREATOR).create
    return create(name, options, backend_options)


def register_all() -> None:
    """Register the ``commlib`` names (the entry point torch 2.14+ calls; ``import commlib``).

    Their devices are the CPU's until a group is made: its plugin then adds
    its own (an accelerator's) to what torch knows of the name.

    Examples:
        >>> register_all()
        >>> "commlib-gloo" in dist.Backend.backend_list
        True
    """
    for name in commlib_names():
        register(name, functools.partial(_create, name))
