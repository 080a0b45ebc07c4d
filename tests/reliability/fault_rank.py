"""One rank of ``test_exit.py``: a fault, the error it raises, and the process's exit.

Usage (the test starts WORLD of these and hosts the store, unless the
scenario puts it in rank 0's process, as ``env://`` does)::

    python fault_rank.py SCENARIO RANK WORLD PORT TIMEOUT

The rank prints one JSON line when its error is raised (what, when) and then
re-raises it, as a training script would: the test measures how long after
that line the process has ended, and that it ended by itself (exit code 1,
not a signal).
"""

from __future__ import annotations

import datetime
import json
import os
import signal
import sys
import threading
import time

import torch
import torch.distributed as tdist

import commlib
from commlib import Communicator
from commlib._engine import engine_limit
from commlib.errors import CommError

# the process group's own timeout: far longer than the communicator's, so only
# commlib's bound on the engine's wait can let the process exit in time
PG_TIMEOUT = datetime.timedelta(minutes=30)


def _report(rank: int, exc: BaseException, started: float, **extra: object) -> None:
    record = {
        "rank": rank,
        "error_type": type(exc).__name__,
        "is_comm_error": isinstance(exc, CommError),
        "message": str(exc)[:1500],
        "seconds": time.monotonic() - started,
        "error_at": time.time(),
        **extra,
    }
    print(json.dumps(record), flush=True)


def baseline(comm: Communicator) -> None:
    """No fault: a collective, then a user error; how long any exit takes here."""
    comm.all_reduce(torch.ones(8))
    raise ValueError("the user's own error, after a collective that worked")


def mismatch(comm: Communicator) -> None:
    """Row 3: ranks pass different shapes to all_reduce, default settings."""
    last = comm.rank == comm.world_size - 1
    comm.all_reduce(torch.ones(3000 if last else 4000))


def stuck(comm: Communicator) -> None:
    """Row 4: every rank stuck inside gloo in a different call (checks off)."""
    loose = Communicator(timeout=comm.timeout, strict=False)
    if comm.rank % 2:
        loose.broadcast(torch.ones(8), src=comm.rank)
    else:
        loose.all_reduce(torch.ones(8))


def retry(comm: Communicator) -> None:
    """Row 5: rank 0 times out and retries; the others arrive late.

    Later than the engine's own limit on rank 0's abandoned call: a peer
    arriving before that may still complete it with the data it carried (and
    learns of the failure at its next call).
    """
    if comm.rank == 0:
        started = time.monotonic()
        try:
            comm.all_reduce(torch.ones(8))
        except CommError as first:
            _report(0, first, started, phase="first")
        started = time.monotonic()
        try:
            comm.all_reduce(torch.ones(8))  # the retry
        except CommError as exc:
            _report(0, exc, started, phase="retry")
            raise
        return
    time.sleep(engine_limit(comm.timeout).total_seconds() + 1.0)
    started = time.monotonic()
    try:
        comm.all_reduce(torch.ones(8))
    except CommError as exc:
        _report(comm.rank, exc, started, phase="late")
        raise


def killed(comm: Communicator) -> None:
    """Row 6: the last rank is SIGKILLed in the middle of a collective."""
    if comm.rank == comm.world_size - 1:
        threading.Timer(0.05, os.kill, (os.getpid(), signal.SIGKILL)).start()
    for _ in range(1_000_000):
        comm.all_reduce(torch.ones(1 << 16))


def killed_first(comm: Communicator) -> None:
    """Row 6 again, rank 0 SIGKILLed: the others connected to it, and gloo names its address."""
    if comm.rank == 0:
        threading.Timer(0.05, os.kill, (os.getpid(), signal.SIGKILL)).start()
    for _ in range(1_000_000):
        comm.all_reduce(torch.ones(1 << 16))


def store_host_dies(comm: Communicator) -> None:
    """Rank 0 holds the store (``env://``) and dies: shrink must say so, not hang."""
    if comm.rank == 0:
        threading.Timer(0.05, os.kill, (os.getpid(), signal.SIGKILL)).start()
    try:
        for _ in range(1_000_000):
            comm.all_reduce(torch.ones(1 << 16))
    except CommError:
        pass
    comm.shrink()


#: a communicator a script keeps at module level, alive until the interpreter exits
HELD: list[Communicator] = []


def held_then_destroyed(comm: Communicator) -> None:
    """No fault: the script's own communicator outlives the group it destroyed, then exits."""
    HELD.append(Communicator(timeout=comm.timeout))
    HELD[0].all_gather(torch.ones(2) * comm.rank)
    tdist.destroy_process_group()


def held_at_exit(comm: Communicator) -> None:
    """No fault: the script exits with its communicator and its group still up."""
    HELD.append(Communicator(timeout=comm.timeout))
    HELD[0].all_gather(torch.ones(2) * comm.rank)


def future_pending_at_exit(comm: Communicator) -> None:
    """Rank 0 leaves a collective's future pending (rank 1 never joins) and exits."""
    loose = Communicator(timeout=20, strict=False)
    if comm.rank == 0:
        HELD.append(loose)
        loose.all_reduce(torch.ones(3), async_op=True).get_future()
        time.sleep(0.5)
    else:
        time.sleep(2)


SCENARIOS = {
    f.__name__: f
    for f in (
        future_pending_at_exit,
        baseline,
        mismatch,
        stuck,
        retry,
        killed,
        killed_first,
        store_host_dies,
        held_then_destroyed,
        held_at_exit,
    )
}


def main() -> None:
    scenario, rank, world, port, timeout = sys.argv[1:6]
    rank_i, world_i = int(rank), int(world)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    store_here = scenario == "store_host_dies" and rank_i == 0
    store = tdist.TCPStore(
        "127.0.0.1",
        int(port),
        world_i if store_here else None,
        store_here,
        timeout=datetime.timedelta(seconds=60),
        wait_for_workers=False,
    )
    tdist.init_process_group(
        "gloo", store=store, rank=rank_i, world_size=world_i, timeout=PG_TIMEOUT
    )
    comm = Communicator(timeout=float(timeout))
    commlib.set_default_communicator(comm)
    comm.barrier()
    print(json.dumps({"rank": rank_i, "ready": True}), flush=True)
    started = time.monotonic()
    try:
        SCENARIOS[scenario](comm)
    except Exception as exc:
        if scenario != "retry":  # retry's ranks report their own
            _report(rank_i, exc, started)
        raise
    print(json.dumps({"rank": rank_i, "finished": True, "at": time.time()}), flush=True)


if __name__ == "__main__":
    main()
