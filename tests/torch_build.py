"""What tests expect from how the installed torch was built, asked of torch, not assumed.

PyPI's Linux torch is a CUDA build; CI runs it on machines without a GPU, where
the nccl plugin's reason is the missing device, not the missing engine.
"""

from __future__ import annotations

import torch.distributed as dist


def nccl_reason() -> str:
    """Why the nccl plugin cannot run on this machine (no GPU here), as torch was built."""
    if not dist.is_nccl_available():
        return "torch was built without NCCL"
    return "no CUDA device visible"
