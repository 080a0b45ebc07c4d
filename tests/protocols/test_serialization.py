"""Serializer strategies in one process: exact round trips, out-of-band buffers, safety."""

from __future__ import annotations

import collections
import fractions
import os
import pickle

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings

from commlib.plugins import list_backends, resolve_backend
from commlib.serialization import (
    OutOfBandSerializer,
    PickleSerializer,
    RefusedClassError,
    RestrictedSerializer,
    default_serializer,
    landing_device,
)
from commlib.testing.strategies import (
    TORCH_DTYPES,
    arrays,
    assert_same,
    picklable_objects,
    same,
    tensors,
)

PROPERTY = settings(
    max_examples=120,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def serializers():
    """Every registered backend's serializer, plus the restricted one."""
    found = {info.name: resolve_backend(info.name).serializer() for info in list_backends()}
    found["restricted"] = RestrictedSerializer()
    return found


def round_trip(ser, obj):
    header, buffers = ser.dumps(obj)
    assert isinstance(header, bytes)
    assert all(b.dtype == torch.uint8 and b.dim() == 1 for b in buffers)
    return ser.loads(header, buffers)


def test_backends_default_to_out_of_band():
    assert isinstance(default_serializer(), OutOfBandSerializer)
    assert isinstance(resolve_backend("gloo").serializer(), OutOfBandSerializer)


@PROPERTY
@given(picklable_objects())
def test_round_trip_every_serializer(obj):
    for name, ser in serializers().items():
        try:
            assert_same(round_trip(ser, obj), obj)
        except AssertionError as exc:
            raise AssertionError(f"{name}: {exc}") from exc


@PROPERTY
@given(tensors())
def test_round_trip_tensors(t):
    for ser in serializers().values():
        assert_same(round_trip(ser, t), t)


@PROPERTY
@given(arrays())
def test_round_trip_arrays(a):
    for ser in serializers().values():
        assert_same(round_trip(ser, a), a)


@pytest.mark.parametrize("dtype", TORCH_DTYPES, ids=str)
def test_every_dtype_0dim_and_0size(dtype):
    ser = OutOfBandSerializer()
    one = torch.arange(16, dtype=torch.uint8)[: dtype.itemsize].view(dtype).reshape(())
    empty = torch.empty(0, dtype=torch.uint8).view(dtype).reshape(0, 3)
    for t in (one, empty):
        assert_same(round_trip(ser, t), t)


def test_tensors_and_arrays_travel_out_of_band_from_their_own_memory():
    t = torch.arange(1000, dtype=torch.float32)
    a = np.arange(1000, dtype=np.float64)
    header, buffers = OutOfBandSerializer().dumps({"t": t, "a": a})
    assert len(header) < 400
    assert [b.numel() for b in buffers] == [4000, 8000]
    assert buffers[0].data_ptr() == t.data_ptr()
    assert buffers[1].data_ptr() == a.ctypes.data


def test_a_view_sends_only_its_own_elements():
    storage = torch.arange(10_000, dtype=torch.float64)
    window = storage[100:110]
    gaps = storage.view(100, 100)[::10, ::10]
    transposed = storage.view(100, 100).T
    arr = np.arange(10_000, dtype=np.int32)[5000:5010]
    ser = OutOfBandSerializer()
    _, buffers = ser.dumps([window, gaps, transposed, arr])
    assert [b.numel() for b in buffers] == [80, 800, 80_000, 40]
    assert buffers[0].data_ptr() == window.data_ptr()  # a dense view is not copied
    back = round_trip(ser, [window, gaps, transposed, arr])
    assert_same(back, [window, gaps, transposed, arr])
    assert back[2].stride() == transposed.stride()  # dense permuted layouts survive


def test_received_tensors_and_arrays_are_views_of_the_received_memory():
    ser = OutOfBandSerializer()
    header, buffers = ser.dumps([torch.ones(8, dtype=torch.float64), np.ones(8)])
    received = [b.clone() for b in buffers]
    t, a = ser.loads(header, received)
    assert t.data_ptr() == received[0].data_ptr()
    assert a.ctypes.data == received[1].data_ptr()
    assert a.flags.writeable


def test_misaligned_buffers_are_copied_not_misread():
    ser = OutOfBandSerializer()
    value = torch.arange(12, dtype=torch.float64).view(torch.complex128)
    header, (buf,) = ser.dumps(value)
    blob = torch.zeros(buf.numel() + 1, dtype=torch.uint8)
    blob[1:].copy_(buf)
    back = ser.loads(header, [blob[1:]])
    assert_same(back, value)
    assert back.data_ptr() % 16 == 0


def test_parameters_grad_and_attributes_survive():
    ser = OutOfBandSerializer()
    p = torch.nn.Parameter(torch.randn(3))
    frozen = torch.nn.Parameter(torch.randn(2), requires_grad=False)
    leaf = torch.randn(2, requires_grad=True)
    nonleaf = leaf * 2
    tagged = torch.zeros(2)
    tagged.note = "keep me"
    back = round_trip(ser, [p, frozen, leaf, nonleaf, tagged])
    assert type(back[0]) is torch.nn.Parameter and back[0].requires_grad
    assert type(back[1]) is torch.nn.Parameter and not back[1].requires_grad
    assert back[2].requires_grad and back[2].is_leaf
    assert back[3].requires_grad and back[3].is_leaf  # sent as data, arrives as a leaf
    assert torch.equal(back[3].detach(), nonleaf.detach())
    assert back[4].note == "keep me"


def test_identity_within_one_object_is_kept():
    t = torch.ones(3)
    a, b = round_trip(OutOfBandSerializer(), [t, t])
    assert a is b


@pytest.mark.parametrize("kind", [bytes, bytearray, str])
def test_large_strings_leave_the_pickle_stream(kind):
    big = kind(b"x" * (1 << 20)) if kind is not str else "é" * (1 << 19)
    obj = {"small": b"abc", "big": big, "after": [1, 2]}
    ser = OutOfBandSerializer()
    header, buffers = ser.dumps(obj)
    assert len(header) < 200
    assert [b.numel() for b in buffers] == [1 << 20]
    if kind is not str:
        assert buffers[0].data_ptr() == torch.frombuffer(big, dtype=torch.uint8).data_ptr()
    for ser in serializers().values():
        assert_same(round_trip(ser, obj), obj)


class Blob:
    """A class that hands pickle its memory as a PickleBuffer, like numpy does."""

    def __init__(self, data):
        self.data = data

    def __reduce_ex__(self, protocol):
        return (_make_blob, (pickle.PickleBuffer(self.data), type(self.data)))


def _make_blob(buf, kind):
    return Blob(kind(buf))


@pytest.mark.parametrize("kind", [bytes, bytearray])
def test_foreign_pickle_buffers_travel_out_of_band(kind):
    blob = Blob(kind(range(200)) * 50)
    header, buffers = OutOfBandSerializer().dumps(blob)
    assert [b.numel() for b in buffers] == [10_000]
    back = OutOfBandSerializer().loads(header, buffers)
    assert type(back.data) is kind and back.data == blob.data
    masked = np.ma.masked_array(np.arange(50.0), mask=np.arange(50) % 2)
    back = round_trip(OutOfBandSerializer(), masked)
    assert np.array_equal(back.mask, masked.mask) and np.array_equal(back.data, masked.data)


def test_object_arrays_and_scalars_use_plain_pickle():
    obj = [np.array([1, "a", None], dtype=object), np.float32(2.5), np.datetime64("2024-01-02")]
    assert_same(round_trip(OutOfBandSerializer(), obj), obj)


def test_unpicklable_objects_fail_in_dumps():
    with pytest.raises((pickle.PicklingError, AttributeError, TypeError)):
        OutOfBandSerializer().dumps({"f": lambda x: x})


def test_header_and_buffers_must_match():
    ser = OutOfBandSerializer()
    header, buffers = ser.dumps([torch.ones(2), torch.ones(3)])
    with pytest.raises(pickle.UnpicklingError, match="names 2 buffers but 1 arrived"):
        ser.loads(header, buffers[:1])


def test_landing_device_is_the_receivers_current_device(monkeypatch):
    assert landing_device("cpu") == torch.device("cpu")
    # a receiver whose current CUDA device is 3: a tensor sent from cuda:0 lands on cuda:3
    monkeypatch.setattr(torch.accelerator, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)
    assert landing_device("cuda") == torch.device("cuda", 3)


def test_tensors_are_rebuilt_where_landing_device_says(monkeypatch):
    import commlib.serialization as serialization

    asked = []

    def landing(device_type):
        asked.append(device_type)
        return torch.device("meta")  # stands in for "some other device than the buffer's"

    ser = OutOfBandSerializer()
    header, buffers = ser.dumps({"t": torch.ones(3, dtype=torch.bfloat16), "a": np.ones(2)})
    monkeypatch.setattr(serialization, "landing_device", landing)
    back = ser.loads(header, buffers)
    assert asked == ["cpu"]
    assert back["t"].device.type == "meta" and back["t"].dtype == torch.bfloat16
    assert isinstance(back["a"], np.ndarray)  # numpy arrays always land in host memory


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_tensor_lands_on_the_receivers_current_device():
    ser = OutOfBandSerializer()
    t = torch.arange(6.0, device="cuda:0")
    header, buffers = ser.dumps({"t": t, "cpu": torch.ones(2)})
    assert buffers[0].device.type == "cuda"
    # the transport hands buffers over on the communicator's device: CPU for gloo
    back = ser.loads(header, [b.cpu() for b in buffers])
    assert back["t"].device == torch.device("cuda", torch.cuda.current_device())
    assert back["cpu"].device.type == "cpu"
    assert torch.equal(back["t"].cpu(), t.cpu())


# -- the restricted serializer ------------------------------------------------------------
class Evil:
    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (os.system, (f"touch {self.path}",))


class Point:
    def __init__(self, x, y):
        self.x, self.y = x, y

    def __eq__(self, other):
        return type(other) is Point and (self.x, self.y) == (other.x, other.y)


def test_restricted_refuses_code_that_would_run(tmp_path):
    target = tmp_path / "pwned"
    header, buffers = RestrictedSerializer().dumps({"payload": Evil(target)})
    with pytest.raises(RefusedClassError, match="system") as info:
        RestrictedSerializer().loads(header, buffers)
    assert info.value.qualname in ("posix.system", "os.system", "nt.system")
    assert not target.exists()
    # the same payload really would run the command under plain pickle
    OutOfBandSerializer().loads(header, buffers)
    assert target.exists()


def test_restricted_names_the_refused_class():
    with pytest.raises(RefusedClassError, match=r"test_serialization\.Point"):
        RestrictedSerializer().loads(*RestrictedSerializer().dumps([Point(1, 2)]))


@pytest.mark.parametrize("allow", [f"{__name__}.Point", Point, f"{__name__}.*"])
def test_restricted_loads_what_the_user_allows(allow):
    ser = RestrictedSerializer(allow=[allow])
    assert round_trip(ser, [Point(1, 2)]) == [Point(1, 2)]
    with pytest.raises(RefusedClassError, match="Fraction"):
        round_trip(ser, fractions.Fraction(1, 3))


def test_restricted_loads_the_safe_defaults():
    obj = {
        "od": collections.OrderedDict(a=1),
        "dd": collections.defaultdict(list, a=[1]),
        "counter": collections.Counter("aab"),
        "deque": collections.deque([1, 2]),
        "misc": [frozenset({1}), {2}, complex(1, 2), bytearray(b"x"), slice(1, 2), range(3)],
        "torch": [torch.float16, torch.Size([2, 3]), torch.device("cpu"), torch.ones(2)],
        "numpy": [np.float64(1.5), np.dtype("<i4"), np.arange(3)],
    }
    back = round_trip(RestrictedSerializer(), obj)
    assert back["dd"]["a"] == [1] and back["dd"].default_factory is list
    assert back["torch"][:3] == obj["torch"][:3]
    assert_same(back["numpy"], obj["numpy"])


def test_pickle_serializer_keeps_everything_in_the_header():
    ser = PickleSerializer()
    header, buffers = ser.dumps({"t": torch.ones(3)})
    assert buffers == []
    assert torch.equal(ser.loads(header, buffers)["t"], torch.ones(3))


# -- the comparison helper ---------------------------------------------------------------
def test_same_is_exact():
    nan = float("nan")
    assert same([nan, {"a": (1, b"x")}], [nan, {"a": (1, b"x")}])
    assert not same(0.0, -0.0)
    assert not same(b"x", bytearray(b"x"))
    assert not same(torch.ones(2), torch.nn.Parameter(torch.ones(2)))
    assert not same(torch.ones(2), torch.ones(2, dtype=torch.float64))
    assert not same(torch.ones(2), torch.ones(2).requires_grad_())
    assert not same(np.ones(2, "<i4"), np.ones(2, ">i4"))
    assert not same({"a": 1, "b": 2}, {"b": 2, "a": 1})
    assert same(torch.tensor([nan]), torch.tensor([nan]))
    with pytest.raises(AssertionError, match=r"obj\['a'\]\[1\]: tensor values differ"):
        assert_same({"a": [0, torch.zeros(2)]}, {"a": [0, torch.ones(2)]})


def test_size_one_view_with_an_odd_stride_round_trips():
    # found by hypothesis: contiguous by torch's rules (a size-1 dim may carry any
    # stride) yet refused by view(torch.uint8)
    from commlib.serialization import OutOfBandSerializer

    ser = OutOfBandSerializer()
    for dtype in (torch.bfloat16, torch.float64, torch.complex64, torch.bool):
        t = torch.zeros(4, dtype=dtype)[::2][:1]
        assert t.is_contiguous() and t.stride() == (2,)
        out = ser.loads(*ser.dumps([None, t]))[1]
        assert out.dtype == dtype and torch.equal(out, t)
