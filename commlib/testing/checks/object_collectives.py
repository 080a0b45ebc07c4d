"""Object collectives and serialization round trips."""

from __future__ import annotations

import pickle
from typing import Any

import torch

from commlib.testing.checks import check, expect
from commlib.testing.samples import deep_equal, drawn_objects, fixed_objects


def _arrived(received: Any, sent: Any) -> bool:
    """``received`` is ``sent``, or at least what plain pickle would have made of it."""
    if deep_equal(received, sent):
        return True
    try:  # numpy's pickle drops some details (byte order of empty arrays)
        return deep_equal(received, pickle.loads(pickle.dumps(sent)))
    except Exception:
        return False


def _mine(rank: int) -> dict:
    # rank-dependent size: some ranks fit the first round, others do not
    return {
        "rank": rank,
        "payload": bytes([rank]) * (1000 * 40 ** min(rank, 2)),
        "t": torch.arange(rank + 1),
    }


@check("all_gather_object")
def _all_gather_object(comm: Any, ctx: dict) -> None:
    """all_gather_object: every rank's object, by rank, small and large."""
    n = comm.world_size
    got = comm.all_gather_object(_mine(comm.rank))
    expect(isinstance(got, list) and len(got) == n, f"returned {type(got).__name__}")
    for r in range(n):
        expect(deep_equal(got[r], _mine(r)), f"object of rank {r} arrived changed")
    expect(comm.all_gather_object(None) == [None] * n, "all_gather_object(None)")


@check("gather_object")
def _gather_object(comm: Any, ctx: dict) -> None:
    """gather_object to every dst in turn: dst gets the list, the others None."""
    n = comm.world_size
    for dst in range(n):
        got = comm.gather_object(_mine(comm.rank), dst=dst)
        if comm.rank != dst:
            expect(got is None, f"gather_object on a non-dst rank returned {type(got).__name__}")
            continue
        expect(isinstance(got, list) and len(got) == n, f"gather_object returned {got!r:.80}")
        for r in range(n):
            expect(deep_equal(got[r], _mine(r)), f"gather_object dst={dst}: rank {r} changed")


@check("broadcast_object_list")
def _broadcast_object_list(comm: Any, ctx: dict) -> None:
    """broadcast_object_list fills the list in place from every src; broadcast_object returns."""
    for src in range(comm.world_size):
        objs = [_mine(comm.rank), "x" * comm.rank, None]
        same_list = objs
        ret = comm.broadcast_object_list(objs, src=src)
        expect(ret is None, f"broadcast_object_list returned {ret!r:.80}")
        expect(objs is same_list and len(objs) == 3, "the list was not filled in place")
        expect(deep_equal(objs, [_mine(src), "x" * src, None]), f"src={src}: objects differ")
        got = comm.broadcast_object({"cfg": src} if comm.rank == src else None, src=src)
        expect(got == {"cfg": src}, f"broadcast_object from {src}: {got!r}")
    empty: list = []
    comm.broadcast_object_list(empty)
    expect(empty == [], "broadcasting an empty list")


@check("serialization_roundtrip")
def _serialization_roundtrip(comm: Any, ctx: dict) -> None:
    """The serializer and the object collectives return every sample object exactly."""
    samples = fixed_objects() + drawn_objects(ctx.get("drawn", 20))
    ser = comm.serializer
    for i, obj in enumerate(samples):
        header, buffers = ser.dumps(obj)
        expect(_arrived(ser.loads(header, buffers), obj), f"sample {i}: local round trip")
    r, n = comm.rank, comm.world_size
    # every rank sends a different slice, so each sample travels from some rank
    mine = samples[r::n]
    got = comm.all_gather_object(mine)
    for src in range(n):
        theirs = samples[src::n]
        expect(len(got[src]) == len(theirs), f"rank {src} sent {len(theirs)} objects")
        for k, (a, b) in enumerate(zip(got[src], theirs)):
            expect(_arrived(a, b), f"sample {src + k * n} from rank {src} arrived changed")
    objs = list(samples) if r == 0 else [None] * len(samples)
    comm.broadcast_object_list(objs, src=0)
    for i, (a, b) in enumerate(zip(objs, samples)):
        expect(_arrived(a, b), f"sample {i} broadcast from rank 0 arrived changed")


@check("objects_keep_devices")
def _objects_keep_devices(comm: Any, ctx: dict) -> None:
    """Tensors inside objects: CPU ones arrive on the CPU, device ones on the receiver's device."""
    dev = comm.device
    obj = {"cpu": torch.ones(3), "dev": torch.full((2,), float(comm.rank), device=dev)}
    for r, got in enumerate(comm.all_gather_object(obj)):
        expect(got["cpu"].device.type == "cpu", f"a CPU tensor from rank {r} left the CPU")
        expect(got["dev"].device == dev, f"a device tensor from {r} landed on {got['dev'].device}")
        expect(got["dev"].cpu().tolist() == [float(r)] * 2, f"device tensor from {r} changed")
