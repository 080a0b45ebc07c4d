"""A rank of a :class:`~commlib.testing.World` whose engine's launcher started it.

Run as ``LAUNCHER python -m commlib.testing.launched_rank SPEC`` by
:meth:`World.start <commlib.testing.World.start>`: it starts the process
group through the plugin (which learns rank and size from its launcher),
calls back to the world on the address in ``COMMLIB_WORLD_ADDRESS``, says
which rank it is, and serves runs as a spawned rank does.
"""

from __future__ import annotations

import datetime
import importlib
import multiprocessing.connection
import os
import pickle
import sys
import traceback
from typing import Any

import torch
import torch.distributed as dist

import commlib
from commlib import plugins
from commlib.testing.harness import leave, serve


def _plugin(backend: str) -> Any:
    """The backend under test, registered here as it was in the world's process."""
    try:
        return plugins.resolve_backend(backend)
    except ValueError:
        module, _, name = os.environ["COMMLIB_WORLD_PLUGIN"].partition(":")
        plugins.register_backend(getattr(importlib.import_module(module), name))
        return plugins.resolve_backend(backend)


def main(spec: str) -> None:
    """Start this rank, call back, serve (see the module's docstring)."""
    host, port = os.environ["COMMLIB_WORLD_ADDRESS"].rsplit(":", 1)
    conn = multiprocessing.connection.Client(
        (host, int(port)), authkey=bytes.fromhex(os.environ["COMMLIB_WORLD_KEY"])
    )
    try:
        os.environ.setdefault("OMP_NUM_THREADS", "1")
        torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
        backend, setup, pg_timeout = pickle.loads(bytes.fromhex(spec))
        plugin = _plugin(backend)
        plugin.init_process_group(timeout=datetime.timedelta(seconds=pg_timeout))
        rank, size = dist.get_rank(), dist.get_world_size()
        if setup is not None:
            setup(rank, size)
        comm = commlib.Communicator(backend=plugin)
        commlib.set_default_communicator(comm)
        conn.send(("ready", (rank, os.getpid()), ""))
    except BaseException as exc:
        conn.send(("error", RuntimeError(f"{type(exc).__name__}: {exc}"), traceback.format_exc()))
        return
    serve(comm, conn)
    del comm
    leave()


if __name__ == "__main__":
    main(sys.argv[1])
