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

Facts about speed (torch 2.13, 127.0.0.1, 2-4 ranks) and what follows:

* point to point moves large tensors several times faster than gloo's
  all_gather and gather do (16 MiB per rank, 2 ranks: 23 ms against 69 ms;
  4 ranks: 104 ms against 318 ms), while below about a megabyte a message
  costs a few milliseconds more than a collective round: so gathers of at
  least 4 MiB per rank go point to point (``p2p_gather_bytes``), and so do the
  large payloads of the object collectives (``large_payload_transport``);
* gloo's all_to_all is the cheapest of its collectives that every rank sends
  in: below a megabyte gathered (2 ranks, 4 KiB each: 0.35 ms against
  0.54 ms for all_gather_into_tensor and 0.64-1.9 ms for all_reduce; 4 ranks:
  1.3 ms against 3.7 ms and 7.4 ms), so small gathers and all_reduces go
  through it (``small_exchange_bytes``); small reduces gather to ``dst``.
  A reduce_scatter by all_to_all and a local reduction measured faster than
  gloo's own at every size (two to five times below a megabyte; 6.4 MB among
  4 ranks: 23 ms against 32 ms), so every reduce_scatter takes it
  (``reduce_scatter_by_all_to_all``).
"""

from __future__ import annotations

import torch

from commlib.hookspecs import hookimpl
from commlib_backends.direct_calls import DirectCalls
from commlib_backends.engine_gaps import STANDARD_DTYPES, EngineGaps

# gloo in torch 2.13 rejects int16, uint16/32/64 and float8 ("Invalid scalar type")
_MOVES = STANDARD_DTYPES | {torch.float64}


class GlooBackend(EngineGaps, DirectCalls):
    """gloo on the CPU; large gathers and object payloads go point to point.

    On gloo, send/recv moved 64 MiB about 8x faster than all_gather did, so
    the object collectives use ``"p2p"`` for what does not fit their first
    round, and ``all_gather``, ``all_gather_into_tensor`` and ``gather`` of at
    least 4 MiB per rank are sent point to point (``p2p_gather_bytes``).
    """

    name = "gloo"
    torch_backend = "gloo"
    device_type = "cpu"
    description = "CPU collectives over TCP (torch.distributed gloo)"
    native_avg = False
    large_payload_transport = "p2p"
    p2p_gather_bytes = 4 << 20
    small_exchange_bytes = 1 << 20
    reduce_scatter_by_all_to_all = True
    wire_dtypes = _MOVES
    reduce_dtypes = _MOVES
    mismatch_aborts = True
    interruptible_wait = True
    # gloo's results for these are what the check computes from its round
    completed_by_check = frozenset(
        {
            "all_reduce",
            "reduce",
            "broadcast",
            "all_gather_into_tensor",
            "gather",
            "scatter",
            "reduce_scatter",
            "all_to_all_single",
        }
    )


@hookimpl
def commlib_backends():
    return [GlooBackend]
