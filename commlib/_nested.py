"""Collectives on nested structures and Python values, built on the tensor collectives.

A :class:`~commlib.Communicator`'s ``all_reduce``, ``broadcast`` and
``all_gather`` hand anything that is not a tensor here; ``all_gather_cat``
lives here whole. The structure's leaves travel packed: one flat tensor per
(dtype, device) bucket, one collective each, as accelerate's and Lightning's
helpers do leaf by leaf. Python numbers become 0-dim tensors for the trip and
come back as Python numbers (ignite's ``idist`` convention); strings and
other objects travel as objects.

Before anything moves, the ranks agree on the structure: the same round the
argument check uses (:meth:`Communicator.ensure_same`), so ranks whose
structures, dtypes or shapes differ raise the same
:class:`~commlib.errors.RemoteArgumentError` everywhere, naming the first
path that differs (``['logits']: rank 1 (3, 10), rank 0 (4, 10)``), instead
of pairing mismatched collectives (a hang, or gloo ending the process). A
communicator made with ``strict=False`` skips that round, as it skips every
check.

Every function takes the communicator first (typed ``Any``: the communicator
imports this module).
"""

from __future__ import annotations

import json
import numbers
from collections import defaultdict
from typing import Any

import torch

from commlib import _trees
from commlib import _validation as check
from commlib.errors import RemoteArgumentError
from commlib.reductions import write

_TEXT = (str, bytes)
_NO_ASYNC = "{}: async_op=True takes a tensor; a {} completes before the call returns"


def _number_dtype(value: Any, op: str) -> torch.dtype | None:
    """The dtype a Python number travels in; ``None`` for anything else."""
    if isinstance(value, bool):
        return torch.float64 if op == "mean" else torch.int64
    if isinstance(value, numbers.Integral):
        return torch.float64 if op == "mean" else torch.int64
    if isinstance(value, numbers.Real):
        return torch.float64
    if isinstance(value, numbers.Complex):
        return torch.complex128
    return None


def _as_number(value: torch.Tensor, like: Any, op: str) -> Any:
    """The reduced 0-dim ``value`` as the Python type of the number it came from."""
    item = value.item()
    if isinstance(like, bool) and op in ("band", "bor", "bxor", "min", "max"):
        return bool(item)
    return item


def _mismatch(
    what: str, specs: list[Any], ignore_dim: int | None = None, *, shapes: bool = True
) -> None:
    """Raise, naming the first path where the ranks' ``specs`` (containers, leaves) differ."""
    found = _trees.difference([s[1] for s in specs], ignore_dim, shapes=shapes)
    if found is not None:
        path, shown = found
        raise RemoteArgumentError(
            what,
            {r: f"{_trees.show_path(path)} {text}" for r, text in shown.items()},
            f"ranks passed structures that differ at {_trees.summary(path, shown)}",
        )
    containers = [s[0] for s in specs]
    if any(c != containers[0] for c in containers):
        raise RemoteArgumentError(
            what, dict(enumerate(containers)), "ranks passed structures that differ"
        )


def _agree(comm: Any, what: str, described: Any) -> None:
    """Every rank passes the same ``described`` structure, or all raise naming the path."""
    if comm.strict is False or comm.world_size == 1:
        return
    text = json.dumps(described)
    try:
        comm.ensure_same(what, text)
    except RemoteArgumentError as exc:
        if exc.refused:
            raise
        specs = []
        head = f"{what}("
        for said in exc.failures.values():
            try:
                specs.append(json.loads(said.removeprefix(head)[:-1]))
            except (ValueError, TypeError):
                raise exc from None  # another collective, not a structure: as it was
        _mismatch(
            what, [(s[0], [(p, (k, d, tuple(shape))) for p, k, d, shape in s[1]]) for s in specs]
        )
        raise


def _refuse_agreed(comm: Any, what: str, error: Exception) -> None:
    """Raise ``error``, this rank's own mistake, on every rank: it joins the agreement round."""
    if comm.strict is not False and comm.world_size > 1:
        # every rank that made the same mistake passes; the others raise, refused
        comm.ensure_same(what, f"refused: {error}")
    raise error


def _described(data: Any, kinds: list[tuple[str, str, tuple[int, ...]]]) -> Any:
    paths = [p for p, _ in _trees.leaves(data)]
    return [
        _trees.container_spec(data),
        [[p, k, d, list(s)] for p, (k, d, s) in zip(paths, kinds)],
    ]


def _buckets(tensors: list[torch.Tensor]) -> dict[tuple[torch.dtype, torch.device], list[int]]:
    out: dict[tuple[torch.dtype, torch.device], list[int]] = defaultdict(list)
    for i, t in enumerate(tensors):
        out[(t.dtype, t.device)].append(i)
    return out


def all_reduce(
    comm: Any, data: Any, op: Any, timeout: Any = None, *, async_op: bool = False
) -> Any:
    """Reduce every leaf of ``data`` across ranks; returns the reduced structure.

    Tensors are reduced in place; numbers come back reduced in the result.

    Examples:
        >>> all_reduce(comm, {"n": 2, "loss": torch.tensor(0.5)}, "sum")
        {'n': 2, 'loss': tensor(0.5000)}
    """
    try:
        name, found, work, kinds = _reduced_leaves(comm, data, op, async_op)
    except (ValueError, TypeError) as exc:
        _refuse_agreed(comm, "all_reduce", exc)
    buckets = _buckets(work)
    # which bucket each leaf travels in is part of what the ranks must agree on
    bucket_of = {i: b for b, idx in enumerate(buckets.values()) for i in idx}
    described = _described(data, kinds)
    for i, leaf in enumerate(described[1]):
        leaf[1] = f"{leaf[1]}@{bucket_of[i]}" if len(buckets) > 1 else leaf[1]
    _agree(comm, "all_reduce", described)
    results: list[Any] = [value for _, value in found]
    for indices in buckets.values():
        parts = [work[i] for i in indices]
        flat = torch.cat([comm.plugin.to_device(t).reshape(-1) for t in parts])
        if comm.world_size > 1:
            comm.all_reduce(flat, name, timeout=timeout)
        pos = 0
        for i, t in zip(indices, parts):
            n = t.numel()
            chunk = flat[pos : pos + n].view(t.shape)
            pos += n
            leaf = found[i][1]
            if isinstance(leaf, torch.Tensor):
                if chunk.data_ptr() != leaf.data_ptr():
                    write(leaf, chunk.to(leaf.device))
            else:
                results[i] = _as_number(chunk, leaf, name)
    return _trees.rebuild(data, results) if _trees.is_container(data) else results[0]


def _reduced_leaves(
    comm: Any, data: Any, op: Any, async_op: bool
) -> tuple[str, list[Any], list[torch.Tensor], list[Any]]:
    """The op, the leaves, the tensors they travel as and their descriptions, checked."""
    if async_op:
        raise TypeError(_NO_ASYNC.format("all_reduce", type(data).__name__))
    name = check.reduce_op(op)
    if isinstance(data, _TEXT):
        raise TypeError(f"all_reduce reduces tensors and numbers, not {type(data).__name__}")
    found = _trees.leaves(data)
    work: list[torch.Tensor] = []
    kinds = []
    for path, value in found:
        if isinstance(value, torch.Tensor):
            check.tensor(value, _trees.show_path(path))
            check.reduce_op(name, value)
            work.append(value)
            kinds.append(_trees.leaf_spec(value))
            continue
        dtype = _number_dtype(value, name)
        if dtype is None:
            raise TypeError(
                f"all_reduce reduces tensors and numbers; {_trees.show_path(path)} is "
                f"{type(value).__name__}"
            )
        number = torch.tensor(value, dtype=dtype, device=comm.device)
        check.reduce_op(name, number)
        work.append(number)
        kinds.append((type(value).__name__, str(dtype), ()))
    return name, found, work, kinds


#: what src sends first when its structure holds tensors: the skeleton (``None`` where a
#: tensor is), each tensor's dtype, shape and device kind, and its other values
_PLAN = "commlib.broadcast: src's structure holds tensors"


def broadcast(
    comm: Any, data: Any, src: int, timeout: Any = None, *, async_op: bool = False
) -> Any:
    """``src``'s ``data`` on every rank; tensors are written in place.

    Leaves that are not tensors (numbers, strings, anything picklable) are
    ``src``'s on every rank, in the result; the others may pass anything there.
    A rank other than ``src`` that passes no tensor (``None``, as ignite's
    ``safe_mode``) gets ``src``'s value, its tensors too (new tensors, on
    the communicator's device, or the CPU where ``src``'s are); a rank that
    passes tensors has them written in place, and its structure, dtypes and
    shapes must be ``src``'s (or every rank raises the same
    :class:`~commlib.errors.RemoteArgumentError` naming the path).

    The first round is ``src``'s object (:meth:`Communicator.broadcast_object`):
    its value when it holds no tensor, else the plan of its structure.

    Examples:
        >>> broadcast(comm, {"step": 3, "w": torch.ones(2)}, 0)
        {'step': 3, 'w': tensor([1., 1.])}
    """
    found = _trees.leaves(data)
    tensors = [i for i, (_, v) in enumerate(found) if isinstance(v, torch.Tensor)]
    if async_op:
        _refuse_agreed(
            comm, "broadcast", TypeError(_NO_ASYNC.format("broadcast", type(data).__name__))
        )
    check.rank_in_range(src, comm.world_size, "src")
    if comm.world_size == 1:
        for i in tensors:
            check.tensor(found[i][1], _trees.show_path(found[i][0]))
        return _trees.rebuild(data, [v for _, v in found])
    first: Any = data
    if comm.rank == src and tensors:
        try:
            for i in tensors:
                check.tensor(found[i][1], _trees.show_path(found[i][0]))
        except (ValueError, TypeError) as exc:
            refused = (_PLAN, "refused", f"{type(exc).__name__}: {exc}")
            comm.broadcast_object(refused, src, timeout=timeout)
            raise
        skeleton = _trees.rebuild(
            data, [None if i in tensors else v for i, (_, v) in enumerate(found)]
        )
        specs = {
            i: (str(found[i][1].dtype), list(found[i][1].shape), found[i][1].device.type)
            for i in tensors
        }
        first = (_PLAN, skeleton, specs)
    try:  # src's value, or its plan: the others cannot tell which yet (they may pass None)
        got = comm.broadcast_object(first if comm.rank == src else None, src, timeout=timeout)
    except RemoteArgumentError as exc:
        raise tensor_meets_no_tensor(exc, src) from None
    if not (isinstance(got, tuple) and len(got) == 3 and got[0] == _PLAN):
        return got  # no tensor at src: its object, whatever this rank passed
    if got[1] == "refused":  # (src raised its own error above)
        raise RemoteArgumentError("broadcast", {src: got[2]}, refused=True)
    skeleton, specs = got[1], {int(i): spec for i, spec in got[2].items()}
    if comm.rank != src and not tensors:
        # this rank takes src's value: new tensors where src has them
        data = _trees.rebuild(
            skeleton,
            [
                _fresh(comm, *specs[i]) if i in specs else v
                for i, (_, v) in enumerate(_trees.leaves(skeleton))
            ],
        )
        found = _trees.leaves(data)
        tensors = sorted(specs)
    elif comm.rank != src:
        try:
            for i in tensors:
                check.tensor(found[i][1], _trees.show_path(found[i][0]))
        except (ValueError, TypeError) as exc:
            _refuse_agreed(comm, "broadcast", exc)
    kinds = [
        _trees.leaf_spec(v) if isinstance(v, torch.Tensor) else ("value", "", ()) for _, v in found
    ]
    _agree(comm, "broadcast", [*_described(data, kinds), src])
    values = _trees.leaves(skeleton)
    results: list[Any] = [v if i in specs else values[i][1] for i, (_, v) in enumerate(found)]
    work = [found[i][1] for i in tensors]
    for indices in _buckets(work).values():
        parts = [work[i] for i in indices]
        flat = torch.cat([comm.plugin.to_device(t).reshape(-1) for t in parts])
        comm.broadcast(flat, src, timeout=timeout)
        if comm.rank == src:
            continue
        pos = 0
        for t in parts:
            n = t.numel()
            write(t, flat[pos : pos + n].view(t.shape).to(t.device))
            pos += n
    return _trees.rebuild(data, results)


def tensor_meets_no_tensor(exc: RemoteArgumentError, src: int) -> RemoteArgumentError:
    """``exc`` as every rank words it when ``src`` broadcasts a tensor and some rank passes none.

    The plain tensor broadcast (src's first round is the argument check) met
    a rank whose broadcast took the object path (``None``, or a value): both
    sides see the other's round, and each says so in the same words. Any
    other error comes back unchanged.

    Examples:
        >>> seen = RemoteArgumentError(
        ...     "broadcast", {0: "a checked tensor collective", 1: "another collective"},
        ...     "ranks called different collectives")
        >>> print(tensor_meets_no_tensor(seen, 0))  # doctest: +ELLIPSIS
        broadcast: rank 0 (src) passes a tensor, written in place on every rank, and ...
    """
    said = exc.failures
    if exc.summary == "ranks called different collectives":  # src's side: the check's round
        if said.get(src) != "a checked tensor collective":
            return exc
        tensor_ranks = [r for r, w in said.items() if w == "a checked tensor collective"]
    elif said.get(src) == "collective=another collective" and all(
        w in ("collective=another collective", "collective=broadcast_object_list")
        for w in said.values()
    ):  # the side of the ranks without a tensor: the object round
        tensor_ranks = [r for r, w in said.items() if w == "collective=another collective"]
    else:
        return exc
    others = [r for r in said if r not in tensor_ranks]
    who = ("rank " if len(others) == 1 else "ranks ") + ", ".join(map(str, others))
    text = (
        f"rank {src} (src) passes a tensor, written in place on every rank, and {who} "
        f"{'passes' if len(others) == 1 else 'pass'} no tensor (None, or a value): every "
        "rank passes a tensor of src's shape and dtype as `tensor`; for src's tensor where "
        "a rank has none, use comm.broadcast_object(t if comm.rank == src else None, src), "
        "or broadcast a structure holding it ({'t': t} on src, None elsewhere)"
    )
    failures = {r: "a tensor" if r in tensor_ranks else "no tensor" for r in said}
    error = RemoteArgumentError("broadcast", failures, text)
    error.args = (f"broadcast: {text}",)
    return error


def _fresh(comm: Any, dtype: str, shape: list[int], device_type: str) -> torch.Tensor:
    """An empty tensor like src's: on the CPU where src's is, else on the communicator's device."""
    device = torch.device("cpu") if device_type == "cpu" else comm.device
    kind = getattr(torch, dtype.removeprefix("torch."))
    return torch.empty(shape, dtype=kind, device=device)


def _gathered_specs(
    comm: Any, what: str, data: Any, timeout: Any, refused: Exception | None
) -> list[Any]:
    """Every rank's structure (and its leaves that are not tensors): the first round.

    A rank that ``refused`` its own arguments says so in it instead: every
    rank raises alike.
    """
    found = _trees.leaves(data)
    described: Any = (
        ["refused", f"{type(refused).__name__}: {refused}"]
        if refused is not None
        else [
            _trees.container_spec(data),
            [(p, _trees.leaf_spec(v)) for p, v in found],
            # leaves that are not tensors travel in the spec itself
            {i: v for i, (_, v) in enumerate(found) if not isinstance(v, torch.Tensor)},
        ]
    )
    every = comm.all_gather_object(described, timeout=timeout) if comm.world_size > 1 else []
    said = {r: s[1] for r, s in enumerate(every) if s[0] == "refused"}
    if refused is not None and len(said) == len(every):
        if len(set(said.values())) <= 1:
            raise refused  # every rank made the same mistake: its own error
    if refused is not None or said:
        raise RemoteArgumentError(what, said, refused=True)
    return every or [described]


def all_gather(comm: Any, data: Any, timeout: Any = None) -> list[Any]:
    """Every rank's ``data`` (a list by rank); tensor shapes may differ across ranks.

    Examples:
        >>> all_gather(comm, {"ids": torch.arange(2), "name": "a"})
        [{'ids': tensor([0, 1]), 'name': 'a'}]
    """
    found = _trees.leaves(data)
    if not any(isinstance(v, torch.Tensor) for _, v in found):
        return comm.all_gather_object(data, timeout=timeout)  # nothing to pack: one object round
    refused = None
    try:
        for path, value in found:
            if isinstance(value, torch.Tensor):
                check.tensor(value, _trees.show_path(path))
    except (ValueError, TypeError) as exc:
        refused = exc
    specs = _gathered_specs(comm, "all_gather", data, timeout, refused)
    _mismatch("all_gather", specs, shapes=False)  # shapes may differ, dims may not
    per_rank = _moved(comm, found, specs, timeout)
    return [_trees.rebuild(data, values) for values in per_rank]


def _moved(comm: Any, found: list[Any], specs: list[Any], timeout: Any) -> list[list[Any]]:
    """Every rank's leaves: tensors through one ragged all_gather per bucket."""
    world = len(specs)
    per_rank: list[list[Any]] = [[None] * len(found) for _ in range(world)]
    for r, s in enumerate(specs):
        for i, value in s[2].items():
            per_rank[r][int(i)] = value
    me = comm.rank
    per_rank[me] = [v for _, v in found]  # this rank's own objects, not copies
    tensors = [i for i, (_, v) in enumerate(found) if isinstance(v, torch.Tensor)]
    work = [found[i][1] for i in tensors]
    for indices in _buckets(work).values():
        leaf_ids = [tensors[i] for i in indices]
        flat = torch.cat([comm.plugin.to_device(work[i]).reshape(-1) for i in indices])
        every = comm.all_gather(flat, timeout=timeout) if world > 1 else [flat]
        for r, got in enumerate(every):
            pos = 0
            for i in leaf_ids:
                shape = tuple(specs[r][1][i][1][2])
                n = int(torch.Size(shape).numel())
                like = found[i][1]
                if r != me:
                    per_rank[r][i] = got[pos : pos + n].view(shape).to(like.device)
                pos += n
    return per_rank


def all_gather_cat(comm: Any, data: Any, dim: int = 0, timeout: Any = None) -> Any:
    """Every leaf concatenated along ``dim`` across ranks, in rank order, lengths uneven.

    Each rank's true length is known, so nothing is padded: the last, shorter
    batch of an evaluation loop comes back exactly. Other dims and dtypes
    must match across ranks.

    Examples:
        >>> all_gather_cat(comm, {"pred": torch.arange(3)})
        {'pred': tensor([0, 1, 2])}
    """
    found = _trees.leaves(data)
    refused = None
    try:
        if not isinstance(dim, int) or isinstance(dim, bool):
            raise TypeError(f"dim must be an int, got {type(dim).__name__}")
        for path, value in found:
            where = _trees.show_path(path)
            check.tensor(value, where)
            if value.dim() == 0 or not -value.dim() <= dim < value.dim():
                raise ValueError(
                    f"all_gather_cat concatenates along dim {dim}; {where} has shape "
                    f"{tuple(value.shape)}"
                )
    except (ValueError, TypeError) as exc:
        refused = exc
    specs = _gathered_specs(comm, "all_gather_cat", data, timeout, refused)
    _mismatch("all_gather_cat", specs, ignore_dim=dim)
    per_rank = _moved(comm, found, specs, timeout)
    joined = [torch.cat([values[i] for values in per_rank], dim) for i in range(len(found))]
    return _trees.rebuild(data, joined) if _trees.is_container(data) else joined[0]
