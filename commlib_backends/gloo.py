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
* a collective's ``Work.wait(timeout)`` only waits: ``interruptible_wait``;
  a send's or receive's that times out closes every connection of the group
  ("Application timeout caused pair closure"), which ends every operation
  pending on it and any other thread's wait on them at once:
  ``p2p_timeout_ends_group``;
* gloo cannot shrink a group (``supports_shrinking`` is false): the default
  ``shrink_group`` builds a new gloo group over the survivors through the store;
* gloo raises plain ``RuntimeError``: a timeout reads "Timed out waiting
  3000ms for recv operation to complete" (an operation's own) or "Application
  timeout caused pair closure" (a wait that gave up), a dead peer "[.../pair.cc:553]
  Connection closed by peer [127.0.0.1]:5350. This is typically caused by ...
  GLHF!". The address is the peer's gloo listener, which it published in the
  group's store when the group connected (key ``<device>//<n>/<group rank>``,
  a ``sockaddr`` per pair), its port printed byte-swapped (5350 is port
  58900): ``failed_peer`` finds the rank there.

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

import re
import socket
import struct
import sys
from typing import Any

import torch
import torch.distributed as dist

from commlib import _torch_facts as torch_facts
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
    shares_host_rounds = True
    interruptible_wait = True
    p2p_timeout_ends_group = True
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
            "all_to_all",
        }
    )
    # a steady checked call goes straight to the round its kind prepared (its rows in
    # shared memory on one machine): the check's host work is most of a small call
    # here (commlib._checked_lanes)
    checked_lanes = True

    def is_timeout(self, exc: BaseException) -> bool:
        """Whether gloo's ``exc`` says an operation or a wait ran out of time.

        Args:
            exc: what gloo (or torch around it) raised.

        Returns:
            ``True`` for gloo's timeouts and torch's store wait timeouts.

        Examples:
            >>> gloo = commlib.plugins.resolve_backend("gloo")
            >>> gloo.is_timeout(RuntimeError(
            ...     "[gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting 3000ms for recv"))
            True
            >>> gloo.is_timeout(RuntimeError("Connection closed by peer [127.0.0.1]:5350"))
            False
        """
        return _GLOO_TIMEOUT.search(str(exc)) is not None or super().is_timeout(exc)

    def describe_failure(self, exc: BaseException) -> str:
        """gloo's message without its source location and its sign-off.

        Args:
            exc: what gloo raised.

        Returns:
            The message's first sentence, or the whole text when it has no
            location to strip.

        Examples:
            >>> gloo = commlib.plugins.resolve_backend("gloo")
            >>> gloo.describe_failure(RuntimeError(
            ...     "[/src/gloo/transport/tcp/pair.cc:553] Connection closed by peer "
            ...     "[127.0.0.1]:5350. This is typically caused by a remote worker crashing."))
            'Connection closed by peer [127.0.0.1]:5350'
        """
        text = str(exc)
        located = _SOURCE_LOCATION.match(text)
        if located is None:
            return text
        return text[located.end() :].split(". ", 1)[0].rstrip(".")

    def lost_peer(self, exc: BaseException) -> bool:
        """Whether gloo's ``exc`` names a peer's address: its connection to that peer was lost.

        Examples:
            >>> gloo = commlib.plugins.resolve_backend("gloo")
            >>> gloo.lost_peer(RuntimeError("Connection closed by peer [127.0.0.1]:5350"))
            True
            >>> gloo.lost_peer(RuntimeError("Invalid scalar type"))
            False
        """
        return _PEER_ADDRESS.search(str(exc)) is not None

    def failed_peer(self, exc: BaseException, group: Any) -> int | None:
        """The rank of ``group`` whose gloo address ``exc`` names, read from the group's store.

        Args:
            exc: what gloo raised ("Connection closed by peer [host]:port", ...).
            group: the gloo process group the call ran on.

        Returns:
            The group rank that published that address when the group
            connected, or ``None`` when the message names no address or no
            rank published it.

        Examples:
            >>> gloo = commlib.plugins.resolve_backend("gloo")
            >>> gloo.failed_peer(RuntimeError("Timed out waiting 3000ms"), None) is None
            True
        """
        found = _PEER_ADDRESS.search(str(exc))
        if found is None or group is None:
            return None
        pattern = _sockaddr_pattern(found.group(1), int(found.group(2)))
        if pattern is None:
            return None
        store = _group_store(group)
        for key, rank in _address_keys(store, dist.get_world_size(group)):
            if pattern.search(store.get(key)) is not None:
                return rank
        return None


# gloo's words for an operation (or a wait on it) that ran out of time
_GLOO_TIMEOUT = re.compile(r"Timed out waiting|Application timeout caused pair closure")
# "[/path/to/gloo/transport/tcp/pair.cc:553] " before gloo's messages
_SOURCE_LOCATION = re.compile(r"\[[^\]\s]*\.\w+:\d+\] ")
# how gloo writes a peer's address: [127.0.0.1]:5350, [::1]:5350
_PEER_ADDRESS = re.compile(r"\[([0-9A-Fa-f.:]+)\]:(\d+)")
# the store keys gloo's rendezvous publishes a rank's pair addresses under
_ADDRESS_KEY = re.compile(r"[a-z]+//\d+/(\d+)")


def _sockaddr_pattern(host: str, port: int) -> re.Pattern[bytes] | None:
    """How ``host:port`` looks inside a ``sockaddr`` gloo published (family, port, address)."""
    if not 0 < port < 1 << 16:
        return None  # no listener has port 0 (and its zeros would match padding)
    # gloo 2.13 prints the port as the sockaddr holds it, in network byte order read
    # as a host number: the bytes are the printed number's in this machine's order
    # (a gloo that prints it right: in network order)
    ports = {port.to_bytes(2, sys.byteorder), port.to_bytes(2, "big")}
    port_bytes = b"(?:" + b"|".join(re.escape(p) for p in sorted(ports)) + b")"
    for family, flow in ((socket.AF_INET, b""), (socket.AF_INET6, b".{4}")):
        try:
            address = socket.inet_pton(family, host)
        except OSError:
            continue
        # sockaddr_in: family, port, address; sockaddr_in6: family, port, flow info, address
        head = re.escape(struct.pack("=H", family)) + port_bytes
        return re.compile(head + flow + re.escape(address), re.DOTALL)
    return None


def _group_store(group: Any) -> Any:
    """The store ``group``'s ranks connected through (torch's private table of groups)."""
    return torch_facts.group_map()[group][1]


def _address_keys(store: Any, size: int) -> list[tuple[str, int]]:
    """The keys (and their group ranks) under which the group's ranks published addresses."""
    try:
        keys = store.list_keys()
    except (RuntimeError, AttributeError, NotImplementedError):
        # a store that cannot list its keys: where torch 2.13 puts them for a CPU group
        keys = [f"cpu//0/{rank}" for rank in range(size)]
        keys = [key for key in keys if store.check([key])]
    out = []
    for key in keys:
        matched = _ADDRESS_KEY.fullmatch(key)
        if matched is not None and int(matched.group(1)) < size:
            out.append((key, int(matched.group(1))))
    return out


@hookimpl
def commlib_backends():
    return [GlooBackend]
