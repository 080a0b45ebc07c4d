"""Making ranks agree: fingerprints before collectives, and who is missing on timeout.

:func:`agree` costs one 8-byte all_gather when the ranks agree and a second
round only when they do not (to print what each rank passed).
:func:`missing_ranks` runs only after a timeout: each rank that timed out marks
itself in the process group's store, so the survivors can name the ranks that
never arrived or are stuck in another collective.
"""

from __future__ import annotations

import datetime
import hashlib
import time
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from commlib.errors import RemoteArgumentError

if TYPE_CHECKING:
    from commlib.communicator import Communicator


def fingerprint(description: str) -> int:
    """A signed 64-bit digest of ``description``.

    Examples:
        >>> fingerprint("all_reduce float32 (2,)") == fingerprint("all_reduce float32 (2,)")
        True
    """
    digest = hashlib.blake2b(description.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little", signed=True)


def agree(comm: Communicator, what: str, description: str) -> None:
    """Raise on every rank unless all ranks pass the same ``description``.

    The error shows each rank's description, so the difference is readable.

    Examples:
        >>> agree(comm, "all_reduce_dict", "keys=['a', 'b']")
    """
    mine = comm.plugin.to_device(torch.tensor([fingerprint(description)], dtype=torch.int64))
    every = torch.empty(comm.world_size, dtype=torch.int64, device=mine.device)
    comm._collective(what, "all_gather_into_tensor", every, mine)
    if len(set(every.tolist())) > 1:
        texts = comm.all_gather_object(description)
        raise RemoteArgumentError(what, dict(enumerate(texts)), "ranks passed different arguments")


def _store_and_prefix(comm: Communicator) -> tuple[Any, str] | tuple[None, None]:
    try:
        store = dist.distributed_c10d._get_default_store()
        name = getattr(comm.group, "group_name", None) or "world"
    except Exception:  # private API; without it we just cannot name the ranks
        return None, None
    return store, f"commlib/state/{name}"


def record_failure(comm: Communicator, seq: int, what: str, how: str) -> None:
    """Note in the store that this rank's collective ``seq`` (``what``) ended in ``how``.

    One key per rank, overwritten each time, so peers that time out later can
    say where this rank was.

    Examples:
        >>> record_failure(comm, 17, "all_reduce", "failed")
    """
    store, prefix = _store_and_prefix(comm)
    if store is None:
        return
    try:
        store.set(f"{prefix}/{comm.rank}", f"{seq}|{what}|{how}")
    except Exception:
        pass


def missing_ranks(comm: Communicator, seq: int, what: str, grace: float = 1.0) -> dict[int, str]:
    """After a timeout: where the ranks that held up collective ``seq`` are (rank -> where).

    Every rank that times out or fails records itself (:func:`record_failure`);
    after a short grace for the others to do the same, a rank that recorded the
    same collective is left out (it waited too), one that recorded another is
    reported there ("failed in broadcast #12", "timed out in barrier #9"), and
    one that recorded nothing "did not arrive".

    Examples:
        >>> missing_ranks(comm, 17, "all_reduce")
        {2: 'did not arrive'}
    """
    record_failure(comm, seq, what, "timed out")
    store, prefix = _store_and_prefix(comm)
    if store is None:
        return {}
    try:
        names = [f"{prefix}/{r}" for r in range(comm.world_size)]
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and not store.check(names):
            time.sleep(0.05)
        out = {}
        for r, name in enumerate(names):
            if r == comm.rank:
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
    except Exception:
        return {}


def as_timedelta(value: datetime.timedelta | float | int | None) -> datetime.timedelta | None:
    """Seconds (or a timedelta, or None) as a timedelta.

    Examples:
        >>> as_timedelta(1.5)
        datetime.timedelta(seconds=1, microseconds=500000)
    """
    if value is None or isinstance(value, datetime.timedelta):
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise ValueError(f"timeout must be a positive number of seconds, got {value!r}")
    return datetime.timedelta(seconds=value)
