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


def _store_and_key(comm: Communicator, seq: int) -> tuple[Any, str] | tuple[None, None]:
    try:
        store = dist.distributed_c10d._get_default_store()
        name = getattr(comm.group, "group_name", None) or "world"
    except Exception:  # private API; without it we just cannot name the ranks
        return None, None
    return store, f"commlib/arrived/{name}/{seq}"


def missing_ranks(comm: Communicator, seq: int, what: str, grace: float = 1.0) -> dict[int, str]:
    """After a timeout: the ranks that did not reach collective ``seq`` (rank -> where).

    A rank stuck in a different collective is reported with that collective's
    name; a rank that never wrote is reported as ``"did not arrive"``.

    Examples:
        >>> missing_ranks(comm, 17, "all_reduce")
        {2: 'did not arrive'}
    """
    store, key = _store_and_key(comm, seq)
    if store is None:
        return {}
    try:
        store.set(f"{key}/{comm.rank}", what)
        deadline = time.monotonic() + grace
        names = [f"{key}/{r}" for r in range(comm.world_size)]
        while time.monotonic() < deadline and not store.check(names):
            time.sleep(0.05)
        out = {}
        for r, name in enumerate(names):
            if store.check([name]):
                where = store.get(name).decode()
                if where != what:
                    out[r] = f"waiting in {where}"
            else:
                out[r] = "did not arrive"
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
