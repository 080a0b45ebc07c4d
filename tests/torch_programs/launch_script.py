"""Run a torch script as its launcher's rank: ``python launch_script.py SCRIPT [ARGS]``.

What a launcher adds, not the script: under ``mpiexec`` the rank variables
torch's ``env://`` reads (``RANK``, ``WORLD_SIZE`` from MPICH's ``PMI_*``),
as torchrun sets them; and on a torch that reads no
``torch.distributed.backends`` entry points (2.13) ``import commlib``, which
registers commlib's torch backend names there.
"""

from __future__ import annotations

import os
import runpy
import sys

import torch.distributed as dist

if "RANK" not in os.environ and "PMI_RANK" in os.environ:
    os.environ["RANK"] = os.environ["LOCAL_RANK"] = os.environ["PMI_RANK"]
    os.environ["WORLD_SIZE"] = os.environ["LOCAL_WORLD_SIZE"] = os.environ["PMI_SIZE"]
if not hasattr(dist.Backend, "_ensure_backend_registered"):
    import commlib  # noqa: F401

sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
