"""One process of ``test_grow.py``, started by ``commlib run``: train, lose ranks, grow back.

Usage::

    commlib run --nproc-per-node W --max-restarts R grow_rank.py SCENARIO OUT [BACKEND]

``BACKEND`` is ``gloo`` (default) or a simulated accelerator (``hccl``, ...).

Scenarios:

* ``twice``: at steps 2 and 5 the current rank 1 dies (the second time, at
  world 2, it is the first replacement); the survivors shrink, grow back by
  one newcomer, and send it the training state.
* ``mid_grow``: rank 2 dies at step 2; its first replacement dies once it
  has been given its place (mid-grow), so the survivors' grow ends in the
  smaller group; the second replacement joins the next grow. At step 5 that
  one dies; in the grow that follows, survivor 1 dies once the grow is
  decided: rank 0 and the third replacement form the group of 2, and slot
  1's replacement joins the next grow. Then a grow that nobody joins within
  its wait gives the same communicator back.
* ``two_newcomers``: ranks 2 and 3 die at step 2; the two survivors grow by
  two newcomers at once.

Each process appends JSON lines to ``OUT/<pid>.jsonl``: every grow (its
seconds, the size before and after), the state it holds after each grow (a
checksum: the newcomers' must match the members'), and how it ended.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time

import torch

from commlib.testing import simulated

SCENARIO, OUT = sys.argv[1], sys.argv[2]
BACKEND = sys.argv[3] if len(sys.argv) > 3 else "gloo"
if BACKEND != "gloo":  # a simulated accelerator: what importing its vendor package would do
    simulated.install(BACKEND, devices=4)

import commlib  # noqa: E402
from commlib import _newcomers  # noqa: E402
from commlib.errors import CommError  # noqa: E402

TIMEOUT = 5.0  # collectives and shrink
FORM = 3.0  # forming a grown group: a newcomer that died is given up after this
JOIN_WAIT = 90.0  # how long members wait for a replacement to start (a loaded machine)
STEPS = 8
RESTART = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
SLOT = int(os.environ["RANK"])  # the launcher's slot: the rank this process started as


def log(**record: object) -> None:
    record.update(pid=os.getpid(), at=time.time(), restart=RESTART, slot=SLOT)
    with open(os.path.join(OUT, f"{os.getpid()}.jsonl"), "a") as f:
        f.write(json.dumps(record) + "\n")


def die_in_form(*args: object, **kwargs: object) -> None:
    """Stands in for ``commlib._newcomers.form``: this process dies as the group forms."""
    log(event="dying", where="forming the grown group")
    os.kill(os.getpid(), signal.SIGKILL)


def checksum(state: dict) -> float:
    return float(state["w"].double().sum()) + state["step"]


def dies(step: int) -> bool:
    """Whether this process dies at ``step``: by its launcher slot and which start of it it is."""
    slot = SLOT
    if SCENARIO == "twice":  # slot 1's first process at step 2, its replacement at step 5
        return slot == 1 and (step, RESTART) in ((2, 0), (5, 1))
    if SCENARIO == "mid_grow":  # slot 2's first process at step 2, its second at step 5
        return slot == 2 and (step, RESTART) in ((2, 0), (5, 2))
    return slot in (2, 3) and step == 2 and RESTART == 0


def grow_back(comm: commlib.Communicator, lost: int, state: dict) -> commlib.Communicator:
    """The members' side: grow by ``lost`` newcomers, send them the state."""
    before, started = comm.world_size, time.time()
    if SCENARIO == "mid_grow" and SLOT == 1 and RESTART == 0 and state["step"] == 5:
        # survivor 1 dies once this grow is decided: the others form the group without it
        _newcomers.form = die_in_form  # type: ignore[assignment]
    grown = comm.grow(count=lost, wait=JOIN_WAIT, timeout=FORM)
    size_after, ended = grown.world_size, time.time()
    log(event="grow", size_before=before, size_after=size_after, started=started, ended=ended)
    if grown is not comm:  # a new group (a newcomer in it, or a smaller one after a failure)
        grown.broadcast_object(state, src=0)
        log(event="state", step=state["step"], checksum=checksum(state))
    return grown


def main() -> None:
    if commlib.is_newcomer():
        if SCENARIO == "mid_grow" and SLOT == 2 and RESTART == 1:
            # dies once it has its place: the members are forming the group with it
            _newcomers.form = die_in_form  # type: ignore[assignment]
        log(event="asked")
        comm = commlib.join(timeout=JOIN_WAIT)
        state = comm.broadcast_object(None, src=0)
        log(event="joined", rank=comm.rank, size=comm.world_size, backend=comm.backend)
        log(event="state", step=state["step"], checksum=checksum(state))
    else:
        commlib.init_dist(backend=BACKEND, timeout=TIMEOUT)
        comm = commlib.get_communicator()
        state = {"step": 0, "w": torch.zeros(4)}
    full = int(os.environ["WORLD_SIZE"])
    while state["step"] < STEPS:
        if comm.world_size < full:  # every member, a newcomer that just joined too
            grown = grow_back(comm, full - comm.world_size, state)
            if grown is comm:  # nobody came: go on smaller
                full = comm.world_size
            comm = grown
            continue  # once more if someone died while it grew
        step = state["step"]
        if dies(step):
            log(event="dying", rank=comm.rank, step=step)
            os.kill(os.getpid(), signal.SIGKILL)
        grad = torch.full((4,), float(step + 1))
        try:
            comm.all_reduce(grad)
        except CommError:
            comm = comm.shrink(timeout=TIMEOUT)
            log(event="shrunk", size=comm.world_size)
            continue  # grow back, then the step again with everyone
        state["w"] += grad / comm.world_size
        state["step"] = step + 1
    if SCENARIO == "mid_grow":
        started = time.time()
        same = comm.grow(count=1, wait=1.0, timeout=FORM)
        log(event="nobody", same=same is comm, started=started, ended=time.time())
    sums = comm.all_gather_object(checksum(state))
    log(
        event="done",
        rank=comm.rank,
        size=comm.world_size,
        agree=len(set(sums)) == 1,
        backend=comm.backend,
    )


if __name__ == "__main__":
    main()
