"""One rank of ``test_exit_after_caught_error.py``, started as torchrun starts its workers.

Usage (the test sets torchrun's variables and holds the store, as its agent does)::

    torchrun --nproc-per-node N caught_error_rank.py {broadcast|gather} [uncaught] [teardown]

Every rank refuses its own root (``src``/``dst`` = its rank), catches the
RemoteArgumentError every rank raises, checks that the group still works and
exits; with ``uncaught`` the error ends the script instead. With ``teardown``
it prints, at exit after commlib's teardown, how many of gloo's worker
threads are left (``pt_gloo_runloop``): none, once the process group was
destroyed while Python still runs.
"""

from __future__ import annotations

import atexit
import os
import sys

import commlib
from commlib.errors import RemoteArgumentError


def _gloo_workers() -> int:
    tasks = os.listdir("/proc/self/task")
    names = []
    for task in tasks:
        try:
            with open(f"/proc/self/task/{task}/comm") as f:
                names.append(f.read().strip())
        except OSError:  # the thread ended meanwhile
            pass
    return names.count("pt_gloo_runloop")


def main() -> None:
    which, rest = sys.argv[1], sys.argv[2:]
    if "teardown" in rest:
        # registered before commlib's teardown, so it runs after it (last in, first out)
        atexit.register(lambda: print(f"gloo workers left: {_gloo_workers()}", flush=True))
    commlib.init_dist("pytorch")
    rank, world = commlib.get_dist_info()
    try:
        if which == "gather":
            commlib.gather_object(rank, dst=rank)
        else:
            commlib.broadcast_object_list([rank], src=rank)
    except RemoteArgumentError as exc:
        assert "disagree on the src/dst" in str(exc), exc
        if "uncaught" in rest:
            raise
    else:
        raise AssertionError("no RemoteArgumentError")
    assert commlib.all_gather_object(rank) == list(range(world))
    print(f"rank {rank} finished", flush=True)


if __name__ == "__main__":
    main()
