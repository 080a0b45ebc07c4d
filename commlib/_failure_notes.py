"""Where each rank was when a collective failed: notes in the process group's store.

Read only on the failure path. Each rank that times out or fails writes one
key (overwritten each time), so a rank that times out later can name the
ranks that held it up: "did not arrive", "failed in broadcast #12",
"timed out in barrier #9". The first rank that finds the group broken also
says so for the group as a whole, so ranks still waiting on live peers (who
gave up) learn it within a moment instead of at their own timeout.
"""

from __future__ import annotations

import time
from typing import Any

from commlib._world import default_store, store_failed

# how long a rank that timed out waits for the others' notes, to name them
GRACE = 1.0


def _store_and_prefix(group: Any) -> tuple[Any, str] | tuple[None, None]:
    store = default_store()
    if store is None:  # without one we just cannot name the ranks
        return None, None
    try:
        name = getattr(group, "group_name", None) or "world"
    except Exception:
        return None, None
    return store, f"commlib/state/{name}"


def record(group: Any, rank: int, seq: int, what: str, how: str) -> None:
    """Note that this rank's collective ``seq`` (``what``) ended in ``how``.

    Examples:
        >>> record(group, 0, 17, "all_reduce", "failed")  # in a process group  # doctest: +SKIP
    """
    store, prefix = _store_and_prefix(group)
    if store is None:
        return
    try:
        store.set(f"{prefix}/{rank}", f"{seq}|{what}|{how}")
    except Exception as exc:  # the store may be what failed; the error still goes up
        store_failed(exc)


def missing_ranks(
    group: Any, rank: int, world_size: int, seq: int, what: str, grace: float = GRACE
) -> dict[int, str]:
    """After a timeout: where the ranks that held up collective ``seq`` are (rank -> where).

    This rank records itself first; after a short ``grace`` for the others to
    do the same, a rank that recorded the same collective is left out (it
    waited too), one that recorded another is reported there, and one that
    recorded nothing "did not arrive".

    Examples:
        >>> missing_ranks(group, 0, 3, 17, "all_reduce")  # 3 ranks, rank 2 gone  # doctest: +SKIP
        {2: 'did not arrive'}
    """
    record(group, rank, seq, what, "timed out")
    store, prefix = _store_and_prefix(group)
    if store is None:
        return {}
    try:
        names = [f"{prefix}/{r}" for r in range(world_size)]
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and not store.check(names):
            time.sleep(0.05)
        out = {}
        for r, name in enumerate(names):
            if r == rank:
                continue
            if not store.check([name]):
                out[r] = "did not arrive"
                continue
            their_seq, their_what, how = store.get(name).decode().split("|", 2)
            if int(their_seq) == seq and their_what == what and how == "timed out":
                continue  # waiting alongside this rank
            if int(their_seq) == seq and their_what == what:
                out[r] = f"{how} in this {what}"
            else:
                out[r] = f"{how} in {their_what} #{their_seq}"
        return out
    except Exception as exc:  # naming the ranks is a courtesy; the timeout error goes up anyway
        store_failed(exc)
        return {}


def announce_broken(group: Any, reason: str, timed_out: bool, lost: bool = False) -> None:
    """Tell the group's other ranks that it broke, why, by a timeout or not, a rank lost or not.

    The first rank to announce it is the one the others hear of.

    Examples:
        >>> announce_broken(group, "all_reduce failed on rank 2: Connection reset", False)
        ... # doctest: +SKIP
    """
    store, prefix = _store_and_prefix(group)
    if store is None:
        return
    try:
        store.compare_set(f"{prefix}/broken", "", f"{int(timed_out)}{int(lost)}|{reason}")
    except Exception as exc:  # the store may be what failed; each rank still finds out by itself
        store_failed(exc)


def broken_elsewhere(group: Any) -> tuple[str, bool, bool] | None:
    """Why another rank found ``group`` broken, whether by a timeout, whether a rank was lost.

    ``None`` if no rank has.

    Examples:
        >>> broken_elsewhere(group) is None  # doctest: +SKIP
        True
    """
    store, prefix = _store_and_prefix(group)
    if store is None:
        return None
    key = f"{prefix}/broken"
    try:
        if not store.check([key]):
            return None
        how, _, reason = store.get(key).decode().partition("|")
    except Exception as exc:  # an unreachable store tells nothing; the call's timeout ends it
        store_failed(exc)
        return None
    return reason, how[:1] == "1", how[1:2] == "1"
