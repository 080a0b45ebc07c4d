"""Copies between host tensors on the calling thread, whatever their size.

torch splits a copy of more than ``at::internal::GRAIN_SIZE`` elements across
its intra-op threads. Between the ranks of a group on a few shared cores
(each rank's threads, gloo's I/O threads), those threads wait for each
other: copying 256 KiB into the argument check's slot took 3.5 ms instead of
3 us on 2 cores at load 2. The check's round copies its riding data in and
out, so it copies large ones through numpy, which stays on this thread.

Small ones whose layout the caller knows (contiguous host tensors of one
dtype) go as plain memory copies (:func:`copy_bytes`): torch's ``copy_``
passes its dispatcher, whose code is cold when the thread comes back from a
sleep (another engine's blocking call, another program on the core): 2
ranks, load 2.4, thread CPU time of one 1 KiB copy after a torch call on
gloo, median: ``copy_`` 32 us, a memory copy 19 us (after an MPI call 3.6
against 2.7).
"""

from __future__ import annotations

from collections.abc import Sequence
from ctypes import memmove

import numpy as np
import torch

#: torch's grain: copies of more elements may run on several threads
PARALLEL_FROM = 32768


def _bytes(t: torch.Tensor) -> np.ndarray:
    # the same memory as bytes (the last dim, contiguous, times the item size)
    return t.view(torch.uint8).numpy()


def copy_bytes(at: int, parts: Sequence[torch.Tensor], nbytes: int) -> None:
    """Each of ``parts`` (``nbytes`` each) to the address ``at``, back to back.

    The caller vouches that the memory from ``at`` is a contiguous host
    tensor with room for them all, and that each part is a contiguous host
    tensor of ``nbytes`` bytes: nothing is checked.

    Examples:
        >>> out, parts = torch.empty(4), [torch.ones(2), torch.zeros(2)]
        >>> copy_bytes(out.data_ptr(), parts, 8)
        >>> out
        tensor([1., 1., 0., 0.])
    """
    if nbytes:
        for part in parts:
            memmove(at, part.data_ptr(), nbytes)
            at += nbytes


def is_plain_memory(tensor: torch.Tensor) -> bool:
    """Whether ``tensor``'s values are its memory as laid out, for :func:`copy_bytes`.

    A contiguous host tensor with no lazy conjugate or negation (``x.conj()``
    of a complex tensor, ``x.conj().imag``): those read or write other values
    than their bytes hold, which only torch's own copy resolves.

    Examples:
        >>> z = torch.ones(2, dtype=torch.complex64)
        >>> is_plain_memory(z), is_plain_memory(z.conj()), is_plain_memory(z.conj().imag)
        (True, False, False)
        >>> is_plain_memory(torch.ones(2, 3).t())
        False
    """
    return (
        tensor.is_contiguous() and tensor.is_cpu and not tensor.is_conj() and not tensor.is_neg()
    )


def host_copy(dst: torch.Tensor, src: torch.Tensor) -> None:
    """``dst.copy_(src)`` for host tensors of one dtype; a large one on this thread.

    ``src`` may broadcast to ``dst`` as in ``copy_``; each one's last dim
    must be contiguous (a row of slots, a typed area of a slot).

    Examples:
        >>> rows = torch.zeros(2, 40000)
        >>> host_copy(rows, torch.ones(40000))      # into both rows
        >>> rows.sum().item()
        80000.0
    """
    if (
        dst.numel() < PARALLEL_FROM
        or dst.dtype != src.dtype
        or not (dst.is_cpu and src.is_cpu)
        or dst.dim() == 0
        or src.dim() == 0
        or dst.stride(-1) != 1
        or src.stride(-1) != 1
    ):
        dst.copy_(src)
        return
    np.copyto(_bytes(dst), _bytes(src))


def host_clone(t: torch.Tensor) -> torch.Tensor:
    """``t.clone()``; a large contiguous host tensor copied on this thread.

    Examples:
        >>> host_clone(torch.ones(40000)).sum().item()
        40000.0
    """
    if t.numel() < PARALLEL_FROM or not t.is_cpu or not t.is_contiguous():
        return t.clone()
    out = torch.empty_like(t)
    host_copy(out.view(-1), t.view(-1))
    return out


def stack_into(out: torch.Tensor, parts: list[torch.Tensor]) -> None:
    """``torch.stack(parts, out=out)`` where ``out`` is already ``(len(parts), *part)``.

    Examples:
        >>> out = torch.empty(2, 3)
        >>> stack_into(out, [torch.zeros(3), torch.ones(3)])
        >>> out[1]
        tensor([1., 1., 1.])
    """
    if out.numel() < PARALLEL_FROM:
        torch.stack(parts, out=out)
        return
    for row, part in zip(out.unbind(0), parts):
        host_copy(row, part)
