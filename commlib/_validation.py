"""Argument checks shared by the collectives; each raises before anything is sent."""

from __future__ import annotations

from typing import Any, Literal

import torch

from commlib.p2p import p2p_kind

#: one checked op of a batch: its kind, tensor, peer and tag
P2PChecked = tuple[Literal["send", "recv"], torch.Tensor, int, int]

REDUCE_OPS = ("sum", "mean", "product", "min", "max", "band", "bor", "bxor")
_BITWISE = ("band", "bor", "bxor")
# the op names every dtype takes, as callers usually write them
_ANY_DTYPE = {name: name for name in ("sum", "mean", "product")}


def reduce_op(op: Any, tensor: torch.Tensor | None = None) -> str:
    """Normalise a reduce-op name (case-insensitive), checking it fits ``tensor``.

    ``torch.distributed.ReduceOp`` members are accepted too, for code that
    passes them as mmengine allows.

    Examples:
        >>> reduce_op("MEAN")
        'mean'
        >>> reduce_op("avg")
        Traceback (most recent call last):
        ValueError: unknown reduce op 'avg'; expected one of sum, mean, ...
    """
    if type(op) is str:
        found = _ANY_DTYPE.get(op)
        if found is not None:  # the usual names, which fit every dtype: nothing to check
            return found
    name = op
    if not isinstance(op, str):
        # ReduceOp / RedOpType: "RedOpType.SUM" or "ReduceOp.SUM"
        text = str(getattr(op, "name", op)).rsplit(".", 1)[-1].lower()
        name = "mean" if text == "avg" else text
        if name not in REDUCE_OPS:
            raise TypeError(f"op must be a string such as 'sum' or 'mean', got {op!r}")
    name = name.lower()
    if name not in REDUCE_OPS:
        raise ValueError(f"unknown reduce op {op!r}; expected one of {', '.join(REDUCE_OPS)}")
    if (
        tensor is not None
        and name in _BITWISE
        and (tensor.is_floating_point() or tensor.is_complex())
    ):
        raise TypeError(f"op {name!r} needs an integer or bool tensor, got {tensor.dtype}")
    if tensor is not None and name in ("min", "max") and tensor.is_complex():
        raise TypeError(f"op {name!r} has no order to follow in a complex tensor ({tensor.dtype})")
    return name


def tensor(value: Any, what: str = "data") -> torch.Tensor:
    """Check that ``value`` is a tensor.

    Examples:
        >>> tensor([1, 2])
        Traceback (most recent call last):
        TypeError: data must be a torch.Tensor, got list
    """
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{what} must be a torch.Tensor, got {type(value).__name__}")
    if value.layout is not torch.strided or value.is_meta:
        # their own messages come from deep in the engine, after the check's round
        kind = "a meta tensor (no data)" if value.is_meta else f"a {value.layout} tensor"
        raise TypeError(f"{what} must be a dense tensor with data, got {kind}")
    return value


def rank_in_range(value: Any, world_size: int, what: str) -> int:
    """Check that ``value`` is a rank of a group of ``world_size``.

    Examples:
        >>> rank_in_range(2, 2, "dst")
        Traceback (most recent call last):
        ValueError: dst=2 is out of range for a group of 2 ranks (0..1)
    """
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{what} must be an int rank, got {type(value).__name__}")
    if not 0 <= value < world_size:
        raise ValueError(
            f"{what}={value} is out of range for a group of {world_size} ranks "
            f"(0..{world_size - 1})"
        )
    return value


def peer(value: Any, world_size: int, rank: int, what: str) -> int:
    """Check that ``value`` is another rank of the group: the peer of a send or receive.

    Examples:
        >>> peer(0, 2, 0, "dst")
        Traceback (most recent call last):
        ValueError: dst=0 is this rank itself; point-to-point needs another rank
    """
    rank_in_range(value, world_size, what)
    if value == rank:
        raise ValueError(f"{what}={value} is this rank itself; point-to-point needs another rank")
    return value


def tag(value: Any) -> int:
    """Check a point-to-point tag: an int.

    Examples:
        >>> tag("a")
        Traceback (most recent call last):
        TypeError: tag must be an int, got str
    """
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"tag must be an int, got {type(value).__name__}")
    return value


def tensor_list(
    value: Any,
    length: int,
    what: str,
    like: torch.Tensor | None = None,
    on: str | None = None,
) -> list[torch.Tensor]:
    """Check a list of ``length`` tensors (shaped and typed ``like`` it, when given).

    Examples:
        >>> tensor_list([torch.ones(1)], 2, "scatter_list", on="src")
        Traceback (most recent call last):
        ValueError: scatter_list on src needs 2 tensors (one per rank), got 1
    """
    if not isinstance(value, (list, tuple)):
        where = f" on {on}" if on else ""
        raise TypeError(
            f"{what}{where} must be a list of {length} tensors, got {type(value).__name__}"
        )
    if len(value) != length:
        where = f" on {on}" if on else ""
        raise ValueError(f"{what}{where} needs {length} tensors (one per rank), got {len(value)}")
    # names are formatted only for an error: this runs for every tensor of every call
    strided = torch.strided
    shape = dtype = None
    if like is not None:
        shape, dtype = like.shape, like.dtype
    for i, t in enumerate(value):
        if not isinstance(t, torch.Tensor) or t.layout is not strided or t.is_meta:
            tensor(t, f"{what}[{i}]")
        if like is not None and (t.dtype != dtype or t.shape != shape):
            raise ValueError(
                f"{what}[{i}] is {t.dtype} {tuple(t.shape)}; it must be shaped and typed like "
                f"tensor ({dtype} {tuple(like.shape)})"
            )
    return list(value)


def plain_tensor_lists(
    outputs: Any, inputs: Any, length: int, device: torch.device | None = None
) -> tuple[torch.dtype, bool] | None:
    """The one dtype of two lists of ``length`` tensors an engine takes as they are.

    As they are: plain ``torch.Tensor`` (no subclass), dense, on the CPU (or
    on ``device``, an engine's accelerator), contiguous, outside autograd,
    all of one dtype. Returns that dtype and
    whether every tensor has one shape; ``None`` when anything differs (the
    caller then checks the lists with :func:`tensor_list` and
    :func:`same_dtype`, whose errors say what is wrong, and adapts the
    tensors one by one). One loop over both lists, for the call that needs
    no more.

    Examples:
        >>> plain_tensor_lists([torch.ones(2)], [torch.zeros(3)], 1)
        (torch.float32, False)
        >>> print(plain_tensor_lists([torch.ones(2)], [torch.zeros(2, dtype=torch.int64)], 1))
        None
    """
    if (
        type(outputs) not in (list, tuple)
        or type(inputs) not in (list, tuple)
        or len(outputs) != length
        or len(inputs) != length
        or not length
    ):
        return None
    first = inputs[0]
    if type(first) is not torch.Tensor:
        return None
    dtype, shape, one_shape = first.dtype, first.shape, True
    strided = torch.strided
    for tensors in (outputs, inputs):
        for t in tensors:
            if (
                type(t) is not torch.Tensor
                or t.dtype is not dtype
                or not (t.is_cpu if device is None else t.device == device)
                or t.layout is not strided
                or t.requires_grad
                or not t.is_contiguous()
            ):
                return None
            if one_shape and t.shape != shape:
                one_shape = False
    return dtype, one_shape


def same_dtype(tensors: list[torch.Tensor], what: str) -> torch.dtype:
    """Check that ``tensors`` share one dtype (returned).

    Examples:
        >>> same_dtype([torch.ones(1), torch.ones(1, dtype=torch.int64)], "all_to_all")
        Traceback (most recent call last):
        TypeError: all_to_all needs tensors of one dtype, got torch.float32 and torch.int64
    """
    first = tensors[0].dtype
    for t in tensors:  # a loop, not all() over a generator: it runs on every call
        if t.dtype != first:
            break
    else:
        return first
    dtypes = sorted({str(t.dtype) for t in tensors})
    raise TypeError(f"{what} needs tensors of one dtype, got {' and '.join(dtypes)}")


def split_sizes(value: Any, world_size: int, rows: int, what: str) -> list[int] | None:
    """Check ``all_to_all_single`` splits of ``rows`` rows (``None``: equal parts).

    Examples:
        >>> split_sizes([1, 2], 2, 4, "input")
        Traceback (most recent call last):
        ValueError: input_split_sizes [1, 2] sum to 3, but input has 4 rows (dim 0)
    """
    name = f"{what}_split_sizes"
    if value is None:
        if rows % world_size:
            raise ValueError(
                f"{what} has {rows} rows (dim 0), not divisible by world_size {world_size}; "
                f"pass {name}"
            )
        return None
    if not isinstance(value, (list, tuple)) or any(
        isinstance(n, bool) or not isinstance(n, int) for n in value
    ):
        raise TypeError(f"{name} must be a list of ints, got {value!r:.60}")
    sizes = list(value)
    if len(sizes) != world_size:
        raise ValueError(f"{name} needs {world_size} entries (one per rank), got {len(sizes)}")
    if any(n < 0 for n in sizes):
        raise ValueError(f"{name} {sizes} has a negative size")
    if sum(sizes) != rows:
        raise ValueError(f"{name} {sizes} sum to {sum(sizes)}, but {what} has {rows} rows (dim 0)")
    return sizes


def self_pair(sends: int, expects: int, me: int) -> None:
    """Check the one pair of all_to_all_single a rank alone can see: rows to itself.

    A checked call raises it after its check's round: raised before it on
    this rank alone, the ranks would part.

    Examples:
        >>> self_pair(2, 3, 0)
        Traceback (most recent call last):
        ...
        ValueError: all_to_all_single: rank 0 sends itself 2 rows of input but expects 3 ...
    """
    if sends != expects:
        raise ValueError(
            f"all_to_all_single: rank {me} sends itself {sends} rows of input but "
            f"expects {expects} rows of output from itself"
        )


def reduce_scatter_input(output: torch.Tensor, input: Any, world_size: int) -> torch.Tensor | None:
    """``reduce_scatter``'s ``input`` as one flat tensor, checked against ``output``.

    ``input`` is a tensor of ``world_size`` x ``output``'s elements, or a list
    of ``world_size`` tensors shaped like ``output``; ``None`` for a list of
    tensors of different shapes (the caller reduces those its own way).

    Examples:
        >>> reduce_scatter_input(torch.zeros(2), [torch.ones(2), torch.ones(2)], 2)
        tensor([1., 1., 1., 1.])
        >>> reduce_scatter_input(torch.zeros(2), torch.ones(3), 2)
        Traceback (most recent call last):
        ...
        ValueError: input has 3 elements; reduce_scatter needs world_size (2) x output's 2
    """
    if isinstance(input, torch.Tensor):
        if input.numel() != output.numel() * world_size:
            raise ValueError(
                f"input has {input.numel()} elements; reduce_scatter needs world_size "
                f"({world_size}) x output's {output.numel()}"
            )
        flat = input if input.dim() == 1 else input.reshape(-1)
    elif isinstance(input, (list, tuple)):
        if len(input) != world_size:
            raise ValueError(f"reduce_scatter needs {world_size} input tensors, got {len(input)}")
        for t in input:
            tensor(t, "input[i]")
        if any(t.shape != input[0].shape for t in input):
            return None
        for t in input:
            if t.shape != output.shape:
                raise ValueError(
                    f"each input tensor must be shaped like output {tuple(output.shape)}, "
                    f"got {tuple(t.shape)}"
                )
        flat = torch.cat([t.reshape(-1) for t in input])
    else:
        raise TypeError(
            f"input must be a torch.Tensor or a list of them, got {type(input).__name__}"
        )
    if flat.dtype != output.dtype:
        raise TypeError(f"input dtype {flat.dtype} differs from output dtype {output.dtype}")
    return flat


def gathered_output(output: Any, like: torch.Tensor, world_size: int, what: str) -> torch.Tensor:
    """``output`` if it holds ``world_size`` x ``like``'s elements, in ``like``'s dtype.

    Examples:
        >>> gathered_output(torch.zeros(4), torch.ones(2), 2, "gather_into_tensor").shape
        torch.Size([4])
        >>> gathered_output(torch.zeros(3), torch.ones(2), 2, "gather_into_tensor")
        Traceback (most recent call last):
        ...
        ValueError: gather_into_tensor: the output has 3 elements; it needs world_size (2) x 2
    """
    out = tensor(output, "output")
    if out.numel() != like.numel() * world_size:
        raise ValueError(
            f"{what}: the output has {out.numel()} elements; it needs world_size "
            f"({world_size}) x {like.numel()}"
        )
    if out.dtype != like.dtype:
        raise TypeError(f"{what}: output dtype {out.dtype} differs from tensor dtype {like.dtype}")
    return out


def p2p_batch(p2p_op_list: Any, world_size: int, rank: int) -> list[P2PChecked]:
    """Check ``batch_isend_irecv``'s list: each op's ``(kind, tensor, peer, tag)``.

    A ``P2POp``'s ``group_peer`` (torch's peer within the group), where set,
    is its peer.

    Examples:
        >>> from commlib.p2p import P2POp
        >>> p2p_batch([P2POp(commlib.isend, torch.ones(1), 1)], 2, 0)
        [('send', tensor([1.]), 1, 0)]
        >>> p2p_batch([], 2, 0)
        Traceback (most recent call last):
        ...
        ValueError: batch_isend_irecv needs a non-empty list of P2POp
    """
    if not isinstance(p2p_op_list, (list, tuple)) or not p2p_op_list:
        raise ValueError("batch_isend_irecv needs a non-empty list of P2POp")
    checked: list[P2PChecked] = []
    for i, op in enumerate(p2p_op_list):
        if not all(hasattr(op, a) for a in ("op", "tensor", "peer", "tag")):
            raise TypeError(f"p2p_op_list[{i}] is not a P2POp: {op!r:.60}")
        kind = p2p_kind(op.op)
        tensor(op.tensor, f"p2p_op_list[{i}].tensor")
        group_peer = getattr(op, "group_peer", None)
        peer_rank = op.peer if group_peer is None else group_peer
        peer(peer_rank, world_size, rank, f"p2p_op_list[{i}].peer")
        tag(op.tag)
        checked.append((kind, op.tensor, peer_rank, op.tag))
    return checked
