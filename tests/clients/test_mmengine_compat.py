"""Code written for mmengine.dist runs after ``import commlib as dist``.

``_evaluate`` below is the kind of code mmengine users write; it is run
unchanged in one plain process (no torch.distributed: mmengine's documented
non-distributed results) and on gloo worlds of 2 to 4 ranks.
"""

from __future__ import annotations

import numpy as np
import torch

import commlib as dist


def _evaluate():
    rank, world_size = dist.get_dist_info()
    out = {"rank": rank, "world_size": world_size, "main": dist.is_main_process()}

    data = torch.arange(2, dtype=torch.int64) + 1 + 2 * rank
    dist.all_reduce(data)
    out["all_reduce"] = data.tolist()

    data = torch.arange(2, dtype=torch.int64) + 1 + 2 * rank
    out["all_gather"] = [t.tolist() for t in dist.all_gather(data)]
    out["gather"] = [t.tolist() for t in dist.gather(data)]

    data = torch.arange(2, dtype=torch.int64) + 1 + 2 * rank
    dist.broadcast(data)
    out["broadcast"] = data.tolist()

    objs = ["foo", 12, {1: 2}] if rank == 0 else [None, None, None]
    dist.broadcast_object_list(objs)
    out["broadcast_object_list"] = objs

    out["all_gather_object"] = dist.all_gather_object(f"rank {rank}")
    out["gather_object"] = dist.gather_object(f"rank {rank}")

    losses = {"loss_cls": torch.tensor(1.0 + rank), "loss_bbox": torch.tensor([2.0, rank])}
    dist.all_reduce_dict(losses, op="mean")
    out["all_reduce_dict"] = {k: v.tolist() for k, v in losses.items()}

    params = [torch.ones(3) * rank, torch.ones(2, 2)]
    dist.all_reduce_params(params, coalesce=True, bucket_size_mb=-1, op="sum")
    out["all_reduce_params"] = [p.tolist() for p in params]

    part = list(range(rank, 10, world_size))
    out["collect_results"] = dist.collect_results(part, 10, device="cpu")
    out["collect_results_gpu"] = dist.collect_results(part, 10, device="gpu")
    out["collect_results_kw"] = dist.collect_results(results=part, size=10, device="cpu")

    data = {"x": torch.ones(2), "y": [torch.zeros(1)]}
    moved = dist.cast_data_device(data, dist.get_comm_device())
    out["cast_data_device"] = (str(dist.get_data_device(moved)), moved["x"].tolist())

    np.random.seed(42)
    out["seed"] = dist.sync_random_seed()
    dist.barrier()
    return out


def _mmengine_expectations(world_size: int) -> list[dict]:
    n, ranks = world_size, range(world_size)
    common = {
        "all_reduce": [sum(1 + 2 * r for r in ranks), sum(2 + 2 * r for r in ranks)],
        "all_gather": [[1 + 2 * r, 2 + 2 * r] for r in ranks],
        "broadcast": [1, 2],
        "broadcast_object_list": ["foo", 12, {1: 2}],
        "all_gather_object": [f"rank {r}" for r in ranks],
        "all_reduce_dict": {"loss_cls": 1.0 + sum(ranks) / n, "loss_bbox": [2.0, sum(ranks) / n]},
        "all_reduce_params": [[float(sum(ranks))] * 3, [[float(n)] * 2] * 2],
        "seed": int(np.random.RandomState(42).randint(2**31)),
        "cast_data_device": ("cpu", [1.0, 1.0]),
    }
    out = []
    for r in ranks:
        main = r == 0
        out.append(
            {
                **common,
                "rank": r,
                "world_size": n,
                "main": main,
                "gather": common["all_gather"] if main else [],
                "gather_object": common["all_gather_object"] if main else None,
                "collect_results": list(range(10)) if main else None,
                "collect_results_gpu": list(range(10)) if main else None,
                "collect_results_kw": list(range(10)) if main else None,
            }
        )
    return out


def _on_evaluate(comm):
    return _evaluate()


def test_not_distributed_matches_mmengine():
    # mmengine's documented non-distributed results, e.g. all_gather -> [data]
    assert _evaluate() == _mmengine_expectations(1)[0]


def test_gloo_matches_mmengine(world):
    assert world.run(_on_evaluate) == _mmengine_expectations(world.size)
