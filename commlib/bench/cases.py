"""What ``commlib bench`` measures: each case is one collective, done two ways.

A :class:`Case` prepares, for one size, a call through commlib's module-level
API (what ``import commlib as dist`` code runs) and the equivalent call a
plain ``torch.distributed`` program makes, on the same data. Where commlib
returns new tensors (``all_gather``) or new objects, the torch call allocates
its outputs inside the call too, since a torch user has to; where both write
into a caller's buffer, both get a preallocated one.

The torch baseline of ``all_reduce_params`` is one ``all_reduce`` per tensor:
torch has no public coalesced all_reduce that is not deprecated
(``all_reduce_coalesced`` warns on every call), and a loop is what code
without a helper does.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

import commlib
from commlib import _torch_facts as torch_facts
from commlib.bench.dispatch_cases import is_dispatch_token
from commlib.communicator import Communicator

IMPLS = ("commlib", "torch")
#: every implementation a row can hold, in column order: commlib in the run's
#: mode (``--strict``; checked by default where the backend checks), commlib
#: unchecked (``strict=False``, with ``--strict both``), torch
SIDES = ("commlib", "unchecked", "torch")

# torch 2.13 renamed the flat collectives and warns on every call of the old names
_torch_all_gather_single = torch_facts.all_gather_single
_torch_reduce_scatter_single = torch_facts.reduce_scatter_single

PARAM_TENSORS = 128  # "many small tensors": about a small model's parameter count
_SMALL_OBJECT = {"step": 1000, "loss": 0.25, "lr": 1e-4, "tag": "train"}


@dataclass
class Prepared:
    """One case at one size, ready to call.

    ``nbytes`` is the size bandwidth is computed from (see
    :mod:`commlib.bench.bandwidth`), ``count`` the elements each rank
    contributes. ``calls`` maps ``"commlib"`` / ``"torch"`` to a no-argument
    call; ``check`` raises ``AssertionError`` if the result of an
    implementation's *first* call is wrong (in-place collectives change their
    input, so later results differ by design).
    """

    nbytes: int
    count: int
    calls: dict[str, Callable[[], Any]]
    check: Callable[[Any], None]


@dataclass(frozen=True)
class Case:
    """A benchmark case: a collective, a payload, and how to prepare it.

    ``fixed_size`` cases (small-object latency) run once at their own size
    instead of following the sweep; a case needs at least ``min_world`` ranks
    (a ping-pong needs two) and is left out of smaller runs.
    """

    name: str
    op: str
    payload: str
    kind: str
    prepare: Callable[[Communicator, int], Prepared]
    fixed_size: bool = False
    min_world: int = 1


# -- checks: cheap (first and last element), enough to catch a broken case ----------
def _expect(cond: bool, what: str) -> None:
    if not cond:
        raise AssertionError(f"wrong result: {what}")


def _ends(t: torch.Tensor) -> tuple[float, float]:
    flat = t.reshape(-1)
    return float(flat[0]), float(flat[-1])


def _rank_sum(n: int) -> float:
    return n * (n + 1) / 2  # every rank contributes rank + 1


# -- tensor collectives ----------------------------------------------------------------
def _elements(nbytes: int, parts: int, itemsize: int = 4) -> int:
    return max(1, nbytes // (parts * itemsize))


def _filled(count: int, value: float, device: torch.device) -> torch.Tensor:
    return torch.full((count,), float(value), dtype=torch.float32, device=device)


def _all_reduce(comm: Communicator, size: int) -> Prepared:
    n, rank, dev = comm.world_size, comm.rank, comm.device
    count = _elements(size, 1)
    mine = {impl: _filled(count, rank + 1, dev) for impl in IMPLS}

    def ours() -> torch.Tensor:
        commlib.all_reduce(mine["commlib"], "sum", group=comm)
        return mine["commlib"]

    def theirs() -> torch.Tensor:
        dist.all_reduce(mine["torch"], group=comm.group)
        return mine["torch"]

    def check(out: torch.Tensor) -> None:
        _expect(_ends(out) == (_rank_sum(n),) * 2, "all_reduce sum")

    return Prepared(count * 4, count, {"commlib": ours, "torch": theirs}, check)


def _all_gather(comm: Communicator, size: int) -> Prepared:
    n, rank, dev = comm.world_size, comm.rank, comm.device
    count = _elements(size, n)
    x = _filled(count, rank, dev)

    def ours() -> list[torch.Tensor]:
        return commlib.all_gather(x, group=comm)

    def theirs() -> list[torch.Tensor]:
        out = [torch.empty_like(x) for _ in range(n)]
        dist.all_gather(out, x, group=comm.group)
        return out

    def check(out: list[torch.Tensor]) -> None:
        _expect(len(out) == n, "all_gather length")
        for i, t in enumerate(out):
            _expect(_ends(t) == (i, i), f"all_gather part {i}")

    return Prepared(n * count * 4, count, {"commlib": ours, "torch": theirs}, check)


def _all_gather_into_tensor(comm: Communicator, size: int) -> Prepared:
    n, rank, dev = comm.world_size, comm.rank, comm.device
    count = _elements(size, n)
    x = _filled(count, rank, dev)
    outs = {impl: torch.empty(n * count, dtype=torch.float32, device=dev) for impl in IMPLS}

    def ours() -> torch.Tensor:
        commlib.all_gather_into_tensor(outs["commlib"], x, group=comm)
        return outs["commlib"]

    def theirs() -> torch.Tensor:
        _torch_all_gather_single(outs["torch"], x, group=comm.group)
        return outs["torch"]

    def check(out: torch.Tensor) -> None:
        for i, part in enumerate(out.view(n, count)):
            _expect(_ends(part) == (i, i), f"all_gather_into_tensor part {i}")

    return Prepared(n * count * 4, count, {"commlib": ours, "torch": theirs}, check)


def _broadcast(comm: Communicator, size: int) -> Prepared:
    rank, dev = comm.rank, comm.device
    count = _elements(size, 1)
    mine = {impl: _filled(count, rank + 1, dev) for impl in IMPLS}

    def ours() -> torch.Tensor:
        commlib.broadcast(mine["commlib"], 0, group=comm)
        return mine["commlib"]

    src = _world_rank(comm, 0)

    def theirs() -> torch.Tensor:
        dist.broadcast(mine["torch"], src=src, group=comm.group)
        return mine["torch"]

    def check(out: torch.Tensor) -> None:
        _expect(_ends(out) == (1.0, 1.0), "broadcast from rank 0")

    return Prepared(count * 4, count, {"commlib": ours, "torch": theirs}, check)


def _reduce_scatter(comm: Communicator, size: int) -> Prepared:
    n, rank, dev = comm.world_size, comm.rank, comm.device
    count = _elements(size, n)
    x = _filled(n * count, rank + 1, dev)
    outs = {impl: torch.empty(count, dtype=torch.float32, device=dev) for impl in IMPLS}

    def ours() -> torch.Tensor:
        commlib.reduce_scatter(outs["commlib"], x, "sum", group=comm)
        return outs["commlib"]

    def theirs() -> torch.Tensor:
        _torch_reduce_scatter_single(outs["torch"], x, group=comm.group)
        return outs["torch"]

    def check(out: torch.Tensor) -> None:
        _expect(_ends(out) == (_rank_sum(n),) * 2, "reduce_scatter sum")

    return Prepared(n * count * 4, count, {"commlib": ours, "torch": theirs}, check)


def _reduce(comm: Communicator, size: int) -> Prepared:
    n, rank, dev = comm.world_size, comm.rank, comm.device
    count = _elements(size, 1)
    mine = {impl: _filled(count, rank + 1, dev) for impl in IMPLS}
    dst = _world_rank(comm, 0)

    def ours() -> torch.Tensor:
        commlib.reduce(mine["commlib"], 0, "sum", group=comm)
        return mine["commlib"]

    def theirs() -> torch.Tensor:
        dist.reduce(mine["torch"], dst=dst, group=comm.group)
        return mine["torch"]

    def check(out: torch.Tensor) -> None:
        if rank == 0:  # the others' buffers are scratch space to torch
            _expect(_ends(out) == (_rank_sum(n),) * 2, "reduce sum on dst")

    return Prepared(count * 4, count, {"commlib": ours, "torch": theirs}, check)


def _scatter(comm: Communicator, size: int) -> Prepared:
    n, rank, dev = comm.world_size, comm.rank, comm.device
    count = _elements(size, n)
    parts = [_filled(count, i, dev) for i in range(n)] if rank == 0 else None
    outs = {impl: torch.empty(count, dtype=torch.float32, device=dev) for impl in IMPLS}
    src = _world_rank(comm, 0)

    def ours() -> torch.Tensor:
        commlib.scatter(outs["commlib"], parts, 0, group=comm)
        return outs["commlib"]

    def theirs() -> torch.Tensor:
        dist.scatter(outs["torch"], parts, src=src, group=comm.group)
        return outs["torch"]

    def check(out: torch.Tensor) -> None:
        _expect(_ends(out) == (rank, rank), "scatter part")

    return Prepared(n * count * 4, count, {"commlib": ours, "torch": theirs}, check)


def _all_to_all_single(comm: Communicator, size: int) -> Prepared:
    n, rank, dev = comm.world_size, comm.rank, comm.device
    count = _elements(size, n)
    x = _filled(n * count, rank, dev)
    outs = {impl: torch.empty(n * count, dtype=torch.float32, device=dev) for impl in IMPLS}

    def ours() -> torch.Tensor:
        commlib.all_to_all_single(outs["commlib"], x, group=comm)
        return outs["commlib"]

    def theirs() -> torch.Tensor:
        dist.all_to_all_single(outs["torch"], x, group=comm.group)
        return outs["torch"]

    def check(out: torch.Tensor) -> None:
        for i, part in enumerate(out.view(n, count)):
            _expect(_ends(part) == (i, i), f"all_to_all_single part {i}")

    return Prepared(n * count * 4, count, {"commlib": ours, "torch": theirs}, check)


def _gather(comm: Communicator, size: int) -> Prepared:
    n, rank, dev = comm.world_size, comm.rank, comm.device
    count = _elements(size, n)
    x = _filled(count, rank, dev)
    dst = _world_rank(comm, 0)

    def ours() -> list[torch.Tensor]:
        return commlib.gather(x, group=comm)

    def theirs() -> list[torch.Tensor]:
        out = [torch.empty_like(x) for _ in range(n)] if rank == 0 else None
        dist.gather(x, out, dst=dst, group=comm.group)
        return out or []

    def check(out: list[torch.Tensor]) -> None:
        _expect(len(out) == (n if rank == 0 else 0), "gather length")
        for i, t in enumerate(out):
            _expect(_ends(t) == (i, i), f"gather part {i}")

    return Prepared(n * count * 4, count, {"commlib": ours, "torch": theirs}, check)


def _all_to_all(comm: Communicator, size: int) -> Prepared:
    n, rank, dev = comm.world_size, comm.rank, comm.device
    count = _elements(size, n)
    ins = [_filled(count, 10 * rank + j, dev) for j in range(n)]
    outs = {
        impl: [torch.empty(count, dtype=torch.float32, device=dev) for _ in range(n)]
        for impl in IMPLS
    }

    def ours() -> list[torch.Tensor]:
        commlib.all_to_all(outs["commlib"], ins, group=comm)
        return outs["commlib"]

    def theirs() -> list[torch.Tensor]:
        dist.all_to_all(outs["torch"], ins, group=comm.group)
        return outs["torch"]

    def check(out: list[torch.Tensor]) -> None:
        for i, part in enumerate(out):
            _expect(_ends(part) == (10 * i + rank,) * 2, f"all_to_all part {i}")

    return Prepared(n * count * 4, count, {"commlib": ours, "torch": theirs}, check)


def _ping_pong(comm: Communicator, size: int) -> Prepared:
    """Rank 0 sends to rank 1, which sends it back; the other ranks wait at the barrier."""
    rank, dev = comm.rank, comm.device
    count = _elements(size, 1)
    mine = _filled(count, rank + 1, dev)
    got = {impl: torch.empty(count, dtype=torch.float32, device=dev) for impl in IMPLS}
    peer = 1 - rank  # group rank of the other player (ranks 0 and 1 only)
    world_peer = _world_rank(comm, peer) if rank < 2 else -1

    def ours() -> torch.Tensor:
        if rank == 0:
            commlib.send(mine, peer, group=comm)
            commlib.recv(got["commlib"], peer, group=comm)
        elif rank == 1:
            commlib.recv(got["commlib"], peer, group=comm)
            commlib.send(mine, peer, group=comm)
        return got["commlib"]

    def theirs() -> torch.Tensor:
        if rank == 0:
            dist.send(mine, world_peer, group=comm.group)
            dist.recv(got["torch"], world_peer, group=comm.group)
        elif rank == 1:
            dist.recv(got["torch"], world_peer, group=comm.group)
            dist.send(mine, world_peer, group=comm.group)
        return got["torch"]

    def check(out: torch.Tensor) -> None:
        if rank < 2:
            _expect(_ends(out) == (peer + 1.0,) * 2, "ping-pong message")

    # bytes moved: the message there and back
    return Prepared(2 * count * 4, count, {"commlib": ours, "torch": theirs}, check)


def _world_rank(comm: Communicator, group_rank: int) -> int:
    return comm.ranks[group_rank]


# -- object collectives ------------------------------------------------------------------
def _numpy_payload(comm: Communicator, count: int) -> Any:
    return {"rank": comm.rank, "data": np.full(count, comm.rank, dtype=np.float32)}


def _tensor_payload(comm: Communicator, count: int) -> Any:
    return {"rank": comm.rank, "data": _filled(count, comm.rank, comm.device)}


def _small_payload(comm: Communicator, count: int) -> Any:
    return {"rank": comm.rank, **_SMALL_OBJECT}


def _check_object(obj: Any, rank: int, what: str) -> None:
    _expect(isinstance(obj, dict) and obj.get("rank") == rank, f"{what}: object of rank {rank}")
    data = obj.get("data")
    if data is not None:
        first, last = float(data[0]), float(data[-1])
        _expect((first, last) == (rank, rank), f"{what}: data of rank {rank}")


def _object_case(op: str, make: Callable[[Communicator, int], Any], fixed: bool) -> Callable:
    def prepare(comm: Communicator, size: int) -> Prepared:
        n = comm.world_size
        gathers = op != "broadcast_object_list"
        if fixed:
            obj = make(comm, 0)
            per_rank = len(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL))
            count = 1
        else:
            count = _elements(size, n if gathers else 1)
            obj = make(comm, count)
            per_rank = count * 4
        nbytes = per_rank * n if gathers else per_rank
        calls, check = _object_calls(comm, op, obj)
        return Prepared(nbytes, count, calls, check)

    return prepare


def _object_calls(comm: Communicator, op: str, obj: Any) -> tuple[dict, Callable[[Any], None]]:
    return _OBJECT_CALLS[op](comm, obj)


def _all_gather_object_calls(comm: Communicator, obj: Any) -> tuple[dict, Callable]:
    n = comm.world_size

    def theirs() -> list[Any]:
        out: list[Any] = [None] * n
        dist.all_gather_object(out, obj, group=comm.group)
        return out

    def check(out: list[Any]) -> None:
        _expect(len(out) == n, "all_gather_object length")
        for i, o in enumerate(out):
            _check_object(o, i, "all_gather_object")

    return {"commlib": lambda: commlib.all_gather_object(obj, group=comm), "torch": theirs}, check


def _gather_object_calls(comm: Communicator, obj: Any) -> tuple[dict, Callable]:
    n, rank, dst = comm.world_size, comm.rank, _world_rank(comm, 0)

    def theirs() -> list[Any] | None:
        out: list[Any] | None = [None] * n if rank == 0 else None
        dist.gather_object(obj, out, dst=dst, group=comm.group)
        return out

    def check(out: list[Any] | None) -> None:
        if rank != 0:
            _expect(out is None, "gather_object returns None off dst")
            return
        _expect(out is not None and len(out) == n, "gather_object length")
        for i, o in enumerate(out or []):
            _check_object(o, i, "gather_object")

    return {"commlib": lambda: commlib.gather_object(obj, 0, group=comm), "torch": theirs}, check


def _broadcast_object_calls(comm: Communicator, obj: Any) -> tuple[dict, Callable]:
    rank, src = comm.rank, _world_rank(comm, 0)

    def ours() -> Any:
        box = [obj if rank == 0 else None]
        commlib.broadcast_object_list(box, 0, group=comm)
        return box[0]

    def theirs() -> Any:
        box = [obj if rank == 0 else None]
        dist.broadcast_object_list(box, src=src, group=comm.group)
        return box[0]

    def check(out: Any) -> None:
        _check_object(out, 0, "broadcast_object_list")

    return {"commlib": ours, "torch": theirs}, check


_OBJECT_CALLS = {
    "all_gather_object": _all_gather_object_calls,
    "gather_object": _gather_object_calls,
    "broadcast_object_list": _broadcast_object_calls,
}


# -- helpers ------------------------------------------------------------------------------
def _all_reduce_params(comm: Communicator, size: int) -> Prepared:
    n, rank, dev = comm.world_size, comm.rank, comm.device
    total = _elements(size, 1)
    tensors = min(PARAM_TENSORS, total)
    each = total // tensors
    params = {impl: [_filled(each, rank + 1, dev) for _ in range(tensors)] for impl in IMPLS}

    def ours() -> list[torch.Tensor]:
        commlib.all_reduce_params(params["commlib"], group=comm)
        return params["commlib"]

    def theirs() -> list[torch.Tensor]:
        for p in params["torch"]:
            dist.all_reduce(p, group=comm.group)
        return params["torch"]

    def check(out: list[torch.Tensor]) -> None:
        for t in (out[0], out[-1]):
            _expect(_ends(t) == (_rank_sum(n),) * 2, "all_reduce_params sum")

    return Prepared(tensors * each * 4, tensors * each, {"commlib": ours, "torch": theirs}, check)


CASES: list[Case] = [
    Case("all_reduce", "all_reduce", "float32", "tensor", _all_reduce),
    Case("all_gather", "all_gather", "float32", "tensor", _all_gather),
    Case(
        "all_gather_into_tensor",
        "all_gather_into_tensor",
        "float32",
        "tensor",
        _all_gather_into_tensor,
    ),
    Case("broadcast", "broadcast", "float32", "tensor", _broadcast),
    Case("reduce_scatter", "reduce_scatter", "float32", "tensor", _reduce_scatter),
    Case("reduce", "reduce", "float32", "tensor", _reduce),
    Case("gather", "gather", "float32", "tensor", _gather),
    Case("scatter", "scatter", "float32", "tensor", _scatter),
    Case("all_to_all", "all_to_all", "float32", "tensor", _all_to_all),
    Case("all_to_all_single", "all_to_all_single", "float32", "tensor", _all_to_all_single),
    Case("send_recv", "send_recv", "float32 ping-pong", "tensor", _ping_pong, min_world=2),
    *(
        Case(
            f"{op}[{payload}]",
            op,
            payload,
            "object",
            _object_case(op, make, fixed=False),
        )
        for op in ("all_gather_object", "gather_object", "broadcast_object_list")
        for payload, make in (("numpy", _numpy_payload), ("tensor", _tensor_payload))
    ),
    *(
        Case(f"{op}[small]", op, "small", "latency", _object_case(op, _small_payload, True), True)
        for op in ("all_gather_object", "gather_object", "broadcast_object_list")
    ),
    Case(
        "all_reduce_params",
        "all_reduce_params",
        f"{PARAM_TENSORS} tensors",
        "helper",
        _all_reduce_params,
    ),
]


def prepare_sides(
    case: Case,
    comms: Mapping[str, Communicator],
    size: int,
    baseline: Communicator | None = None,
) -> Prepared:
    """``case`` at ``size``: torch's call and a commlib call per communicator of ``comms``.

    ``comms`` maps a side (``"commlib"``, ``"unchecked"``) to the communicator
    its calls go through, all over one process group; each side gets buffers
    of its own, filled alike, so the sides move the same data. torch's call
    runs on ``comms["commlib"]``'s group, or on ``baseline``'s when given (the
    same ranks on the engine torch itself drives for the device, where
    commlib's runs on one torch does not ship).

    Examples:
        >>> off = Communicator(comm.group, strict=False)   # every rank  # doctest: +SKIP
        >>> p = prepare_sides(CASES[0], {"commlib": comm, "unchecked": off}, 4096)
        ... # doctest: +SKIP
        >>> list(p.calls)                                  # doctest: +SKIP
        ['commlib', 'unchecked', 'torch']
    """
    prepared = case.prepare(comms["commlib"], size)
    calls = {"commlib": prepared.calls["commlib"]}
    for side, comm in comms.items():
        if side != "commlib":
            calls[side] = case.prepare(comm, size).calls["commlib"]
    theirs = prepared if baseline is None else case.prepare(baseline, size)
    calls["torch"] = theirs.calls["torch"]
    return Prepared(prepared.nbytes, prepared.count, calls, prepared.check)


def select_cases(spec: str | Sequence[str] | None) -> list[Case]:
    """The cases named by ``spec``, in the standard order.

    ``spec`` is a comma-separated list (or a list) of case names
    (``all_gather_object[numpy]``), collective names (``all_gather_object``:
    every payload) or kinds (``tensor``, ``object``, ``latency``, ``helper``);
    ``None`` or ``"all"`` is every case. Tokens of the dispatch kind
    (:func:`~commlib.bench.dispatch_cases.select_dispatch`) select none of these.

    Examples:
        >>> [c.name for c in select_cases("all_reduce,broadcast_object_list")]
        ['all_reduce', 'broadcast_object_list[numpy]', 'broadcast_object_list[tensor]',
         'broadcast_object_list[small]']
        >>> select_cases("dispatch"), len(select_cases("all,dispatch")) == len(CASES)
        ([], True)
    """
    if spec is None:
        return list(CASES)
    tokens = [t.strip() for t in (spec.split(",") if isinstance(spec, str) else spec)]
    tokens = [t for t in tokens if t]
    if tokens and all(is_dispatch_token(t) for t in tokens):
        return []  # the dispatch kind alone: see commlib.bench.dispatch_cases
    tokens = [t for t in tokens if not is_dispatch_token(t)]
    if not tokens or "all" in tokens:
        return list(CASES)
    known = {c.name for c in CASES} | {c.op for c in CASES} | {c.kind for c in CASES}
    unknown = [t for t in tokens if t not in known]
    if unknown:
        raise ValueError(
            f"unknown --ops {unknown}; choose from cases {[c.name for c in CASES]}, "
            f"collectives, or kinds {sorted({c.kind for c in CASES})}"
        )
    wanted = set(tokens)
    return [c for c in CASES if wanted & {c.name, c.op, c.kind}]
