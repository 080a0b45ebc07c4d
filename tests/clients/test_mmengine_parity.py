"""mmengine.dist drop-in parity (issue 10).

* every name of ``mmengine.dist.__all__`` exists, with compatible parameters;
* ``src``/``dst`` are world ranks with a torch ProcessGroup, group ranks with a
  Communicator (``group_src``/``group_dst`` as torch >= 2.6), on worlds of 1 to
  3 ranks and on subgroups that are not a prefix of the world;
* ``collect_results`` under mmengine's parameter names, on any device type a
  registered backend serves, removing a given ``tmpdir`` it leaves empty;
* the device helpers, the local group, ``infer_launcher`` and the warning under
  a launcher before ``init_dist``.

Functions named ``_on_*`` run inside the ranks (``fn(comm, ...)``).
"""

from __future__ import annotations

import inspect
import os
import threading
import warnings
from collections import OrderedDict, defaultdict, namedtuple

import pytest
import torch
import torch.distributed as torch_dist

import commlib as dist
from commlib import _world
from commlib.data_device import resolve_device
from commlib.errors import BackendUnavailableError, RemoteError
from commlib.testing import World, simulated
from tests.conftest import get_world
from tests.torch_build import nccl_reason

# -- the names and signatures: mmengine 0.10.7's mmengine/dist/__init__.py ---------------
MMENGINE_DIST_ALL = [
    "all_gather_object",
    "all_reduce",
    "all_gather",
    "all_reduce_dict",
    "collect_results",
    "collect_results_cpu",
    "collect_results_gpu",
    "gather",
    "broadcast",
    "gather_object",
    "sync_random_seed",
    "broadcast_object_list",
    "get_dist_info",
    "init_dist",
    "init_local_group",
    "get_backend",
    "get_world_size",
    "get_rank",
    "get_local_size",
    "get_local_group",
    "get_local_rank",
    "is_main_process",
    "master_only",
    "barrier",
    "is_distributed",
    "get_default_group",
    "all_reduce_params",
    "get_data_device",
    "get_comm_device",
    "cast_data_device",
    "infer_launcher",
]

# each function's parameters as mmengine.dist declares them (dist.py and utils.py)
MMENGINE_SIGNATURES = {
    "all_gather_object": "data, group=None",
    "all_reduce": "data, op='sum', group=None",
    "all_gather": "data, group=None",
    "all_reduce_dict": "data, op='sum', group=None",
    "collect_results": "results, size, device='cpu', tmpdir=None",
    "collect_results_cpu": "result_part, size, tmpdir=None",
    "collect_results_gpu": "result_part, size",
    "gather": "data, dst=0, group=None",
    "broadcast": "data, src=0, group=None",
    "gather_object": "data, dst=0, group=None",
    "sync_random_seed": "group=None",
    "broadcast_object_list": "data, src=0, group=None",
    "get_dist_info": "group=None",
    "init_dist": "launcher, backend='nccl', init_backend='torch', **kwargs",
    "init_local_group": "node_rank, num_gpus_per_node",
    "get_backend": "group=None",
    "get_world_size": "group=None",
    "get_rank": "group=None",
    "get_local_size": "",
    "get_local_group": "",
    "get_local_rank": "",
    "is_main_process": "group=None",
    "master_only": "func",
    "barrier": "group=None",
    "is_distributed": "",
    "get_default_group": "",
    "all_reduce_params": "params, coalesce=True, bucket_size_mb=-1, op='sum', group=None",
    "get_data_device": "data",
    "get_comm_device": "group=None",
    "cast_data_device": "data, device, out=None",
    "infer_launcher": "",
}

_ROOT_DEFAULT = (
    "None is the group's first rank: world rank 0 whenever world rank 0 is a member "
    "(torch orders a group's ranks), so mmengine's 0 where that works; it also works for a "
    "torch group without world rank 0, where 0 would be an error, and lets group_src / "
    "group_dst be passed alone, as torch >= 2.6 does"
)

# (function, parameter) -> why commlib's default differs from mmengine's
DELIBERATE_DEFAULT_DIFFERENCES = {
    ("broadcast", "src"): _ROOT_DEFAULT,
    ("gather", "dst"): _ROOT_DEFAULT,
    ("gather_object", "dst"): _ROOT_DEFAULT,
    ("broadcast_object_list", "src"): _ROOT_DEFAULT,
    ("init_dist", "backend"): (
        "None picks torch's backend for this machine's accelerator (gloo on CPU, hccl on "
        "an NPU, ...); 'nccl' fails everywhere but on CUDA"
    ),
}


def _mmengine_signature(name: str) -> inspect.Signature:
    namespace: dict = {}
    exec(f"def {name}({MMENGINE_SIGNATURES[name]}): pass", namespace)
    return inspect.signature(namespace[name])


def _positional(sig: inspect.Signature) -> list[str]:
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return [p.name for p in sig.parameters.values() if p.kind in kinds]


def test_the_reference_list_is_whole():
    assert sorted(MMENGINE_DIST_ALL) == sorted(MMENGINE_SIGNATURES)
    assert len(set(MMENGINE_DIST_ALL)) == len(MMENGINE_DIST_ALL) == 31


@pytest.mark.parametrize("name", MMENGINE_DIST_ALL)
def test_every_mmengine_name_exists_with_compatible_parameters(name):
    assert name in dist.__all__, f"commlib does not export {name}"
    ours = inspect.signature(getattr(dist, name))
    theirs = _mmengine_signature(name)
    # positional calls written for mmengine bind the same parameters
    assert _positional(ours)[: len(_positional(theirs))] == _positional(theirs)
    for param in theirs.parameters.values():
        if param.kind is inspect.Parameter.VAR_KEYWORD:
            assert any(p.kind is p.VAR_KEYWORD for p in ours.parameters.values()), name
            continue
        assert param.name in ours.parameters, f"{name} lacks {param.name}"
        mine = ours.parameters[param.name]
        if param.default is inspect.Parameter.empty:
            continue  # commlib may add a default where mmengine requires the argument
        if (name, param.name) in DELIBERATE_DEFAULT_DIFFERENCES:
            assert mine.default != param.default, f"{name}.{param.name} is no longer different"
        else:
            assert mine.default == param.default, f"{name}.{param.name}: {mine.default!r}"
    # commlib's own additions never make an mmengine call fail to bind
    for extra in set(ours.parameters) - set(theirs.parameters):
        p = ours.parameters[extra]
        assert p.default is not p.empty or p.kind in (p.VAR_KEYWORD, p.VAR_POSITIONAL), extra


def test_every_listed_difference_names_a_real_parameter():
    for name, param in DELIBERATE_DEFAULT_DIFFERENCES:
        assert param in _mmengine_signature(name).parameters


# -- worlds of 1 to 3 ranks, started once per session ----------------------------------------
@pytest.fixture(scope="module", params=[1, 2, 3], ids=lambda n: f"world{n}")
def world(request) -> World:
    return get_world(request.param)


def _members(n: int) -> list[int]:
    """World ranks [1, ..., n-1] (not a prefix of the world), or [0] in a world of one."""
    return list(range(1, n)) or [0]


def _error(call) -> str | None:
    try:
        call()
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


# -- ranks: world ranks with a torch group, group ranks with a Communicator ---------------
def _on_roots(comm):
    n, r = comm.world_size, comm.rank
    members = _members(n)
    sub = dist.new_group(members)
    out: dict = {}
    x = torch.tensor([r])
    dist.broadcast(x, src=n - 1, group=dist.get_default_group())  # the world: both agree
    out["world broadcast"] = x.item()
    out["world gather_object"] = dist.gather_object(r, group_dst=n - 1)
    if not sub.is_member:
        pg = sub.group
        out["outside"] = [
            _error(lambda: dist.broadcast(torch.ones(1), src=1, group=pg)),
            _error(lambda: dist.gather(torch.ones(1), dst=1, group=pg)),
            _error(lambda: dist.gather_object(1, group_dst=0, group=pg)),
            _error(lambda: dist.broadcast_object_list([1], src=1, group=pg)),
            _error(lambda: dist.broadcast_object(1, group=pg)),
        ]
        return out
    pg, k = sub.group, len(members)
    first, last = members[0], members[-1]

    def bcast(**kw):
        t = torch.tensor([r])
        dist.broadcast(t, **kw)
        return t.item()

    out["broadcast"] = [
        bcast(src=first, group=pg),  # world ranks with a torch group
        bcast(src=last, group=pg),
        bcast(group_src=k - 1, group=pg),
        bcast(group=pg),  # the group's first rank
        bcast(src=k - 1, group=sub),  # group ranks with a Communicator
        bcast(group_src=0, group=sub),
    ]
    out["gather"] = [
        [t.item() for t in dist.gather(torch.tensor([r]), dst=last, group=pg)],
        [t.item() for t in dist.gather(torch.tensor([r]), group_dst=0, group=pg)],
        [t.item() for t in dist.gather(torch.tensor([r]), dst=k - 1, group=sub)],
    ]
    out["gather_object"] = [
        dist.gather_object(r, dst=last, group=pg),
        dist.gather_object(r, group_dst=0, group=pg),
        dist.gather_object(r, dst=0, group=sub),
    ]
    box = [r, "x"]
    dist.broadcast_object_list(box, src=last, group=pg)
    box2 = [r]
    dist.broadcast_object_list(box2, group_src=0, group=pg)
    out["broadcast_object_list"] = [box, box2]
    out["broadcast_object"] = [
        dist.broadcast_object(r, src=first, group=pg),
        dist.broadcast_object(r, src=k - 1, group=sub),
        dist.broadcast_object(r, group=pg),
    ]
    # bad ranks: the same ValueError / TypeError on every member, nothing sent
    out["errors"] = [
        _error(lambda: dist.broadcast(torch.ones(1), src=n, group=pg)),
        _error(lambda: dist.broadcast(torch.ones(1), src=last, group_src=0, group=pg)),
        _error(lambda: dist.gather_object(r, group_dst=k, group=pg)),
        _error(lambda: dist.broadcast_object_list([r], src=k, group=sub)),
        _error(lambda: dist.gather(torch.ones(1), dst="0", group=pg)),
    ]
    # a failure on a subgroup's rank names its world rank too
    try:
        dist.broadcast_object(threading.Lock() if r == last else None, src=last, group=pg)
        out["remote"] = None
    except RemoteError as exc:
        out["remote"] = (sorted(exc.failures), str(exc))
    return out


def test_src_dst_are_world_ranks_with_a_torch_group(world):
    n = world.size
    members, k = _members(n), len(_members(n))
    first, last = members[0], members[-1]
    for r, got in enumerate(world.run(_on_roots)):
        assert got["world broadcast"] == n - 1
        assert got["world gather_object"] == (list(range(n)) if r == n - 1 else None)
        if r not in members:
            assert len(got["outside"]) == 5
            assert all(e and e.startswith("NotInGroupError") for e in got["outside"])
            assert all(f"(world rank {r}) is not a member" in e for e in got["outside"])
            continue
        assert got["broadcast"] == [first, last, last, first, last, first]
        assert got["gather"] == [
            members if r == last else [],
            members if r == first else [],
            members if r == last else [],
        ]
        assert got["gather_object"] == [
            members if r == last else None,
            members if r == first else None,
            members if r == first else None,
        ]
        assert got["broadcast_object_list"] == [[last, "x"], [first]]
        assert got["broadcast_object"] == [first, last, first]
        out_of_world, both, group_range, comm_range, bad_type = got["errors"]
        assert out_of_world == (
            f"ValueError: broadcast: src={n} is not a member of the group (world ranks "
            f"{members}); src is a world rank with a torch ProcessGroup, group_src= takes a "
            "rank within the group"
        )
        assert both.startswith("ValueError: broadcast: pass src (a world rank) or group_src")
        assert f"got src={last} and group_src=0" in both
        assert group_range == (
            f"ValueError: gather_object: group_dst={k} is out of range for a group of {k} "
            f"ranks (0..{k - 1}; world ranks {members})"
        )
        assert comm_range == (
            f"ValueError: broadcast_object_list: src={k} is out of range for a group of {k} "
            f"ranks (0..{k - 1}; world ranks {members})"
        )
        assert bad_type == "TypeError: gather: dst must be an int rank, got str"
        if k == 1:  # a group of one sends nothing, so nothing is pickled
            assert got["remote"] is None
            continue
        failed, text = got["remote"]
        assert failed == [k - 1]
        # group rank k - 1 is world rank `last`: the message names both
        assert f"failed on rank(s) [{k - 1}] (world rank(s) [{last}])" in text


def test_rank_errors_in_a_world_of_one():
    x = torch.ones(1)
    with pytest.raises(ValueError, match=r"src=1 is out of range for a group of 1 ranks"):
        dist.broadcast(x, src=1)
    with pytest.raises(ValueError, match="not both"):
        dist.broadcast_object_list([1], src=0, group_src=0)
    with pytest.raises(TypeError, match="dst must be an int rank, got bool"):
        dist.gather_object(1, dst=True)
    assert dist.gather(x, group_dst=0) == [x]
    assert dist.broadcast_object("a", group_src=0) == "a"


# -- collect_results ------------------------------------------------------------------------
def _on_collect(comm, base):
    n, r = comm.world_size, comm.rank
    part = list(range(r, 7, n))
    out: dict = {"kw": dist.collect_results(results=part, size=7)}
    out["gpu"] = dist.collect_results(part, 7, device="gpu")
    fresh = os.path.join(base, "fresh")
    out["fresh"] = dist.collect_results(part, 7, "cpu", fresh)
    dist.barrier()
    out["fresh left"] = os.path.exists(fresh)
    kept = os.path.join(base, "kept")
    out["kept"] = dist.collect_results_cpu(part, 7, tmpdir=kept)
    dist.barrier()
    out["kept left"] = sorted(os.listdir(kept))
    for device in ("npu", "cuda", "xpu"):
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                got = dist.collect_results(part, 7, device=device)
            out[device] = (got, [str(w.message) for w in caught])
        except (BackendUnavailableError, ValueError) as exc:
            out[device] = f"{type(exc).__name__}: {exc}"
    members = _members(n)
    sub = dist.new_group(members)
    if sub.is_member:
        sub_part = list(range(sub.rank, 5, sub.world_size))
        subdir = os.path.join(base, "sub")
        out["sub"] = dist.collect_results(sub_part, 5, tmpdir=subdir, group=sub.group)
        sub.barrier()
        out["sub left"] = os.path.exists(subdir)
    return out


def test_collect_results(world, tmp_path):
    kept = tmp_path / "kept"
    kept.mkdir()
    (kept / "user.txt").write_text("mine")
    n = world.size
    members = _members(n)
    for r, got in enumerate(world.run(_on_collect, str(tmp_path))):
        expect = list(range(7)) if r == 0 else None
        assert got["kw"] == got["gpu"] == got["fresh"] == got["kept"] == expect
        assert got["fresh left"] is False  # a given tmpdir left empty is removed
        assert got["kept left"] == ["user.txt"]  # user files (and their directory) stay
        # as mmengine: the device only picks the object path; a warning names what is missing
        for device, missing in (("npu", "torch_npu is not installed"), ("cuda", nccl_reason())):
            collected, warned = got[device]
            assert collected == expect
            assert len(warned) == 1 and missing in warned[0] and "'gloo' backend" in warned[0]
        assert got["xpu"].startswith("ValueError: device must be one of 'cpu', 'gpu', 'cuda'")
        if r in members:
            assert got["sub"] == (list(range(5)) if r == members[0] else None)
            assert got["sub left"] is False
    assert (kept / "user.txt").read_text() == "mine"


def test_collect_results_arguments():
    with pytest.raises(ValueError, match="tmpdir is only used with device='cpu'"):
        dist.collect_results([1], 1, device="gpu", tmpdir="somewhere")
    with pytest.raises(TypeError, match="device must be a str"):
        dist.collect_results([1], 1, device=torch.device("cpu"))
    with pytest.warns(RuntimeWarning, match="mlu.*collecting through the group's 'single'"):
        assert dist.collect_results([1, 2], 1, device="mlu") == [1]  # a world of one too
    assert dist.collect_results(results=[3, 4, 5], size=2, device="gpu") == [3, 4]


# -- device helpers -----------------------------------------------------------------------------
def test_get_data_device():
    cpu, meta = torch.zeros(1), torch.zeros(1, device="meta")
    assert dist.get_data_device(cpu) == torch.device("cpu")
    assert dist.get_data_device({"a": [cpu, cpu], "b": (cpu,)}) == torch.device("cpu")
    assert dist.get_data_device([meta]) == torch.device("meta")
    with pytest.raises(ValueError, match="consistent"):
        dist.get_data_device([cpu, {"x": meta}])
    with pytest.raises(ValueError, match="empty"):
        dist.get_data_device([])
    with pytest.raises(TypeError, match="Tensor"):
        dist.get_data_device("cpu")
    with pytest.raises(TypeError):
        dist.get_data_device([cpu, 3])


def test_cast_data_device():
    cpu = torch.arange(3)
    assert dist.cast_data_device(cpu, torch.device("cpu")) is cpu  # already there: not copied
    assert dist.cast_data_device(cpu, "cpu") is cpu
    moved = dist.cast_data_device(cpu, "meta")
    assert moved.device.type == "meta" and moved.shape == cpu.shape
    Pair = namedtuple("Pair", "a b")
    data = {
        "list": [cpu, cpu],
        "tuple": (cpu,),
        "ordered": OrderedDict(x=cpu),
        "default": defaultdict(list, y=cpu),
        "pair": Pair(cpu, cpu),
    }
    got = dist.cast_data_device(data, "meta")
    assert type(got) is dict and type(got["tuple"]) is tuple and type(got["pair"]) is Pair
    assert type(got["ordered"]) is OrderedDict and type(got["default"]) is defaultdict
    assert got["default"].default_factory is list
    assert dist.get_data_device(got) == torch.device("meta")
    out = {"a": torch.zeros(3), "b": [torch.zeros(2)]}
    result = dist.cast_data_device({"a": cpu + 1, "b": [torch.ones(2)]}, "cpu", out=out)
    assert out["a"].tolist() == [1, 2, 3] and out["b"][0].tolist() == [1.0, 1.0]
    assert result["a"].tolist() == [1, 2, 3]
    with pytest.raises(TypeError, match="out should be of data's type"):
        dist.cast_data_device([cpu], "cpu", out=(cpu,))
    with pytest.raises(TypeError, match="set"):
        dist.cast_data_device({cpu}, "cpu", out={cpu})
    with pytest.raises(ValueError, match="length"):
        dist.cast_data_device({"a": cpu}, "cpu", out={"a": cpu, "b": cpu})
    with pytest.raises(ValueError, match="empty"):
        dist.cast_data_device({}, "cpu")
    with pytest.raises(TypeError, match="Tensor"):
        dist.cast_data_device("text", "cpu")


@pytest.mark.parametrize(
    ("device", "reason"),
    [
        ("cuda", f"nccl: {nccl_reason()}"),
        ("cuda:1", f"nccl: {nccl_reason()}"),
        (torch.device("cuda", 0), f"nccl: {nccl_reason()}"),
        ("npu", "hccl: torch_npu is not installed"),
        ("mlu", "cncl: torch_mlu is not installed"),
        ("gpu", "none is available here"),
    ],
)
def test_an_accelerator_that_is_not_here_is_a_clear_error(device, reason):
    with pytest.raises(BackendUnavailableError, match=reason):
        dist.cast_data_device(torch.ones(1), device)


def test_device_names_that_are_not_devices():
    with pytest.raises(ValueError, match="not a device: 'warp'"):
        dist.cast_data_device(torch.ones(1), "warp")
    with pytest.raises(ValueError, match="takes no index"):
        resolve_device("gpu:0")
    with pytest.raises(TypeError, match=r"str or torch\.device"):
        resolve_device(3)
    assert dist.get_comm_device() == torch.device("cpu")


def _on_simulated_npu(comm):
    r = comm.rank
    return (
        dist.collect_results([r], comm.world_size, device="npu"),
        dist.collect_results([r], comm.world_size, device="gpu"),
        resolve_device("npu") == resolve_device("gpu", comm.plugin) == dist.get_comm_device(),
        dist.cast_data_device([torch.ones(1)], "npu")[0].device == dist.get_comm_device(),
        dist.cast_data_device(torch.ones(1), "gpu").device == dist.get_comm_device(),
    )


@pytest.mark.timeout(120)
def test_npu_resolves_through_the_hccl_plugin():
    # a simulated Ascend NPU: the hccl plugin serves "npu", so it is accepted and used
    setup = simulated.setup("hccl", devices=2)
    with World(2, backend="hccl", setup=setup, timeout=60) as sim:
        got = sim.run(_on_simulated_npu)
    assert got == [([0, 1], [0, 1], True, True, True), (None, None, True, True, True)]


# -- the local group ------------------------------------------------------------------------
def _on_local_group(comm, per_node):
    r, n = comm.rank, comm.world_size
    node = r // per_node
    members = list(range(node * per_node, min((node + 1) * per_node, n)))
    try:
        before = _error(dist.get_local_group) or "no error"
        dist.init_local_group(node, per_node)
        pg = dist.get_local_group()
        x = torch.tensor([float(r)])
        dist.all_reduce(x, group=pg)
        y = torch.tensor([r])
        dist.broadcast(y, src=members[-1], group=pg)  # a torch group: world ranks
        try:
            dist.init_local_group(node, per_node)
            again = None
        except RuntimeError as exc:
            again = str(exc)
        return (
            before,
            isinstance(pg, torch_dist.ProcessGroup),
            dist.get_local_rank(),
            dist.get_local_size(),
            x.item(),
            y.item(),
            again,
        )
    finally:
        _world.world.forget_local_group()  # these ranks serve other tests: leave no trace


def _on_local_group_disagreement(comm):
    try:
        dist.init_local_group(node_rank=1, num_gpus_per_node=comm.world_size)
    except ValueError as exc:
        return str(exc)
    return None


def test_local_group(world):
    n = world.size
    per_node = 2
    for r, got in enumerate(world.run(_on_local_group, per_node)):
        node = list(range(r // per_node * per_node, min((r // per_node + 1) * per_node, n)))
        before, is_pg, local_rank, local_size, total, last, again = got
        assert "call init_local_group(node_rank, num_gpus_per_node) first" in before
        assert is_pg and (local_rank, local_size) == (node.index(r), len(node))
        assert (total, last) == (float(sum(node)), node[-1])
        assert again == "init_local_group was already called in this world"
    # every rank raises the same error, before any group is made
    errors = world.run(_on_local_group_disagreement)
    assert len(set(errors)) == 1 and "rank 0: node_rank=1" in errors[0]
    # nothing was left behind: the launcher's LOCAL_RANK answers again
    assert world.run(_local_identity) == [(r, n) for r in range(n)]


def _local_identity(comm):
    return dist.get_local_rank(), dist.get_local_size()


def _local_unknown(comm):
    saved = {v: os.environ.pop(v, None) for v in ("LOCAL_RANK", "LOCAL_WORLD_SIZE")}
    try:  # as under mp.spawn: nothing says how many ranks share the machine
        return [_error(dist.get_local_rank), _error(dist.get_local_size)]
    finally:
        os.environ.update({k: v for k, v in saved.items() if v is not None})


def test_local_rank_and_size_are_not_guessed(world2):
    # mmengine raises too; a guess (1 rank per machine) would be silently wrong
    for errors in world2.run(_local_unknown):
        assert "LOCAL_RANK is not set" in errors[0] and "init_local_group" in errors[0]
        assert "LOCAL_WORLD_SIZE is not set" in errors[1]


def test_local_group_not_distributed():
    dist.init_local_group(0, 8)  # a world of one: only the arguments are checked
    assert dist.get_local_group() is None
    assert (dist.get_local_rank(), dist.get_local_size()) == (0, 1)
    with pytest.raises(TypeError, match="node_rank must be an int"):
        dist.init_local_group("0", 8)
    with pytest.raises(ValueError, match="num_gpus_per_node must be at least 1"):
        dist.init_local_group(0, 0)


# -- launchers ------------------------------------------------------------------------------
_LAUNCHER_VARS = ("WORLD_SIZE", "SLURM_NTASKS", "OMPI_COMM_WORLD_LOCAL_RANK")


@pytest.mark.parametrize(
    ("env", "expect"),
    [
        ({}, "none"),
        ({"WORLD_SIZE": "2"}, "pytorch"),
        ({"SLURM_NTASKS": "4"}, "slurm"),
        ({"OMPI_COMM_WORLD_LOCAL_RANK": "0"}, "mpi"),
        ({"WORLD_SIZE": "2", "SLURM_NTASKS": "4"}, "pytorch"),
    ],
)
def test_infer_launcher(monkeypatch, env, expect):
    for name in _LAUNCHER_VARS:
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert dist.infer_launcher() == expect


def test_init_dist_takes_mmengine_init_backend():
    with pytest.raises(ValueError, match="init_backend='deepspeed' is not supported"):
        dist.init_dist("pytorch", init_backend="deepspeed")


@pytest.fixture
def fresh_warning(fresh_commlib_state, monkeypatch):
    """A process that has not warned yet, with no launcher variables."""
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    return monkeypatch


def test_a_launcher_without_init_dist_warns_once(fresh_warning):
    fresh_warning.setenv("WORLD_SIZE", "4")
    assert dist.get_rank() == 0  # asking who one is stays quiet
    with pytest.warns(UserWarning, match=r"WORLD_SIZE=4.*init_dist") as caught:
        dist.all_reduce(torch.ones(1))
    assert caught[0].filename == __file__  # it points at the caller's line
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        dist.all_gather_object(1)
        dist.barrier()


def test_a_communicator_under_a_launcher_without_init_dist_warns(fresh_warning):
    fresh_warning.setenv("WORLD_SIZE", "2")
    comm = dist.Communicator()
    assert (comm.rank, comm.world_size) == (0, 1)  # made and asked: quiet
    with pytest.warns(UserWarning, match=r"WORLD_SIZE=2.*init_dist") as caught:
        comm.all_reduce(torch.ones(1))
    assert caught[0].filename == __file__


@pytest.mark.parametrize("world_size", [None, "1", "junk"])
def test_single_process_use_stays_silent(fresh_warning, world_size):
    if world_size is not None:
        fresh_warning.setenv("WORLD_SIZE", world_size)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        dist.all_reduce(torch.ones(1))
        dist.collect_results([1], 1)
        dist.Communicator().broadcast(torch.ones(1))


def _on_warnings(comm):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dist.all_reduce(torch.ones(1))
        dist.all_gather_object(comm.rank)
    return [str(w.message) for w in caught if "init_dist" in str(w.message)]


def test_initialised_ranks_do_not_warn(world):
    # the harness's ranks have WORLD_SIZE set and torch.distributed up
    assert world.run(_on_warnings) == [[] for _ in range(world.size)]
