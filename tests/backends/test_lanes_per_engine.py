"""The direct path is the contract's, not one class's: every kind of plugin whose collective
method is the default torch.distributed call takes its lanes, and a plugin that overrides a
method still has it called.

Per kind of engine, on torch's fake process group of 8 (the dispatch benchmark's world):
gloo, a plugin written as docs/plugins.md's minimum (``commlib.Backend`` with three
attributes), an ``EngineGaps`` plugin where it passes through (and where it does not), and
the nccl, hccl and cncl plugins over simulated devices (each in a process of its own: a
simulated device changes torch for good). Then the minimal plugin's results at 2 gloo ranks.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
import torch

import commlib
from commlib import plugins
from commlib.bench.fake_world import dispatch_plugin, fake_world
from commlib_backends.engine_gaps import STANDARD_DTYPES, EngineGaps

ROOT = Path(__file__).resolve().parents[2]
# what a lane must serve on every engine; the dispatch target's three among them
TIMED = ("all_reduce", "broadcast", "all_gather_into_tensor")


class Minimal(commlib.Backend):
    """docs/plugins.md's minimum: an engine torch.distributed drives, nothing overridden."""

    name = "lanes-minimal"
    torch_backend = "gloo"
    device_type = "cpu"


class Gapped(EngineGaps):
    """An EngineGaps plugin whose engine reduces neither max nor int32."""

    name = "lanes-gapped"
    torch_backend = "gloo"
    device_type = "cpu"
    wire_dtypes = STANDARD_DTYPES
    reduce_dtypes = STANDARD_DTYPES - {torch.int32}
    reduce_ops = frozenset({"sum", "product", "min"})


class NoScatter(EngineGaps):
    """An EngineGaps plugin whose engine has no scatter (as hccl and cncl): a broadcast."""

    name = "lanes-no-scatter"
    torch_backend = "gloo"
    device_type = "cpu"
    wire_dtypes = STANDARD_DTYPES
    reduce_dtypes = STANDARD_DTYPES
    native_scatter = False


def _calls(comm: commlib.Communicator) -> dict[str, Any]:
    t = torch.ones(4)
    out = torch.empty(32)
    parts = [torch.ones(4) for _ in range(8)]
    return {
        "scatter": lambda: comm.scatter(t, parts, src=0),
        "all_reduce": lambda: comm.all_reduce(t),
        "broadcast": lambda: comm.broadcast(t, src=0),
        "all_gather_into_tensor": lambda: comm.all_gather_into_tensor(out, t),
        "reduce": lambda: comm.reduce(t, dst=0),
        "all_to_all_single": lambda: comm.all_to_all_single(out, torch.ones(32)),
        "send": lambda: comm.send(t, dst=1),
        "recv": lambda: comm.recv(t, src=1),
        "all_reduce max": lambda: comm.all_reduce(t, op="max"),
        "all_reduce int32": lambda: comm.all_reduce(torch.ones(4, dtype=torch.int32)),
        "barrier": lambda: comm.barrier(),
    }


def lanes_taken(base: commlib.Backend) -> dict[str, Any]:
    """How ``base``'s plugin dispatches on the fake group of 8, as plain data.

    ``taken``: per call, how many of two calls after the first went through a lane
    (``Engine.direct`` / ``direct_p2p``); ``logged``: for a subclass that overrides
    ``all_reduce``, how many of three calls ran its method and how many of those
    went through a lane, and the lanes its broadcast took.
    """
    taken = {}
    with fake_world(8, dispatch_plugin(base)) as comm:
        engine = comm._engine
        for name, call in _calls(comm).items():
            call()  # validated, learnt
            with (
                mock.patch.object(engine, "direct", wraps=engine.direct) as direct,
                mock.patch.object(engine, "direct_p2p", wraps=engine.direct_p2p) as p2p,
            ):
                call()
                call()
            taken[name] = direct.call_count + p2p.call_count
    seen = []
    barriers = []

    class Logged(type(base)):  # type: ignore[misc]
        def all_reduce(self, tensor, op, group, async_op=False):
            seen.append(op)
            return super().all_reduce(tensor, op, group, async_op)

        def barrier(self, group, timeout=None):
            barriers.append(timeout)
            return super().barrier(group, timeout)

    with fake_world(8, dispatch_plugin(Logged())) as comm:
        engine = comm._engine
        t = torch.ones(4)
        comm.broadcast(t, src=0)
        with mock.patch.object(engine, "direct", wraps=engine.direct) as direct:
            for _ in range(3):
                comm.all_reduce(t)
            on_lanes = direct.call_count
            comm.broadcast(t, src=0)
            comm.broadcast(t, src=0)
            broadcast = direct.call_count - on_lanes
            for _ in range(3):
                comm.barrier()
            barrier_lanes = direct.call_count - on_lanes - broadcast
    logged = {"ran": len(seen), "lanes": on_lanes, "bcast": broadcast}
    logged["barrier"] = [len(barriers), barrier_lanes]
    return {"taken": taken, "logged": logged}


def simulated_report(kind: str) -> None:
    """Print :func:`lanes_taken` for ``kind``'s plugin over simulated devices, as JSON."""
    from commlib.testing import simulated

    simulated.install(kind, devices=1)
    print(json.dumps(lanes_taken(plugins.resolve_backend(kind))))


def _assert_the_default_s_lanes(report: dict[str, Any], *, all_ops: bool = True) -> None:
    taken = report["taken"]
    for name in (*TIMED, "reduce", "all_to_all_single", "send", "recv", "scatter", "barrier"):
        assert taken[name] == 2, (name, taken)
    if all_ops:
        assert taken["all_reduce max"] == 2 and taken["all_reduce int32"] == 2, taken
    # the overriding plugin's all_reduce and barrier ran every time; its broadcast kept
    # its lane
    assert report["logged"] == {"ran": 3, "lanes": 0, "bcast": 2, "barrier": [3, 0]}


@pytest.fixture
def free_dist():
    import torch.distributed as dist

    assert not dist.is_initialized()
    yield


@pytest.mark.parametrize(
    "base", [Minimal(), plugins.resolve_backend("gloo")], ids=["minimal", "gloo"]
)
def test_a_torch_engine_plugin_takes_the_default_s_lanes(free_dist, base):
    _assert_the_default_s_lanes(lanes_taken(base))


def test_a_scatter_its_engine_lacks_takes_the_broadcast_s_lane(free_dist):
    # the plugin's scatter broadcasts the root's list: its lane is that broadcast
    report = lanes_taken(NoScatter())
    _assert_the_default_s_lanes(report)

    class LoggedBroadcast(NoScatter):
        def broadcast(self, tensor, src, group, async_op=False):
            return super().broadcast(tensor, src, group, async_op)

    # a broadcast of its own, which the scatter calls: neither takes a lane
    with fake_world(8, dispatch_plugin(LoggedBroadcast())) as comm:
        group = comm.group
        plugin = comm.plugin
        assert plugin.direct_call("scatter", group, src=0, dtype=torch.float32) is None
        lane = NoScatter().direct_call("scatter", group, src=0, dtype=torch.float32)
        assert lane is not None and lane.via == "broadcast"


def test_engine_gaps_lanes_where_it_passes_through(free_dist):
    report = lanes_taken(Gapped())
    _assert_the_default_s_lanes(report, all_ops=False)
    # what its engine cannot reduce is gathered and reduced here: its method, no lane
    assert report["taken"]["all_reduce max"] == 0
    assert report["taken"]["all_reduce int32"] == 0


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["nccl", "hccl", "cncl"])
def test_a_simulated_accelerator_takes_its_lanes(kind):
    code = f"from {__name__} import simulated_report; simulated_report({kind!r})"
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=240
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    # the vendor libraries have no band/bor/bxor, but they reduce max and int32
    _assert_the_default_s_lanes(report)


# -- results through the lanes, 2 ranks: the minimal plugin on gloo, the simulated kinds ----


def _on_lanes(world_comm: commlib.Communicator, plugin: str | None) -> tuple[dict, list[str]]:
    # unchecked (the lanes' condition); the simulated engines would check by default
    backend = {"minimal": Minimal, "no-scatter": NoScatter}[plugin]() if plugin else None
    comm = commlib.Communicator(backend=backend or world_comm.backend, strict=False)
    me, world = comm.rank, comm.world_size
    got = {}
    for round_ in range(2):  # the first learns, the second takes the lane
        x = torch.full((3,), float(me + round_))
        comm.all_reduce(x, op="max")
        got[f"all_reduce {round_}"] = x.tolist()
        b = torch.full((3,), float(me * 10 + round_))
        comm.broadcast(b, src=world - 1)
        got[f"broadcast {round_}"] = b.tolist()
        out = torch.empty(2 * world)
        comm.all_gather_into_tensor(out, torch.full((2,), float(me + round_)))
        got[f"all_gather_into_tensor {round_}"] = out.tolist()
        got[f"all_gather {round_}"] = [t.tolist() for t in comm.all_gather(torch.ones(1) * me)]
        part = torch.empty(2)
        whole = [torch.full((2,), 10.0 * r + round_) for r in range(world)]
        comm.scatter(part, whole if me == world - 1 else None, src=world - 1)
        got[f"scatter {round_}"] = part.tolist()
    return got, sorted(k[0] for k, lane in comm._engine.lanes.items() if lane is not None)


def _assert_results(outcomes: list[tuple[dict, list[str]]]) -> None:
    for rank, (got, lanes) in enumerate(outcomes):
        for round_ in range(2):
            assert got[f"all_reduce {round_}"] == [1.0 + round_] * 3
            assert got[f"broadcast {round_}"] == [10.0 + round_] * 3
            assert got[f"all_gather_into_tensor {round_}"] == [
                float(round_),
                float(round_),
                1.0 + round_,
                1.0 + round_,
            ]
            assert got[f"all_gather {round_}"] == [[0.0], [1.0]]
            assert got[f"scatter {round_}"] == [10.0 * rank + round_] * 2  # root: rank 1
        assert {"all_reduce", "broadcast", "all_gather_into_tensor", "scatter"} <= set(lanes)


@pytest.mark.parametrize("plugin", ["minimal", "no-scatter"])
def test_the_minimal_plugin_s_results_through_its_lanes(world2, plugin):
    _assert_results(world2.run(_on_lanes, plugin))


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["nccl", "hccl", "cncl"])
def test_a_simulated_accelerator_s_results_through_its_lanes(kind):
    from commlib.testing import World, simulated

    with World(2, backend=kind, setup=simulated.setup(kind, devices=2), timeout=60) as world:
        _assert_results(world.run(_on_lanes, None))


def test_a_lane_is_issued_as_torch_s_blocking_call(free_dist):
    # torch's function builds its options with asyncOp=async_op; a lane serves blocking
    # calls only, so NCCL runs it on the current stream as it runs dist.all_reduce(t)
    from commlib import _torch_facts as facts

    if not facts.OPTIONS_ASYNC_OP:
        pytest.skip("this torch's options carry no asyncOp")
    with fake_world(8, dispatch_plugin(Minimal())) as comm:
        for call in list(_calls(comm).values())[:3]:
            call()
        lanes = [lane for lane in comm._engine.lanes.values() if lane is not None]
        assert len(lanes) == 3
        assert all(lane.options.asyncOp is False for lane in lanes)


class OtherOps(Minimal):
    """A plugin whose reductions are another engine's (as mpi's map to mpi4py's)."""

    name = "lanes-other-ops"

    def torch_reduce_op(self, op):
        return f"engine-{op}"


def test_no_torch_lane_for_a_plugin_whose_ops_are_not_torch_s(free_dist):
    import torch.distributed as dist

    with fake_world(2, dispatch_plugin(Minimal())):
        group = dist.group.WORLD
        plugin = OtherOps()
        for collective in ("all_reduce", "reduce_scatter"):
            assert plugin.direct_call(collective, group, op="sum", dtype=torch.float32) is None
        lane = plugin.direct_call("reduce", group, op="max", dst=0, dtype=torch.float32)
        assert lane is None
        # what takes no op keeps its lane
        assert plugin.direct_call("broadcast", group, src=0, dtype=torch.float32) is not None


@pytest.mark.parametrize("world", [8, 1])
def test_a_device_barrier_s_lane_holds_the_host(free_dist, world):
    # on a real device the engine waits for a lane as torch's blocking calls do (the
    # stream waits); the barrier's lane then reads its token back: the host waits too,
    # on a group of one as well (nothing to issue there, but torch's barrier still
    # synchronizes the device)
    nccl = type(plugins.resolve_backend("nccl"))

    class OnStream(nccl):  # type: ignore[misc, valid-type]
        def unavailable_reason(self) -> None:
            return None  # (its device is the CPU here)

        def accelerator_device(self) -> torch.device:
            return torch.device("cpu")

        def waits_on_stream(self) -> bool:
            return True

    read = []
    with fake_world(world, dispatch_plugin(OnStream())) as comm:
        engine = comm._engine
        comm.barrier()  # learnt
        lane = engine.lanes[("barrier",)]
        with (
            mock.patch.object(engine, "direct", wraps=engine.direct) as direct,
            mock.patch.object(torch.Tensor, "item", lambda t: read.append(t.tolist())),
        ):
            comm.barrier()
            comm.barrier()
        assert type(lane.call).__name__ == "_HostHeld" and direct.call_count == 2
        assert read == [[0.0], [0.0]]
