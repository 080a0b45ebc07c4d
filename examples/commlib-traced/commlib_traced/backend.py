"""``traced``: a backend that hands every call to another one and records it.

It is written only against commlib's public plugin API (``commlib.Backend``
and the plugin registry), as any third-party plugin would be.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import torch

from commlib import Backend
from commlib.plugins import resolve_backend
from commlib_traced import trace


class _TimedWork:
    """An engine's work handle that records its event when it is waited for."""

    def __init__(self, work: Any, finish: Callable[[], None]):
        self._work, self._finish = work, finish

    def wait(self, *args: Any, **kwargs: Any) -> Any:
        result = self._work.wait(*args, **kwargs)
        self._finish()
        return result

    def is_completed(self) -> bool:
        return self._work.is_completed()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._work, name)


def _nbytes(tensors: Sequence[torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


class TracedBackend(Backend):
    """Runs on ``inner_name`` (gloo) and records every collective in :mod:`commlib_traced.trace`.

    To trace another backend, subclass with ``inner_name`` and
    ``torch_backend`` set to it (and its ``device_type`` and
    ``large_payload_transport``).

    Examples:
        >>> class TracedNccl(TracedBackend):
        ...     name = "traced-nccl"
        ...     inner_name = torch_backend = "nccl"
        ...     device_type = "cuda"
        ...     large_payload_transport = "collective"
    """

    name = "traced"
    inner_name: ClassVar[str] = "gloo"
    torch_backend = "gloo"
    device_type = "cpu"
    description = "gloo, recording every collective (commlib-traced)"
    native_avg = False
    large_payload_transport = "p2p"  # what gloo prefers

    @property
    def inner(self) -> Backend:
        """The backend doing the work (looked up lazily: the registry is built after us)."""
        return resolve_backend(self.inner_name)

    # -- everything but the collectives is the inner backend's -------------------------
    def unavailable_reason(self) -> str | None:
        return self.inner.unavailable_reason()

    def device(self) -> torch.device:
        return self.inner.device()

    def setup_device(self, local_rank: int) -> None:
        self.inner.setup_device(local_rank)

    def to_device(self, tensor: torch.Tensor) -> torch.Tensor:
        return self.inner.to_device(tensor)

    def serializer(self) -> Any:
        return self.inner.serializer()

    def init_process_group(self, **kwargs: Any) -> None:
        self.inner.init_process_group(**kwargs)

    def new_group(
        self, ranks: Sequence[int], timeout: datetime.timedelta | None = None, **how: Any
    ) -> Any:
        return self.inner.new_group(ranks, timeout, **how)

    def rank(self, group: Any) -> int:
        return self.inner.rank(group)

    def world_size(self, group: Any) -> int:
        return self.inner.world_size(group)

    def torch_reduce_op(self, op: str) -> Any:
        return self.inner.torch_reduce_op(op)

    # -- the collectives, recorded -----------------------------------------------------
    def _traced(
        self,
        op: str,
        tensors: Sequence[torch.Tensor],
        group: Any,
        call: Callable[[], Any],
        detail: str = "",
    ) -> Any:
        first = tensors[0] if tensors else None
        event = trace.Event(
            op=op,
            nbytes=_nbytes(tensors),
            dtype=str(first.dtype) if first is not None else "-",
            shape=tuple(first.shape) if first is not None else (),
            rank=self.rank(group),
            start=trace.now(),
            detail=detail,
        )

        def finish() -> None:
            event.seconds = trace.now() - event.start
            trace.record(event)

        work = call()
        if work is None or not hasattr(work, "wait"):
            finish()
            return work
        return _TimedWork(work, finish)

    def all_reduce(self, tensor, op, group, async_op=False):
        return self._traced(
            "all_reduce",
            [tensor],
            group,
            lambda: self.inner.all_reduce(tensor, op, group, async_op),
            op,
        )

    def all_gather(self, tensor_list, tensor, group, async_op=False):
        return self._traced(
            "all_gather",
            [tensor],
            group,
            lambda: self.inner.all_gather(tensor_list, tensor, group, async_op),
        )

    def all_gather_into_tensor(self, output, tensor, group, async_op=False):
        return self._traced(
            "all_gather_into_tensor",
            [tensor],
            group,
            lambda: self.inner.all_gather_into_tensor(output, tensor, group, async_op),
        )

    def gather(self, tensor, gather_list, dst, group, async_op=False):
        return self._traced(
            "gather",
            [tensor],
            group,
            lambda: self.inner.gather(tensor, gather_list, dst, group, async_op),
            f"dst={dst}",
        )

    def broadcast(self, tensor, src, group, async_op=False):
        return self._traced(
            "broadcast",
            [tensor],
            group,
            lambda: self.inner.broadcast(tensor, src, group, async_op),
            f"src={src}",
        )

    def reduce_scatter(self, output, input, op, group, async_op=False):
        return self._traced(
            "reduce_scatter",
            [input],
            group,
            lambda: self.inner.reduce_scatter(output, input, op, group, async_op),
            op,
        )

    def barrier(self, group, timeout=None):
        return self._traced("barrier", [], group, lambda: self.inner.barrier(group, timeout))

    def exchange(self, sends, recvs, group, async_op=False):
        tensors = [t for t, _ in sends] + [t for t, _ in recvs]
        detail = f"sends={len(sends)} recvs={len(recvs)}"
        return self._traced(
            "exchange",
            tensors,
            group,
            lambda: self.inner.exchange(sends, recvs, group, async_op),
            detail,
        )

    def reduce(self, tensor, dst, op, group, async_op=False):
        return self._traced(
            "reduce",
            [tensor],
            group,
            lambda: self.inner.reduce(tensor, dst, op, group, async_op),
            f"dst={dst} {op}",
        )

    def scatter(self, tensor, scatter_list, src, group, async_op=False):
        return self._traced(
            "scatter",
            [tensor],
            group,
            lambda: self.inner.scatter(tensor, scatter_list, src, group, async_op),
            f"src={src}",
        )

    def all_to_all(self, output_list, input_list, group, async_op=False):
        return self._traced(
            "all_to_all",
            input_list,
            group,
            lambda: self.inner.all_to_all(output_list, input_list, group, async_op),
        )

    def all_to_all_single(
        self, output, input, output_split_sizes, input_split_sizes, group, async_op=False
    ):
        return self._traced(
            "all_to_all_single",
            [input],
            group,
            lambda: self.inner.all_to_all_single(
                output, input, output_split_sizes, input_split_sizes, group, async_op
            ),
        )

    def send(self, tensor, dst, group, async_op=False, tag=0):
        return self._traced(
            "send",
            [tensor],
            group,
            lambda: self.inner.send(tensor, dst, group, async_op, tag),
            f"dst={dst}",
        )

    def recv(self, tensor, src, group, async_op=False, tag=0):
        return self._traced(
            "recv",
            [tensor],
            group,
            lambda: self.inner.recv(tensor, src, group, async_op, tag),
            f"src={src}",
        )

    def batch_isend_irecv(self, requests, group, async_op=False):
        return self._traced(
            "batch_isend_irecv",
            [r.tensor for r in requests],
            group,
            lambda: self.inner.batch_isend_irecv(requests, group, async_op),
            f"ops={len(requests)}",
        )
