"""Nested structures of tensors: their leaves by path, rebuilt, described, compared.

A structure is a tensor, a Python value, or a dict (any ``Mapping``), list,
tuple or namedtuple of structures, to any depth: what evaluation loops hold.
The collectives on structures (:mod:`commlib._nested`) flatten it into leaves
with their paths (``['logits']``, ``[0]``, ``.boxes``), move the leaves, and
rebuild the same containers around the results. Dict keys are visited in
sorted order (insertion order where the keys cannot be sorted), so ranks that
built the same dict in different orders agree.

When ranks pass structures that differ, every rank has every rank's
description (:func:`spec`), and :func:`difference` names the first path
where they differ: ``['logits']: rank 1 (3, 10), rank 0 (4, 10)``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

Path = str
#: one leaf's description: its kind ("tensor" or a type name), dtype and shape
LeafSpec = tuple[str, str, tuple[int, ...]]


def is_container(value: Any) -> bool:
    """Whether ``value`` is a container the structure collectives walk into.

    Examples:
        >>> is_container({"a": 1}), is_container((1, 2)), is_container("ab")
        (True, True, False)
    """
    return isinstance(value, (Mapping, list, tuple))


def _keys(mapping: Mapping) -> list[Any]:
    try:
        return sorted(mapping)
    except TypeError:  # keys of mixed types: the order they were inserted in
        return list(mapping)


def _is_namedtuple(value: Any) -> bool:
    return isinstance(value, tuple) and hasattr(type(value), "_fields")


def leaves(data: Any, path: Path = "") -> list[tuple[Path, Any]]:
    """Every leaf of ``data`` with its path, in a fixed order.

    Examples:
        >>> leaves({"b": [1, 2], "a": torch.zeros(1)})
        [("['a']", tensor([0.])), ("['b'][0]", 1), ("['b'][1]", 2)]
    """
    out: list[tuple[Path, Any]] = []
    _walk(data, path, out)
    return out


def _walk(data: Any, path: Path, out: list[tuple[Path, Any]]) -> None:
    if isinstance(data, Mapping):
        for k in _keys(data):
            _walk(data[k], f"{path}[{k!r}]", out)
    elif _is_namedtuple(data):
        for name, item in zip(type(data)._fields, data):
            _walk(item, f"{path}.{name}", out)
    elif isinstance(data, (list, tuple)):
        for i, item in enumerate(data):
            _walk(item, f"{path}[{i}]", out)
    else:
        out.append((path, data))


def rebuild(data: Any, values: list[Any]) -> Any:
    """``data``'s containers around ``values`` (its leaves' replacements, in :func:`leaves` order).

    Dicts keep their type and their own key order; tuples and namedtuples are
    made anew, lists and dicts too (the caller's are left as they were).

    Examples:
        >>> rebuild({"b": [1, 2], "a": 0}, [10, 20, 30])
        {'b': [20, 30], 'a': 10}
    """
    slots: dict[Path, Any] = dict(zip((p for p, _ in leaves(data)), values))
    return _build(data, "", slots.__getitem__)


def _build(data: Any, path: Path, leaf: Callable[[Path], Any]) -> Any:
    if isinstance(data, Mapping):
        items = {k: _build(v, f"{path}[{k!r}]", leaf) for k, v in data.items()}
        try:
            return type(data)(items)  # type: ignore[call-arg]
        except TypeError:  # a mapping type without a dict constructor (defaultdict, ...)
            return items
    if _is_namedtuple(data):
        names = type(data)._fields
        return type(data)(*(_build(v, f"{path}.{n}", leaf) for n, v in zip(names, data)))
    if isinstance(data, (list, tuple)):
        items_ = [_build(v, f"{path}[{i}]", leaf) for i, v in enumerate(data)]
        return items_ if isinstance(data, list) else type(data)(items_)
    return leaf(path)


def container_spec(data: Any) -> str:
    """The containers of ``data`` without their leaves: equal on ranks whose structures match.

    Examples:
        >>> container_spec({"a": [1, 2]})
        "dict{'a': list[_, _]}"
    """
    if isinstance(data, Mapping):
        inner = ", ".join(f"{k!r}: {container_spec(data[k])}" for k in _keys(data))
        return f"{type(data).__name__}{{{inner}}}"
    if isinstance(data, (list, tuple)):
        inner = ", ".join(container_spec(v) for v in data)
        return f"{type(data).__name__}[{inner}]"
    return "_"


def leaf_spec(value: Any) -> LeafSpec:
    """What a leaf is: ``("tensor", dtype, shape)``, or its type's name.

    Examples:
        >>> leaf_spec(torch.zeros(2, 3)), leaf_spec(1.5)
        (('tensor', 'torch.float32', (2, 3)), ('float', '', ()))
    """
    if isinstance(value, torch.Tensor):
        return ("tensor", str(value.dtype), tuple(value.shape))
    return (type(value).__name__, "", ())


def spec(data: Any) -> list[tuple[Path, LeafSpec]]:
    """Every leaf's path and description: what ranks compare.

    Examples:
        >>> spec({"x": torch.zeros(2)})
        [("['x']", ('tensor', 'torch.float32', (2,)))]
    """
    return [(p, leaf_spec(v)) for p, v in leaves(data)]


def show_path(path: Path) -> str:
    """A path as messages show it (the whole structure is ``data``).

    Examples:
        >>> show_path("['a'][0]"), show_path("")
        ("['a'][0]", 'data')
    """
    return path or "data"


def difference(
    specs: list[list[tuple[Path, Any]]],
    ignore_dim: int | None = None,
    *,
    shapes: bool = True,
) -> tuple[Path, dict[int, str]] | None:
    """The first path where ranks' specs differ and what each rank has there; ``None`` if none.

    ``ignore_dim`` leaves that dim of tensor shapes out of the comparison (a
    concatenation along it); ``shapes=False`` compares only the number of
    dims (a gather of uneven tensors). Each rank's entry shows the fields
    that differ: the shape alone where only shapes differ.

    Examples:
        >>> a = spec({"logits": torch.zeros(4, 10)})
        >>> b = spec({"logits": torch.zeros(3, 10)})
        >>> difference([a, b])
        ("['logits']", {0: '(4, 10)', 1: '(3, 10)'})
    """
    tables = [dict(s) for s in specs]
    order: list[Path] = []
    seen: set[Path] = set()
    for s in specs:
        for p, _ in s:
            if p not in seen:
                seen.add(p)
                order.append(p)
    for p in order:
        got = [t.get(p) for t in tables]
        keys = [_compared(g, ignore_dim, shapes) for g in got]
        if all(k == keys[0] for k in keys):
            continue
        return p, {r: _shown(g, got) for r, g in enumerate(got)}
    return None


def _compared(leaf: Any, ignore_dim: int | None, shapes: bool) -> Any:
    if leaf is None or leaf[0] != "tensor":
        return leaf
    kind, dtype, shape = leaf
    shape = tuple(shape)
    if not shapes:
        return (kind, dtype, len(shape))
    if ignore_dim is None:
        return (kind, dtype, shape)
    if not shape:
        return leaf
    dim = ignore_dim % len(shape) if -len(shape) <= ignore_dim < len(shape) else None
    if dim is None:
        return leaf
    return (kind, dtype, len(shape), shape[:dim] + shape[dim + 1 :])


def _shown(leaf: Any, every: list[Any]) -> str:
    if leaf is None:
        return "missing"
    kind, dtype, shape = leaf
    present = [g for g in every if g is not None]
    if kind != "tensor":
        return kind
    if all(g[0] == "tensor" and g[1] == dtype for g in present):
        return str(tuple(shape))
    return f"{dtype.removeprefix('torch.')} {tuple(shape)}"


def summary(path: Path, shown: dict[int, str]) -> str:
    """``['logits']: rank 1 (3, 10), rank 0 (4, 10)``: who holds what, rank 0's group last.

    Examples:
        >>> summary("['x']", {0: "(4,)", 1: "(3,)", 2: "(4,)"})
        "['x']: rank 1 (3,), ranks 0, 2 (4,)"
    """
    groups: dict[str, list[int]] = {}
    for r, text in sorted(shown.items()):
        groups.setdefault(text, []).append(r)
    ordered = sorted(groups.items(), key=lambda item: (0 in item[1], item[1][0]))
    parts = [
        f"{'rank' if len(rs) == 1 else 'ranks'} {', '.join(map(str, rs))} {text}"
        for text, rs in ordered
    ]
    return f"{show_path(path)}: {', '.join(parts)}"
