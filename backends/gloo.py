"""``gloo``: CPU collectives through torch.distributed's gloo.

Data on an accelerator is copied to the CPU for the collective and the result
is copied back to where it came from. Dtypes gloo cannot move (int16, the
unsigned types wider than a byte, float8) travel as bytes and are reduced on
each rank.

Facts about failures (torch 2.13), and what follows from them:

* ranks calling the same collective with different byte counts end the
  process: gloo throws ``EnforceNotMet`` on its own I/O thread, where no
  Python code can catch it (different collectives or roots hang instead):
  ``mismatch_aborts``, so commlib checks the tensor collectives' arguments;
* ``ProcessGroup.abort()`` and ``shutdown()`` leave pending operations
  running: only the operation's own timeout (set per call through
  ``ProcessGroup.set_timeout``) or the peer closing its connection ends one;
* ``Work.wait(timeout)`` only waits: ``interruptible_wait``;
* gloo cannot shrink a group (``supports_shrinking`` is false): the default
  ``shrink_group`` builds a new gloo group over the survivors through the store.
"""

from __future__ import annotations

import torch

from commlib.hookspecs import hookimpl
from commlib_backends.engine_gaps import STANDARD_DTYPES, EngineGaps

# gloo in torch 2.13 rejects int16, uint16/32/64 and float8 ("Invalid scalar type")
_MOVES = STANDARD_DTYPES | {torch.float64}


class GlooBackend(EngineGaps):
    """gloo on the CPU; large object payloads go point to point.

    On gloo, send/recv moved 64 MiB about 8x faster than all_gather did, so
    the object collectives use ``"p2p"`` for what does not fit their first
    round.
    """

    name = "gloo"
    torch_backend = "gloo"
    device_type = "cpu"
    description = "CPU collectives over TCP (torch.distributed gloo)"
    native_avg = False
    large_payload_transport = "p2p"
    wire_dtypes = _MOVES
    reduce_dtypes = _MOVES
    mismatch_aborts = True
    interruptible_wait = True


@hookimpl
def commlib_backends():
    return [GlooBackend]
