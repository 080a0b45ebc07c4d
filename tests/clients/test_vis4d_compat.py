"""commlib.compat.vis4d against the behaviour vis4d.common.distributed's page documents.

Single-process behaviour here; every rank's in the session's gloo worlds (1 to 4 ranks).
"""

from __future__ import annotations

import os

import pytest
import torch

import commlib.compat.vis4d as dist
from commlib.errors import RemoteArgumentError

# the 17 functions of vis4d.common.distributed's documentation page
VIS4D_NAMES = {
    "all_gather_object_cpu",
    "all_gather_object_gpu",
    "all_reduce_dict",
    "broadcast",
    "create_tmpdir",
    "distributed_available",
    "get_local_rank",
    "get_rank",
    "get_world_size",
    "is_module_wrapper",
    "obj2tensor",
    "pad_to_largest_tensor",
    "rank_zero_only",
    "reduce_mean",
    "serialize_to_tensor",
    "synchronize",
    "tensor2obj",
}


def test_every_vis4d_name_is_there():
    assert set(dist.__all__) == VIS4D_NAMES
    assert all(callable(getattr(dist, name)) for name in VIS4D_NAMES)


def test_single_process():
    assert dist.distributed_available() is False
    assert (dist.get_rank(), dist.get_world_size(), dist.get_local_rank()) == (0, 1, 0)
    dist.synchronize()
    assert dist.broadcast({"a": 1}) == {"a": 1}
    assert dist.all_gather_object_gpu(3) == [3] == dist.all_gather_object_cpu(3)
    t = dist.serialize_to_tensor({"x": [1, 2]})
    assert t.dtype == torch.uint8 and t.dim() == 1
    assert dist.tensor2obj(t) == {"x": [1, 2]} == dist.tensor2obj(dist.obj2tensor({"x": [1, 2]}))
    given = {"loss": torch.tensor(2), "n": 3}
    out = dist.all_reduce_dict(given, "mean")
    assert out["loss"].dtype == torch.float32 and out["n"].item() == 3.0
    assert given["loss"].dtype == torch.int64  # the caller's dict is left as it was
    assert dist.all_reduce_dict({"i": torch.tensor(2)}, to_float=False)["i"].dtype == torch.int64
    lin = torch.nn.Linear(1, 1)
    assert not dist.is_module_wrapper(lin)
    assert dist.is_module_wrapper(torch.nn.DataParallel(lin))


def test_create_tmpdir_given_or_made(tmp_path, monkeypatch):
    given = tmp_path / "given" / "dir"
    assert dist.create_tmpdir(0, str(given)) == str(given) and given.is_dir()
    made = dist.create_tmpdir(0)
    assert os.path.isdir(made)
    os.rmdir(made)
    monkeypatch.chdir(tmp_path)
    local = dist.create_tmpdir(0, use_system_tmp=False)
    assert os.path.dirname(os.path.abspath(local)) == str(tmp_path / ".dist_tmp")


def _on_vis4d(comm, tmpdir):
    r = comm.rank
    out = {
        "available": dist.distributed_available(),
        "broadcast": dist.broadcast(f"from {r}", src=comm.world_size - 1),
        "gpu": dist.all_gather_object_gpu({"r": r}),
        "gpu_all": dist.all_gather_object_gpu(r, rank_zero_return_only=False),
        "cpu": dist.all_gather_object_cpu([r] * r, tmpdir=tmpdir),
        "cpu_all": dist.all_gather_object_cpu(r, rank_zero_return_only=False),
        "reduced": dist.all_reduce_dict({"a": torch.tensor(r), "b": torch.tensor([1.0, r])})[
            "b"
        ].tolist(),
        "tmpdir": dist.create_tmpdir(r),
        "serialized": dist.tensor2obj(dist.serialize_to_tensor(("x", r))),
    }
    dist.synchronize()
    try:
        dist.all_reduce_dict({"a": torch.zeros(1)} if r else {"b": torch.zeros(1)})
    except RemoteArgumentError as exc:
        out["mismatch"] = exc.collective
    return out


def test_vis4d_names_on_every_rank(world, tmp_path):
    n = world.size
    results = world.run(_on_vis4d, str(tmp_path / "parts"))
    dirs = {res["tmpdir"] for res in results}
    assert len(dirs) == 1  # rank 0's directory, broadcast
    os.rmdir(dirs.pop())
    for r, got in enumerate(results):
        assert got["available"] is True
        assert got["broadcast"] == f"from {n - 1}"
        assert got["gpu"] == ([{"r": q} for q in range(n)] if r == 0 else None)
        assert got["gpu_all"] == list(range(n))
        assert got["cpu"] == ([[q] * q for q in range(n)] if r == 0 else None)
        assert got["cpu_all"] == list(range(n))
        assert got["reduced"] == [float(n), float(sum(range(n)))]
        assert got["serialized"] == ("x", r)
        assert got.get("mismatch") == (None if n == 1 else "all_reduce_dict")


@pytest.mark.parametrize("name", sorted(VIS4D_NAMES))
def test_every_name_is_documented_with_an_example(name):
    doc = getattr(dist, name).__doc__ or ""
    assert ">>>" in doc, name
