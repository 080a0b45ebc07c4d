"""One rank of ``test_multihost.py``, started by torchrun inside a network namespace.

Usage (torchrun supplies RANK, WORLD_SIZE, MASTER_ADDR, ...; the test supplies
``MH_HOST``, the host's index, and ``MH_TIMEOUT``, the communicator timeout)::

    python multihost_rank.py conformance OUTDIR
    python multihost_rank.py fault OUTDIR
    python multihost_rank.py shrink OUTDIR

``conformance`` runs every collective once across the hosts and writes what it
observed to ``OUTDIR/rank<R>.json``; the test holds the expected values.
``fault`` loops over collectives (writing ``alive-<R>`` once it is in the loop)
until one raises, because the test cut off the other host; it then writes the
exception and the seconds it took to ``OUTDIR/rank<R>.json`` and re-raises, as a
training script would. ``shrink`` loops and records the error the same way, but
then the surviving ranks shrink their communicator and check every collective
on the survivors, and exit normally.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import sys
import time
import traceback

import numpy as np
import torch

import commlib as dist
from commlib import Communicator
from commlib.errors import CommError, CommTimeoutError

TIMEOUT = float(os.environ.get("MH_TIMEOUT", "10"))
# joining the group: the two hosts' ranks start seconds apart on busy cores, whatever
# the communicator's timeout a test chose
START_TIMEOUT = max(TIMEOUT, 10.0)
BIG = 1 << 20  # 1 MiB: far more than an object collective's first-round slot
ITEMS = 10  # dataset size for collect_results


def big_array(rank: int, nbytes: int = BIG) -> np.ndarray:
    """Deterministic per-rank bytes: the test rebuilds them to check digests."""
    return np.random.default_rng(1000 + rank).integers(0, 256, size=nbytes, dtype=np.uint8)


def digest(array: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(array).tobytes()).hexdigest()


def _write(outdir: str, rank: int, record: dict) -> None:
    # write-then-rename: the test polls for these files and must never read half of one
    path = os.path.join(outdir, f"rank{rank}.json")
    with open(path + ".tmp", "w") as f:
        json.dump(record, f)
    os.replace(path + ".tmp", path)


def conformance(outdir: str) -> dict:
    dist.init_dist("pytorch", timeout=START_TIMEOUT)
    rank, world = dist.get_dist_info()
    out: dict = {
        "rank": rank,
        "world": world,
        "host": int(os.environ["MH_HOST"]),
        "local_rank": dist.get_local_rank(),
        "local_size": dist.get_local_size(),
        "backend": dist.get_backend(),
    }

    x = torch.tensor([rank + 1.0, 2.0 * (rank + 1)])
    dist.all_reduce(x)
    out["all_reduce_sum"] = x.tolist()
    x = torch.tensor([rank + 1.0, 2.0 * (rank + 1)])
    dist.all_reduce(x, "mean")
    out["all_reduce_mean"] = x.tolist()
    i = torch.tensor([rank])
    dist.all_reduce(i, "mean")  # integer mean: computed in float, truncated back
    out["all_reduce_mean_int"] = i.tolist()

    # ragged: every rank a different length, so the shapes round crosses hosts too
    out["all_gather_ragged"] = [t.tolist() for t in dist.all_gather(torch.arange(rank + 1) * 10)]
    rows = dist.all_gather(torch.full((rank + 1, 3), float(rank)))
    out["all_gather_ragged_2d"] = [[list(t.shape), t.unique().tolist()] for t in rows]

    # the source is on the other host from rank 0
    src = world - 1
    b = torch.arange(5.0) + 100 if rank == src else torch.zeros(5)
    dist.broadcast(b, src=src)
    out["broadcast"] = b.tolist()

    small = dist.all_gather_object({"rank": rank, "host": out["host"]})
    out["all_gather_object_small"] = small
    big = dist.all_gather_object({"rank": rank, "blob": big_array(rank)})
    out["all_gather_object_big"] = [[o["rank"], digest(o["blob"])] for o in big]

    # odd ranks send 1 MiB, even ranks a few bytes: mixed first-round and overflow
    mixed = {"rank": rank, "blob": big_array(rank) if rank % 2 else None}
    gathered = dist.gather_object(mixed, dst=src)
    out["gather_object"] = (
        None
        if gathered is None
        else [[o["rank"], None if o["blob"] is None else digest(o["blob"])] for o in gathered]
    )

    items = [{"from": rank}, big_array(rank), f"rank {rank}"] if rank == 1 else [None] * 3
    dist.broadcast_object_list(items, src=1)
    out["broadcast_object_list"] = [items[0], digest(items[1]), items[2]]

    for op in ("sum", "mean"):
        d = {
            "loss": torch.tensor(float(rank)),
            "count": torch.tensor([rank + 1]),
            "vec": torch.ones(3) * rank,
        }
        dist.all_reduce_dict(d, op=op)
        out[f"all_reduce_dict_{op}"] = {k: [str(v.dtype), v.tolist()] for k, v in d.items()}

    # a distributed sampler's split: rank r holds items r, r + W, ...
    part = [{"item": k} for k in range(rank, ITEMS, world)]
    shared = os.path.join(outdir, "collect-shared")
    out["collect_cpu_tmpdir"] = dist.collect_results(part, ITEMS, device="cpu", tmpdir=shared)
    # no tmpdir: rank 0 makes one under ./.dist_test; the cwd is shared by both hosts
    out["collect_cpu_default"] = dist.collect_results(part, ITEMS, device="cpu")
    out["collect_gpu"] = dist.collect_results(part, ITEMS, device="gpu")

    out["seed"] = dist.sync_random_seed()
    dist.barrier()
    return out


def _until_it_fails(comm: Communicator, outdir: str, record: dict) -> BaseException | None:
    """Loop over collectives until one raises (the test kills or cuts off the other host).

    Writes ``alive-<R>`` once in the loop; puts what was raised, where and when
    into ``record``, and returns the exception (None if none came in time).
    """
    rank = comm.rank
    # 256 KiB per rank: large enough that a kill is likely to land mid-transfer
    payload = {"rank": rank, "blob": big_array(rank, 256 << 10)}
    steps = [
        ("all_reduce", lambda: comm.all_reduce(torch.ones(1024))),
        ("all_gather_object", lambda: comm.all_gather_object(payload)),
        ("broadcast", lambda: comm.broadcast(torch.ones(1024), src=comm.world_size - 1)),
        ("all_reduce_mean", lambda: comm.all_reduce(torch.ones(8), op="mean")),
    ]
    iterations, current, started = 0, "", time.monotonic()
    give_up = time.monotonic() + 120  # never loop forever if the kill never comes
    try:
        while time.monotonic() < give_up:
            for name, step in steps:
                started, current = time.monotonic(), name
                step()
            iterations += 1
            if iterations == 3:
                open(os.path.join(outdir, f"alive-{rank}"), "w").close()
    except Exception as exc:
        record.update(
            outcome="raised",
            collective=current,
            iterations=iterations,
            error_type=f"{type(exc).__module__}.{type(exc).__qualname__}",
            is_comm_error=isinstance(exc, CommError),
            is_timeout_error=isinstance(exc, CommTimeoutError),
            # torch's own error (DistBackendError is one too), where commlib did not wrap it
            is_torch_error=isinstance(exc, RuntimeError) and not isinstance(exc, CommError),
            cause_type=None if exc.__cause__ is None else type(exc.__cause__).__qualname__,
            message=str(exc)[:2000],
            seconds=time.monotonic() - started,
            raised_at=time.time(),
        )
        return exc
    record.update(outcome="finished without error", iterations=iterations)
    return None


def fault(outdir: str) -> None:
    dist.init_dist("pytorch", timeout=START_TIMEOUT)
    comm = Communicator(timeout=TIMEOUT)
    rank, host = comm.rank, int(os.environ["MH_HOST"])
    record: dict = {"rank": rank, "host": host}
    exc = _until_it_fails(comm, outdir, record)
    _write(outdir, rank, record)
    if exc is None:
        return
    open(os.path.join(outdir, f"done-h{host}-r{rank}"), "w").close()
    # torchrun stops the other local workers as soon as one exits with an
    # error: wait (briefly) until this host's ranks have all written theirs
    deadline = time.monotonic() + 3 * TIMEOUT
    local = dist.get_local_size()
    while time.monotonic() < deadline:
        if len(glob.glob(os.path.join(outdir, f"done-h{host}-r*"))) >= local:
            break
        time.sleep(0.05)
    raise exc


def shrink(outdir: str) -> None:
    from collective_checks import check_every_collective  # this script's directory

    dist.init_dist("pytorch", timeout=START_TIMEOUT)
    comm = Communicator(timeout=TIMEOUT)
    rank = comm.rank
    record: dict = {"rank": rank, "host": int(os.environ["MH_HOST"])}
    exc = _until_it_fails(comm, outdir, record)
    if not isinstance(exc, CommError):  # no error, or not commlib's: the test says which
        _write(outdir, rank, record)
        return
    started = time.monotonic()
    survivors = comm.shrink(timeout=TIMEOUT)
    record.update(
        outcome="shrunk",
        shrink_seconds=time.monotonic() - started,
        new_rank=survivors.rank,
        new_world=survivors.world_size,
        world_ranks=survivors.ranks,
    )
    check_every_collective(survivors)
    record["checked"] = True
    _write(outdir, rank, record)


def main() -> None:
    mode, outdir = sys.argv[1], sys.argv[2]
    rank = int(os.environ["RANK"])
    if mode == "fault":
        fault(outdir)
        return
    if mode == "shrink":
        try:
            shrink(outdir)
        except Exception:
            _write(outdir, rank, {"rank": rank, "error": traceback.format_exc()})
            raise
        return
    try:
        _write(outdir, rank, conformance(outdir))
    except Exception:
        _write(outdir, rank, {"rank": rank, "error": traceback.format_exc()})
        raise


if __name__ == "__main__":
    main()
