"""The mmengine / vis4d helpers and the module-level API, on the backend under test."""

from __future__ import annotations

import os
from typing import Any, cast

import numpy as np
import torch

import commlib.functional as F
from commlib.testing.checks import (
    check,
    devices,
    every_rank,
    expect,
    expect_tensor,
    oracle,
    rank_tensor,
)


@check("all_reduce_dict")
def _all_reduce_dict(comm: Any, ctx: dict) -> None:
    """all_reduce_dict replaces every value with the reduced one, dtypes mixed."""
    for op in ("sum", "mean", "max"):
        for dev in devices(comm):
            data = {
                "loss": rank_tensor(comm.rank, torch.float32, (), device=dev),
                "acc": rank_tensor(comm.rank, torch.float64, (2,), device=dev),
                "count": rank_tensor(comm.rank, torch.int64, (3,), device=dev),
            }
            ret = cast(Any, F.all_reduce_dict)(data, op, group=comm)
            expect(ret is None, f"all_reduce_dict returned {ret!r}")
            expect(list(data) == ["loss", "acc", "count"], "keys changed or reordered")
            for key, dtype, shape in (
                ("loss", torch.float32, ()),
                ("acc", torch.float64, (2,)),
                ("count", torch.int64, (3,)),
            ):
                want = oracle(every_rank(comm, dtype, shape), op).to(dev)
                expect_tensor(
                    data[key], want, f"all_reduce_dict {op} [{key}] on {dev}", close=True
                )


@check("all_reduce_params")
def _all_reduce_params(comm: Any, ctx: dict) -> None:
    """all_reduce_params reduces parameters in place: coalesced, bucketed or one by one."""
    for coalesce, bucket_mb in ((True, -1), (True, 1e-5), (False, -1)):
        for op in ("sum", "mean"):
            model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.Linear(2, 1))
            with torch.no_grad():
                for i, p in enumerate(model.parameters()):
                    p.copy_(rank_tensor(comm.rank + i, torch.float32, tuple(p.shape)))
            params = list(model.parameters())
            F.all_reduce_params(model.parameters(), coalesce, bucket_mb, op, group=comm)
            for i, p in enumerate(params):
                expect(p is list(model.parameters())[i], "parameters were replaced")
                parts = [
                    rank_tensor(r + i, torch.float32, tuple(p.shape))
                    for r in range(comm.world_size)
                ]
                what = f"all_reduce_params coalesce={coalesce} bucket={bucket_mb} {op} [{i}]"
                expect_tensor(p.data, oracle(parts, op), what, close=True)


@check("collect_results")
def _collect_results(comm: Any, ctx: dict) -> None:
    """collect_results gpu and cpu: rank 0 gets dataset order, padding cut; others None."""
    n, r = comm.world_size, comm.rank
    size = 3 * n - 1  # the sampler padded one sample
    part = [{"idx": i, "t": torch.tensor([i])} for i in range(r, 3 * n, n)]
    for device in ("gpu", "cpu"):
        tmpdir = os.path.join(ctx["tmpdir"], f"collect-{device}") if device == "cpu" else None
        got = F.collect_results(part, size, device=device, tmpdir=tmpdir, group=comm)
        if r != 0:
            expect(got is None, f"collect_results({device}) on rank {r} returned {got!r:.60}")
            continue
        expect(isinstance(got, list) and len(got) == size, f"collect_results({device}) length")
        assert got is not None
        expect([g["idx"] for g in got] == list(range(size)), f"collect_results({device}) order")
        expect(all(int(g["t"]) == g["idx"] for g in got), f"collect_results({device}) values")
    got = F.collect_results_cpu(part, size, group=comm)  # rank 0 makes the directory
    expect((got is None) == (r != 0), "collect_results_cpu without tmpdir")


@check("sync_random_seed")
def _sync_random_seed(comm: Any, ctx: dict) -> None:
    """sync_random_seed: rank 0's draw on every rank."""
    np.random.seed(1234 + comm.rank)
    seed = F.sync_random_seed(group=comm)
    expect(isinstance(seed, int), f"seed is {type(seed).__name__}")
    seeds = comm.all_gather_object(seed)
    expect(len(set(seeds)) == 1, f"ranks got different seeds {seeds}")
    np.random.seed(1234)
    expect(seeds[0] == int(np.random.randint(2**31)), "the seed is not rank 0's draw")


@check("reduce_mean")
def _reduce_mean(comm: Any, ctx: dict) -> None:
    """reduce_mean returns a new tensor, the input untouched."""
    for dev in devices(comm):
        t = rank_tensor(comm.rank, torch.float32, device=dev)
        before = t.clone()
        out = F.reduce_mean(t, group=comm)
        expect(out is not t, "reduce_mean returned its input")
        expect_tensor(t, before, "reduce_mean changed its input")
        expect_tensor(
            out, oracle(every_rank(comm, torch.float32), "mean").to(dev), "reduce_mean", close=True
        )


@check("pad_to_largest_tensor")
def _pad_to_largest(comm: Any, ctx: dict) -> None:
    """pad_to_largest_tensor: every rank's dim-0 size and a zero-padded tensor."""
    n, r = comm.world_size, comm.rank
    for dev in devices(comm):
        t = torch.ones(r + 1, 2, device=dev)
        sizes, padded = F.pad_to_largest_tensor(t, group=comm)
        expect(list(sizes) == list(range(1, n + 1)), f"sizes {sizes}")
        want = torch.zeros(n, 2, device=dev)
        want[: r + 1] = 1
        expect_tensor(padded, want, "pad_to_largest_tensor")


@check("functional_api")
def _functional_api(comm: Any, ctx: dict) -> None:
    """The mmengine-named module API answers for the backend's group."""
    expect(F.get_rank(comm) == comm.rank, "get_rank")
    expect(F.get_world_size(comm) == comm.world_size, "get_world_size")
    expect(F.get_dist_info(comm) == (comm.rank, comm.world_size), "get_dist_info")
    expect(F.get_comm_device(comm) == comm.device, "get_comm_device")
    expect(F.get_backend(comm) == comm.plugin.torch_backend, "get_backend")
    expect(F.is_main_process(comm) == (comm.rank == 0), "is_main_process")
    expect(F.tensor2obj(F.obj2tensor({"a": [1, 2]})) == {"a": [1, 2]}, "obj2tensor round trip")
    got = F.broadcast_object("hello" if comm.rank == 0 else None, 0, group=comm)
    expect(got == "hello", f"broadcast_object: {got!r}")
    data = rank_tensor(comm.rank, torch.float32)
    F.all_reduce(data, "sum", group=comm)
    expect_tensor(data, oracle(every_rank(comm, torch.float32), "sum"), "functional all_reduce")
    F.barrier(group=comm)
