"""How the installed torch was built for devices: the device half of ``commlib._torch_facts``.

The core names no device (device knowledge lives in ``commlib_backends/``), so the
facts that do, which engine ``"nccl"`` means and whether torch has NCCL at
all, are here, probed from torch as the core's are.

Examples:
    >>> from commlib_backends import torch_build
    >>> torch_build.nccl_engine() in ("nccl", "nccl2")
    True
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist

from commlib import _torch_facts as torch_facts

__all__ = ["CUDA_BUILD", "NCCL_BUILT", "build", "nccl_engine"]

#: torch was built with CUDA (PyPI's Linux wheels are); says nothing about a GPU being here
CUDA_BUILD: bool = torch.version.cuda is not None

#: torch.distributed has its NCCL engine (a CUDA build); a GPU may still be missing
NCCL_BUILT: bool = dist.is_available() and dist.is_nccl_available()

#: the first torch whose ``"nccl"`` means nccl2 unless ``TORCH_DIST_USE_NCCL2=0``
NCCL2_DEFAULT_FROM = (2, 15)


def build() -> str:
    """How this torch was built: ``"CPU"``, ``"CUDA 13.0"`` or ``"ROCm 6.4"``.

    Examples:
        >>> build()             # PyPI's Linux wheel  # doctest: +SKIP
        'CUDA 13.0'
    """
    hip = getattr(torch.version, "hip", None)
    if hip:
        return f"ROCm {hip}"
    return f"CUDA {torch.version.cuda}" if CUDA_BUILD else "CPU"


def nccl_engine() -> str:
    """The engine ``init_process_group("nccl")`` creates here: ``"nccl2"`` or ``"nccl"``.

    torch 2.14 has both (``nccl2`` and ``nccl-legacy`` are names of their own)
    and takes nccl2 for ``"nccl"`` when ``TORCH_DIST_USE_NCCL2=1``; torch 2.15
    takes it unless ``TORCH_DIST_USE_NCCL2=0``. nccl2 binds one device to a
    group when the group starts.

    Examples:
        >>> nccl_engine() in ("nccl", "nccl2")
        True
    """
    if not NCCL_BUILT or not hasattr(dist, "ProcessGroupNCCL2"):
        return "nccl"
    wanted = os.environ.get("TORCH_DIST_USE_NCCL2")
    if wanted is not None:
        return "nccl2" if wanted == "1" else "nccl"
    return "nccl2" if torch_facts.VERSION[:2] >= NCCL2_DEFAULT_FROM else "nccl"
