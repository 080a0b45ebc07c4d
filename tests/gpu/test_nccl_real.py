"""commlib on a real NCCL engine: what only a GPU can show (skipped without one).

CI has no GPU, so these run on a lent GPU machine (``benchmarks/gpu_check.sh``
runs them there with the conformance kit and the NCCL benchmark). One GPU
holds one NCCL rank (NCCL refuses two ranks on one device), so the world is 1:
every collective still goes through NCCL's kernels and streams, which is what
the simulated devices of the CPU suite cannot show. What they check:

- every tensor collective's result on the device, and that the steady call
  takes its lane (the direct path, ``asyncOp=False``);
- a blocking call orders after work queued on the caller's current stream
  and before work queued after it, and returns without waiting for the GPU
  (as torch's own blocking call: ``Work.wait()``, never ``wait(timeout)``,
  which holds the host in 1 ms sleeps until the device is done);
- async handles, the checked mode, object collectives and ``collect_results``
  with CUDA tensors inside;
- DDP on ``commlib-nccl`` (torch's own traffic through a Communicator) trains
  to the same weights as DDP on plain NCCL.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from commlib.testing import World

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(300),
    pytest.mark.skipif(
        not torch.cuda.is_available(), reason="needs a GPU: run on a lent GPU machine"
    ),
]


@pytest.fixture(scope="module")
def world():
    with World(1, backend="nccl", timeout=120) as w:
        yield w


def _tensor_collectives(comm: Any) -> dict[str, Any]:
    dev = comm.device
    got: dict[str, Any] = {"device": str(dev), "engine": comm.plugin.engine(comm.group)}
    x = torch.arange(8, dtype=torch.float32, device=dev)
    for _ in range(3):  # the first learns, the later ones take the lane
        y = x.clone()
        comm.all_reduce(y)
    got["all_reduce"] = y.tolist()
    y = x.clone()
    comm.all_reduce(y, op="mean")
    got["all_reduce mean"] = y.tolist()
    y = x.clone()
    comm.broadcast(y, src=0)
    got["broadcast"] = y.tolist()
    out = torch.empty(8, device=dev)
    comm.all_gather_into_tensor(out, x)
    got["all_gather_into_tensor"] = out.tolist()
    got["all_gather"] = [t.tolist() for t in comm.all_gather(x)]
    out = torch.empty(8, device=dev)
    comm.reduce_scatter(out, [x])
    got["reduce_scatter"] = out.tolist()
    out = torch.empty(8, device=dev)
    comm.all_to_all_single(out, x)
    got["all_to_all_single"] = out.tolist()
    y = x.clone()
    comm.reduce(y, dst=0)
    got["reduce"] = y.tolist()
    h = comm.all_reduce(x.clone(), async_op=True)
    h.wait()
    got["async done"] = h.is_completed()
    got["lanes"] = sorted(k[0] for k, lane in comm._engine.lanes.items() if lane is not None)
    return got


def test_every_tensor_collective_on_nccl_and_its_lanes(world):
    (got,) = world.run(_tensor_collectives)
    x = [float(i) for i in range(8)]
    assert got["device"] == "cuda:0"
    assert got["engine"] in ("nccl", "nccl2")
    for name in (
        "all_reduce",
        "all_reduce mean",
        "broadcast",
        "all_gather_into_tensor",
        "reduce_scatter",
        "all_to_all_single",
        "reduce",
    ):
        assert got[name] == x, name
    assert got["all_gather"] == [x]
    assert got["async done"] is True
    assert "all_reduce" in got["lanes"], got["lanes"]


def _stream_order(comm: Any) -> list[float]:
    dev = comm.device
    side = torch.cuda.Stream(device=dev)
    n = 1 << 22  # big enough that an unordered read would see the fill unfinished
    results = []
    for _ in range(3):  # the learning call, then the steady ones
        with torch.cuda.stream(side):
            x = torch.zeros(n, device=dev)
            x.add_(1.0).mul_(3.0)  # queued on the side stream, not yet done
            out = torch.empty(n * comm.world_size, device=dev)
            # at world 1 all_reduce issues nothing; the gather is a real NCCL call
            comm.all_gather_into_tensor(out, x)
            out.add_(1.0)  # after the collective, on the same stream
        side.synchronize()
        results += [float(out.min()), float(out.max())]
    return results


def test_a_blocking_call_orders_on_the_callers_current_stream(world):
    (got,) = world.run(_stream_order)
    assert got == [4.0] * 6


def _host_free(comm: Any) -> dict[str, Any]:
    dev = comm.device
    x = torch.ones(1 << 10, device=dev)
    out = torch.empty(x.numel() * comm.world_size, device=dev)
    comm.all_gather_into_tensor(out, x)  # learnt
    torch.cuda.synchronize()
    torch.cuda._sleep(2_000_000_000)  # about a second of device time queued ahead
    comm.all_gather_into_tensor(out, x)
    after = torch.cuda.Event()
    after.record()
    # the call returned while the device was still busy with the sleep: the host
    # was not held until the collective finished (torch's own blocking call)
    pending = not after.query()
    torch.cuda.synchronize()
    on_stream = comm._engine._on_stream
    return {"pending": pending, "waits_on_stream": on_stream, "out": out.sum().item()}


def test_a_blocking_call_does_not_hold_the_host_until_the_gpu_is_done(world):
    (got,) = world.run(_host_free)
    assert got == {"pending": True, "waits_on_stream": True, "out": 1024.0}


def _host_syncs(comm: Any) -> dict[str, Any]:
    # the shapes round of gather/all_gather reads only the headers back (one host sync:
    # every rank must agree on the shapes before the results exist); the data goes into
    # the sent row on the device; a list all_to_all of plain device tensors takes its lane
    import warnings
    from unittest import mock

    dev = comm.device
    x = torch.arange(8, dtype=torch.float32, device=dev)
    ragged = torch.arange(3 + comm.rank, dtype=torch.float32, device=dev)
    calls = {
        "gather": lambda: comm.gather(x, 0),
        "all_gather": lambda: comm.all_gather(x),
        "all_gather uneven": lambda: comm.all_gather(ragged),
        "all_to_all": lambda: comm.all_to_all([torch.empty(8, device=dev)], [x]),
    }
    got: dict[str, Any] = {}
    engine = comm._engine
    for name, call in calls.items():
        call()
        call()  # learnt, the kind's row on the device made
        torch.cuda.synchronize()
        with (
            mock.patch.object(engine, "direct", wraps=engine.direct) as direct,
            warnings.catch_warnings(record=True) as seen,
        ):
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                result = call()
            finally:
                torch.cuda.set_sync_debug_mode("default")
        # (the mode's own first warning, that it is a prototype, is not a sync)
        syncs = [w for w in seen if "called a synchronizing" in str(w.message)]
        value = [t.tolist() for t in result] if isinstance(result, list) else None
        got[name] = {"syncs": len(syncs), "direct": direct.call_count, "value": value}
    return got


def test_a_steady_gather_reads_only_its_headers_back(world):
    (got,) = world.run(_host_syncs)
    x = [float(i) for i in range(8)]
    assert got["gather"]["value"] == [x] and got["all_gather"]["value"] == [x]
    assert got["all_gather uneven"]["value"] == [[0.0, 1.0, 2.0]]
    # before: three (the data to the host, the row back to the device, the headers)
    for name in ("gather", "all_gather", "all_gather uneven"):
        assert got[name]["syncs"] <= 1 and got[name]["direct"] == 1, got
    assert got["all_to_all"] == {"syncs": 0, "direct": 1, "value": None}, got


def _held_barrier(comm: Any) -> dict[str, Any]:
    # the barrier's lane on a device (a world of one issues nothing: its primitive is
    # checked here on NCCL's own all_reduce): its wait holds the host until the device
    # has done the all_reduce, queued behind about a second of device time
    import functools

    import torch.distributed.distributed_c10d as c10d

    from commlib_backends.accelerator import _HostHeld

    dev = comm.device
    token = torch.zeros(1, device=dev)
    pg = comm.group if comm.group is not None else c10d._get_default_group()
    opts = c10d.AllreduceOptions()
    held = _HostHeld(functools.partial(pg.allreduce, [token]), token)
    held(opts).wait()
    torch.cuda.synchronize()
    torch.cuda._sleep(2_000_000_000)
    held(opts).wait()
    after = torch.cuda.Event()
    after.record()
    done = after.query()
    comm.barrier()
    comm.barrier()
    lane = comm._engine.lanes.get(("barrier",))
    return {"done": done, "lane": lane is not None, "token": token.item()}


def test_a_device_barrier_s_lane_holds_the_host(world):
    (got,) = world.run(_held_barrier)
    assert got == {"done": True, "lane": True, "token": 0.0}


def _checked_and_objects(comm: Any) -> dict[str, Any]:
    import commlib

    dev = comm.device
    checked = commlib.Communicator(comm.group, backend="nccl", strict=True)
    x = torch.ones(4, device=dev)
    checked.all_reduce(x)
    out: dict[str, Any] = {"checked all_reduce": x.tolist()}
    try:
        checked.all_reduce(torch.ones(4, device=dev), op="nonsense")
    except ValueError as exc:
        out["bad op"] = type(exc).__name__
    obj = {"t": torch.arange(3, device=dev), "s": "text"}
    gathered = comm.all_gather_object(obj)
    out["all_gather_object"] = [(g["t"].device.type, g["t"].tolist(), g["s"]) for g in gathered]
    lst = [obj, 7]
    comm.broadcast_object_list(lst, src=0)
    out["broadcast_object_list"] = (lst[0]["t"].tolist(), lst[1])
    out["gather_object"] = len(comm.gather_object(obj, dst=0))
    out["collect_results gpu"] = commlib.collect_results([1, 2, 3], 3, device="gpu")
    out["collect_results cpu"] = commlib.collect_results([1, 2, 3], 3, device="cpu")
    return out


def test_checked_calls_and_object_collectives_on_nccl(world):
    (got,) = world.run(_checked_and_objects)
    assert got["checked all_reduce"] == [1.0] * 4
    assert got["bad op"] == "ValueError"
    assert got["all_gather_object"] == [("cuda", [0, 1, 2], "text")]
    assert got["broadcast_object_list"] == ([0, 1, 2], 7)
    assert got["gather_object"] == 1
    assert got["collect_results gpu"] == [1, 2, 3]
    assert got["collect_results cpu"] == [1, 2, 3]


def _ddp(comm: Any, backend: str) -> list[float]:
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    group = dist.new_group(backend=backend)
    torch.manual_seed(0)
    dev = comm.device
    net = nn.Sequential(nn.Linear(8, 64), nn.ReLU(), nn.Linear(64, 4)).to(dev)
    ddp = DDP(net, device_ids=[dev.index], process_group=group, bucket_cap_mb=0.001)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    for step in range(3):
        torch.manual_seed(100 + step)
        ddp(torch.randn(16, 8, device=dev)).square().mean().backward()
        opt.step()
        opt.zero_grad()
    torch.cuda.synchronize()
    return torch.cat([p.detach().reshape(-1) for p in net.parameters()]).tolist()


def test_ddp_on_commlib_nccl_matches_plain_nccl(world):
    (plain,) = world.run(_ddp, "nccl")
    (served,) = world.run(_ddp, "commlib-nccl")
    diff = (torch.tensor(plain) - torch.tensor(served)).abs().max()
    assert diff < 1e-6, diff
