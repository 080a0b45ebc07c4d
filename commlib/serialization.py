"""Object serialization strategies: object <-> (small header, raw buffers).

A :class:`Serializer` turns a Python object into a :class:`Payload`: a small
``header`` (bytes) and a list of ``buffers`` (1-D ``uint8`` tensors, on any
device). The object collectives in :mod:`commlib._objects` move payloads between
ranks and hand the receiver the same header and buffers: each buffer a 1-D
``uint8`` tensor on the communicator's device (small payloads that completed in
the first round may arrive in host memory instead). ``loads`` moves each buffer
to where its data belongs and rebuilds the object.

Strategies here:

* :class:`OutOfBandSerializer` (the default): pickle protocol 5 with numpy
  arrays, tensors and large byte strings out of band, rebuilt over the
  received memory;
* :class:`RestrictedSerializer`: the same wire format, but loads only an
  allow-list of classes (safe with untrusted peers);
* :class:`PickleSerializer`: everything in one pickle stream (what
  torch.distributed does), for comparison and for exotic objects.

Each backend picks its default strategy (``Backend.serializer()``); a user can
pass another one to a :class:`~commlib.Communicator` or to a single call.
"""

from __future__ import annotations

import abc
import io
import pickle
import struct
import warnings
from collections.abc import Callable, Iterable, Sequence
from typing import Any, NamedTuple

import numpy as np
import torch

# the restricted loading's parts; its public names stay importable from here
from commlib._restricted import RefusedClassError as RefusedClassError
from commlib._restricted import RefusedRemoteClassError as RefusedRemoteClassError
from commlib._restricted import RestrictingUnpickler, qualname_of
from commlib._restricted import torch_safe_names as torch_safe_names


class Payload(NamedTuple):
    """What a serializer produces: ``header`` bytes and raw ``buffers``.

    Examples:
        >>> p = PickleSerializer().dumps({"a": 1})
        >>> type(p.header), p.buffers
        (<class 'bytes'>, [])
    """

    header: bytes
    buffers: list[torch.Tensor]


class Serializer(abc.ABC):
    """The strategy interface: ``dumps(obj) -> Payload``, ``loads(header, buffers)``.

    ``dumps`` may return buffers on any device. ``loads`` receives ``header``
    as a bytes-like object and ``buffers`` as 1-D ``uint8`` tensors in the
    order ``dumps`` produced them, each on the communicator's device or in
    host memory; it moves each one to where it belongs and may keep views of
    them in the returned object.

    Examples:
        >>> s = PickleSerializer()
        >>> s.loads(*s.dumps([1, 2]))
        [1, 2]
    """

    name: str = ""

    @abc.abstractmethod
    def dumps(self, obj: Any) -> Payload:
        """Serialize ``obj``."""

    @abc.abstractmethod
    def loads(self, header: bytes | memoryview, buffers: list[torch.Tensor]) -> Any:
        """Rebuild the object ``dumps`` produced ``header`` and ``buffers`` from."""

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r}>"


class PickleSerializer(Serializer):
    """Plain pickle, everything in the header (what torch.distributed does).

    Examples:
        >>> PickleSerializer().dumps(3).buffers
        []
    """

    name = "pickle"

    def __init__(self, protocol: int = pickle.HIGHEST_PROTOCOL):
        self.protocol = protocol

    def dumps(self, obj: Any) -> Payload:
        return Payload(pickle.dumps(obj, protocol=self.protocol), [])

    def loads(self, header: bytes | memoryview, buffers: list[torch.Tensor]) -> Any:
        return pickle.loads(header)


# -- the out-of-band wire format ------------------------------------------------------
#
# header = pickle stream | kinds | splice offsets | footer
#
# * the pickle stream (protocol 5) refers to out-of-band buffers with
#   NEXT_BUFFER; ``kinds`` has one byte per such buffer: HOST (its data lives in
#   host memory: numpy arrays, CPU tensors, foreign PickleBuffers) or DEVICE (a
#   tensor on an accelerator: it travels there and lands on the receiver's
#   device of that type);
# * large chunks the C pickler writes verbatim (bytes, bytearray, str payloads)
#   are cut out of the stream and sent as buffers of their own, "spliced" back
#   in at the recorded stream offsets when reading: the C pickler hands such
#   chunks to ``write()`` as the original objects, so cutting them out costs no
#   copy and no per-object Python call.
#
# Payload.buffers = out-of-band buffers, then spliced chunks.

_FOOTER = struct.Struct("<II")  # number of out-of-band buffers, number of splices
HOST, DEVICE = 0, 1
SPLICE_BYTES = 1 << 18  # chunks of the pickle stream at least this big travel apart

# every dtype whose values are plain bytes (quantized ones carry a quantizer)
_TORCH_DTYPES = {
    str(d).removeprefix("torch."): d
    for d in vars(torch).values()
    if isinstance(d, torch.dtype) and not str(d).startswith("torch.q")
}
_DTYPE_NAMES = {d: n for n, d in _TORCH_DTYPES.items()}
# numpy dtype kinds whose items are plain bytes (no Python object pointers)
_PLAIN_KINDS = frozenset("biufcmMSUV")


# read-only data up to this size is copied rather than viewed (see uint8_view)
_COPY_READONLY_UP_TO = 64 << 10


def uint8_view(data: Any) -> torch.Tensor:
    """A 1-D ``uint8`` tensor over the memory of ``data`` (bytes-like), without a copy.

    Read-only memory (``bytes``) is accepted: commlib only ever reads it. Small
    read-only data is copied (torch warns on a read-only buffer, and silencing
    that warning per call costs more than the copy).

    Examples:
        >>> uint8_view(b"ab")
        tensor([97, 98], dtype=torch.uint8)
    """
    mv = memoryview(data)
    if mv.nbytes == 0:
        return torch.empty(0, dtype=torch.uint8)
    if mv.readonly and mv.nbytes <= _COPY_READONLY_UP_TO:
        # a copy of a small header costs less than catch_warnings() does
        return torch.frombuffer(bytearray(mv), dtype=torch.uint8)
    if mv.readonly:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the buffer is only ever read
            return torch.frombuffer(mv, dtype=torch.uint8)
    return torch.frombuffer(mv, dtype=torch.uint8)


def _dense_strides(shape: Sequence[int], stride: Sequence[int]) -> bool:
    """Whether the elements fill a block of memory with no gaps or overlaps."""
    expect = 1
    for st, n in sorted((st, n) for n, st in zip(shape, stride) if n != 1):
        if st != expect:
            return False
        expect *= n
    return True


_current_device_lookup: Callable[[str], torch.device | None] | None = None


def set_current_device_lookup(lookup: Callable[[str], torch.device | None]) -> None:
    """Say how :func:`landing_device` finds the current device of a device type.

    ``lookup(device_type)`` returns the device the backend serving that type
    calls current, or None when no backend serves it. The backend registry
    sets it when it is imported (this module never imports the registry,
    which imports the backends, which import this module).

    Examples:
        >>> set_current_device_lookup(lambda device_type: None)   # doctest: +SKIP
    """
    global _current_device_lookup
    _current_device_lookup = lookup


def landing_device(device_type: str) -> torch.device:
    """The receiver's current device of ``device_type`` (never the sender's index).

    The backend that serves the device type says which device is current;
    without one, torch's module for the device type does.

    Examples:
        >>> landing_device("cpu")
        device(type='cpu')
        >>> landing_device("cuda")          # after torch.cuda.set_device(1)  # doctest: +SKIP
        device(type='cuda', index=1)
    """
    if device_type == "cpu":
        return torch.device("cpu")
    # set by commlib.plugins, which ``import commlib`` imports before this is called
    lookup = _current_device_lookup
    found = lookup(device_type) if lookup is not None else None
    if found is not None:
        return found
    try:
        module = torch.get_device_module(device_type)
        return torch.device(device_type, module.current_device())
    except (RuntimeError, AttributeError, ValueError):
        return torch.device(device_type)


def _aligned(raw: torch.Tensor, itemsize: int) -> torch.Tensor:
    """``raw`` if its memory can be viewed as items of ``itemsize`` bytes, else a copy."""
    if itemsize > 1 and (raw.storage_offset() % itemsize or raw.data_ptr() % itemsize):
        return raw.clone()
    return raw


def _rebuild_tensor(
    buf: Any,
    dtype: str,
    shape: tuple[int, ...],
    stride: tuple[int, ...] | None,
    device_type: str,
    requires_grad: bool,
    parameter: bool,
    state: dict | None,
) -> torch.Tensor:
    """Rebuild a tensor over a received buffer (a uint8 numpy array or tensor)."""
    dt = _TORCH_DTYPES[dtype]
    raw = torch.from_numpy(buf) if isinstance(buf, np.ndarray) else buf
    if not isinstance(raw, torch.Tensor) or raw.dtype != torch.uint8 or raw.dim() != 1:
        raise pickle.UnpicklingError("a tensor's buffer must be a 1-D uint8 tensor")
    target = landing_device(device_type)
    if raw.device != target:
        raw = raw.to(target)
    if raw.numel():
        data = _aligned(raw, dt.itemsize).view(dt)
    else:  # an empty buffer may carry any stride; nothing to view
        data = torch.empty(0, dtype=dt, device=target)
    t = data.view(shape) if stride is None else data.as_strided(shape, stride)
    if parameter:
        t = torch.nn.Parameter(t, requires_grad=requires_grad)
    elif requires_grad:
        t.requires_grad_(True)
    if state:
        t.__dict__.update(state)
    return t


def _rebuild_array(buf: Any, dtype: Any, shape: tuple[int, ...], order: str) -> np.ndarray:
    """Rebuild a numpy array over a received buffer (a uint8 numpy array)."""
    if isinstance(buf, torch.Tensor):
        buf = buf.cpu().numpy()
    if not isinstance(buf, np.ndarray) or buf.dtype != np.uint8 or buf.ndim != 1:
        raise pickle.UnpicklingError("an array's buffer must be a 1-D uint8 array")
    dt = np.dtype(dtype)
    if buf.ctypes.data % dt.alignment:
        buf = buf.copy()
    return buf.view(dt).reshape(shape, order=order)


class _Sink:
    """The pickler's output file: small writes are kept, large chunks become splices."""

    __slots__ = ("chunks", "size", "spliced", "splices")

    def __init__(self) -> None:
        self.chunks: list[bytes] = []
        self.size = 0
        self.splices: list[int] = []
        self.spliced: list[torch.Tensor] = []

    def write(self, data: Any) -> int:
        n = len(data)
        # any chunk may be cut out (the reader splices it back in); only large
        # ones are worth a buffer of their own
        if n >= SPLICE_BYTES:
            self.splices.append(self.size)
            self.spliced.append(uint8_view(data))
        else:
            self.chunks.append(data)
            self.size += n
        return n


class _Pickler(pickle.Pickler):
    """Pickle protocol 5; arrays and tensors become out-of-band uint8 buffers."""

    def __init__(self, file: _Sink):
        super().__init__(file, protocol=5, buffer_callback=self._take)
        self.buffers: list[torch.Tensor] = []
        self.kinds = bytearray()
        # placeholder PickleBuffer id -> (placeholder, buffer, kind); the
        # placeholder is kept alive until pickle hands it to _take
        self._pending: dict[int, tuple[Any, torch.Tensor, int]] = {}

    def _take(self, pb: pickle.PickleBuffer) -> None:
        entry = self._pending.pop(id(pb), None)
        if entry is None:  # a PickleBuffer from some class's own __reduce_ex__
            try:
                raw = pb.raw()
            except BufferError:  # not contiguous: the only case that needs a copy
                raw = memoryview(bytes(pb))
            self.buffers.append(uint8_view(raw))
            self.kinds.append(HOST)
        else:
            self.buffers.append(entry[1])
            self.kinds.append(entry[2])

    def _placeholder(self, buf: torch.Tensor, kind: int) -> pickle.PickleBuffer:
        # writable, so pickle emits NEXT_BUFFER without READONLY_BUFFER
        pb = pickle.PickleBuffer(bytearray())
        self._pending[id(pb)] = (pb, buf, kind)
        return pb

    def reducer_override(self, obj: Any) -> Any:
        # called for every object that is not a builtin scalar or container
        cls = type(obj)
        if cls is np.ndarray:
            return self._reduce_array(obj)
        if cls is torch.Tensor or cls is torch.nn.Parameter:
            return self._reduce_tensor(obj)
        return NotImplemented

    def _reduce_array(self, arr: np.ndarray) -> Any:
        dt = arr.dtype
        if dt.hasobject or dt.kind not in _PLAIN_KINDS or dt.itemsize == 0:
            return NotImplemented
        if arr.flags.c_contiguous:
            order, flat = "C", arr.reshape(-1)
        elif arr.flags.f_contiguous:
            order, flat = "F", arr.reshape(-1, order="F")
        else:  # a view with gaps: send only its own elements
            order, flat = "C", np.ascontiguousarray(arr).reshape(-1)
        simple = dt.fields is None and dt.subdtype is None and dt.metadata is None
        buf = self._placeholder(uint8_view(flat.view(np.uint8)), HOST)
        return _rebuild_array, (buf, dt.str if simple else dt, arr.shape, order)

    def _reduce_tensor(self, t: torch.Tensor) -> Any:
        if (
            t.layout != torch.strided
            or t.is_quantized
            or t.is_nested
            or t.device.type == "meta"
            or t.dtype not in _DTYPE_NAMES
        ):
            return NotImplemented
        data = t.detach()
        if data.is_conj():
            data = data.resolve_conj()
        if data.is_neg():
            data = data.resolve_neg()
        stride = None
        if data.is_contiguous():
            flat = data.as_strided((data.numel(),), (1,))  # size-1 dims may carry any stride
        elif _dense_strides(data.shape, data.stride()):
            # e.g. a transpose or channels_last: its own block of memory, sent as is
            flat = data.as_strided((data.numel(),), (1,))
            stride = data.stride()
        else:  # a view with gaps: send only its own elements
            flat = data.contiguous().reshape(-1)
        kind = HOST if data.device.type == "cpu" else DEVICE
        if flat.numel():
            raw = flat.view(torch.uint8)
        else:  # an empty tensor may carry any stride, which view() refuses
            raw = torch.empty(0, dtype=torch.uint8, device=data.device)
        buf = self._placeholder(raw, kind)
        state = t.__dict__ or None
        return _rebuild_tensor, (
            buf,
            _DTYPE_NAMES[t.dtype],
            tuple(t.shape),
            stride,
            t.device.type,
            t.requires_grad,
            type(t) is torch.nn.Parameter,
            state,
        )


class _Reader:
    """A read-only file over byte pieces (the stream with its spliced chunks)."""

    def __init__(self, pieces: Iterable[Any]):
        self._pieces = [memoryview(p).cast("B") for p in pieces if len(p)]
        self._i = 0
        self._pos = 0

    def readinto(self, out: Any) -> int:
        out = memoryview(out).cast("B")
        done = 0
        while done < len(out) and self._i < len(self._pieces):
            piece = self._pieces[self._i]
            n = min(len(out) - done, len(piece) - self._pos)
            out[done : done + n] = piece[self._pos : self._pos + n]
            done += n
            self._pos += n
            if self._pos == len(piece):
                self._i, self._pos = self._i + 1, 0
        return done

    def read(self, n: int = -1) -> bytes:
        if n is None or n < 0:
            n = sum(len(p) for p in self._pieces[self._i :]) - self._pos
        if self._i < len(self._pieces) and self._pos + n < len(self._pieces[self._i]):
            # within one piece (every frame of the stream is): one copy
            start, self._pos = self._pos, self._pos + n
            return bytes(self._pieces[self._i][start : self._pos])
        out = bytearray(n)
        return bytes(out[: self.readinto(out)])

    def readline(self) -> bytes:
        line = bytearray()
        while self._i < len(self._pieces):
            piece = self._pieces[self._i]
            end = bytes(piece[self._pos :]).find(b"\n")
            stop = len(piece) if end < 0 else self._pos + end + 1
            line += piece[self._pos : stop]
            self._pos = stop
            if self._pos == len(piece):
                self._i, self._pos = self._i + 1, 0
            if end >= 0:
                break
        return bytes(line)


def _host_view(buf: torch.Tensor) -> np.ndarray:
    return (buf if buf.device.type == "cpu" else buf.cpu()).numpy()


class OutOfBandSerializer(Serializer):
    """Pickle protocol 5 with arrays, tensors and large byte strings out of band.

    * numpy arrays and tensors of every dtype travel as raw ``uint8`` buffers
      holding only their own elements (a view of a larger storage sends just
      the view); contiguous data is sent straight from its memory;
    * on receipt they are rebuilt over the received memory, without a copy
      when it is aligned for their dtype;
    * a tensor on an accelerator travels on the device and lands on the
      receiver's current device of that type; CPU tensors and numpy arrays
      land on the CPU; ``requires_grad`` and ``nn.Parameter`` survive;
    * ``bytes``, ``bytearray`` and ``str`` payloads of 256 KiB or more are cut
      out of the pickle stream and travel as buffers of their own.

    Loading runs pickle: use :class:`RestrictedSerializer` with untrusted peers.

    Examples:
        >>> s = OutOfBandSerializer()
        >>> header, buffers = s.dumps({"w": torch.ones(2, 3)})
        >>> [b.numel() for b in buffers]
        [24]
        >>> s.loads(header, buffers)["w"].shape
        torch.Size([2, 3])
    """

    name = "pickle5"

    def dumps(self, obj: Any) -> Payload:
        sink = _Sink()
        pickler = _Pickler(sink)
        pickler.dump(obj)
        trailer = bytes(pickler.kinds)
        if sink.splices:
            trailer += struct.pack(f"<{len(sink.splices)}Q", *sink.splices)
        trailer += _FOOTER.pack(len(pickler.buffers), len(sink.splices))
        sink.chunks.append(trailer)
        return Payload(b"".join(sink.chunks), pickler.buffers + sink.spliced)

    def _parse(
        self, header: bytes | memoryview, buffers: Sequence[torch.Tensor]
    ) -> tuple[memoryview, list[Any], list[int], Sequence[torch.Tensor]]:
        mv = memoryview(header).cast("B")
        end = len(mv) - _FOOTER.size
        n_oob, n_splice = _FOOTER.unpack_from(mv, end)
        if n_oob + n_splice != len(buffers):
            raise pickle.UnpicklingError(
                f"the header names {n_oob + n_splice} buffers but {len(buffers)} arrived"
            )
        end -= 8 * n_splice
        splices = list(struct.unpack_from(f"<{n_splice}Q", mv, end)) if n_splice else []
        end -= n_oob
        kinds = mv[end : end + n_oob]
        oob = [_host_view(b) if k == HOST else b for b, k in zip(buffers[:n_oob], kinds.tolist())]
        return mv[:end], oob, splices, buffers[n_oob:]

    def _file(self, stream: memoryview, splices: list[int], spliced: Sequence) -> _Reader:
        pieces, last = [], 0
        for at, buf in zip(splices, spliced):
            pieces += [stream[last:at], _host_view(buf)]
            last = at
        pieces.append(stream[last:])
        return _Reader(pieces)

    def loads(self, header: bytes | memoryview, buffers: list[torch.Tensor]) -> Any:
        stream, oob, splices, spliced = self._parse(header, buffers)
        if not splices:
            return pickle.loads(stream, buffers=oob)
        return pickle.Unpickler(self._file(stream, splices, spliced), buffers=oob).load()


_SAFE_NAMES = frozenset(
    {
        *(
            f"builtins.{n}"
            for n in (
                "bool int float complex str bytes bytearray list tuple dict set frozenset "
                "slice range"
            ).split()
        ),
        "collections.OrderedDict",
        "collections.defaultdict",
        "collections.deque",
        "collections.Counter",
        "torch.Size",
        "torch.device",
        *(f"torch.{name}" for name in _TORCH_DTYPES),
        *(
            f"{core}.{n}"
            for core in ("numpy.core", "numpy._core")
            for n in ("multiarray._reconstruct", "multiarray.scalar", "numeric._frombuffer")
        ),
        "numpy.dtype",
        "numpy.ndarray",
        f"{__name__}._rebuild_tensor",
        f"{__name__}._rebuild_array",
    }
)


class RestrictedSerializer(OutOfBandSerializer):
    """The out-of-band format, loading only an allow-list: safe with untrusted peers.

    Loads builtin containers and scalars (plus ``collections.OrderedDict``,
    ``defaultdict``, ``deque``, ``Counter``), numpy arrays, scalars and dtypes,
    torch tensors, dtypes, devices and sizes, and whatever ``allow`` names:
    classes or functions as ``"module.QualName"`` strings or the objects
    themselves, or whole modules as ``"module.*"``. Anything else is refused
    with :class:`RefusedClassError` naming it, before it can run.

    With ``torch_safe_globals=True`` it also loads what torch's
    ``weights_only`` loading allows: whatever ``torch.serialization.add_safe_globals``
    added (read at each load), the builtin exceptions and ``traceback``'s stack
    summaries. That is what ``weights_only=True`` on an object collective
    selects (:func:`object_serializer`).

    Args:
        allow: extra classes / functions / modules that may be loaded.
        torch_safe_globals: also load torch's safe globals (see above).

    Examples:
        >>> s = RestrictedSerializer(allow=["mypkg.metrics.Summary"])
        >>> s.loads(*s.dumps({"acc": np.ones(3)}))["acc"]
        array([1., 1., 1.])
        >>> s.loads(*s.dumps(os.system))
        Traceback (most recent call last):
        ...
        commlib.serialization.RefusedClassError: refusing to load 'posix.system': ...
    """

    name = "restricted"

    def __init__(
        self, allow: Iterable[str | type | Any] = (), *, torch_safe_globals: bool = False
    ):
        names = {item if isinstance(item, str) else qualname_of(item) for item in allow}
        self.allowed = frozenset(n for n in names if not n.endswith(".*"))
        self.allowed_modules = frozenset(n[:-2] for n in names if n.endswith(".*"))
        self.torch_safe_globals = torch_safe_globals

    def loads(self, header: bytes | memoryview, buffers: list[torch.Tensor]) -> Any:
        stream, oob, splices, spliced = self._parse(header, buffers)
        file = self._file(stream, splices, spliced) if splices else io.BytesIO(stream)
        allowed = self.allowed | torch_safe_names() if self.torch_safe_globals else self.allowed
        return RestrictingUnpickler(file, oob, allowed, self.allowed_modules, _SAFE_NAMES).load()

    def weights_only(self) -> RestrictedSerializer:
        """This serializer as ``weights_only=True`` uses it: torch's safe globals allowed too.

        Examples:
            >>> RestrictedSerializer(allow=["mypkg.Summary"]).weights_only()
            <RestrictedSerializer allow=['mypkg.Summary'] +torch safe globals>
        """
        if self.torch_safe_globals:
            return self
        kept = self.__dict__.get("_weights_only")
        if kept is None:
            kept = object.__new__(type(self))
            kept.__dict__.update(self.__dict__, torch_safe_globals=True)
            self.__dict__["_weights_only"] = kept
        return kept

    def __repr__(self) -> str:
        extra = sorted(self.allowed | {f"{m}.*" for m in self.allowed_modules})
        torch_too = " +torch safe globals" if self.torch_safe_globals else ""
        return f"<{type(self).__name__} allow={extra}{torch_too}>"


_WEIGHTS_ONLY = RestrictedSerializer(torch_safe_globals=True)


def object_serializer(
    serializer: Serializer | None, default: Serializer, weights_only: bool = False
) -> Serializer:
    """The serializer an object collective uses: ``serializer``, else the communicator's.

    ``weights_only=True`` (torch 2.14's argument, on every torch here) loads
    only tensors and allowed types: the restricted loading, with torch's safe
    globals allowed too. A :class:`RestrictedSerializer` given (or the
    communicator's) keeps its own allow-list; any other serializer given with
    it is a ``ValueError``, raised before anything is sent.

    Examples:
        >>> object_serializer(None, OutOfBandSerializer()).name
        'pickle5'
        >>> object_serializer(None, OutOfBandSerializer(), weights_only=True)
        <RestrictedSerializer allow=[] +torch safe globals>
        >>> object_serializer(PickleSerializer(), OutOfBandSerializer(), weights_only=True)
        Traceback (most recent call last):
        ...
        ValueError: weights_only=True loads with a RestrictedSerializer, ...
    """
    chosen = serializer or default
    if not weights_only:
        return chosen
    if isinstance(chosen, RestrictedSerializer):
        return chosen.weights_only()
    if serializer is not None:
        raise ValueError(
            "weights_only=True loads with a RestrictedSerializer, not with "
            f"serializer={serializer!r}: pass RestrictedSerializer(allow=[...]) or no serializer"
        )
    return _WEIGHTS_ONLY


def default_serializer() -> Serializer:
    """The strategy backends use unless they choose their own.

    Examples:
        >>> default_serializer().name
        'pickle5'
    """
    return OutOfBandSerializer()
