"""Every exception an engine raises maps to the right commlib error (as httpx tests its map).

No ranks needed: the engine of a world of one translates what a fake call
raises. The table below is the contract: torch 2.13's ``DistError`` family
first, by type; an engine's own wording only through its backend
(:meth:`commlib.Backend.is_timeout`, ``describe_failure``, ``failed_peer``).
"""

from __future__ import annotations

import datetime
import re
import socket
import struct
import sys

import pytest
import torch.distributed as dist

from commlib import _error_map
from commlib._engine import Engine
from commlib.backend import Backend
from commlib.errors import (
    CommBrokenError,
    CommError,
    CommTimeoutError,
    DeserializationError,
    RankLostError,
)
from commlib_backends import gloo as gloo_module
from commlib_backends.gloo import GlooBackend

LIMIT = datetime.timedelta(seconds=30)


class _OneRank(Backend):
    """A backend of one rank whose engine's words are the base class's defaults."""

    name = "one-rank-test"
    torch_backend = None

    def rank(self, group):
        return 0

    def world_size(self, group):
        return 1


class _OneGlooRank(GlooBackend):
    def rank(self, group):
        return 0

    def world_size(self, group):
        return 1


def _raised(plugin: Backend, exc: BaseException) -> BaseException:
    engine = Engine(plugin, None, LIMIT)
    try:
        with engine.map_errors("all_reduce", 1, LIMIT):
            raise exc
    except BaseException as raised:
        return raised
    raise AssertionError("map_errors swallowed the exception")


# exception -> the commlib error class it becomes (exactly that class)
ENGINE_ERRORS = [
    # no peer named gone (the fake plugin names none, no rank ended): the engine failed
    (dist.DistError("unknown c10d failure"), CommError),
    (dist.DistBackendError("NCCL error: unhandled system error"), CommError),
    (
        dist.DistNetworkError("Failed to recv, got 0 bytes. Connection was likely closed."),
        RankLostError,
    ),
    (dist.DistNetworkError("Broken pipe"), RankLostError),
    (dist.DistStoreError("wait timeout after 1000ms, keys: /nokey"), CommTimeoutError),
    (dist.DistStoreError("key not found"), CommError),
    (dist.QueueEmptyError("queue is empty"), CommError),
    (TimeoutError(), CommTimeoutError),
    (ConnectionResetError("reset"), RankLostError),
    (ConnectionRefusedError("refused"), RankLostError),
    (
        RuntimeError("Connection reset by peer"),
        CommError,
    ),  # a peer named: test_broken, test_faults
    (RuntimeError("operation timed out after 5000ms"), CommTimeoutError),
]


@pytest.mark.parametrize(
    ("exc", "expected"), ENGINE_ERRORS, ids=[f"{type(e).__name__}:{e}" for e, _ in ENGINE_ERRORS]
)
def test_each_engine_exception_becomes_its_commlib_error(exc, expected):
    raised = _raised(_OneRank(), exc)
    assert type(raised) is expected, raised
    if expected is CommTimeoutError:  # the message says it all: torch's chain is noise
        assert raised.__cause__ is None and raised.__suppress_context__
    else:
        assert raised.__cause__ is exc  # torch's own error stays attached


# not engine failures: they reach the caller as they are
PASSED_THROUGH = [
    CommError("commlib's own"),
    CommBrokenError("broken earlier"),
    DeserializationError("rank 1 sent what cannot be loaded"),
    ValueError("the caller's mistake"),
    TypeError("not a tensor"),
    KeyError("user code"),
    KeyboardInterrupt(),
]


@pytest.mark.parametrize("exc", PASSED_THROUGH, ids=lambda e: type(e).__name__)
def test_what_is_not_an_engine_failure_passes_through_unchanged(exc):
    assert _raised(_OneRank(), exc) is exc


def _torch_error_types() -> list[type[BaseException]]:
    return sorted(
        {
            found
            for found in (getattr(dist, name) for name in dir(dist) if name.endswith("Error"))
            if isinstance(found, type) and issubclass(found, dist.DistError)
        },
        key=lambda t: t.__name__,
    )


def test_every_torch_dist_error_type_is_in_the_table():
    # a DistError subclass a later torch adds fails here until it has a row (or
    # its parent's row is right for it: QueueEmptyError is a DistStoreError)
    rows = {kind_type for kind_type, _ in _error_map.TABLE}
    missing = [
        t.__name__ for t in _torch_error_types() if t not in rows and t.__base__ not in rows
    ]
    assert not missing, f"torch error types without a row in commlib._error_map: {missing}"
    for kind_type in _torch_error_types():
        assert _error_map.kind_of(kind_type("x")) is not None


def test_the_table_puts_subclasses_before_their_parents():
    types = [kind_type for kind_type, _ in _error_map.TABLE]
    for i, earlier in enumerate(types):
        for later in types[i + 1 :]:
            assert not issubclass(later, earlier), f"{later} is shadowed by {earlier}"


def test_a_failure_after_the_whole_timeout_is_a_timeout_whatever_it_says():
    engine = Engine(_OneRank(), None, LIMIT)
    with pytest.raises(CommTimeoutError):
        with engine.map_errors("barrier", 1, datetime.timedelta(0)):
            raise RuntimeError("pair closed")


# -- gloo's words, which only the gloo backend reads -------------------------------------
CLOSED = (
    "[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection "
    "closed by peer [127.0.0.1]:5350. This is typically caused by a remote worker crashing. "
    "Check the logs of the remote worker before reporting an error. GLHF! \N{UMBRELLA ON GROUND}"
)
GLOO_TEXTS = [
    (
        "[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:78] "
        "Timed out waiting 3000ms for recv operation to complete",
        CommTimeoutError,
    ),
    ("Application timeout caused pair closure", CommTimeoutError),
    (CLOSED, RankLostError),
    (
        "[../gloo/transport/tcp/pair.cc:598] Read error [127.0.0.1]:40765: Connection reset",
        RankLostError,
    ),
]


@pytest.mark.parametrize(("text", "expected"), GLOO_TEXTS, ids=lambda v: str(v)[:40])
def test_gloo_texts_map_by_the_gloo_backend(text, expected):
    raised = _raised(_OneGlooRank(), RuntimeError(text))
    assert type(raised) is expected, raised


def test_gloo_describes_a_closed_peer_without_its_source_location_and_sign_off():
    raised = _raised(_OneGlooRank(), RuntimeError(CLOSED))
    assert str(raised) == "all_reduce failed on rank 0: Connection closed by peer [127.0.0.1]:5350"


class _FakeStore:
    """The keys gloo's rendezvous leaves in a group's store (torch 2.13's layout)."""

    def __init__(self, published: dict[str, bytes], listable: bool = True):
        self.published, self.listable = published, listable

    def list_keys(self):
        if not self.listable:
            raise RuntimeError("this store cannot list its keys")
        return list(self.published)

    def check(self, keys):
        return all(k in self.published for k in keys)

    def get(self, key):
        return self.published[key]


def _address_blob(host: str, port: int, family: int = socket.AF_INET) -> bytes:
    """One rank's published pair addresses: a header, then a sockaddr per pair."""
    if family == socket.AF_INET:
        addr = struct.pack("=H", family) + port.to_bytes(2, "big") + socket.inet_aton(host)
    else:
        addr = (
            struct.pack("=H", family)
            + port.to_bytes(2, "big")
            + b"\x00\x00\x00\x07"
            + socket.inet_pton(family, host)
        )
    return (bytes(16) + addr.ljust(136, b"\x00")) * 2


@pytest.mark.parametrize("listable", [True, False], ids=["list_keys", "check"])
def test_gloo_names_the_rank_whose_address_a_message_gives(monkeypatch, listable):
    store = _FakeStore(
        {
            "cpu//0/0": _address_blob("127.0.0.1", 33181),
            "cpu//0/1": _address_blob("127.0.0.1", 58900),
            "cpu//0/2": _address_blob("127.0.0.1", 40765),
            # another group's keys, listed through the world's store: not this group's ranks
            "1//cpu//0/0": _address_blob("127.0.0.1", 58900),
        },
        listable,
    )
    monkeypatch.setattr(gloo_module, "_group_store", lambda group: store)
    monkeypatch.setattr(gloo_module.dist, "get_world_size", lambda group: 3)
    gloo = GlooBackend()
    # gloo 2.13 prints port 58900 as the sockaddr's bytes read in host order
    printed = int.from_bytes((58900).to_bytes(2, "big"), sys.byteorder)
    assert gloo.failed_peer(RuntimeError(CLOSED.replace("5350", str(printed))), object()) == 1
    # and a gloo that prints the port right
    assert gloo.failed_peer(RuntimeError(CLOSED.replace("5350", "40765")), object()) == 2
    assert gloo.failed_peer(RuntimeError(CLOSED.replace("5350", "1")), object()) is None
    assert (
        gloo.failed_peer(RuntimeError(CLOSED.replace("127.0.0.1]:5350", "0.0.0.0]:0")), object())
        is None
    )
    assert gloo.failed_peer(RuntimeError("Timed out waiting 3000ms"), object()) is None


def test_gloo_names_a_peer_by_its_ipv6_address(monkeypatch):
    store = _FakeStore(
        {
            "cpu//0/0": _address_blob("::1", 7000, socket.AF_INET6),
            "cpu//0/1": _address_blob("::1", 7001, socket.AF_INET6),
        }
    )
    monkeypatch.setattr(gloo_module, "_group_store", lambda group: store)
    monkeypatch.setattr(gloo_module.dist, "get_world_size", lambda group: 2)
    text = "Connection closed by peer [::1]:7001"
    assert GlooBackend().failed_peer(RuntimeError(text), object()) == 1


def _on_name_the_sender_of_own_address(comm):
    # what gloo would print if this rank's connection closed: the address rank 0
    # published, its port as gloo 2.13 prints it
    group = dist.group.WORLD
    store = gloo_module._group_store(group)
    published = dict(gloo_module._address_keys(store, comm.world_size))
    key = next(k for k, r in published.items() if r == 0)
    # the ranks listen on 127.0.0.1: its sockaddr_in is family, port, address
    found = re.search(
        re.escape(struct.pack("=H", socket.AF_INET)) + rb"(..)\x7f\0\0\x01",
        store.get(key),
        re.DOTALL,
    )
    port = int.from_bytes(found.group(1), sys.byteorder)
    text = f"[pair.cc:553] Connection closed by peer [127.0.0.1]:{port}. GLHF!"
    return GlooBackend().failed_peer(RuntimeError(text), group)


def test_gloo_finds_a_peer_by_the_address_it_published_in_a_real_group(world2):
    # the store's real layout (keys, sockaddr bytes) on torch 2.13: rank 0 on every rank
    assert world2.run(_on_name_the_sender_of_own_address) == [0, 0]
