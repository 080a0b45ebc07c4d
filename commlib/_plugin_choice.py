"""Which backend plugin serves a new communicator, or why none can here.

A communicator names its plugin (an instance, a plugin name, a torch backend
such as ``"cpu:gloo,cuda:nccl"``, or a device type), or leaves it to the
group: a single process gets the ``single`` backend, a process group the
plugin that drives its torch.distributed backend (the one the world started
with, where the world was started by commlib).

Examples:
    >>> plugin_for(None, None, distributed=False, is_member=True).name
    'single'
    >>> plugin_for("gloo", None, distributed=False, is_member=True)
    Traceback (most recent call last):
    ...
    ValueError: backend 'gloo' drives torch.distributed (gloo), which is not initialised ...
"""

from __future__ import annotations

from commlib import _world, plugins
from commlib._torch_groups import torch_backend_name
from commlib.backend import Backend
from commlib.errors import BackendUnavailableError
from commlib.types import Group


def plugin_for(
    backend: str | Backend | None, group: Group, *, distributed: bool, is_member: bool
) -> Backend:
    """The plugin a communicator over ``group`` uses, given its ``backend=`` argument.

    Raises :class:`~commlib.errors.BackendUnavailableError` for a named plugin
    that cannot run in this process, and ``ValueError`` for one that drives
    torch.distributed where it is not initialised.
    """
    if backend is not None:
        # an instance, a plugin name, a torch backend ("cpu:gloo,cuda:nccl") or a device
        plugin = backend if isinstance(backend, Backend) else plugins.resolve_backend(backend)
        reason = plugin.unavailable_reason()
        if reason is not None:
            # the engine's own failure ("Torch not compiled with CUDA enabled", a
            # missing vendor package) would come later and name neither
            raise BackendUnavailableError(
                f"backend {plugin.name!r} is not available in this process: {reason} "
                "(`commlib info` lists the backends and why)"
            )
    elif not distributed:
        plugin = plugins.resolve_backend("single")
    else:
        # a non-member cannot ask its group; the world's engine is the best answer
        torch_backend = torch_backend_name(group if is_member else None)
        plugin = _world.world.started_plugin(torch_backend) or plugins.backend_for_group(
            torch_backend
        )
    if not distributed and plugin.torch_backend:
        # torch's own message ("Default process group has not been
        # initialized") names neither the backend nor the way out
        raise ValueError(
            f"backend {plugin.name!r} drives torch.distributed ({plugin.torch_backend}), "
            "which is not initialised in this process: start the ranks first "
            "(commlib.init_dist(), torchrun, or torch.distributed.init_process_group), "
            "or leave backend unset for a single-process run"
        )
    return plugin
