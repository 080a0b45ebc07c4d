"""This rank's outgoing slot of a first round, kept in host memory from call to call.

The argument check (:mod:`commlib._guard`) and ``all_gather``'s first round
(:mod:`commlib._ragged`) each send one slot per rank: a header, then the data
when it fits. Their buffer lives as long as the engine, so no call allocates
it. A small slot (up to :data:`REPEAT_UP_TO`) is written once per rank, into
every row, so that an engine that gathers small tensors by all_to_all sends
the rows as they are (:meth:`Backend.all_gather_slots`); a larger one once.
The views of the data areas, typed and shaped like the data, are made once per
layout: on a small CPU each view op costs microseconds.
"""

from __future__ import annotations

import torch

from commlib._host_copy import host_copy
from commlib._rooms import PAD_UP_TO

#: slots up to this many bytes are written into every row (one copy of the data
#: for them all); a larger one once, and not copied where the engine gathers it
#: itself: the size up to which the slot carries the data of most collectives
REPEAT_UP_TO = PAD_UP_TO

#: data layouts (dtype and shape) a slot keeps views for; a loop uses a handful
LAYOUTS = 64


def copies_of(world: int, size: int, on_cpu: bool) -> int:
    """How many rows a slot of ``size`` bytes is written into.

    Examples:
        >>> copies_of(4, 4096, on_cpu=True), copies_of(4, 1 << 20, on_cpu=True)
        (4, 1)
        >>> copies_of(4, 4096, on_cpu=False)  # one row, moved to the device
        1
    """
    return world if on_cpu and size <= REPEAT_UP_TO else 1


class Areas:
    """The data area of every row of a sent slot, typed and shaped like one layout of data."""

    __slots__ = ("every", "first", "head_row", "rest")

    def __init__(self, rows: torch.Tensor, data_at: int, like: torch.Tensor, nbytes: int):
        typed = rows.narrow(1, data_at, nbytes).view(like.dtype)
        #: every row's area, ``(rows, *like.shape)``: one copy fills them all
        self.every = typed.view(len(rows), *like.shape)
        #: the first row's area, for a writer that fills it in place
        self.first = self.every[0]
        self.head_row, self.rest = self.every[:1], self.every[1:]

    def spread(self) -> None:
        """Copy what a writer put in the first row's area into the other rows'."""
        if len(self.rest):
            host_copy(self.rest, self.head_row)


class SentSlot:
    """One engine's outgoing slot: ``copies`` rows of ``size`` bytes, data from ``data_at``.

    Examples:
        >>> slot = SentSlot(copies=2, size=128, data_at=64)
        >>> slot.head(b"header")
        >>> slot.areas(torch.ones(2), 8).every.copy_(torch.ones(2))
        tensor([[1., 1.],
                [1., 1.]])
        >>> bytes(slot.rows[1, :6])
        b'header'
    """

    __slots__ = ("_data_at", "layouts", "raw", "rows", "size", "starts")

    def __init__(self, copies: int, size: int, data_at: int):
        self.size = size
        self.raw = bytearray(copies * size)
        self.rows = torch.frombuffer(self.raw, dtype=torch.uint8).view(copies, size)
        self.starts = range(0, copies * size, size)
        self.layouts: dict[tuple[torch.dtype, torch.Size], Areas] = {}
        self._data_at = data_at

    def head(self, header: bytes) -> None:
        """Write ``header`` at the start of every row."""
        size = len(header)
        for start in self.starts:
            self.raw[start : start + size] = header

    def areas(self, like: torch.Tensor, nbytes: int) -> Areas:
        """The data areas, typed and shaped like ``like`` (made once per layout)."""
        key = (like.dtype, like.shape)
        found = self.layouts.get(key)
        if found is None:
            if len(self.layouts) >= LAYOUTS:
                self.layouts.clear()
            found = self.layouts[key] = Areas(self.rows, self._data_at, like, nbytes)
        return found
