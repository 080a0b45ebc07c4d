"""Point to point: send / recv / isend / irecv, batches, and objects sent to one rank.

Blocking sends follow a chain (rank 0 sends first, every other rank receives
before it sends on), so the checks never rely on an engine buffering a send
nobody receives yet; two-way exchange goes through ``batch_isend_irecv``.
"""

from __future__ import annotations

from typing import Any

import torch

import commlib.functional as F
from commlib.errors import CommError, RemoteError
from commlib.p2p import P2POp
from commlib.testing.checks import (
    check,
    devices,
    expect,
    expect_raises,
    expect_tensor,
    rank_tensor,
)
from commlib.testing.samples import deep_equal

P2P_DTYPES = (
    torch.float32,
    torch.float64,
    torch.bfloat16,
    torch.int64,
    torch.uint8,
    torch.bool,
    torch.int16,
    torch.uint32,
    torch.complex64,
)


@check("send_recv", min_world=2)
def _send_recv(comm: Any, ctx: dict) -> None:
    """send/recv along a chain 0 -> 1 -> ... for every dtype, into the caller's device."""
    n, r = comm.world_size, comm.rank
    for dtype in P2P_DTYPES:
        for dev in devices(comm):
            got = torch.zeros((2, 3), dtype=dtype, device=dev)
            if r > 0:
                ptr = got.data_ptr()
                ret = comm.recv(got, src=r - 1)
                expect(ret == r - 1, f"recv returned {ret!r}, not the sender's rank {r - 1}")
                expect(got.data_ptr() == ptr, "recv did not fill its tensor in place")
                expect_tensor(got, rank_tensor(r - 1, dtype, device=dev), f"recv {dtype} {dev}")
            if r < n - 1:
                ret = comm.send(rank_tensor(r, dtype, device=dev), dst=r + 1)
                expect(ret is None, f"send returned {ret!r}")
    # tags keep two messages apart; a strided target is filled through its base
    if r == 0:
        comm.send(torch.ones(2), dst=n - 1, tag=7)
        comm.send(torch.full((2,), 2.0), dst=n - 1, tag=3)
    elif r == n - 1:
        base = torch.zeros(2, 2)
        first = comm.irecv(base[:, 0], src=0, tag=7)
        second = comm.irecv(base[:, 1], src=0, tag=3)
        expect(first.wait() is True and second.wait() is True, "irecv handles")
        expect_tensor(base, torch.tensor([[1.0, 2.0], [1.0, 2.0]]), "tagged irecv into views")
    comm.barrier()


@check("isend_irecv", min_world=2)
def _isend_irecv(comm: Any, ctx: dict) -> None:
    """isend / irecv, module-level too: handles complete both ways around a ring."""
    n, r = comm.world_size, comm.rank
    right, left = (r + 1) % n, (r - 1) % n
    for dev in devices(comm):
        got = torch.zeros(1000, device=dev)
        handles = [comm.irecv(got, src=left), comm.isend(torch.full((1000,), float(r)), right)]
        for h in handles:
            expect(h.wait() is True, "isend/irecv wait() must return True")
            expect(h.is_completed(), "is_completed() is False after wait()")
        expect_tensor(got, torch.full((1000,), float(left), device=dev), f"ring irecv on {dev}")
    got = torch.zeros(1)
    handles = [F.irecv(got, src=left, group=comm), F.isend(torch.tensor([float(r)]), right, comm)]
    for h in handles:
        h.wait()
    expect_tensor(got, torch.tensor([float(left)]), "F.irecv")
    if r == 0:
        F.send(torch.tensor([5.0]), 1, group=comm)
    elif r == 1:
        x = torch.zeros(1)
        expect(F.recv(x, 0, group=comm) == 0, "F.recv returns the sender's rank")
        expect_tensor(x, torch.tensor([5.0]), "F.recv")


@check("batch_isend_irecv")
def _batch_isend_irecv(comm: Any, ctx: dict) -> None:
    """batch_isend_irecv: both neighbours at once, several dtypes, module-level too."""
    n, r = comm.world_size, comm.rank
    if n == 1:
        expect_raises(ValueError, comm.batch_isend_irecv, [])
        return
    right, left = (r + 1) % n, (r - 1) % n
    for dtype in (torch.float32, torch.int16, torch.bool):
        for dev in devices(comm):
            from_left = torch.zeros((2, 3), dtype=dtype, device=dev)
            from_right = torch.zeros((2, 3), dtype=dtype, device=dev)
            mine = rank_tensor(r, dtype, device=dev)
            ops = [
                P2POp(F.isend, mine, right),
                P2POp(F.isend, mine, left),
                P2POp(F.irecv, from_left, left),
                P2POp(F.irecv, from_right, right),
            ]
            handles = comm.batch_isend_irecv(ops)
            expect(isinstance(handles, list) and handles, f"batch returned {handles!r}")
            for h in handles:
                expect(h.wait() is True, "batch handle wait()")
            expect_tensor(from_left, rank_tensor(left, dtype, device=dev), f"batch {dtype} left")
            expect_tensor(from_right, rank_tensor(right, dtype, device=dev), f"batch {dtype}")
    got = torch.zeros(1)
    ops = [P2POp("isend", torch.tensor([float(r)]), right, comm), P2POp("irecv", got, left, comm)]
    for h in F.batch_isend_irecv(ops):
        h.wait()
    expect_tensor(got, torch.tensor([float(left)]), "F.batch_isend_irecv")


def _payload(rank: int, size: str) -> Any:
    if size == "small":
        return {"from": rank, "x": [1, 2]}
    if size == "medium":  # fits a slot of its own, not src's slot with the others
        return {"from": rank, "blob": bytes([rank]) * 1500}
    if size == "large":
        return {"from": rank, "blob": bytes([rank]) * 200_000, "t": torch.arange(3000) + rank}
    return [torch.full((2,), float(i + rank)) for i in range(600)]  # more buffers than a slot


@check("send_recv_object_list", min_world=2)
def _send_recv_object_list(comm: Any, ctx: dict) -> None:
    """send_object_list / recv_object_list: small, large and many-buffer lists, along a chain."""
    n, r = comm.world_size, comm.rank
    for size in ("small", "large", "packed"):
        if r > 0:
            box: list = [None, None]
            ret = comm.recv_object_list(box, src=r - 1)
            expect(ret == r - 1, f"recv_object_list returned {ret!r:.60}, not the sender's rank")
            expect(deep_equal(box, [_payload(r - 1, size), size]), f"{size} list from {r - 1}")
        if r < n - 1:
            comm.send_object_list([_payload(r, size), size], dst=r + 1)
    # async both ways
    if r == 0:
        h = comm.send_object_list([{"async": True}], dst=n - 1, async_op=True)
        expect(h is not None and h.wait() is None, "async send_object_list")
    elif r == n - 1:
        box = [None]
        h = comm.recv_object_list(box, src=0, async_op=True)
        expect(h is not None and h.wait() == 0 and box == [{"async": True}], "async recv")
    comm.barrier()


@check("send_object_failure", min_world=2)
def _send_object_failure(comm: Any, ctx: dict) -> None:
    """An unpicklable send raises on the sender and at once on the receiver, not after a wait."""
    n, r = comm.world_size, comm.rank
    if r == 0:
        err = expect_raises(RemoteError, comm.send_object_list, [lambda: 0], dst=n - 1)
        expect(0 in getattr(err, "failures", {}), f"the sender's error does not name it: {err}")
    elif r == n - 1:
        err = expect_raises(RemoteError, comm.recv_object_list, [None], src=0, timeout=120)
        expect(0 in getattr(err, "failures", {}), f"the receiver's error lacks the sender: {err}")
        # a wrong list length is found after the whole message arrived
    if r == 0:
        comm.send_object_list([1, 2], dst=n - 1)
    elif r == n - 1:
        expect_raises(ValueError, comm.recv_object_list, [None], src=0)
    comm.barrier()


@check("scatter_object_list")
def _scatter_object_list(comm: Any, ctx: dict) -> None:
    """scatter_object_list from every src: small (one round), large and many-buffer objects."""
    n, r = comm.world_size, comm.rank
    for src in range(n):
        for size in ("small", "medium", "large", "packed"):
            objs = [_payload(10 * src + i, size) for i in range(n)]
            box: list = [None]
            ret = comm.scatter_object_list(box, objs if r == src else None, src=src)
            expect(ret is None, f"scatter_object_list returned {ret!r:.60}")
            expect(deep_equal(box[0], _payload(10 * src + r, size)), f"{size} from src={src}")
            if r == src:
                expect(box[0] is objs[r], "src's own object is not kept itself")
    # mixed: one rank's object fits the slot, another's does not
    objs = [_payload(i, "large" if i % 2 else "small") for i in range(n)]
    box = [None]
    h = F.scatter_object_list(
        box, objs if r == n - 1 else None, group_src=n - 1, group=comm, async_op=True
    )
    expect(h is not None and h.wait() is None, "async scatter_object_list")
    expect(deep_equal(box[0], objs[r]), "mixed sizes")


@check("async_object_collectives")
def _async_object_collectives(comm: Any, ctx: dict) -> None:
    """async_op=True on every object collective: wait() gives the result; calls stay in order."""
    n, r = comm.world_size, comm.rank
    big = {"rank": r, "blob": bytes([r]) * 100_000}
    h1 = comm.all_gather_object(big, async_op=True)
    h2 = comm.gather_object(r, dst=n - 1, async_op=True)
    box = [r]
    h3 = comm.broadcast_object_list(box, src=n - 1, async_op=True)
    h4 = comm.broadcast_object({"cfg": r}, src=0, async_op=True)
    t = torch.tensor([1.0])
    comm.all_reduce(t)  # issued after the four: they finish first, on every rank
    expect(float(t) == n, "a collective after async object collectives")
    got = h1.wait()
    expect([g["rank"] for g in got] == list(range(n)), f"async all_gather_object: {got!r:.60}")
    expect(h2.wait() == (list(range(n)) if r == n - 1 else None), "async gather_object")
    expect(h3.wait() is None and box == [n - 1], "async broadcast_object_list")
    expect(h4.wait() == {"cfg": 0}, "async broadcast_object")
    for h in (h1, h2, h3, h4):
        expect(h.is_completed(), "is_completed() after wait()")
    got = F.all_gather_object(r, group=comm, timeout=120, async_op=True).wait()
    expect(got == list(range(n)), f"F.all_gather_object async: {got}")
    # a failure agreed in round one surfaces in wait(), on every rank
    h = comm.all_gather_object((lambda: 0) if r == 0 else r, async_op=True)
    try:
        h.wait()
    except CommError as exc:
        expect(n > 1 and "rank 0" in str(exc), f"unexpected failure: {exc}")
    else:
        expect(n == 1, "an unpicklable object gathered without error")


@check("bad_arguments_collectives")
def _bad_arguments_collectives(comm: Any, ctx: dict) -> None:
    """The new collectives refuse bad arguments on every rank, and the group goes on.

    A mistake only one rank can make (src's scatter list, a rank's own
    all_to_all lists and splits) fails every rank together where the
    arguments are checked (in the check's round); unchecked, that rank
    refuses before anything is sent.
    """
    n, r = comm.world_size, comm.rank
    x = torch.ones(2)
    expect_raises(ValueError, comm.reduce, x, dst=n)
    expect_raises(TypeError, comm.reduce, x, op="band")
    expect_raises(ValueError, comm.reduce, x, op="median")
    expect_raises(ValueError, comm.scatter, x, src=n)
    # only src has a list to check: checked, its refusal fails every rank alike
    # (the others are inside the scatter, waiting for src); unchecked, src
    # refuses before anything is sent
    bad_lists = [(ValueError, [x] * (n + 1)), (TypeError, None), (ValueError, [torch.ones(3)] * n)]
    for kind, bad in bad_lists:
        if comm.checks != "off":
            got = expect_raises(kind, comm.scatter, x, bad if r == 0 else None, src=0)
            expect("scatter_list on src" in str(got) or "scatter_list[0]" in str(got), f"{got}")
        elif r == 0:
            expect_raises(kind, comm.scatter, x, bad, src=0)
    expect_raises(ValueError, comm.all_to_all, [x] * (n + 1), [x] * n)
    expect_raises(TypeError, comm.all_to_all, [x] * n, [x.long()] * n)
    out = torch.empty(2 * n)
    expect_raises(ValueError, comm.all_to_all_single, out, torch.ones(2 * n), [2] * (n + 1))
    expect_raises(ValueError, comm.all_to_all_single, out, torch.ones(2 * n), None, [1] * n)
    expect_raises(ValueError, comm.all_to_all_single, out, torch.ones(2 * n), [-1] + [3] * n)
    expect_raises(ValueError, comm.all_to_all_single, torch.empty(2 * n + 1), torch.ones(2))
    expect_raises(TypeError, comm.all_to_all_single, out, torch.ones(2 * n, dtype=torch.int64))
    expect_raises(ValueError, comm.send, x, dst=r)
    expect_raises(ValueError, comm.recv, x, src=r)
    expect_raises(ValueError, comm.isend, x, dst=n)
    if n > 1:
        expect_raises(TypeError, comm.send, x, dst=(r + 1) % n, tag="a")
    expect_raises(ValueError, comm.batch_isend_irecv, [P2POp("isend", x, r)])
    expect_raises(ValueError, comm.batch_isend_irecv, [P2POp("gather", x, (r + 1) % n)])
    expect_raises(ValueError, comm.send_object_list, [1], dst=r)
    expect_raises(ValueError, F.send, x, group=comm)  # no dst
    expect_raises((ValueError, TypeError), comm.scatter_object_list, [], [1] * n)
    expect_raises((ValueError, TypeError), comm.scatter_object_list, [None], [1] * (n + 1))
    t = torch.tensor([float(r + 1)])
    comm.all_reduce(t)
    expect(float(t) == n * (n + 1) / 2, f"the world is out of step after an error: {t}")
