"""Making ranks agree before a collective: fingerprints of what each rank passed.

:func:`agree` costs one 8-byte all_gather when the ranks agree and a second
round only when they do not (to show what each rank passed). Strict mode and
``Communicator.ensure_same`` use it.
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING

import torch

from commlib import _objects
from commlib.errors import RemoteArgumentError

if TYPE_CHECKING:
    from commlib._engine import Engine
    from commlib.serialization import Serializer


def fingerprint(description: str) -> int:
    """A signed 64-bit digest of ``description``.

    Examples:
        >>> fingerprint("all_reduce float32 (2,)") == fingerprint("all_reduce float32 (2,)")
        True
    """
    digest = hashlib.blake2b(description.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little", signed=True)


def agree(
    engine: Engine, what: str, description: str, serializer: Serializer, slot_size: int
) -> None:
    """Raise on every rank unless all ranks pass the same ``description``.

    The error shows each rank's description, so the difference is readable.

    Examples:
        >>> agree(engine, "all_reduce_dict", "keys=['a', 'b']", serializer, 4096)
    """
    mine = engine.plugin.to_device(torch.tensor([fingerprint(description)], dtype=torch.int64))
    every = torch.empty(engine.world_size, dtype=torch.int64, device=mine.device)
    engine.run(what, engine.plugin.all_gather_into_tensor, every, mine)
    if len(set(every.tolist())) > 1:
        texts = _objects.all_gather_object(engine, description, serializer, slot_size)
        raise RemoteArgumentError(what, dict(enumerate(texts)), "ranks passed different arguments")
