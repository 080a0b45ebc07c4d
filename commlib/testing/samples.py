"""Objects the conformance kit sends around, and an equality that understands them.

:func:`fixed_objects` is a deterministic set covering what the design promises
to round-trip exactly (containers, numpy arrays and tensors of many dtypes,
shapes and strides, large buffers). :func:`drawn_objects` adds examples from
the hypothesis strategies in :mod:`commlib.testing.strategies` when that module
and hypothesis are importable. :func:`register_objects` is the hook for more.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from commlib.dtypes import byte_view

_extra_sources: list[Callable[[], list[Any]]] = []


@dataclasses.dataclass
class Record:
    """A user class with tensors inside, importable by every rank."""

    name: str
    values: torch.Tensor
    meta: dict


def fixed_objects() -> list[Any]:
    """A deterministic list of objects every serializer must round-trip exactly.

    Examples:
        >>> len(fixed_objects()) > 20
        True
    """
    gen = torch.Generator().manual_seed(0)
    rng = np.random.default_rng(0)
    big = torch.randint(0, 256, (300_000,), dtype=torch.uint8, generator=gen)
    return [
        None,
        True,
        0,
        -(2**70),
        3.5,
        float("inf"),
        float("nan"),
        1 + 2j,
        "",
        "ünïcödé ✓",
        b"",
        bytes(range(256)) * 400,  # 100 KB: beyond a first-round slot
        bytearray(b"abc"),
        [1, [2, [3, []]]],
        (1, "two", 3.0),
        {"a": 1, 2: "b", (3, 4): [5]},
        {1, 2, 3},
        frozenset({"x"}),
        range(3, 9, 2),
        np.arange(6, dtype=np.float32).reshape(2, 3),
        np.zeros((0, 4), dtype=np.int64),
        np.array(7, dtype=np.int16),
        np.array([True, False]),
        rng.standard_normal((5, 4))[:, ::2],  # non-contiguous
        np.arange(4, dtype=np.complex64),
        np.float64(2.5),
        torch.arange(12, dtype=torch.float32).reshape(3, 4),
        torch.arange(12, dtype=torch.float32).reshape(3, 4).t(),  # non-contiguous
        torch.tensor(3.25, dtype=torch.float64),  # 0-dim
        torch.empty(0, 3),
        torch.tensor([1.5, -2.0], dtype=torch.bfloat16),
        torch.tensor([1.5, -2.0], dtype=torch.float16),
        torch.tensor([True, False, True]),
        torch.tensor([1 + 2j, 3 - 4j], dtype=torch.complex64),
        torch.tensor([-7, 8], dtype=torch.int8),
        torch.tensor([1, 2, 3], dtype=torch.int16),
        big,
        {"weights": torch.ones(2, 2), "step": 3, "array": np.ones(3)},
        Record("r", torch.arange(3), {"k": [np.int32(1)]}),
        *[obj for source in _extra_sources for obj in source()],
    ]


def register_objects(source: Callable[[], list[Any]]) -> None:
    """Add objects to :func:`fixed_objects` (``source`` must be importable by the ranks).

    Examples:
        >>> register_objects(lambda: [MyConfig()])   # for the whole process  # doctest: +SKIP
    """
    _extra_sources.append(source)


def drawn_objects(count: int = 25, seed: int = 0) -> list[Any]:
    """Up to ``count`` objects drawn from :mod:`commlib.testing.strategies` (deterministic).

    Returns ``[]`` when hypothesis or the strategies module is missing.

    Examples:
        >>> len(drawn_objects(5)) <= 5
        True
    """
    try:
        from hypothesis import HealthCheck, given, settings

        from commlib.testing import strategies
    except ImportError:
        return []
    strategy = _strategy(strategies)
    if strategy is None:
        return []
    drawn: list[Any] = []

    @settings(
        max_examples=count,
        derandomize=True,
        database=None,
        deadline=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(strategy)
    def collect(obj: Any) -> None:
        drawn.append(obj)

    collect()
    return drawn[:count]


def _strategy(module: Any) -> Any:
    # the strategies module is written alongside the serializer; take its
    # broadest strategy under whichever name it settled on
    for name in ("picklable_objects", "objects", "payloads", "any_objects"):
        factory = getattr(module, name, None)
        if callable(factory):
            return factory()
    return None


def deep_equal(a: Any, b: Any) -> bool:
    """Exact equality for nested containers of arrays, tensors and plain objects.

    The same types all the way down (``nn.Parameter`` is not ``Tensor``);
    tensors and arrays with the same dtype, shape and values (NaN equals NaN),
    tensors also with the same ``requires_grad`` and device type; dataclasses
    field by field.

    Examples:
        >>> deep_equal({"x": torch.ones(2)}, {"x": torch.ones(2)})
        True
        >>> deep_equal(torch.ones(2), torch.ones(2, dtype=torch.float64))
        False
    """
    if type(a) is not type(b):
        return False
    if isinstance(a, torch.Tensor):
        if (a.dtype, a.shape, a.requires_grad, a.device.type) != (
            b.dtype,
            b.shape,
            b.requires_grad,
            b.device.type,
        ):
            return False
        return _values_equal(a.detach().cpu(), b.detach().cpu())
    if isinstance(a, np.ndarray):
        if a.dtype != b.dtype or a.shape != b.shape:
            return False
        if a.dtype.hasobject:
            return deep_equal(a.tolist(), b.tolist())
        return a.tobytes() == b.tobytes()
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(deep_equal(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return list(a) == list(b) and all(deep_equal(a[k], b[k]) for k in a)
    if dataclasses.is_dataclass(a):
        return all(
            deep_equal(getattr(a, f.name), getattr(b, f.name)) for f in dataclasses.fields(a)
        )
    if isinstance(a, float) and math.isnan(a):
        return math.isnan(b)
    if isinstance(a, complex) and (math.isnan(a.real) or math.isnan(a.imag)):
        return repr(a) == repr(b)
    return bool(a == b)


def _values_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    # compare bytes: every dtype has them, NaN payloads and -0.0 included
    a, b = a.resolve_conj().resolve_neg().contiguous(), b.resolve_conj().resolve_neg().contiguous()
    return byte_view(a).cpu().numpy().tobytes() == byte_view(b).cpu().numpy().tobytes()
