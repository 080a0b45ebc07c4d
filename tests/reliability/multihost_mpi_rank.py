"""One rank of the MPI multi-host test (test_multihost_mpi.py), started by hydra in a namespace.

Prints one JSON line: its rank, what the collectives returned, and its namespace's
address (MPI's processor name cannot tell the hosts apart: they share the host name).
"""

from __future__ import annotations

import json
import os
import socket
import sys
from pathlib import Path

import torch

import commlib
from commlib import plugins


def _own_address() -> str:
    """This namespace's address: the source address of a route to the store's host."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect((os.environ["MASTER_ADDR"], 9))  # UDP: nothing is sent
        return str(probe.getsockname()[0])


def main() -> None:
    try:
        plugins.resolve_backend("mpi")
    except ValueError:  # a checkout whose entry points are not installed
        from commlib_backends.mpi import MPIBackend

        commlib.register_backend(MPIBackend)
    commlib.init_dist("mpi", timeout=60)
    comm = commlib.get_communicator()
    big = torch.full((16 << 20,), float(comm.rank + 1))  # 64 MiB each way
    comm.all_reduce(big)
    objs = comm.all_gather_object({"rank": comm.rank, "host": _own_address()})
    pair = comm.new_group([0, 1])
    x = torch.tensor([float(comm.rank)])
    pair.all_reduce(x, op="max")
    out = {
        "rank": comm.rank,
        "size": comm.world_size,
        "big": [float(big[0]), float(big[-1])],
        "objs": objs,
        "pair": float(x),
    }
    # a file per rank: hydra merges the ranks' stdout, and two lines written at once
    # can come out joined on one line
    Path(f"result-rank{comm.rank}.json").write_text(json.dumps(out))


if __name__ == "__main__":
    sys.exit(main())
