"""Nested structures and Python values in all_reduce, broadcast, all_gather, all_gather_cat.

Unit tests run on the ``single`` backend; the rest on the session's gloo
worlds (1 to 4 ranks, started once), comparing with what each rank computes
locally.
"""

from __future__ import annotations

import collections

import pytest
import torch

import commlib as dist
from commlib import Communicator
from commlib.errors import RemoteArgumentError

Box = collections.namedtuple("Box", "xy score")


def _state(r: int) -> dict:
    """A rank's evaluation state: every container kind, two dtypes, numbers."""
    return {
        "logits": torch.full((2, 3), float(r)),
        "counts": [torch.tensor([r, 1]), (torch.tensor(r * 2), 5)],
        "box": Box(torch.ones(2) * r, 0.5 * r),
        "n": r + 1,
    }


def _on_reduce_and_broadcast(comm):
    r, n = comm.rank, comm.world_size
    state = _state(r)
    logits = state["logits"]
    out = comm.all_reduce(state, "sum")
    # tensors in place, the structure returned with its numbers reduced
    in_place = out["logits"] is logits and torch.equal(logits, state["logits"])
    mean = dist.all_reduce({"a": torch.tensor([1.0 * r]), "i": r}, op="mean")
    values = (
        comm.all_reduce(r + 1),
        comm.all_reduce(0.5 * r, "max"),
        dist.all_reduce(r, op="mean"),
        comm.all_reduce(r == 0, "band"),
    )
    src = n - 1
    mine = {"w": [torch.full((3,), float(r))], "step": 10 * r, "name": f"rank{r}"}
    got = comm.broadcast(mine, src)
    broadcast = (got["w"][0].tolist(), mine["w"][0].tolist(), got["step"], got["name"])
    plain = (
        comm.broadcast("hello" if r == src else None, src),
        dist.broadcast(3.5 if r == 0 else None),
    )
    return {
        "sum": {
            "logits": out["logits"].tolist(),
            "counts0": out["counts"][0].tolist(),
            "counts1": (out["counts"][1][0].item(), out["counts"][1][1]),
            "box": (type(out["box"]).__name__, out["box"].xy.tolist(), out["box"].score),
            "n": out["n"],
        },
        "in_place": in_place,
        "mean": (mean["a"].tolist(), mean["i"]),
        "values": values,
        "broadcast": broadcast,
        "plain": plain,
    }


def test_reduce_and_broadcast_structures_and_values(world):
    n = world.size
    ranks = range(n)
    results = world.run(_on_reduce_and_broadcast)
    expect_sum = {
        "logits": [[float(sum(ranks))] * 3] * 2,
        "counts0": [sum(ranks), n],
        "counts1": (2 * sum(ranks), 5 * n),
        "box": ("Box", [float(sum(ranks))] * 2, sum(0.5 * r for r in ranks)),
        "n": sum(r + 1 for r in ranks),
    }
    for r, got in enumerate(results):
        assert got["sum"] == expect_sum
        assert got["in_place"]
        assert got["mean"] == ([sum(ranks) / n], sum(ranks) / n)
        assert got["values"] == (sum(r + 1 for r in ranks), 0.5 * (n - 1), sum(ranks) / n, n == 1)
        assert type(got["values"][0]) is int and type(got["values"][3]) is bool
        src = n - 1
        assert got["broadcast"] == ([float(src)] * 3, [float(src)] * 3, 10 * src, f"rank{src}")
        assert got["plain"] == ("hello", 3.5)


def _on_gather(comm):
    r = comm.rank
    # uneven predictions: rank r holds r + 1 rows, the last batch shorter
    batch = {
        "pred": torch.arange(r + 1),
        "scores": torch.full((r + 1, 2), float(r)),
        "meta": [f"img{r}", Box(torch.tensor([r]), r)],
    }
    every = comm.all_gather(batch)
    shaped = [
        (
            b["pred"].tolist(),
            b["scores"].shape[0],
            b["meta"][0],
            type(b["meta"][1]).__name__,
            b["meta"][1].xy.tolist(),
        )
        for b in every
    ]
    joined = dist.all_gather_cat({"pred": batch["pred"], "scores": batch["scores"]})
    along1 = comm.all_gather_cat([torch.ones(2, r + 1) * r], dim=-1)
    return {
        "every": shaped,
        "own_is_own": every[r]["pred"] is batch["pred"],
        "joined": (joined["pred"].tolist(), joined["scores"].tolist()),
        "along1": along1[0].tolist(),
        "values": (comm.all_gather(r * 1.5), dist.all_gather(f"s{r}")),
    }


def test_gather_structures_uneven_and_values(world):
    n = world.size
    ranks = range(n)
    preds = [list(range(r + 1)) for r in ranks]
    for got in world.run(_on_gather):
        assert got["every"] == [(preds[q], q + 1, f"img{q}", "Box", [q]) for q in ranks]
        assert got["own_is_own"]
        cat_scores = torch.cat([torch.full((q + 1, 2), float(q)) for q in ranks]).tolist()
        assert got["joined"] == ([i for q in ranks for i in preds[q]], cat_scores)
        assert got["along1"] == torch.cat([torch.ones(2, q + 1) * q for q in ranks], 1).tolist()
        assert got["values"] == ([q * 1.5 for q in ranks], [f"s{q}" for q in ranks])


def _caught(fn):
    try:
        fn()
    except RemoteArgumentError as exc:
        return ("remote", exc.refused, str(exc))
    except (ValueError, TypeError) as exc:
        return (type(exc).__name__, False, str(exc))
    return None


def _on_mismatches(comm):
    r = comm.rank
    rows = 3 if r == 1 else 4
    cases = {
        "shape": lambda: comm.all_reduce({"logits": torch.zeros(rows, 10)}),
        "missing key": lambda: comm.all_reduce(
            {"a": torch.zeros(1), **({"b": torch.zeros(1)} if r == 1 else {})}
        ),
        "dtype": lambda: comm.all_reduce(
            {"x": [torch.zeros(2, dtype=torch.int64 if r == 1 else torch.float32)]}
        ),
        "number kind": lambda: comm.all_reduce({"n": 1.0 if r == 1 else 1}),
        "refused leaf": lambda: comm.all_reduce({"s": "text" if r == 1 else 1}),
        "broadcast shape": lambda: comm.broadcast(Box(torch.zeros(rows), 1)),
        "gather dims": lambda: comm.all_gather(
            {"x": torch.zeros(2, 2) if r == 1 else torch.zeros(2)}
        ),
        "cat trailing": lambda: comm.all_gather_cat({"y": torch.zeros(2, rows)}),
        "cat refused": lambda: comm.all_gather_cat(
            {"y": torch.zeros(()) if r == 1 else torch.zeros(2)}
        ),
        "async": lambda: comm.all_reduce({"a": torch.zeros(1)}, async_op=r == 1),
        "tensor or structure": lambda: comm.all_reduce(
            torch.zeros(1) if r == 1 else {"a": torch.zeros(1)}
        ),
    }
    out = {name: _caught(fn) for name, fn in cases.items()}
    # the communicator keeps working after every one of them
    out["after"] = comm.all_reduce({"k": torch.ones(1)})["k"].item()
    return out


def test_mismatches_raise_the_same_error_everywhere_naming_the_path(multi_world):
    n = multi_world.size
    results = multi_world.run(_on_mismatches)
    for name in results[0]:
        assert all(res[name] == results[0][name] for res in results), name
    got = results[0]
    others = "rank 0" if n == 2 else f"ranks {', '.join(str(q) for q in range(n) if q != 1)}"
    assert got["shape"][:2] == ("remote", False)
    assert f"['logits']: rank 1 (3, 10), {others} (4, 10)" in got["shape"][2]
    assert f"['b']: rank 1 (1,), {others} missing" in got["missing key"][2]
    assert "['x'][0]: rank 1 int64 (2,)" in got["dtype"][2]
    assert f"['n']: rank 1 float, {others} int" in got["number kind"][2]
    assert got["refused leaf"][:2] == ("remote", True) and "['s'] is str" in got["refused leaf"][2]
    assert f".xy: rank 1 (3,), {others} (4,)" in got["broadcast shape"][2]
    assert "['x']: rank 1 (2, 2)" in got["gather dims"][2]
    assert f"['y']: rank 1 (2, 3), {others} (2, 4)" in got["cat trailing"][2]
    assert got["cat refused"][:2] == ("remote", True)
    assert got["async"][:2] == ("remote", True) and "async_op" in got["async"][2]
    # a structure is shown by its leaves, not in the check's own encoding
    mixed = got["tensor or structure"][2]
    assert "all_reduce of a structure: ['a'] torch.float32 (1,)" in mixed, mixed
    assert '["dict' not in mixed and "rank 1: all_reduce(op=sum, torch.float32, (1,))" in mixed
    assert got["after"] == n


def _on_broadcast_of_none(comm):
    """src holds tensors, the others pass None: src's value; a plain tensor: one clear error."""
    r, src = comm.rank, comm.world_size - 1
    state = {
        "w": torch.arange(3.0) * (r + 1),
        "step": 7,
        "buf": [torch.ones(2, dtype=torch.int64)],
    }
    got = comm.broadcast(state if r == src else None, src)
    # a rank passing its own tensors gets them written in place, the others src's
    mine = {"w": torch.zeros(3), "step": None, "buf": [torch.zeros(2, dtype=torch.int64)]}
    written = comm.broadcast(state if r == src else mine, src)
    out = {
        "structure": (got["w"].tolist(), got["step"], got["buf"][0].tolist()),
        "in place": (
            written["w"].tolist(),
            written["step"],
            r == src
            or (written["w"] is mine["w"] and mine["w"].tolist() == written["w"].tolist()),
        ),
        "plain tensor": _caught(lambda: comm.broadcast(torch.ones(2) if r == src else None, src)),
        "plain value": comm.broadcast(4.5 if r == src else None, src),
    }
    out["after"] = comm.all_reduce({"k": torch.ones(1)})["k"].item()
    return out


def test_broadcast_of_tensors_where_the_others_pass_none(multi_world):
    n = multi_world.size
    results = multi_world.run(_on_broadcast_of_none)
    src_w = [float(i * n) for i in range(3)]
    for got in results:
        assert got["structure"] == (src_w, 7, [1, 1])
        assert got["in place"] == (src_w, 7, True)
        assert got["plain value"] == 4.5 and got["after"] == n
        # the same readable error on every rank, naming the argument and what to use
        assert got["plain tensor"] == results[0]["plain tensor"]
        kind, _, text = got["plain tensor"]
        assert kind == "remote" and "another collective" not in text, text
        assert f"rank {n - 1} (src) passes a tensor" in text and "no tensor" in text
        assert "broadcast_object" in text and "`tensor`" in text


def test_single_process_structures():
    comm = Communicator()
    x = torch.ones(2)
    state = {"x": x, "n": [1, 2.5], "t": (True,)}
    out = comm.all_reduce(state, "max")
    assert out == {"x": x, "n": [1, 2.5], "t": (True,)} or out["x"] is x
    assert comm.all_gather_cat((torch.arange(3),))[0].tolist() == [0, 1, 2]
    assert comm.broadcast({"a": "b"}) == {"a": "b"}
    assert comm.all_gather(Box(x, 1))[0].xy is x
    with pytest.raises(TypeError, match="all_reduce reduces tensors and numbers"):
        comm.all_reduce("text")
    with pytest.raises(ValueError, match=r"\['p'\] has shape \(\)"):
        comm.all_gather_cat({"p": torch.zeros(())})
    with pytest.raises(TypeError, match="async_op=True takes a tensor"):
        comm.all_reduce({"a": x}, async_op=True)


def _on_uneven(comm):
    r, n = comm.rank, comm.world_size
    out = {}
    for rows in (2, 600):  # with the shapes' round, and past the slot
        got = comm.gather(torch.full((rows * (r + 1), 3), float(r)), dst=n - 1)
        out[f"gather{rows}"] = [(*t.shape, t.sum().item()) for t in got]
        sizes = [rows * (q + 1) for q in range(n)]
        chunks = [torch.arange(s, dtype=torch.float64) * (r + 1) for s in sizes]
        mine = torch.empty(sizes[r], dtype=torch.float64)
        comm.reduce_scatter(mine, chunks, "mean")
        out[f"rs{rows}"] = mine.tolist()
    out["dst"] = _caught(lambda: comm.gather(torch.ones(r + 1), dst=r % 2))
    out["ndim"] = _caught(lambda: comm.gather(torch.ones(2, 2) if r == 1 else torch.ones(2)))
    return out


def test_uneven_gather_and_reduce_scatter(world):
    n = world.size
    for r, got in enumerate(world.run(_on_uneven)):
        for rows in (2, 600):
            if r == n - 1:
                want = [(rows * (q + 1), 3, float(q * rows * (q + 1) * 3)) for q in range(n)]
                assert got[f"gather{rows}"] == want
            else:
                assert got[f"gather{rows}"] == []
            mean = sum(q + 1 for q in range(n)) / n
            assert got[f"rs{rows}"] == pytest.approx(
                (torch.arange(rows * (r + 1), dtype=torch.float64) * mean).tolist()
            )
        if n > 1:
            assert got["dst"][:2] == ("remote", False) and "dst=1" in got["dst"][2]
            assert got["ndim"][:2] == ("remote", False) and "ndim=2" in got["ndim"][2]
