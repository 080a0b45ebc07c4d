"""ignite's own checks of ``ignite.distributed``, re-expressed to return what they saw.

The checks are those of pytorch/ignite's ``tests/ignite/distributed/utils/__init__.py``
(v0.5.5: ``_test_distrib_all_reduce``, ``_all_reduce_group``, ``_all_gather``,
``_all_gather_group``, ``_idist_all_gather_tensors_with_shapes`` and its group
variant, ``_broadcast``, ``_barrier``, ``_group``, ``_one_rank_only`` and its
Engine variant, ``__get_max_length``, and ``_sanity_check``): each makes the
same calls and asserts the same results as ignite's, and also returns every
result it saw, with its type, dtype, shape and device, and every exception
as its type and whether it matched ignite's pattern. So the same check run
under ignite's native model and under commlib's, in the same ranks, can be
compared value for value.

Two things only a run of both models in one process group needs: ignite's
native model makes the torch group of a ``group=[...]`` all_reduce on the
members alone, so the other ranks make it too afterwards (it costs them
nothing: a non-member only counts it), keeping every rank's count of torch
groups in step for the groups made later; and ``new_group``'s result is a
torch ``ProcessGroup`` there (``g.rank()``) and a commlib ``Communicator``
here (``g.rank``).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import ignite.distributed as idist
import torch
import torch.distributed as dist
from ignite.distributed.utils import _rank_not_in_group, all_gather_tensors_with_shapes
from ignite.engine import Engine, Events


def seen(x: Any) -> Any:
    """``x`` as plain data that keeps what a comparison must see (types, dtypes, devices)."""
    if isinstance(x, torch.Tensor):
        return ("tensor", str(x.dtype), tuple(x.shape), x.device.type, x.tolist())
    if isinstance(x, dict):
        return ("dict", [(k, seen(v)) for k, v in x.items()])  # in order: ignite checks it
    if isinstance(x, (list, tuple)):
        return (type(x).__name__, [seen(v) for v in x])
    if isinstance(x, Path):
        return ("Path", str(x))
    return (type(x).__name__, x)


def raised(fn: Callable[[], Any], kind: type[BaseException], pattern: str) -> tuple[str, bool]:
    """Call ``fn``; assert it raises ``kind`` matching ``pattern`` (as pytest.raises)."""
    try:
        fn()
    except kind as exc:
        assert re.search(pattern, str(exc)), f"{exc!r} does not match {pattern!r}"
        return kind.__name__, True
    raise AssertionError(f"{fn} did not raise {kind.__name__}")


def _native() -> bool:
    return idist.model_name() == "native-dist"


def _group_rank(g: Any) -> int:
    return g.rank() if isinstance(g, dist.ProcessGroup) else g.rank


def check_all_reduce(device: torch.device) -> list:
    out = []
    ws, rank = idist.get_world_size(), idist.get_rank()
    res = idist.all_reduce(10)
    assert res == 10 * ws
    out.append(seen(res))

    res = idist.all_reduce(torch.tensor(10, device=device))
    assert res.item() == 10 * ws
    out.append(seen(res))

    res = idist.all_reduce(torch.tensor(rank * 2.0 + 1.0, device=device))
    assert res.item() == sum(i * 2.0 + 1.0 for i in range(ws))
    out.append(seen(res))

    res = idist.all_reduce(torch.tensor(rank * 2.0 + 1.0, device=device), "MIN")
    assert res.item() == min(i * 2 + 1 for i in range(ws))
    out.append(seen(res))

    res = idist.all_reduce(torch.tensor(rank * 2.0 + 1.0, device=device), "MAX")
    assert res.item() == max(i * 2.0 + 1.0 for i in range(ws))
    out.append(seen(res))

    res = idist.all_reduce(torch.ones(4, 4, device=device) * (rank * 2.0 + 1.0), "MAX")
    assert res.equal(torch.ones(4, 4, device=device) * ((ws - 1) * 2.0 + 1.0))
    out.append(seen(res))

    res = idist.all_reduce(torch.tensor(rank * 2.0 + 1.0, device=device), "PRODUCT")
    true_val = 1.0
    for v in [i * 2.0 + 1.0 for i in range(ws)]:
        true_val *= v
    assert res.item() == true_val
    out.append(seen(res))

    if ws > 1:
        out.append(raised(lambda: idist.all_reduce("abc"), TypeError, r"Unhandled input type"))
        out.append(
            raised(
                lambda: idist.all_reduce(10, op="ABC"),
                ValueError,
                r"Unsupported reduction operation",
            )
        )
        t = torch.tensor([0, 1, 2])
        res = idist.all_reduce(t)
        assert res.device == t.device
        out.append(seen(res))
    return out


def check_all_reduce_group(device: torch.device) -> list:
    out = []
    ws, rank = idist.get_world_size(), idist.get_rank()
    ranks = sorted(range(ws - 1, 0, -1))
    t = torch.tensor([rank], device=device)
    group = idist.new_group(ranks)
    if rank in ranks:
        res = idist.all_reduce(t, group=group)
        assert res == torch.tensor([sum(ranks)], device=device)
        out.append(seen(res))

    t = torch.tensor([rank], device=device)
    if rank in ranks:
        res = idist.all_reduce(t, group=ranks)
        assert res == torch.tensor([sum(ranks)], device=device)
        out.append(seen(res))
    elif _native():
        dist.new_group(ranks)  # as the members just did (see the module's docstring)

    if idist.backend() in ("nccl", "gloo", "mpi"):
        out.append(
            raised(
                lambda: idist.all_reduce(t, group="abc"),
                ValueError,
                r"Argument group should be list of int or ProcessGroup",
            )
        )
    return out


def _expected_dict(i: int, device: torch.device) -> dict:
    return {
        "a": [i + 1, i + 2, torch.tensor(i + 3, device=device)],
        "b": torch.tensor([[i + 1, i + 2, i + 3]], device=device),
        "c": {"abcd": i, "cdfg": torch.tensor(i, dtype=torch.uint8, device=device)},
    }


def _check_gathered_dicts(res: Any, ranks: list[int], device: torch.device) -> None:
    assert isinstance(res, list) and len(res) == len(ranks)
    for i, obj in zip(ranks, res):
        assert isinstance(obj, dict)
        assert list(obj.keys()) == ["a", "b", "c"], obj
        expected = _expected_dict(i, device)
        assert obj["a"] == expected["a"]
        assert (obj["b"] == expected["b"]).all()
        assert obj["c"] == expected["c"]


def check_all_gather(device: torch.device) -> list:
    out = []
    ws, rank = idist.get_world_size(), idist.get_rank()
    res = idist.all_gather(10)
    assert (torch.tensor(res, device=device) == torch.tensor([10] * ws, device=device)).all()
    out.append(seen(res))

    res = idist.all_gather(torch.tensor(rank, device=device))
    assert (res == torch.tensor(list(range(ws)), device=device)).all()
    out.append(seen(res))

    res = idist.all_gather("abc" if rank == 0 else "test-test")
    assert res == ["abc"] + ["test-test"] * (ws - 1)
    out.append(seen(res))

    base_x = "tests/ignite/distributed/utils/test_native.py" * 2000
    res = idist.all_gather("abc" if rank == 0 else base_x)
    assert res == ["abc"] + [base_x] * (ws - 1)
    out.append(("long strings", [len(s) for s in res]))

    t = torch.arange(100, device=device).reshape(4, 25) * (rank + 1)
    res = idist.all_gather(t)
    assert res.shape == (ws * 4, 25) and res.dtype == t.dtype
    true_res = torch.zeros(ws * 4, 25, device=device)
    for i in range(ws):
        true_res[i * 4 : (i + 1) * 4, ...] = torch.arange(100, device=device).reshape(4, 25) * (
            i + 1
        )
    assert (res == true_res).all()
    out.append(seen(res))

    if ws > 1:
        res = idist.all_gather(_expected_dict(rank, device))
        _check_gathered_dicts(res, list(range(ws)), device)
        out.append(seen(res))
    return out


def check_all_gather_group(device: torch.device) -> list:
    out = []
    ws, rank = idist.get_world_size(), idist.get_rank()
    ranks = sorted(range(ws - 1, 0, -1))

    t = torch.tensor([rank], device=device)
    group = idist.new_group(ranks)
    res = idist.all_gather(t, group=group)
    if rank in ranks:
        assert torch.equal(res, torch.tensor(ranks, device=device))
    else:
        assert res == t  # a non-member gets its own input
    out.append(seen(res))

    res = idist.all_gather(t, group=ranks)
    if rank in ranks:
        assert torch.equal(res, torch.tensor(ranks, device=device))
    else:
        assert res == t
    out.append(seen(res))

    t = _expected_dict(rank, device)
    res = idist.all_gather(t, group=ranks)
    if rank in ranks:
        _check_gathered_dicts(res, ranks, device)
    else:
        assert res == t
    out.append(seen(res))

    t = torch.tensor([rank], device=device)
    out.append(
        raised(
            lambda: idist.all_gather(t, group="abc"),
            ValueError,
            r"Argument group should be list of int",
        )
    )
    return out


def _piece(reference: torch.Tensor, r: int) -> torch.Tensor:
    return reference[
        r * (r + 1) // 2 : r * (r + 1) // 2 + r + 1,
        r * (r + 3) // 2 : r * (r + 3) // 2 + r + 2,
        r * (r + 5) // 2 : r * (r + 5) // 2 + r + 3,
    ]


def check_all_gather_tensors_with_shapes(device: torch.device) -> list:
    torch.manual_seed(41)
    ws, rank = idist.get_world_size(), idist.get_rank()
    reference = torch.randn(ws * 5, ws * 5, ws * 5, device=device)
    tensors = all_gather_tensors_with_shapes(
        _piece(reference, rank), [[r + 1, r + 2, r + 3] for r in range(ws)]
    )
    for r in range(ws):
        assert _piece(reference, r).allclose(tensors[r])
    return [seen(t) for t in tensors]


def check_all_gather_tensors_with_shapes_group(device: torch.device) -> list:
    torch.manual_seed(41)
    ws, rank = idist.get_world_size(), idist.get_rank()
    ranks = sorted(range(ws - 1, 0, -1))
    if rank in ranks:
        reference = torch.randn(ws * 5, ws * 5, ws * 5, device=device)
        rank_tensor = _piece(reference, rank)
    else:
        rank_tensor = torch.tensor([rank], device=device)
    tensors = all_gather_tensors_with_shapes(
        rank_tensor, [[r + 1, r + 2, r + 3] for r in ranks], ranks
    )
    if rank in ranks:
        for i, r in enumerate(ranks):
            assert _piece(reference, r).allclose(tensors[i])
    else:
        assert [rank_tensor] == tensors
    return [seen(t) for t in tensors]


def check_broadcast(device: torch.device) -> list:
    out = []
    ws, rank = idist.get_world_size(), idist.get_rank()

    def _test(data_src: Any, data_others: Any, safe_mode: bool) -> None:
        for src in range(ws):
            data = data_src if rank == src else data_others
            res = idist.broadcast(data, src=src, safe_mode=safe_mode)
            if isinstance(res, torch.Tensor):
                assert (res == data_src).all(), f"{res} vs {data_src}"
                assert data_src.dtype == res.dtype
            else:
                assert res == data_src, f"{res} vs {data_src}"
            out.append(seen(res))

    _test(10, 0, safe_mode=False)
    _test(10, None, safe_mode=True)

    t = torch.tensor([1.2345, 2.3456], dtype=torch.float, device=device)
    _test(t, torch.empty_like(t), safe_mode=False)
    _test(t, None, safe_mode=True)
    _test(t, "abc", safe_mode=True)

    _test("test-abcdefg", "", safe_mode=False)
    _test("test-abcdefg", None, safe_mode=True)
    _test("test-abcdefg", 1.2, safe_mode=True)

    path = Path("tests/ignite/distributed/utils/test_horovod.py")
    _test(path, Path(""), safe_mode=False)
    _test(path, None, safe_mode=True)
    _test(path, "", safe_mode=True)

    s = "tests/ignite/distributed/utils/test_horovod.py::test_idist_broadcast_hvd" * 200
    _test(s, "", safe_mode=False)
    _test(s, None, safe_mode=True)
    _test(s, 123.0, safe_mode=True)

    t = torch.arange(100, device=device).reshape(4, 25) * 2
    _test(t, torch.empty_like(t), safe_mode=False)
    _test(t, None, safe_mode=True)
    _test(t, "None", safe_mode=True)

    t = torch.tensor(12)
    _test(t, torch.empty_like(t), safe_mode=False)
    _test(t, None, safe_mode=True)
    _test(t, 123.4, safe_mode=True)

    if ws > 1:
        out.append(
            raised(lambda: idist.broadcast([0, 1, 2], src=0), TypeError, r"Unhandled input type")
        )
        msg = "Source data can not be None" if rank == 0 else "Argument safe_mode should be True"
        out.append(raised(lambda: idist.broadcast(None, src=0), ValueError, msg))
    return out


def check_barrier(device: torch.device) -> list:
    t = torch.tensor([idist.get_rank()], device=device, dtype=torch.float)
    true_res = sum(range(idist.get_world_size()))
    if idist.get_rank() == 0:
        t += 10.0
    idist.barrier()
    tt = idist.all_reduce(t)
    assert tt.item() == true_res + 10.0
    return [seen(tt)]


def check_new_group(device: torch.device) -> list:
    out: list = []
    ws, rank = idist.get_world_size(), idist.get_rank()
    ranks = sorted(range(ws - 1, 0, -1))
    if ws > 1:
        g = idist.new_group(ranks)
        if rank in ranks:
            global_to_group = {r: i for i, r in enumerate(ranks)}
            assert _group_rank(g) == global_to_group[rank]
            out.append(_group_rank(g))
        assert _rank_not_in_group(g) == (rank not in ranks)
        out.append(_rank_not_in_group(g))
    out.append(
        raised(lambda: idist.new_group(["a", "b", "c"]), ValueError, "should be list of int")
    )
    out.append(raised(lambda: idist.new_group(1), ValueError, "should be list of int"))
    return out


def check_one_rank_only(device: torch.device) -> list:
    out = []
    for barrier in (True, False):
        last = idist.get_world_size() - 1
        value = torch.tensor(0).to(device)

        @idist.one_rank_only(rank=last, with_barrier=barrier)
        def initialize(value: torch.Tensor = value) -> None:
            value.add_(torch.tensor(100).to(device))

        initialize()
        value_list = idist.all_gather(tensor=value)
        for r in range(idist.get_world_size()):
            assert value_list[r].item() == (100 if r == last else 0)
        out.append(seen(value_list))
    return out


def check_one_rank_only_with_engine(device: torch.device) -> list:
    out = []
    for barrier in (True, False):
        engine = Engine(lambda e, b: b)
        batch_sum = torch.tensor(0).to(device)

        @engine.on(Events.ITERATION_COMPLETED)
        @idist.one_rank_only(with_barrier=barrier)
        def _(_: Engine, engine: Engine = engine, batch_sum: torch.Tensor = batch_sum) -> None:
            batch_sum.data += torch.tensor(engine.state.batch).to(device)

        engine.run([1, 2, 3], max_epochs=2)
        value_list = idist.all_gather(tensor=batch_sum)
        for r in range(idist.get_world_size()):
            assert value_list[r].item() == (12 if r == 0 else 0)
        out.append(seen(value_list))
    return out


def check_get_max_length(device: torch.device) -> list:
    from ignite.distributed.utils import _model

    x = "_test_distrib__get_max_length" * (idist.get_rank() + 2)
    res = _model._get_max_length(x, device)
    assert res == len("_test_distrib__get_max_length" * (idist.get_world_size() + 1))
    return [seen(res)]


def check_config(device: torch.device) -> list:
    from ignite.distributed.utils import _model

    assert _model.get_world_size() == _model.get_nnodes() * _model.get_nproc_per_node()
    assert _model.get_local_rank() < _model.get_nproc_per_node()
    assert _model.get_rank() < _model.get_world_size()
    assert _model.get_node_rank() < _model.get_nnodes()
    return [
        idist.get_rank(),
        idist.get_world_size(),
        idist.get_local_rank(),
        idist.get_nproc_per_node(),
        idist.get_nnodes(),
        idist.get_node_rank(),
        idist.device().type,
    ]


#: every check, and whether it needs more than one rank (as ignite runs them)
CHECKS: dict[str, tuple[Callable[[torch.device], list], bool]] = {
    "all_reduce": (check_all_reduce, False),
    "all_reduce_group": (check_all_reduce_group, True),
    "all_gather": (check_all_gather, False),
    "all_gather_group": (check_all_gather_group, True),
    "all_gather_tensors_with_shapes": (check_all_gather_tensors_with_shapes, False),
    "all_gather_tensors_with_shapes_group": (check_all_gather_tensors_with_shapes_group, True),
    "broadcast": (check_broadcast, False),
    "barrier": (check_barrier, False),
    "new_group": (check_new_group, False),
    "one_rank_only": (check_one_rank_only, False),
    "one_rank_only_with_engine": (check_one_rank_only_with_engine, False),
    "get_max_length": (check_get_max_length, False),
    "config": (check_config, False),
}


#: the checks that call ``idist.barrier()``
BARRIER_CHECKS = ("barrier", "one_rank_only", "one_rank_only_with_engine")


def run_checks(skip: tuple[str, ...] = ()) -> dict[str, list]:
    """Every check that applies to this world size, under idist's current model."""
    device = idist.device()
    ws = idist.get_world_size()
    return {
        name: check(device)
        for name, (check, multi) in CHECKS.items()
        if (ws > 1 or not multi) and name not in skip
    }
