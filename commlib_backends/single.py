"""``single``: a world of one process, without torch.distributed.

Used whenever torch.distributed is not initialised, so code written for many
ranks runs unchanged in a plain ``python train.py``. Collectives leave data on
whatever device it is on.
"""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from typing import Any

import torch

from commlib.backend import Backend
from commlib.hookspecs import hookimpl


class SingleBackend(Backend):
    """The world of one: every collective is the identity (or a copy)."""

    name = "single"
    torch_backend = None
    device_type = "cpu"
    description = "no distributed run: one process, no process group"
    native_avg = True

    def unavailable_reason(self) -> str | None:
        return None

    def to_device(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor

    def init_process_group(self, **kwargs: Any) -> None:
        raise ValueError("the 'single' backend runs without a process group; nothing to init")

    def new_group(
        self, ranks: Sequence[int], timeout: datetime.timedelta | None = None, **how: Any
    ) -> Any:
        if list(ranks) != [0]:
            raise ValueError(f"a single-process world has only rank 0, got ranks {list(ranks)}")
        return None

    def rank(self, group: Any) -> int:
        return 0

    def world_size(self, group: Any) -> int:
        return 1

    def torch_reduce_op(self, op: str) -> Any:
        return op

    def all_reduce(self, tensor, op, group, async_op=False):
        return None

    def all_gather(self, tensor_list, tensor, group, async_op=False):
        tensor_list[0].copy_(tensor)

    def all_gather_into_tensor(self, output, tensor, group, async_op=False):
        output.copy_(tensor.reshape(output.shape))

    def gather(self, tensor, gather_list, dst, group, async_op=False):
        if gather_list:
            gather_list[0].copy_(tensor)

    def broadcast(self, tensor, src, group, async_op=False):
        return None

    def reduce_scatter(self, output, input, op, group, async_op=False):
        output.copy_(input.reshape(output.shape))

    def reduce(self, tensor, dst, op, group, async_op=False):
        return None

    def scatter(self, tensor, scatter_list, src, group, async_op=False):
        if scatter_list:
            tensor.copy_(scatter_list[0].reshape(tensor.shape))

    def all_to_all(self, output_list, input_list, group, async_op=False):
        output_list[0].copy_(input_list[0].reshape(output_list[0].shape))

    def all_to_all_single(
        self, output, input, output_split_sizes, input_split_sizes, group, async_op=False
    ):
        output.copy_(input.reshape(output.shape))

    def barrier(self, group, timeout=None) -> None:
        return None

    def send(self, tensor, dst, group, async_op=False, tag=0):
        raise ValueError("a single-process world has no peer to send to")

    def recv(self, tensor, src, group, async_op=False, tag=0):
        raise ValueError("a single-process world has no peer to receive from")

    def batch_isend_irecv(self, requests, group, async_op=False) -> None:
        if requests:
            raise ValueError("a single-process world has no peers to exchange with")


@hookimpl
def commlib_backends():
    return [SingleBackend]
