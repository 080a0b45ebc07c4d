"""The restricted loading's parts: its refusals, the unpickler that refuses, torch's safe names.

:class:`~commlib.serialization.RestrictedSerializer` (and ``weights_only=True``
on the object collectives, :func:`~commlib.serialization.object_serializer`)
load through :class:`RestrictingUnpickler`, which loads only the names it is
given and refuses anything else with :class:`RefusedClassError`. Both errors
and :func:`torch_safe_names` are public as ``commlib.serialization``'s names.

Examples:
    >>> "builtins.KeyError" in torch_safe_names()
    True
"""

from __future__ import annotations

import builtins
import pickle
from typing import Any

import torch

from commlib.errors import DeserializationError


class RefusedClassError(pickle.UnpicklingError):
    """A :class:`~commlib.serialization.RestrictedSerializer` met a class or function it refuses.

    Attributes:
        qualname (str): ``"module.QualName"`` of what was refused.

    Examples:
        >>> from fractions import Fraction
        >>> try:
        ...     s = commlib.serialization.RestrictedSerializer()
        ...     s.loads(*s.dumps(Fraction(1, 3)))
        ... except RefusedClassError as err:
        ...     err.qualname
        'fractions.Fraction'
    """

    __module__ = "commlib.serialization"  # its public home (tracebacks, pickles)

    def __init__(self, qualname: str):
        self.qualname = qualname
        super().__init__(
            f"refusing to load {qualname!r}: it is not on the RestrictedSerializer's "
            f"allow-list (allow it with RestrictedSerializer(allow=[{qualname!r}]))"
        )

    def __reduce__(self):
        return (type(self), (self.qualname,))


class RefusedRemoteClassError(DeserializationError, RefusedClassError):
    """What another rank sent holds a class this rank's ``RestrictedSerializer`` refuses.

    Both a :class:`~commlib.errors.DeserializationError` (naming the two ranks)
    and a :class:`RefusedClassError` (``except RefusedClassError`` around a
    collective catches it).

    Attributes:
        qualname (str): ``"module.QualName"`` of what was refused.
        rank (int): the rank that refused it; ``sender``: the rank that sent it.

    Examples:
        >>> err = RefusedRemoteClassError("posix.system", rank=1, sender=0)
        >>> isinstance(err, RefusedClassError), str(err)[:72]
        (True, "rank 1 could not load the object sent by rank 0: refusing to load 'posix")
    """

    __module__ = "commlib.serialization"

    def __init__(self, qualname: str, rank: int, sender: int):
        self.qualname, self.rank, self.sender = qualname, rank, sender
        Exception.__init__(
            self,
            f"rank {rank} could not load the object sent by rank {sender}: "
            f"{RefusedClassError(qualname)}",
        )

    def __reduce__(self):
        return (type(self), (self.qualname, self.rank, self.sender))


class RestrictingUnpickler(pickle.Unpickler):
    """An unpickler that loads only ``allowed`` and ``safe`` names and ``modules``' contents.

    Anything else is refused with :class:`RefusedClassError`, before it can run.

    Examples:
        >>> import io, pickle
        >>> data = io.BytesIO(pickle.dumps(os.system))
        >>> RestrictingUnpickler(data, [], frozenset(), frozenset(), frozenset()).load()
        Traceback (most recent call last):
        ...
        commlib.serialization.RefusedClassError: refusing to load 'posix.system': ...
    """

    def __init__(
        self,
        file: Any,
        buffers: list,
        allowed: frozenset[str],
        modules: frozenset,
        safe: frozenset[str],
    ):
        super().__init__(file, buffers=buffers)
        self._allowed = allowed
        self._modules = modules
        self._safe = safe

    def find_class(self, module: str, name: str) -> Any:
        qualname = f"{module}.{name}"
        if qualname in self._allowed or qualname in self._safe or module in self._modules:
            return super().find_class(module, name)
        raise RefusedClassError(qualname)


def qualname_of(item: Any) -> str:
    """``"module.QualName"`` of a class or function, as pickle names it.

    Examples:
        >>> qualname_of(os.path.join)
        'posixpath.join'
    """
    return f"{item.__module__}.{item.__qualname__}"


# what torch 2.14 adds to torch.serialization's safe globals for its object collectives
# (error propagation sends exceptions and stack summaries); added here on every torch
_TORCH_OBJECT_EXTRAS = frozenset(
    {
        *(
            f"builtins.{name}"
            for name, value in vars(builtins).items()
            if isinstance(value, type) and issubclass(value, BaseException)
        ),
        "traceback.StackSummary",
        "traceback.FrameSummary",
    }
)


def torch_safe_names() -> frozenset[str]:
    """What torch's ``weights_only`` loading allows beyond tensors, as ``"module.Name"``.

    ``torch.serialization.get_safe_globals()`` (what ``add_safe_globals``
    added), the builtin exceptions and ``traceback``'s stack summaries.

    Examples:
        >>> "builtins.ValueError" in torch_safe_names()
        True
    """
    extra = set()
    for item in torch.serialization.get_safe_globals():
        # an entry is the object itself, or (object, "module.Name") as pickle names it
        extra.add(item[1] if isinstance(item, tuple) else qualname_of(item))
    return _TORCH_OBJECT_EXTRAS | extra
