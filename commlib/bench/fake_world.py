"""torch's fake process group, and the commlib plugin that serves it, for the dispatch kind.

torch's fake process group (``torch.testing._internal.distributed.fake_pg``)
is a ProcessGroup of any world size in one process whose collectives return
at once, having sent nothing: what a call costs on it is the Python (and C++
dispatch) between the caller and the engine. ``commlib bench --ops dispatch``
times torch's own calls and commlib's on it (:mod:`commlib.bench.dispatch`).

commlib needs a plugin for a group: :func:`dispatch_plugin` takes the plugin
that would serve the benchmark's backend (``--backend``, or this machine's
default) and re-points it at the fake group, keeping its collectives, its
device and its dtype handling, so the figures are that plugin's call path.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch.distributed as dist

from commlib import _torch_facts as torch_facts
from commlib.backend import Backend
from commlib.communicator import Communicator

#: the torch.distributed backend name of torch's fake process group
FAKE = "fake"

# choices a plugin makes by size about which engine call is fastest on its real
# transport (a small all_reduce as an all_to_all and a local reduction, a large
# gather point to point): with no transport they would only add local work, so
# the plugin on the fake group issues the collective it was asked for, as torch does
_ENGINE_PATHS_BY_SIZE = {
    "small_exchange_bytes": None,
    "p2p_gather_bytes": None,
    "reduce_scatter_by_all_to_all": False,
}


def dispatch_plugin(base: Backend) -> Backend:
    """``base``'s plugin, serving torch's fake process group.

    The same class and device; only its torch backend (``"fake"``), its name
    (``"<base>@fake"``) and its size-based engine-path choices differ.

    Examples:
        >>> base = commlib.plugins.backend_for_group()
        >>> plugin = dispatch_plugin(base)
        >>> plugin.name == f"{base.name}@fake", plugin.torch_backend
        (True, 'fake')
    """
    if base.torch_backend is None:
        raise ValueError(f"backend {base.name!r} drives no process group: nothing to compare")
    base_cls = type(base)
    attrs: dict[str, Any] = {
        "name": f"{base.name}@{FAKE}",
        "torch_backend": FAKE,
        "__module__": __name__,
        "__doc__": f"{base_cls.__name__}, serving torch's fake process group.",
    }
    attrs.update({k: v for k, v in _ENGINE_PATHS_BY_SIZE.items() if hasattr(base_cls, k)})
    return type(f"Fake{base_cls.__name__}", (base_cls,), attrs)()


def _init_fake_group(world_size: int) -> None:
    try:
        FakeStore = torch_facts.fake_store()
    except (ImportError, AttributeError) as exc:  # no testing package, or it moved
        raise RuntimeError(
            f"this torch has no fake process group (torch.testing._internal.distributed."
            f"fake_pg): {exc}"
        ) from None
    dist.init_process_group(FAKE, store=FakeStore(), rank=0, world_size=world_size)


@contextlib.contextmanager
def fake_world(world_size: int, plugin: Backend) -> Iterator[Communicator]:
    """A world of ``world_size`` on torch's fake process group, this process its rank 0.

    Yields an unchecked (``strict=False``) :class:`~commlib.Communicator` over
    it, served by ``plugin`` (see :func:`dispatch_plugin`); the group is
    destroyed on the way out. torch.distributed must not be initialised yet.

    The first call registers torch's fake backend with torch.distributed,
    for the rest of the process.

    Examples:
        >>> plugin = dispatch_plugin(commlib.plugins.backend_for_group())
        >>> with fake_world(8, plugin) as comm:  # doctest: +SKIP
        ...     comm.world_size, comm.rank, comm.checks
        (8, 0, 'off')
    """
    if world_size < 1:
        raise ValueError(f"world_size must be at least 1, got {world_size}")
    if dist.is_initialized():
        raise ValueError(
            "torch.distributed is already initialised in this process: the dispatch "
            "benchmark starts torch's fake process group of its own"
        )
    _init_fake_group(world_size)
    try:
        yield Communicator(backend=plugin, strict=False)
    finally:
        dist.destroy_process_group()
