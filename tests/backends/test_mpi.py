"""The ``mpi`` backend: the conformance kit at 1-4 ranks under mpiexec, and what is MPI's own.

Each world size starts its ranks once, with one ``mpiexec`` (the kit's
world, through :meth:`commlib.Backend.launch_command`), and every check and
MPI-specific test of that size runs on them: the tests run grouped by their
``size`` (``RANKS_BY_SIZE``, tests/conftest.py), the kit's checks first in each.
Skipped, with the reason, where mpi4py, an MPI library or mpiexec is missing.
"""

from __future__ import annotations

import datetime
import importlib.util
import json
import os
import subprocess
import sys
import time
from importlib.metadata import entry_points

import pytest
import torch
import torch.distributed as dist

import commlib
from commlib import plugins
from commlib.errors import CommTimeoutError
from commlib.launch import infer_launcher
from commlib.testing.conformance import CHECKS, KitPool

if importlib.util.find_spec("mpi4py") is None:
    pytest.skip("mpi4py is not installed (pip install 'commlib[mpi]')", allow_module_level=True)

from commlib_backends import mpi as mpi_backend
from commlib_backends import mpi_group
from commlib_backends.mpi import MPIBackend
from tests.backends.test_gloo_checked_lanes import (
    raised_alike,
    steady_all_to_all,
    steady_all_to_all_single,
)


def _plugin() -> commlib.Backend:
    # the entry point, once this checkout's metadata is installed; registered here before
    try:
        return plugins.resolve_backend("mpi")
    except ValueError:
        commlib.register_backend(MPIBackend)
        return plugins.resolve_backend("mpi")


def _why_not() -> str | None:
    reason = _plugin().unavailable_reason()
    if reason is not None:
        return reason
    try:
        _plugin().launch_command(1)
    except FileNotFoundError as exc:
        return str(exc)
    return None


_REASON = _why_not()
WORLD_SIZES = (1, 2, 3, 4)
# the lanes' tests: one rank, an even and an odd world (the kit covers 4; on 2 cores four
# polling MPI ranks make each of these calls several seconds longer, and CI's whole suite
# has 15 minutes); gloo runs the same checks at 1-4 (test_gloo_checked_lanes.py)
LANE_WORLDS = (1, 2, 3)
_kits = KitPool()
# the kit keeps one world alive: a change of size ends it and starts another (one
# mpiexec, each rank importing torch: seconds on 2 cores), so each size's tests run together
RANKS_BY_SIZE = True


@pytest.fixture(scope="module", autouse=True)
def _close_kits():
    yield
    _kits.close()


def _kit():
    if _REASON is not None:
        pytest.skip(f"mpi cannot run here: {_REASON}")
    return _kits.get("mpi", timeout=90.0)


# -- without ranks ---------------------------------------------------------------------
def test_mpi_is_a_registered_cpu_backend_that_finds_its_own_ranks():
    plugin = _plugin()
    assert plugin.name == "mpi" and plugin.device_type == "cpu"
    assert plugin.torch_backend == "mpi4py" and plugin.own_rendezvous
    # a size mismatch is no error MPI reports (docs/backends.md): commlib checks
    assert plugin.mismatch_aborts


def test_unavailable_without_mpi4py_says_how_to_install(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "mpi4py" else real(name, *a)
    )
    assert "pip install 'commlib[mpi]'" in MPIBackend().unavailable_reason()


def test_launch_command_is_the_mpiexec_beside_this_python():
    if not os.access(os.path.join(os.path.dirname(sys.executable), "mpiexec"), os.X_OK):
        pytest.skip("no mpiexec beside this Python")
    command = MPIBackend().launch_command(3)
    assert command == [os.path.join(os.path.dirname(sys.executable), "mpiexec"), "-n", "3"]


def test_mpich_and_open_mpi_environments_say_mpi(monkeypatch):
    for name in ("WORLD_SIZE", "SLURM_NTASKS", "OMPI_COMM_WORLD_LOCAL_RANK", "PMI_RANK"):
        monkeypatch.delenv(name, raising=False)
    assert infer_launcher() == "none"
    monkeypatch.setenv("PMI_RANK", "0")
    assert infer_launcher() == "mpi"
    monkeypatch.delenv("PMI_RANK")
    monkeypatch.setenv("OMPI_COMM_WORLD_LOCAL_RANK", "0")
    assert infer_launcher() == "mpi"


def test_tensors_back_to_back_in_one_buffer_travel_in_place():
    whole = torch.arange(12, dtype=torch.float32)
    run = mpi_backend._run_of(list(whole.view(3, 4).unbind(0)))
    assert run is not None and run.data_ptr() == whole.data_ptr() and run.numel() == 48
    assert mpi_backend._run_of([torch.ones(4), torch.ones(4)]) is None
    assert mpi_backend._run_of(list(whole.view(4, 3).t().unbind(0))) is None


class _Request:
    """An MPI request that completes at its ``polls``-th ``Test``."""

    def __init__(self, polls: int):
        self.left = polls

    def Test(self) -> bool:
        self.left -= 1
        return self.left <= 0


class _Clock:
    """``time`` for MPIWork's polls: each look at the clock is ``step`` seconds later."""

    def __init__(self, step: float):
        self.now, self.step, self.slept = 0.0, step, []

    def monotonic(self) -> float:
        self.now += self.step
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def _polled(monkeypatch, work, *waits: float) -> tuple[_Clock, list[int], list[str]]:
    clock, yields, outcomes = _Clock(step=0.5e-3), [], []
    monkeypatch.setattr(mpi_group, "time", clock)
    monkeypatch.setattr(mpi_group, "yield_core", lambda: yields.append(1))
    for seconds in waits:
        try:
            work.wait(datetime.timedelta(seconds=seconds))
            outcomes.append("done")
        except RuntimeError as exc:
            outcomes.append("timed out" if "timed out" in str(exc) else str(exc))
    return clock, yields, outcomes


def test_a_busy_request_is_polled_without_sleeps_and_others_sleep_between_polls(monkeypatch):
    # MPICH's Ialltoallv moves a step a poll: a sleep between polls gates it
    busy = mpi_group.MPIWork([_Request(polls=100)], busy=True)
    clock, yields, outcomes = _polled(monkeypatch, busy, 10.0)
    assert outcomes == ["done"] and clock.slept == [] and len(yields) >= 90
    plain = mpi_group.MPIWork([_Request(polls=100)])
    clock, yields, outcomes = _polled(monkeypatch, plain, 10.0)
    assert outcomes == ["done"] and len(clock.slept) > 90
    assert max(clock.slept) == 1e-3  # a small transfer: up to 1 ms a pause
    # while it would spin (its first millisecond) it yields the core instead: its peer
    # may be the one waiting for it
    assert 1 <= len(yields) <= mpi_group._SPIN / clock.step
    large = mpi_group.MPIWork([_Request(polls=100)], keep=torch.empty(mpi_group._LARGE // 4))
    clock, yields, outcomes = _polled(monkeypatch, large, 10.0)
    # a large transfer spins hot (MPI moves its data inside the polls), then polls often
    assert outcomes == ["done"] and yields == [] and max(clock.slept) == mpi_group._LARGE_PAUSE


def test_a_lanes_request_is_tested_back_to_back_then_with_the_core_yielded(monkeypatch):
    from commlib_backends import mpi_lanes

    yields = []
    monkeypatch.setattr(mpi_lanes, "yield_core", lambda: yields.append(1))
    assert mpi_lanes.settled(_Request(polls=3), None) is None and yields == []
    hot = len(mpi_lanes.SPINS)
    assert mpi_lanes.settled(_Request(polls=hot + 5), None) is None and len(yields) == 5
    late = _Request(polls=10_000)
    work = mpi_lanes.settled(late, "kept")
    # then its work, which the engine waits on in slices (its requests, its buffers)
    assert isinstance(work, mpi_group.MPIWork) and work.requests == [late]
    assert work.keep == "kept" and len(yields) == 5 + len(mpi_lanes.YIELDS)


def test_a_busy_request_yields_for_a_while_over_all_its_waits_then_sleeps(monkeypatch):
    # the engine waits in slices, each one wait: the yielding ends _BUSY_FOR after the first
    work = mpi_group.MPIWork([_Request(polls=2_000)], busy=True)
    clock, yields, outcomes = _polled(monkeypatch, work, 0.05, 0.05, 10.0)
    assert outcomes == ["timed out", "timed out", "done"]
    most = mpi_group._BUSY_FOR / clock.step
    assert 0.9 * most <= len(yields) <= most
    assert clock.slept and min(clock.slept) > 0


# -- the conformance kit, one mpiexec per world size -------------------------------------
CASES = [(size, name) for size in WORLD_SIZES for name, c in CHECKS.items() if c.applies(size)]


@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.parametrize(("size", "name"), CASES, ids=lambda v: str(v))
def test_mpi_conforms(size, name):
    result = _kit().run(name, size)
    assert result.status == "passed", result.detail


# -- what is MPI's own, on the kit's ranks of that size -----------------------------------
def _torch_and_ddp(comm) -> list[float]:
    """torch.distributed's calls and DDP on the mpi4py group; the trained weights."""
    rank, size = comm.rank, comm.world_size
    t = torch.full((3,), float(rank + 1))
    dist.all_reduce(t)
    assert t.tolist() == [size * (size + 1) / 2] * 3, t
    out = torch.empty(2 * size)
    dist.all_gather_into_tensor(out, torch.full((2,), float(rank)))
    assert out.tolist() == [float(r) for r in range(size) for _ in range(2)], out
    torch.manual_seed(rank)  # DDP makes the ranks' initial weights rank 0's
    model = torch.nn.Linear(4, 2)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    for step in range(3):
        torch.manual_seed(100 * step + rank)  # each rank its own batch
        ddp(torch.randn(8, 4)).square().sum().backward()
        opt.step()
        opt.zero_grad()
    return model.weight.detach().reshape(-1).tolist()


@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.parametrize("size", [4])
def test_torch_distributed_and_ddp_run_on_the_mpi_group(size):
    weights = _kit().call(size, _torch_and_ddp)
    assert all(w == weights[0] for w in weights)  # the gradients were averaged over MPI


def _mismatch(comm) -> str:
    """Ranks all_reduce different lengths: commlib's check says so on every rank."""
    try:
        comm.all_reduce(torch.ones(4 + comm.rank))
    except ValueError as exc:
        return str(exc)
    return "no error"


@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.parametrize("size", [4])
def test_a_size_mismatch_is_an_agreed_error_not_heap_corruption(size):
    errors = _kit().call(size, _mismatch)
    assert all("ranks passed different arguments" in e and "(5,)" in e for e in errors), errors


def _none_meets_splits(comm) -> list[float]:
    """Rank 0 passes None splits, the others explicit equal ones, past the slot: after the
    check every rank calls MPI's Ialltoallv (None alone would take Ialltoall on rank 0)."""
    world, rank = comm.world_size, comm.rank
    rows = 50_000  # a chunk of 200 KB: past the slot, so the engine's collective runs
    x = torch.cat([torch.full((rows,), float(10 * rank + j)) for j in range(world)])
    out = torch.empty(rows * world)
    splits = None if rank == 0 else [rows] * world
    comm.all_to_all_single(out, x, splits, splits)
    return out[::rows].tolist()


@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.parametrize("size", [3])
def test_none_splits_meet_explicit_splits_on_mpi(size):
    got = _kit().call(size, _none_meets_splits)
    assert got == [[float(10 * j + r) for j in range(3)] for r in range(3)]


def _checked_rounds(comm) -> list[str]:
    """The check's round is MPI's own allgather of the slot (a lane); small results complete
    from it, larger ones take MPI's collective after it; every mismatch is still caught alike."""
    world, rank = comm.world_size, comm.rank
    wrong = []
    # in the slot, past it until learnt, and past what a slot learns (1 MiB a rank)
    for n in (8, 2048, 300_000):
        for _ in range(2):  # the slot learns from the first call; the second uses it
            x = torch.full((n,), float(rank + 1))
            comm.all_reduce(x)
            if x[0] != world * (world + 1) / 2 or x[-1] != x[0]:
                wrong.append(f"all_reduce {n}: {x[0]}")
            y = torch.full((n,), float(rank))
            comm.broadcast(y, src=world - 1)
            if y[0] != world - 1 or y[-1] != world - 1:
                wrong.append(f"broadcast {n}: {y[0]}")
            z = torch.full((n,), float(rank + 1))
            comm.reduce(z, dst=0)
            if rank == 0 and z[-1] != world * (world + 1) / 2:
                wrong.append(f"reduce {n}: {z[-1]}")
            out = torch.empty(world * n)
            comm.all_gather_into_tensor(out, torch.full((n,), float(rank)))
            if out.view(world, n)[:, -1].tolist() != [float(r) for r in range(world)]:
                wrong.append(f"all_gather_into_tensor {n}")
            parts = comm.gather(torch.full((n,), float(rank)), dst=0)
            if rank == 0 and [float(p[-1]) for p in parts] != list(map(float, range(world))):
                wrong.append(f"gather {n}")
            mine = torch.empty(max(n // world, 1))
            comm.reduce_scatter(mine, torch.ones(mine.numel() * world))
            if mine[-1] != world:
                wrong.append(f"reduce_scatter {n}: {mine[-1]}")
            # the parts ride whole in the sender's slot (MPI sends every rank every slot)
            piece = max(n // world, 1) + 1  # odd sizes
            sent = [torch.full((piece,), float(10 * j + 1)) for j in range(world)]
            got = torch.zeros(piece)
            comm.scatter(got, sent if rank == world - 1 else None, src=world - 1)
            if got.tolist() != [float(10 * rank + 1)] * piece:
                wrong.append(f"scatter {n}: {got[:3]}")
            ins = torch.arange(world * piece, dtype=torch.float64) + 1000 * rank
            outs = torch.zeros(world * piece, dtype=torch.float64)
            comm.all_to_all_single(outs, ins)
            want = [1000 * j + rank * piece + i for j in range(world) for i in range(piece)]
            if outs.tolist() != [float(v) for v in want]:
                wrong.append(f"all_to_all_single {n}")
            lists = [torch.zeros(piece, dtype=torch.int32) for _ in range(world)]
            comm.all_to_all(
                lists,
                [torch.full((piece,), 10 * rank + j, dtype=torch.int32) for j in range(world)],
            )
            if [int(t[-1]) for t in lists] != [10 * j + rank for j in range(world)]:
                wrong.append(f"all_to_all {n}")
    if world > 1:
        # up to completed_by_check_bytes the result comes from the check's round alone
        comm.all_reduce(torch.ones(1024))  # 4 KiB: the slot learns it
        for name, call, most in (
            ("all_reduce 4K", lambda: comm.all_reduce(torch.ones(1024)), 1),
            ("broadcast 16 B", lambda: comm.broadcast(torch.ones(4), src=0), 1),
            ("all_reduce 8K", lambda: comm.all_reduce(torch.ones(2048)), 2),
            (
                "scatter 2 x 8 B",
                lambda: (
                    comm.scatter(torch.empty(2), [torch.ones(2)] * world, src=0)
                    if rank == 0
                    else comm.scatter(torch.empty(2), None, src=0)
                ),
                1,
            ),
            (
                "all_to_all_single 16 B each",
                lambda: comm.all_to_all_single(torch.empty(4 * world), torch.ones(4 * world)),
                1,
            ),
            (
                "all_to_all 16 B each",
                lambda: comm.all_to_all(
                    [torch.empty(4) for _ in range(world)], [torch.ones(4)] * world
                ),
                1,
            ),
            (  # 8 KiB in all: past what the round carries, MPI's own follows
                "scatter 8K",
                lambda: (
                    comm.scatter(
                        torch.empty(2048 // world), [torch.ones(2048 // world)] * world, src=0
                    )
                    if rank == 0
                    else comm.scatter(torch.empty(2048 // world), None, src=0)
                ),
                2,
            ),
        ):
            before = comm._engine.seq
            call()
            if comm._engine.seq - before != most:
                wrong.append(f"{name}: {comm._engine.seq - before} rounds")
        lanes = [v for k, v in comm._engine.lanes.items() if k[0] == "all_gather_slots"]
        if not any(v is not None and v.call is not None for v in lanes):
            wrong.append(f"the check's round took no lane: {lanes}")
        for name, call in (
            ("all_reduce", lambda: comm.all_reduce(torch.ones(8 + rank))),
            ("broadcast", lambda: comm.broadcast(torch.ones(8), src=rank)),
            ("reduce", lambda: comm.reduce(torch.ones(8), dst=rank)),
            (
                "scatter",
                lambda: (
                    comm.scatter(torch.empty(4 + rank), None, src=world - 1)
                    if rank != world - 1
                    else comm.scatter(
                        torch.empty(4 + rank), [torch.ones(4 + rank)] * world, src=world - 1
                    )
                ),
            ),
            (
                "all_to_all_single",
                lambda: comm.all_to_all_single(
                    torch.empty(world * (1 + rank)), torch.ones(world * (1 + rank))
                ),
            ),
        ):
            try:
                call()
                wrong.append(f"{name}: no error")
            except ValueError as exc:
                if "ranks passed different arguments" not in str(exc):
                    wrong.append(f"{name}: {exc}")
    return wrong


@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.parametrize("size", LANE_WORLDS)
def test_the_check_round_is_mpis_allgather_small_results_ride_and_mismatches_are_caught(size):
    assert _kit().call(size, _checked_rounds) == [[]] * size


def _steady_or_odd(comm, name: str, n: int, odd: bool) -> None:
    # a steady call of ``name``'s kind, or (``odd``) the same call with that one thing changed
    x = torch.ones(n)
    if name == "shape":
        comm.all_reduce(x.view(2, n // 2) if odd else x)
    elif name == "dtype":
        comm.all_reduce(x.int() if odd else x)
    elif name == "op":
        comm.all_reduce(x, "max" if odd else "sum")
    elif name == "scatter op":
        comm.reduce_scatter(
            torch.empty(n), torch.ones(comm.world_size * n), "max" if odd else "sum"
        )
    elif name == "scatter src":
        src = 1 if odd else 0
        parts = [torch.ones(n)] * comm.world_size if comm.rank == src else None
        comm.scatter(x, parts, src=src)
    elif name == "dst":
        comm.reduce(x, dst=1 if odd else 0)
    elif name == "gather shape":
        out = torch.empty(comm.world_size * n)
        comm.all_gather_into_tensor(out.view(-1, 2) if odd else out, x.view(-1, 2) if odd else x)
    elif name == "src":
        comm.broadcast(x, src=1 if odd else 0)
    else:
        comm.broadcast(x.view(2, n // 2) if odd else x, src=0)


def _checked_lanes(comm) -> list[str]:
    """Steady checked calls take their prepared rounds from the lanes' entry (one frame):
    results as the whole way's, the same rounds, and every mismatch still caught alike."""
    world, rank = comm.world_size, comm.rank
    riding = comm._lanes.riding
    # (a group of one checks nothing: no entry)
    wrong = [] if (riding is not None) == (world > 1) else [f"checked lanes: {riding}"]
    engine = comm._engine
    # in the round (1 KiB), past what the round carries (8 KiB: MPI's own follows)
    for n, rounds in ((256, 1), (2048, 2)):
        for dtype in (torch.float32, torch.int64):
            for call in range(3):  # the first call prepares the round, the next take it
                x = torch.full((n,), rank + 1, dtype=dtype)
                x[-1] = 2**40 if dtype is torch.int64 else 0.1 * (rank + 1)
                want, mine = x.clone(), x.clone()
                for r in range(world):  # rank order, as every rank reduces the parts
                    part = torch.full((n,), r + 1, dtype=dtype)
                    part[-1] = 2**40 if dtype is torch.int64 else 0.1 * (r + 1)
                    want = part if r == 0 else want + part
                before = engine.seq
                comm.all_reduce(x)
                if not torch.equal(x, want):
                    wrong.append(f"all_reduce {n} {dtype}: {x[-3:]} != {want[-3:]}")
                if world > 1 and engine.seq - before != rounds:
                    wrong.append(f"all_reduce {n}: {engine.seq - before} rounds")
                m = torch.full((n,), float(rank + 1), dtype=torch.float64)
                comm.all_reduce(m, "max")
                if m.tolist() != [float(world)] * n:
                    wrong.append(f"max {n}: {m[:2]}")
                for dst in {0, world - 1}:
                    z = mine.clone()
                    before = engine.seq
                    comm.reduce(z, dst=dst)
                    if not torch.equal(z, want if rank == dst else mine):
                        wrong.append(f"reduce {n} to {dst}: {z[-2:]}")
                    if world > 1 and engine.seq - before != rounds:
                        wrong.append(f"reduce {n}: {engine.seq - before} rounds")
                out = torch.empty(world * n, dtype=dtype)
                before = engine.seq
                comm.all_gather_into_tensor(out, torch.full((n,), rank, dtype=dtype))
                if out.view(world, n)[:, -1].tolist() != list(range(world)):
                    wrong.append(f"all_gather_into_tensor {n}: {out.view(world, n)[:, -1]}")
                if world > 1 and engine.seq - before != rounds:
                    wrong.append(f"all_gather_into_tensor {n}: {engine.seq - before} rounds")
                mine_rs = torch.empty(n, dtype=dtype)
                before = engine.seq
                comm.reduce_scatter(mine_rs, torch.arange(world * n, dtype=dtype) * (rank + 1))
                got = (torch.arange(n, dtype=dtype) + rank * n) * (world * (world + 1) // 2)
                if not torch.equal(mine_rs, got):
                    wrong.append(f"reduce_scatter {n}: {mine_rs[-2:]} != {got[-2:]}")
                # (int64 at 2 ranks: 4 KiB, past the first slot; the slot learns it)
                rides = world * n * mine_rs.element_size() <= 4096  # (completed_by_check_bytes)
                if call and world > 1 and engine.seq - before != (1 if rides else 2):
                    wrong.append(f"reduce_scatter {n}: {engine.seq - before} rounds")
                piece = torch.zeros(n, dtype=dtype)
                sent = [torch.full((n,), 10 * j + 1, dtype=dtype) for j in range(world)]
                before = engine.seq
                comm.scatter(piece, sent if rank == world - 1 else None, src=world - 1)
                if piece.tolist() != [10 * rank + 1] * n:
                    wrong.append(f"scatter {n}: {piece[:2]}")
                rides = world * n * piece.element_size() <= 4096  # (completed_by_check_bytes)
                if call and world > 1 and engine.seq - before != (1 if rides else 2):
                    wrong.append(f"scatter {n}: {engine.seq - before} rounds")
                grid = torch.empty(world, 2, n // 2, dtype=dtype)
                comm.all_gather_into_tensor(grid, torch.full((2, n // 2), rank, dtype=dtype))
                if grid[:, -1, -1].tolist() != list(range(world)):
                    wrong.append(f"all_gather_into_tensor 2-dim {n}: {grid[:, -1, -1]}")
                for src in {0, world - 1}:
                    y = torch.full((n,), rank, dtype=dtype)
                    before = engine.seq
                    comm.broadcast(y, src=src)
                    if y.tolist() != [src] * n:
                        wrong.append(f"broadcast {n} from {src}: {y[:2]}")
                    if world > 1 and engine.seq - before != rounds:
                        wrong.append(f"broadcast {n}: {engine.seq - before} rounds")
            if riding is not None and world > 1:
                # the entry itself serves a steady call (True: it ran the call)
                x = torch.full((n,), rank + 1, dtype=dtype)
                if not riding.all_reduce(x, "sum") or x[0] != world * (world + 1) // 2:
                    wrong.append(f"the entry did not serve all_reduce {n} {dtype}")
                y = torch.full((n,), rank, dtype=dtype)
                if not riding.broadcast(y, world - 1) or y[0] != world - 1:
                    wrong.append(f"the entry did not serve broadcast {n} {dtype}")
                z = mine.clone()
                if not riding.reduce(z, world - 1, "sum") or not torch.equal(
                    z, want if rank == world - 1 else mine
                ):
                    wrong.append(f"the entry did not serve reduce {n} {dtype}")
                mine_rs = torch.empty(n, dtype=dtype)
                whole = torch.ones(world * n, dtype=dtype)
                if not riding.reduce_scatter(mine_rs, whole, "sum") or mine_rs[0] != world:
                    wrong.append(f"the entry did not serve reduce_scatter {n} {dtype}")
                piece = torch.zeros(n, dtype=dtype)
                sent = [torch.full((n,), j, dtype=dtype) for j in range(world)]
                root = world - 1  # (the kind the loop above made steady)
                if (
                    not riding.scatter(piece, sent if rank == root else None, root)
                    or piece[0] != rank
                ):
                    wrong.append(f"the entry did not serve scatter {n} {dtype}")
                out = torch.empty(world * n, dtype=dtype)
                served = riding.all_gather_into_tensor(out, torch.full((n,), rank, dtype=dtype))
                if not served or out.view(world, n)[:, 0].tolist() != list(range(world)):
                    wrong.append(f"the entry did not serve all_gather_into_tensor {n} {dtype}")
    # misses go the whole way, same results: mean, a tensor needing grad, non-contiguous
    t = torch.full((4,), float(rank + 1))
    comm.all_reduce(t, "mean")
    if t.tolist() != [(world + 1) / 2] * 4:
        wrong.append(f"mean {t}")
    g = torch.full((4,), float(rank + 1), requires_grad=True)
    with torch.no_grad():
        comm.all_reduce(g)
    if g.tolist() != [world * (world + 1) / 2] * 4:
        wrong.append(f"grad leaf {g}")
    # a rank on the whole way (non-contiguous) meets ranks on the entry: they agree
    c = torch.full((4, 2), float(rank + 1))
    for _ in range(2):
        comm.all_reduce(torch.full((2, 4), float(rank + 1)))  # steady on every rank
    c = c.t() if rank == 0 else torch.full((2, 4), float(rank + 1))
    comm.all_reduce(c)
    if c.tolist() != [[world * (world + 1) / 2] * 4] * 2:
        wrong.append(f"non-contiguous {c}")
    if world > 1:
        # after steady calls one rank changes the shape (same bytes), dtype, op or src:
        # every rank raises the same error, and the next call is right
        for n in (256, 2048):
            for name in (
                "shape",
                "dtype",
                "op",
                "src",
                "broadcast shape",
                "dst",
                "gather shape",
                "scatter op",
            ):
                for _ in range(3):
                    _steady_or_odd(comm, name, n, odd=False)
                try:
                    _steady_or_odd(comm, name, n, odd=rank == world - 1)
                    wrong.append(f"{name} {n}: no error")
                except ValueError as exc:
                    if "ranks passed different arguments" not in str(exc):
                        wrong.append(f"{name} {n}: {exc}")
                x = torch.ones(n)
                comm.all_reduce(x)
                if x[0] != world:
                    wrong.append(f"after {name} {n}: {x[0]}")
    return wrong


@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.parametrize("size", LANE_WORLDS)
def test_steady_checked_calls_take_their_prepared_round_from_the_lanes_entry(size):
    assert _kit().call(size, _checked_lanes) == [[]] * size


def _checked_lane_times_out(comm) -> tuple[str, float, bool]:
    """A steady checked call's round waits in slices: a missing rank is a timeout, not a hang."""
    u = comm.new_group([0, 1, 2], timeout=1.0)
    outcome, waited, took = "not in the group", 0.0, False
    if u.is_member:
        for _ in range(2):  # every member: the round is prepared (the whole way)
            u.all_reduce(torch.ones(4))
        riding = u._lanes.riding
        took = riding is not None and riding.all_reduce(torch.ones(4), "sum")
    if comm.rank < 2:
        start = time.monotonic()
        try:
            u.all_reduce(torch.ones(4))
            outcome = "no error"
        except CommTimeoutError as exc:
            outcome = type(exc).__name__
        waited = time.monotonic() - start
    y = torch.ones(2)
    comm.all_reduce(y)  # the world goes on
    return outcome, waited, took


@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.parametrize("size", [4])
def test_a_steady_checked_calls_round_times_out_when_a_rank_stays_away(size):
    results = _kit().call(size, _checked_lane_times_out)
    for rank in (0, 1):
        outcome, waited, took = results[rank]
        assert (outcome, took) == ("CommTimeoutError", True), results
        assert 0.9 < waited < 15, results


_METHODS = (
    "all_reduce",
    "broadcast",
    "reduce",
    "all_gather_into_tensor",
    "reduce_scatter",
    "scatter",
    "all_to_all_single",
    "all_to_all",
    "send",
    "recv",
)


def _each_collective_twice(u) -> list[str]:
    """Every collective with a lane, twice (learnt, then taken), results checked."""
    n, rank = u.world_size, u.rank
    wrong = []
    for _ in range(2):
        t = torch.full((6,), float(rank + 1))
        u.all_reduce(t)
        if t.tolist() != [n * (n + 1) / 2] * 6:
            wrong.append(f"all_reduce {t}")
        t = torch.full((6,), float(rank + 1))
        u.all_reduce(t, "mean")
        if t.tolist() != [(n + 1) / 2] * 6:
            wrong.append(f"mean {t}")
        t = torch.full((6,), float(rank + 1))
        u.broadcast(t, src=n - 1)
        if t.tolist() != [float(n)] * 6:
            wrong.append(f"broadcast {t}")
        t = torch.full((6,), float(rank + 1))
        u.reduce(t, dst=n - 1)
        if t.tolist() != [n * (n + 1) / 2 if rank == n - 1 else rank + 1.0] * 6:
            wrong.append(f"reduce {t}")
        out = torch.empty(3 * n)
        u.all_gather_into_tensor(out, torch.full((3,), float(rank)))
        aliased = torch.empty(3 * n)
        u.all_gather_into_tensor(aliased, aliased[3 * rank : 3 * rank + 3].fill_(rank))
        for got in (out, aliased):
            if got.tolist() != [float(r) for r in range(n) for _ in range(3)]:
                wrong.append(f"all_gather_into_tensor {got}")
        part = torch.empty(3)
        u.reduce_scatter(part, torch.arange(3.0 * n) + rank)
        if part.tolist() != [float(n * (3 * rank + i) + n * (n - 1) // 2) for i in range(3)]:
            wrong.append(f"reduce_scatter {part}")
        mine = torch.empty(3)
        parts = [torch.full((3,), float(j)) for j in range(n)] if rank == 0 else None
        u.scatter(mine, parts, src=0)
        if mine.tolist() != [float(rank)] * 3:
            wrong.append(f"scatter {mine}")
        got = torch.empty(2 * n)
        u.all_to_all_single(got, torch.arange(2.0 * n) + 100 * rank)
        if got.tolist() != [100.0 * j + 2 * rank + i for j in range(n) for i in range(2)]:
            wrong.append(f"all_to_all_single {got}")
        outs = [torch.empty(2) for _ in range(n)]
        u.all_to_all(outs, [torch.full((2,), float(10 * rank + j)) for j in range(n)])
        if [o.tolist() for o in outs] != [[10.0 * j + rank] * 2 for j in range(n)]:
            wrong.append(f"all_to_all {outs}")
        u.barrier()
        if n > 1:  # a ring: each rank sends to the next, receives from the one before
            if rank % 2 == 0:
                u.send(torch.full((4,), float(rank)), (rank + 1) % n)
                got = torch.empty(4)
                u.recv(got, (rank - 1) % n)
            else:
                got = torch.empty(4)
                u.recv(got, (rank - 1) % n)
                u.send(torch.full((4,), float(rank)), (rank + 1) % n)
            if got.tolist() != [float((rank - 1) % n)] * 4:
                wrong.append(f"recv {got}")
    return wrong


def _lanes_taken(comm) -> list[str]:
    """Unchecked calls take the plugin's lanes: the methods run only on the learning call."""
    plugin = comm.plugin
    calls: dict[str, int] = {}

    def spy(name):
        method = getattr(plugin, name)

        def counted(*args, **kwargs):
            calls[name] = calls.get(name, 0) + 1
            return method(*args, **kwargs)

        return counted

    for name in _METHODS:  # on the instance: the engine binds them when it is made
        setattr(plugin, name, spy(name))
    try:
        u = commlib.Communicator(comm.group, strict=False, timeout=comm.timeout)
        wrong = _each_collective_twice(u)
    finally:
        for name in _METHODS:
            delattr(plugin, name)
    n = comm.world_size
    learnt = {k[0]: v for k, v in u._engine.lanes.items() if k[0] != "all_gather_slots"}
    expected = set(_METHODS) | {"barrier"} - ({"send", "recv"} if n == 1 else set())
    if n == 1:  # a group of one: reductions and broadcasts issue nothing, gathers copy
        expected = {"all_reduce", "broadcast", "reduce", "barrier"}
    for name in sorted(expected):
        lane = learnt.get(name)
        if lane is None or (lane.call is None) != (n == 1):
            wrong.append(f"{name}: lane {lane}")
    for name in _METHODS:
        # the learning call went through the method (all_reduce's sum and mean learn
        # apart); every later one took the lane
        if name in expected and calls.get(name, 0) > (2 if name == "all_reduce" else 1):
            wrong.append(f"{name}: the method ran {calls[name]} times")
    return wrong


@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.parametrize("size", LANE_WORLDS)
def test_unchecked_calls_take_mpis_lanes_with_the_same_results(size):
    assert _kit().call(size, _lanes_taken) == [[]] * size


def _overridden_method_still_called(comm) -> tuple[int, bool, list[str]]:
    """A subclass that overrides broadcast has it called on every call; all_reduce's lane stays."""
    seen = []

    class Logged(MPIBackend):
        def broadcast(self, tensor, src, group, async_op=False):
            seen.append(src)
            return super().broadcast(tensor, src, group, async_op)

    u = commlib.Communicator(comm.group, backend=Logged(), strict=False, timeout=comm.timeout)
    wrong = []
    for _ in range(3):
        t = torch.full((4,), float(u.rank))
        u.broadcast(t, src=0)
        if t.tolist() != [0.0] * 4:
            wrong.append(f"broadcast {t}")
        x = torch.ones(4)
        u.all_reduce(x)
        if x.tolist() != [float(u.world_size)] * 4:
            wrong.append(f"all_reduce {x}")
    lanes = u._engine.lanes
    reduced = lanes.get(("all_reduce", "sum", torch.float32))
    return (
        len(seen),
        lanes.get(("broadcast", 0, torch.float32)) is None
        and (reduced is not None and (reduced.call is not None or u.world_size == 1)),
        wrong,
    )


@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.parametrize("size", [3])
def test_a_plugin_overriding_a_method_on_mpi_still_has_it_called(size):
    for seen, lanes_right, wrong in _kit().call(size, _overridden_method_still_called):
        assert (seen, lanes_right, wrong) == (3, True, [])


def _lane_times_out(comm) -> tuple[str, float, bool]:
    """A lane's wait is the engine's sliced one: a missing rank is a timeout, not a hang."""
    u = comm.new_group([0, 1, 2], timeout=1.0)
    u.strict = False
    outcome, waited, took = "not in the group", 0.0, False
    if u.is_member:
        u.all_reduce(torch.ones(4))  # every member: the lane is learnt
        lane = u._engine.lanes.get(("all_reduce", "sum", torch.float32))
        took = lane is not None and lane.call is not None
    if comm.rank < 2:
        start = time.monotonic()
        try:
            u.all_reduce(torch.ones(4))
            outcome = "no error"
        except CommTimeoutError as exc:
            outcome = type(exc).__name__
        waited = time.monotonic() - start
    y = torch.ones(2)
    comm.all_reduce(y)  # the world goes on: the pending request stays in the trio alone
    return outcome, waited, took


@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.parametrize("size", [4])
def test_a_lanes_wait_times_out_when_a_rank_stays_away(size):
    results = _kit().call(size, _lane_times_out)
    for rank in (0, 1):
        outcome, waited, took = results[rank]
        assert (outcome, took) == ("CommTimeoutError", True), results
        assert 0.9 < waited < 15, results


def _timeout_then_shrink(comm) -> tuple[str, float, list[float], list[float]]:
    """Rank 2 stays out of a subgroup's all_reduce; 0 and 1 time out, then shrink past it."""
    trio = comm.new_group([0, 1, 2])
    outcome, waited = "no error", 0.0
    if comm.rank < 2:
        start = time.monotonic()
        try:
            trio.all_reduce(torch.ones(4), timeout=1.0)
        except CommTimeoutError as exc:
            outcome = type(exc).__name__
        waited = time.monotonic() - start
        pair = trio.shrink(exclude=[2], timeout=20)
        x = torch.full((2,), float(comm.rank + 1))
        pair.all_reduce(x)
        shrunk = x.tolist()
    else:
        shrunk = []
    # the world, and the other groups, go on: the timed-out request stays in trio alone
    y = torch.ones(2)
    comm.all_reduce(y)
    return outcome, waited, shrunk, y.tolist()


@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.parametrize("size", [4])
def test_a_timed_out_rank_shrinks_past_a_stuck_one_and_the_world_goes_on(size):
    results = _kit().call(size, _timeout_then_shrink)
    for rank in (0, 1):
        outcome, waited, shrunk, _ = results[rank]
        assert outcome == "CommTimeoutError", results
        assert 0.9 < waited < 15, results  # MPI has no timed wait: the poll's deadline held
        assert shrunk == [3.0, 3.0], results
    assert all(r[3] == [4.0, 4.0] for r in results), results


def _async(comm) -> list[float]:
    x = torch.full((1 << 16,), float(comm.rank))
    handle = comm.all_reduce(x, async_op=True)
    handle.wait(timeout=datetime.timedelta(seconds=30))
    return [float(x[0]), float(x[-1])]


@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.parametrize("size", [4])
def test_async_op_runs_on_mpi_nonblocking_collectives(size):
    assert _kit().call(size, _async) == [[6.0, 6.0]] * size


# -- commlib bench --backend mpi: its ranks start with mpiexec ------------------------------
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_bench_starts_its_ranks_with_mpiexec_and_compares_with_torch_on_its_engine(tmp_path):
    if _REASON is not None:
        pytest.skip(f"mpi cannot run here: {_REASON}")
    if not any(ep.name == "mpi" for ep in entry_points(group="commlib.backends")):
        pytest.skip("the mpi entry point is not installed: the bench's ranks could not find it")
    out = tmp_path / "rows.json"
    done = subprocess.run(
        [sys.executable, "-m", "commlib.cli", "bench", "--backend", "mpi", "--ops",
         "all_reduce", "--min-bytes", "4K", "--max-bytes", "4K", "--trials", "2", "--iters",
         "3", "--no-progress", "--no-memory", "--json", str(out)],
        capture_output=True, text=True, timeout=280,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert "torch side runs torch.distributed on gloo in the same ranks" in done.stdout
    rows = json.loads(out.read_text())["rows"]
    assert [(r["backend"], r["torch_backend"], r["world_size"]) for r in rows] == [
        ("mpi", "gloo", 2)
    ]


_UNCAUGHT = """
import torch, commlib
from commlib import plugins
try:
    plugins.resolve_backend("mpi")
except ValueError:
    from commlib_backends.mpi import MPIBackend
    commlib.register_backend(MPIBackend)
commlib.init_dist("mpi", timeout=600)
comm = commlib.get_communicator()
if comm.rank == 1:
    raise RuntimeError("rank 1 fails outside any collective")
comm.all_reduce(torch.ones(2))  # rank 0 waits here for a rank that will never come
"""


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_an_uncaught_error_in_one_rank_ends_the_mpi_job(tmp_path):
    if _REASON is not None:
        pytest.skip(f"mpi cannot run here: {_REASON}")
    script = tmp_path / "uncaught.py"
    script.write_text(_UNCAUGHT)
    # without the abort, rank 1's MPI_Finalize and rank 0's all_reduce wait for each
    # other until the 600 s timeout: the 150 s limit here fails the test instead
    done = subprocess.run(
        [*_plugin().launch_command(2), sys.executable, str(script)],
        capture_output=True, text=True, timeout=150, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert done.returncode != 0
    assert "rank 1 fails outside any collective" in done.stderr + done.stdout


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize("size", LANE_WORLDS)
def test_steady_checked_all_to_all_single_takes_its_lane(size):
    # the body is gloo's (tests/backends/test_gloo_checked_lanes.py): one world of each size
    results = _kit().call(size, steady_all_to_all_single)
    assert results == [[]] if size == 1 else raised_alike(results), results


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize("size", LANE_WORLDS)
def test_steady_checked_all_to_all_takes_its_lane(size):
    results = _kit().call(size, steady_all_to_all)
    assert results == [[]] if size == 1 else raised_alike(results, "pairs"), results
