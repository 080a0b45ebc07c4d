"""Object serialization strategies: object <-> (small header, raw buffers).

A :class:`Serializer` turns a Python object into a :class:`Payload`: a small
``header`` (bytes) and a list of ``buffers`` (1-D ``uint8`` tensors, on any
device). The object collectives in :mod:`commlib.objects` move payloads between
ranks and hand the receiver the same header and buffers, each buffer a 1-D
``uint8`` tensor on the communicator's device; ``loads`` rebuilds the object.
Buffers let large arrays travel without being copied into a pickle stream.

Each backend picks its default strategy (``Backend.serializer()``); a user can
pass another one to a :class:`~commlib.Communicator` or to a single call.
"""

from __future__ import annotations

import abc
import io
import pickle
from typing import Any, NamedTuple

import torch


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

    ``loads`` receives ``header`` as a bytes-like object and ``buffers`` as
    1-D ``uint8`` tensors; it may keep views of them in the returned object.

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
        return pickle.load(io.BytesIO(header))


def default_serializer() -> Serializer:
    """The strategy backends use unless they choose their own.

    Examples:
        >>> default_serializer().name
        'pickle'
    """
    return PickleSerializer()
