"""Hypothesis strategies for what object collectives carry, and an exact comparison.

For commlib's own tests and for plugin authors checking their serializer or
transport: :func:`tensors` and :func:`arrays` draw every dtype and layout
(0-dim, 0-size, transposed, sliced views of larger storages, expanded,
``requires_grad``, ``nn.Parameter``, conjugate views), with arbitrary bit
patterns (NaN, inf, subnormals); :func:`picklable_objects` nests them in
builtin containers with strings, bytes, big ints and special floats.
:func:`assert_same` compares two such objects exactly.

Needs ``hypothesis`` (``pip install commlib[test]``).

Examples:
    >>> from hypothesis import given
    >>> from commlib.serialization import RestrictedSerializer
    >>> @given(picklable_objects())
    ... def test_round_trip(obj):
    ...     s = RestrictedSerializer()
    ...     assert_same(s.loads(*s.dumps(obj)), obj)
"""

from __future__ import annotations

import math
import struct
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from hypothesis import strategies as st

from commlib.dtypes import byte_view

__all__ = [
    "NUMPY_DTYPES",
    "TORCH_DTYPES",
    "arrays",
    "assert_same",
    "picklable_objects",
    "same",
    "tensors",
]


def _torch_dtypes() -> tuple[list[torch.dtype], list[torch.dtype]]:
    """(dtypes torch can copy and slice, dtypes it can only hold contiguously)."""
    full, packed = [], []
    for dtype in sorted({v for v in vars(torch).values() if isinstance(v, torch.dtype)}, key=str):
        if str(dtype).startswith("torch.q"):  # quantized: values need a quantizer
            continue
        t = torch.zeros(64, dtype=torch.uint8).view(dtype)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # "ComplexHalf support is experimental"
                t[::2].contiguous()
            full.append(dtype)
        except Exception:  # sub-byte dtypes have no copy kernels
            packed.append(dtype)
    return full, packed


def _conjugable(dtype: torch.dtype) -> bool:
    """Whether torch can resolve a conjugate view of ``dtype`` (2.14's bcomplex32 cannot)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.zeros(2, dtype=dtype).conj().resolve_conj()
        return True
    except Exception:
        return False


_FULL_DTYPES, _PACKED_DTYPES = _torch_dtypes()
_CONJUGABLE = {d for d in _FULL_DTYPES if d.is_complex and _conjugable(d)}
TORCH_DTYPES: tuple[torch.dtype, ...] = tuple(_FULL_DTYPES + _PACKED_DTYPES)
"""Every torch dtype whose values are plain bytes (all but the quantized ones)."""

NUMPY_DTYPES: tuple[np.dtype, ...] = tuple(
    np.dtype(d)
    for d in (
        "?",
        "i1",
        "u1",
        "<i2",
        "<u2",
        "<i4",
        ">i4",
        "<u4",
        "<i8",
        "<u8",
        "<f2",
        "<f4",
        ">f8",
        "<f8",
        "<c8",
        "<c16",
        "<M8[ns]",
        "<m8[s]",
        "S5",
        "<U3",
        [("a", "<i4"), ("b", "<f8")],
    )
)
"""numpy dtypes :func:`arrays` draws from: every kind, both byte orders, structured."""

_GRAD_DTYPES = {torch.float16, torch.bfloat16, torch.float32, torch.float64}
_GRAD_DTYPES |= {torch.complex64, torch.complex128}


def _numel(shape: Sequence[int]) -> int:
    return math.prod(shape)


@st.composite
def _bits(draw: Any, nbytes: int) -> bytearray:
    """``nbytes`` arbitrary bytes: random when few, a drawn pattern repeated when many.

    Hypothesis draws from a bounded buffer; large arrays repeat a pattern.
    """
    if nbytes <= 128:
        return bytearray(draw(st.binary(min_size=nbytes, max_size=nbytes)))
    seed = draw(st.binary(min_size=1, max_size=32))
    return bytearray((seed * (nbytes // len(seed) + 1))[:nbytes])


_SHAPES = st.lists(st.integers(0, 5), min_size=0, max_size=4).map(tuple)


@st.composite
def tensors(
    draw: Any,
    dtypes: Sequence[torch.dtype] | None = None,
    max_elements: int = 64,
    large: bool = True,
) -> torch.Tensor:
    """Tensors of any dtype, shape and layout, holding arbitrary bit patterns.

    Layouts: contiguous, transposed (dense but permuted), sliced with gaps
    from a larger storage, expanded (overlapping), conjugate views of complex
    tensors; 0-dim and 0-size shapes. Floating tensors may require grad or be
    ``nn.Parameter``. ``large`` sometimes draws a tensor of tens of KiB, so
    payloads exceed a collective's first-round slot.

    Examples:
        >>> from hypothesis import given
        >>> @given(tensors(dtypes=[torch.bfloat16]))
        ... def test_bf16(t):
        ...     assert t.dtype == torch.bfloat16
    """
    dtype = draw(st.sampled_from(list(dtypes or TORCH_DTYPES)))
    if large and draw(st.integers(0, 15)) == 0:
        shape: tuple[int, ...] = (draw(st.integers(1000, 6000)),)
    else:
        shape = draw(_SHAPES.filter(lambda s: _numel(s) <= max_elements))
    packed = dtype in _PACKED_DTYPES
    layout = (
        "contiguous"
        if packed
        else draw(st.sampled_from(["contiguous", "transposed", "sliced", "expanded", "offset"]))
    )
    # the base holds more than the result when the layout is a view into it
    base_shape = list(shape)
    if layout == "sliced" and shape:
        base_shape = [2 * n + 1 for n in shape]
    itemsize = dtype.itemsize
    count = _numel(base_shape) + (3 if layout == "offset" else 0)
    raw = draw(_bits(count * itemsize))
    if dtype == torch.bool:  # only 0 and 1 are valid bools
        raw = bytearray(b & 1 for b in raw)
    flat = (
        torch.frombuffer(raw, dtype=torch.uint8).view(dtype)
        if raw
        else torch.empty(0, dtype=dtype)
    )
    if layout == "offset":
        t = flat[3:].view(base_shape)
    else:
        t = flat.view(base_shape)
    if layout == "transposed" and t.dim() >= 2:
        t = t.transpose(0, -1).contiguous().transpose(0, -1)
    elif layout == "sliced" and shape:
        t = t[tuple(slice(1, None, 2) for _ in shape)]
    elif layout == "expanded" and t.dim() >= 1 and t.shape[0] == 1:
        t = t.expand(3, *t.shape[1:])
    elif layout == "expanded":
        t = t.unsqueeze(0).expand(2, *t.shape)
    if dtype in _CONJUGABLE and draw(st.booleans()):
        t = t.conj()
    if dtype in _GRAD_DTYPES:
        grad = draw(st.sampled_from(["none", "requires_grad", "parameter"]))
        if grad == "parameter":
            t = torch.nn.Parameter(t.detach().clone(), requires_grad=draw(st.booleans()))
        elif grad == "requires_grad":
            t = t.detach().requires_grad_(True)
    return t


@st.composite
def arrays(
    draw: Any,
    dtypes: Sequence[np.dtype] | None = None,
    max_elements: int = 64,
    large: bool = True,
) -> np.ndarray:
    """numpy arrays of any plain dtype and layout, holding arbitrary bit patterns.

    Layouts: C order, Fortran order, strided views with gaps (including
    negative strides) into larger arrays; 0-dim and 0-size shapes;
    read-only arrays. ``large`` sometimes draws an array of tens of KiB.

    Examples:
        >>> from hypothesis import given
        >>> @given(arrays())
        ... def test_arrays(a):
        ...     assert isinstance(a, np.ndarray)
    """
    dtype = draw(st.sampled_from(list(dtypes or NUMPY_DTYPES)))
    if large and draw(st.integers(0, 15)) == 0:
        shape: tuple[int, ...] = (draw(st.integers(1000, 6000)),)
    else:
        shape = draw(_SHAPES.filter(lambda s: _numel(s) <= max_elements))
    layout = draw(st.sampled_from(["C", "F", "strided", "reversed"]))
    base_shape = [2 * n + 1 for n in shape] if layout == "strided" else list(shape)
    raw = draw(_bits(_numel(base_shape) * dtype.itemsize))
    if dtype.kind == "b":
        raw = bytearray(b & 1 for b in raw)
    a = np.frombuffer(raw, dtype=np.uint8).view(dtype).reshape(base_shape)
    if layout == "F":
        a = np.asfortranarray(a)
    elif layout == "strided" and shape:
        a = a[tuple(slice(1, None, 2) for _ in shape)]
    elif layout == "reversed" and a.ndim:
        a = a[::-1]
    if draw(st.booleans()):
        a = a.copy()
    else:
        a.flags.writeable = False
    return a


def _large_bytes() -> st.SearchStrategy[Any]:
    # big enough to leave the pickle stream as a buffer of its own
    return st.builds(
        lambda n, b, kind: kind(bytes([b]) * n),
        st.integers(1 << 18, (1 << 18) + 64),
        st.integers(0, 255),
        st.sampled_from([bytes, bytearray]),
    )


def _scalars() -> st.SearchStrategy[Any]:
    return st.one_of(
        st.none(),
        st.booleans(),
        st.integers(),  # unbounded: big ints too
        st.integers(-(2**200), 2**200),
        st.floats(allow_nan=True, allow_infinity=True),
        st.complex_numbers(allow_nan=True, allow_infinity=True),
        st.text(max_size=20),
        st.binary(max_size=40),
    )


_KEYS = st.one_of(st.text(max_size=8), st.integers(-5, 1 << 70), st.binary(max_size=4))


def picklable_objects(
    leaves: st.SearchStrategy[Any] | None = None, max_leaves: int = 12
) -> st.SearchStrategy[Any]:
    """Nested dicts, lists, tuples, sets of scalars, strings, bytes, arrays and tensors.

    Args:
        leaves: what sits at the leaves; by default scalars (``None``, bools,
            big ints, floats with NaN and inf, complex, str, bytes), numpy
            arrays, tensors and now and then a large ``bytes`` / ``bytearray``.
        max_leaves: rough bound on the number of leaves.

    Examples:
        >>> from hypothesis import given
        >>> from commlib.serialization import OutOfBandSerializer
        >>> @given(picklable_objects())
        ... def test_round_trip(obj):
        ...     s = OutOfBandSerializer()
        ...     assert_same(s.loads(*s.dumps(obj)), obj)
    """
    if leaves is None:
        leaves = st.one_of(
            _scalars(),
            tensors(),
            arrays(),
            st.integers(0, 30).flatmap(lambda n: _large_bytes() if n == 0 else st.none()),
        )
    hashable = st.one_of(_KEYS, st.none())
    return st.recursive(
        leaves,
        lambda children: st.one_of(
            st.lists(children, max_size=4),
            st.lists(children, max_size=4).map(tuple),
            st.dictionaries(_KEYS, children, max_size=4),
            st.sets(hashable, max_size=4),
            st.frozensets(hashable, max_size=4),
        ),
        max_leaves=max_leaves,
    )


# -- exact comparison -------------------------------------------------------------------
def _float_same(a: float, b: float) -> bool:
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return struct.pack("<d", a) == struct.pack("<d", b)  # tells 0.0 from -0.0


def _tensor_bytes(t: torch.Tensor) -> bytes:
    t = t.detach().resolve_conj().resolve_neg().cpu()
    if not t.numel():
        return b""
    return byte_view(t.contiguous()).numpy().tobytes()


def _diff(a: Any, b: Any, path: str) -> str | None:
    """Where and how ``a`` and ``b`` differ, or ``None`` when they are the same."""
    if type(a) is not type(b):
        return f"{path}: type {type(a).__name__} != {type(b).__name__}"
    if isinstance(a, torch.Tensor):
        for what in ("dtype", "shape", "requires_grad"):
            if getattr(a, what) != getattr(b, what):
                return f"{path}: {what} {getattr(a, what)} != {getattr(b, what)}"
        if a.device.type != b.device.type:
            return f"{path}: device {a.device} != {b.device}"
        if _tensor_bytes(a) != _tensor_bytes(b):
            return f"{path}: tensor values differ"
        return None
    if isinstance(a, np.ndarray):
        if a.dtype != b.dtype or a.shape != b.shape:
            return f"{path}: array {a.dtype}{a.shape} != {b.dtype}{b.shape}"
        if a.dtype.hasobject:
            return _diff(a.tolist(), b.tolist(), path)
        if a.tobytes() != b.tobytes():
            return f"{path}: array values differ"
        return None
    if isinstance(a, float):
        return None if _float_same(a, b) else f"{path}: {a!r} != {b!r}"
    if isinstance(a, complex):
        same_parts = _float_same(a.real, b.real) and _float_same(a.imag, b.imag)
        return None if same_parts else f"{path}: {a!r} != {b!r}"
    if isinstance(a, dict):
        if list(a) != list(b):
            return f"{path}: keys {list(a)!r} != {list(b)!r}"
        for k in a:
            found = _diff(a[k], b[k], f"{path}[{k!r}]")
            if found:
                return found
        return None
    if isinstance(a, (list, tuple)):
        if len(a) != len(b):
            return f"{path}: length {len(a)} != {len(b)}"
        for i, (x, y) in enumerate(zip(a, b)):
            found = _diff(x, y, f"{path}[{i}]")
            if found:
                return found
        return None
    if isinstance(a, np.generic):
        same_scalar = a.dtype == b.dtype and a.tobytes() == b.tobytes()
        return None if same_scalar else f"{path}: {a!r} != {b!r}"
    return None if a == b else f"{path}: {a!r} != {b!r}"


def same(a: Any, b: Any) -> bool:
    """Whether ``a`` and ``b`` are exactly the same value, as :func:`assert_same` decides.

    Examples:
        >>> same({"x": float("nan")}, {"x": float("nan")})
        True
        >>> same(torch.ones(2), torch.ones(2, dtype=torch.float64))
        False
    """
    return _diff(a, b, "obj") is None


def assert_same(a: Any, b: Any) -> None:
    """Assert ``a`` and ``b`` are exactly the same value; the message says where not.

    Exact means: the same types all the way down (``bytes`` is not
    ``bytearray``, ``nn.Parameter`` is not ``Tensor``); dicts with the same
    keys in the same order; floats bit for bit, except that any NaN equals any
    NaN; tensors and arrays with the same dtype, shape, ``requires_grad`` and
    device type, and the same bytes (so NaN payloads and ``-0.0`` count).
    Strides are not compared: a view may arrive as a compact copy.

    Examples:
        >>> assert_same([1.0, -0.0], [1.0, 0.0])
        Traceback (most recent call last):
        AssertionError: obj[1]: -0.0 != 0.0
    """
    found = _diff(a, b, "obj")
    if found:
        raise AssertionError(found)
