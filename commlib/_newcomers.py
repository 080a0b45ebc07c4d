"""Growing back: newcomers ask to join in the job's store; members and newcomers form a new world.

The job's store is the TCPStore of the rendezvous (``MASTER_ADDR``,
``MASTER_PORT``), hosted by the launcher (``commlib run``, torchrun's agent)
or by rank 0's process (``env://`` by hand). Its keys, under
``commlib/grow/``:

* ``tickets``: a counter; a newcomer takes the next number (its ticket) and
  leaves ``ticket/<n>`` = where it runs (machine and pid, so a member on the
  same machine knows at once when it died);
* ``first``: the first ticket no grow has decided on yet;
* ``round/<world>/<attempt>``: one grow of the members of world ``<world>``:
  the first member to see enough newcomers (or its wait run out) writes the
  decision with one ``compare_set``, every member adopts it: which tickets
  join, and the new world's name;
* ``ticket/<n>/place``: the decision as that newcomer needs it: the new
  world's name, its rank, the size, the plugin.

Then every process of the new world (members in their order, newcomers in
ticket order) lets go of its old process groups and starts the new world in
``commlib/world/<name>`` of the same store, with one barrier, and each says
in the store whether that worked. If any did not (a process died or could not
connect within the timeout), the live ones meet again, leave out whoever did
not arrive, and form the smaller world; after a second failure they give up
with the same :class:`~commlib.errors.CommError` everywhere.
"""

from __future__ import annotations

import datetime
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch.distributed as dist

from commlib import _survivors
from commlib._world import world
from commlib.backend import Backend
from commlib.errors import CommError

_POLL = 0.01  # seconds between looks at the store while waiting
_GROW = "commlib/grow"
_WORLDS = "commlib/world"
_TRIES = 3  # forming a world: the first try, and two with whoever is left
# init_process_group wraps sys.excepthook to prefix "[rank<r>]": each new world wraps the
# hook from before the first one, so a traceback carries one prefix, with the current rank
_HOOK_BEFORE_WORLDS = sys.excepthook


@dataclass(frozen=True)
class Place:
    """Where a process stands in a world about to form: its name, this rank, the size.

    ``timeout`` (seconds) is the members' limit for forming it; ``limit``
    their communicator's timeout, which the newcomer's communicator takes.

    Examples:
        >>> Place("w1", 2, 3, "gloo", 60.0, 1800.0).rank
        2
    """

    world: str
    rank: int
    size: int
    plugin: str
    timeout: float
    limit: float


def store_address() -> tuple[str, int]:
    """Host and port of the job's store: the current world's TCPStore, else the environment.

    Examples:
        >>> store_address()  # under commlib run  # doctest: +SKIP
        ('127.0.0.1', 29500)
    """
    kv = _survivors.store()
    while isinstance(kv, dist.PrefixStore):
        kv = kv.underlying_store
    if isinstance(kv, dist.TCPStore):
        return kv.host, kv.port
    host, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
    if not host or not port:
        raise ValueError(
            "grow/join: no TCPStore to meet in: start the ranks with `commlib run` (or "
            "torchrun, or MASTER_ADDR and MASTER_PORT set for env://)"
        )
    return host, int(port)


def connect(address: tuple[str, int], timeout: datetime.timedelta) -> dist.TCPStore:
    """A client of the job's store (``timeout``: how long one of its waits may take).

    Examples:
        >>> kv = connect(("127.0.0.1", 29500), timedelta(seconds=30))  # doctest: +SKIP
    """
    host, port = address
    try:
        return dist.TCPStore(host, port, is_master=False, timeout=timeout, wait_for_workers=False)
    except Exception as exc:  # the host of the store is gone, or never was
        raise CommError(
            f"grow/join: the job's store at {host}:{port} cannot be reached ({exc}); it lives "
            "in the launcher (`commlib run`, torchrun's agent) or in rank 0 (env://)"
        ) from exc


def client(address: tuple[str, int], timeout: datetime.timedelta) -> Any:
    """This process's client of the job's store at ``address``, kept between grows.

    A grow called every step then costs a few round trips, not a connection.

    Examples:
        >>> kv = client(("127.0.0.1", 29500), timedelta(seconds=30))  # doctest: +SKIP
    """
    kept = world.job_store
    if kept is not None and kept[0] == address:
        kept[1].set_timeout(timeout)
        return kept[1]
    kv = connect(address, timeout)
    world.job_store = (address, kv)
    return kv


def _int(kv: Any, key: str, default: int) -> int:
    return int(kv.get(key).decode()) if kv.check([key]) else default


# -- the newcomer's side -------------------------------------------------------------
def ask(kv: Any) -> int:
    """Ask to join: take a ticket and leave where this process runs; returns the ticket.

    Examples:
        >>> ticket = ask(kv)  # doctest: +SKIP
    """
    ticket = int(kv.add(f"{_GROW}/tickets", 1))
    kv.set(f"{_GROW}/ticket/{ticket}", _survivors.process_record() or "elsewhere")
    return ticket


def await_place(kv: Any, ticket: int, timeout: datetime.timedelta) -> Place:
    """The place a grow gave ``ticket``; a :class:`CommError` when none did within ``timeout``.

    Examples:
        >>> await_place(kv, 1, timedelta(minutes=5))  # doctest: +SKIP
        Place(world='w1', rank=3, size=4, plugin='gloo', timeout=60.0, limit=1800.0)
    """
    key = f"{_GROW}/ticket/{ticket}/place"
    deadline = time.monotonic() + timeout.total_seconds()
    while not kv.check([key]):
        if time.monotonic() >= deadline:
            raise CommError(
                f"join: no running group took this newcomer (ticket {ticket}) within "
                f"{timeout.total_seconds():g} s: the members grow with comm.grow()"
            )
        time.sleep(_POLL)
    name, rank, size, plugin, forming, limit = kv.get(key).decode().split()
    return Place(name, int(rank), int(size), plugin, float(forming), float(limit))


# -- the members' side ---------------------------------------------------------------
def _waiting(kv: Any, first: int, count: int | None) -> tuple[list[int], int]:
    """Live newcomers from ticket ``first`` on (at most ``count``), and the ticket after them."""
    asked = int(kv.add(f"{_GROW}/tickets", 0))
    ready: list[int] = []
    after = first
    for ticket in range(first, asked + 1):
        key = f"{_GROW}/ticket/{ticket}"
        if not kv.check([key]):
            break  # took its number, has not said where it runs yet: the next grow's
        after = ticket + 1
        if _survivors.record_ended(kv.get(key).decode()):
            continue  # died while waiting: nobody takes it
        ready.append(ticket)
        if count is not None and len(ready) == count:
            break
    return ready, after


def decide(
    kv: Any,
    members: Sequence[int],
    count: int | None,
    wait: datetime.timedelta,
    plugin: Backend,
    timeout: datetime.timedelta,
    limit: datetime.timedelta,
) -> tuple[str, list[int]] | None:
    """Which newcomers join this world's next grow: the new world's name and their tickets.

    ``members`` are the growing group's ranks in the current world (a group
    shrink left with the same attempt count meets in another round). Every
    member calls it with the same arguments; all get the same answer
    (``None``: nobody asked in time). ``count`` newcomers are awaited up to
    ``wait``; ``None`` takes whoever has asked when ``wait`` ends. Each
    newcomer taken is told its place, ``timeout`` (the limit for forming the
    world) and ``limit`` (the members' communicator timeout).

    Examples:
        >>> decide(kv, [0, 1, 2], 1, timedelta(30), plugin, timedelta(60), timedelta(1800))
        ... # doctest: +SKIP
        ('w1', [1])
    """
    attempt = world.grows
    world.grows += 1
    group = ",".join(map(str, members))
    decision = f"{_GROW}/round/{world.world_name}/{attempt}/{group}"
    deadline = time.monotonic() + wait.total_seconds()
    while not kv.check([decision]):
        ready, after = _waiting(kv, _int(kv, f"{_GROW}/first", 1), count)
        enough = count is not None and len(ready) >= count
        if not enough and time.monotonic() < deadline:
            time.sleep(_POLL)
            continue
        name = f"w{int(kv.add(f'{_WORLDS}/count', 1))}" if ready else "-"
        kv.compare_set(decision, "", f"{after};{name};{','.join(map(str, ready))}")
    after_text, name, tickets_text = kv.get(decision).decode().split(";")
    tickets = [int(t) for t in tickets_text.split(",") if t]
    kv.set(f"{_GROW}/first", after_text)
    if not tickets:
        return None
    size = len(members) + len(tickets)
    for i, ticket in enumerate(tickets):
        # where the newcomer runs, so the others know at once if it dies while the world forms
        rank = len(members) + i
        kv.set(f"{_WORLDS}/{name}/proc/{rank}", kv.get(f"{_GROW}/ticket/{ticket}"))
        seconds = f"{timeout.total_seconds()} {limit.total_seconds()}"
        place = f"{name} {rank} {size} {plugin.name} {seconds}"
        kv.set(f"{_GROW}/ticket/{ticket}/place", place)
    return name, tickets


def note_members(kv: Any, world_name: str, records: Sequence[str | None]) -> None:
    """Leave where the members run (their old ranks' records) in the new world's room.

    A member that dies before it starts the new world is then known dead at
    once on its machine, as a newcomer is, instead of by the timeout.

    Examples:
        >>> note_members(kv, "w1", ["<machine> 4242", None])  # doctest: +SKIP
    """
    for rank, record in enumerate(records):
        if record is not None:
            kv.set(f"{_WORLDS}/{world_name}/proc/{rank}", record)


# -- every process of the new world --------------------------------------------------
def _let_go() -> None:
    """Destroy this process's old world (every group of it) before it joins the new one."""
    world.forget_communicators()
    if dist.is_initialized():
        try:
            dist.destroy_process_group()
        except Exception:  # a broken group may fail to shut down; it is dropped all the same
            pass


def _start(plugin: Backend, kv: Any, place: Place, timeout: datetime.timedelta) -> str | None:
    """Start the world ``place`` names; ``None`` when it works here, else why not."""
    _let_go()
    room = dist.PrefixStore(f"{_WORLDS}/{place.world}", kv)
    room.set(f"proc/{place.rank}", _survivors.process_record() or "elsewhere")
    sys.excepthook = _HOOK_BEFORE_WORLDS
    try:
        plugin.init_process_group(
            store=room, rank=place.rank, world_size=place.size, timeout=timeout
        )
        plugin.barrier(dist.group.WORLD, timeout)
        return None
    except Exception as exc:  # a process of it died or did not come: decided together below
        return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"


def _verdict(
    kv: Any, place: Place, why: str | None, timeout: datetime.timedelta
) -> tuple[bool, list[int]]:
    """Whether ``place``'s world formed on every rank, and which ranks are still there; agreed."""
    room = f"{_WORLDS}/{place.world}"
    kv.set(f"{room}/ok/{place.rank}", "" if why is None else why or "failed")
    deadline = time.monotonic() + timeout.total_seconds()
    decision = f"{room}/verdict"
    while not kv.check([decision]):
        said = [r for r in range(place.size) if kv.check([f"{room}/ok/{r}"])]
        missing = [
            r for r in range(place.size) if r not in said and not _ended(kv, f"{room}/proc/{r}")
        ]
        if missing and time.monotonic() < deadline:
            time.sleep(_POLL)
            continue
        good = [r for r in said if not kv.get(f"{room}/ok/{r}").decode()]
        formed = len(good) == place.size
        kv.compare_set(decision, "", f"{int(formed)};{','.join(map(str, said))}")
    formed_text, there_text = kv.get(decision).decode().split(";")
    return formed_text == "1", [int(r) for r in there_text.split(",") if r]


def _ended(kv: Any, key: str) -> bool:
    return kv.check([key]) and _survivors.record_ended(kv.get(key).decode())


def form(plugin: Backend, kv: Any, place: Place, timeout: datetime.timedelta) -> int:
    """Start the world ``place`` names with the others of it; returns this process's rank in it.

    When it does not form within ``timeout`` (a process died, or could not
    connect), the processes that are still there form it without the others
    (ranks renumbered in order), at most twice; then every one of them
    raises the same :class:`CommError`. A process left out raises too.

    Examples:
        >>> form(plugin, kv, Place("w1", 3, 4, "gloo", 60.0, 1800.0), timedelta(60))
        ... # doctest: +SKIP
        3
    """
    tried: list[str] = []
    for attempt in range(_TRIES):
        why = _start(plugin, kv, place, timeout)
        formed, there = _verdict(kv, place, why, timeout)
        if formed:
            world.started(plugin)
            world.world_name, world.grows = place.world, 0
            world.teardown_at_exit()
            return place.rank
        tried.append(f"world {place.world} of {place.size}: {len(there)} came")
        _let_go()
        if place.rank not in there:
            break
        if attempt + 1 == _TRIES:
            break
        rank, size = there.index(place.rank), len(there)
        place = Place(f"{place.world}r", rank, size, place.plugin, place.timeout, place.limit)
    raise CommError(
        "grow: the new group did not form (" + "; ".join(tried) + "); this process is not "
        f"in any group now (last failure here: {why})"
    )
