"""What an engine raised, by type: the table :meth:`commlib._engine.Engine.map_errors` consults.

Read only on the failure path. torch 2.13 raises its ``DistError`` family
(all of them ``RuntimeError``) from its stores and some of its engines, and
a plain ``RuntimeError`` from others (gloo's "Timed out waiting ..." and
"Connection closed by peer ..." are plain ``RuntimeError``). The type decides
first; only where the type cannot tell a timeout from another failure does
the backend that owns the engine read its own text
(:meth:`commlib.Backend.is_timeout`). No engine's wording lives here.

Measured with torch 2.13, gloo, 127.0.0.1:

============================  ==============================  =================
what happened                 what torch raises               commlib raises
============================  ==============================  =================
gloo collective timed out     ``RuntimeError`` "Timed out"    CommTimeoutError
peer process died             ``RuntimeError`` "closed by"    CommError
store key wait timed out      ``DistStoreError``              CommTimeoutError
store host died               ``DistNetworkError``            CommError
============================  ==============================  =================
"""

from __future__ import annotations

from typing import Literal

import torch.distributed as dist

from commlib.errors import CommError

#: what a failure is to commlib: ``None`` passes through unchanged
Kind = Literal["timeout", "store", "network", "engine"]


def _dist(name: str) -> type[BaseException] | None:
    # torch built without torch.distributed has none of these
    found = getattr(dist, name, None)
    return found if isinstance(found, type) else None


_ROWS: tuple[tuple[type[BaseException] | None, Kind | None], ...] = (
    (CommError, None),  # commlib's own errors: already what the caller sees
    (_dist("DistStoreError"), "store"),  # a store call failed (QueueEmptyError too)
    (_dist("DistNetworkError"), "network"),  # a connection (to a peer, the store) lost
    (_dist("DistBackendError"), "engine"),  # the engine (NCCL, ...) reported a failure
    (_dist("DistError"), "engine"),
    (TimeoutError, "timeout"),
    (ConnectionError, "network"),
    (RuntimeError, "engine"),  # engines that raise plain RuntimeError (gloo)
)
#: most specific first: the first row whose type matches decides
TABLE: tuple[tuple[type[BaseException], Kind | None], ...] = tuple(
    (kind_type, kind) for kind_type, kind in _ROWS if kind_type is not None
)


def kind_of(exc: BaseException) -> Kind | None:
    """What ``exc`` is to commlib by its type; ``None``: not an engine failure, pass it on.

    Examples:
        >>> kind_of(torch.distributed.DistNetworkError("Broken pipe"))
        'network'
        >>> kind_of(TimeoutError())
        'timeout'
        >>> kind_of(ValueError("bad argument")) is None
        True
    """
    for kind_type, kind in TABLE:
        if isinstance(exc, kind_type):
            return kind
    return None
