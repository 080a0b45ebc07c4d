"""mmengine: route ``mmengine.dist`` and every mmengine module's copy of it to commlib.

mmengine's own modules import ``mmengine.dist`` functions by name
(``mmengine.evaluator.metric.collect_results``,
``mmengine.runner.runner.broadcast``, ``mmengine.dataset.sampler.sync_random_seed``,
...), so replacing the attributes of ``mmengine.dist`` alone would leave them on
torch.distributed. :func:`patch` replaces every reference, in every loaded
``mmengine`` module, that *is* one of ``mmengine.dist``'s public functions, by
commlib's function of the same name (commlib keeps mmengine.dist's names,
signatures and return conventions). Modules imported while patched take
commlib's functions from the patched ``mmengine.dist``. :func:`unpatch` puts
mmengine's own functions back everywhere, those late imports included.

Both are idempotent; :func:`patched` is the context manager. Functions that
mmengine wrapped before the patch (methods decorated with ``master_only``)
keep mmengine's wrapper, which looks ``is_main_process`` up in
``mmengine.dist.utils``: they follow the patch too.

Examples:
    >>> from commlib.integrations import mmengine as mm
    >>> mm.patch()                                   # needs mmengine  # doctest: +SKIP
    >>> import mmengine.dist, commlib                                  # doctest: +SKIP
    >>> mmengine.dist.collect_results is commlib.collect_results       # doctest: +SKIP
    True
    >>> mm.unpatch()                                                   # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Iterable, Iterator
from types import ModuleType
from typing import Any

import commlib
from commlib.integrations._clients import require

_lock = threading.Lock()
# mmengine.dist's own functions by name, read once while it is still mmengine's
_originals: dict[str, Any] = {}
_patched = [False]
# top-level packages whose modules are patched: mmengine, and what patch(also=...) added
_packages = {"mmengine"}


def _mmengine_dist() -> ModuleType:
    return require("mmengine.dist", "mmengine", "commlib.integrations.mmengine")


def _commlib_functions() -> dict[str, Any]:
    if not _originals:
        mm_dist = _mmengine_dist()
        _originals.update({name: getattr(mm_dist, name) for name in mm_dist.__all__})
    return {name: getattr(commlib, name) for name in _originals if hasattr(commlib, name)}


def _modules() -> list[ModuleType]:
    return [
        module
        for name, module in list(sys.modules.items())
        if name.split(".", 1)[0] in _packages and isinstance(module, ModuleType)
    ]


def _swap(by_identity: dict[int, Any]) -> int:
    """Replace, in every loaded module of the packages, each attribute that is a key object."""
    swapped = 0
    for module in _modules():
        namespace = vars(module)
        for attr, value in list(namespace.items()):
            replacement = by_identity.get(id(value))
            if replacement is not None:
                namespace[attr] = replacement
                swapped += 1
    return swapped


def patch(also: Iterable[str] = ()) -> int:
    """Route ``mmengine.dist`` and every mmengine module's reference to it to commlib.

    ``also`` names more top-level packages whose modules imported
    ``mmengine.dist`` functions by name (``"mmdet"``, your project); their
    references are replaced too, and :func:`unpatch` restores them. Returns
    how many references it replaced (0 when already patched). Raises
    ``ImportError`` with the install command when mmengine is missing.

    Examples:
        >>> patch()                   # mmengine.runner etc. loaded  # doctest: +SKIP
        52
        >>> patch()                   # idempotent                   # doctest: +SKIP
        0
        >>> patch(also=["mmdet"])     # OpenMMLab code on top        # doctest: +SKIP
        17
    """
    names = [also] if isinstance(also, str) else list(also)
    for name in names:
        if not isinstance(name, str) or not name or "." in name:
            raise ValueError(f"patch(also=...) takes top-level package names, got {name!r}")
    with _lock:
        ours = _commlib_functions()
        _packages.update(names)
        swapped = _swap({id(_originals[name]): fn for name, fn in ours.items()})
        _patched[0] = True
        return swapped


def unpatch() -> int:
    """Put mmengine's own functions back wherever :func:`patch` (or a later import) put commlib's.

    Returns how many references it restored (0 when not patched).

    Examples:
        >>> unpatch()             # doctest: +SKIP
        52
    """
    with _lock:
        if not _originals:  # never patched: nothing of ours can be there
            return 0
        ours = _commlib_functions()
        restored = _swap({id(fn): _originals[name] for name, fn in ours.items()})
        _patched[0] = False
        return restored


def is_patched() -> bool:
    """Whether :func:`patch` is in force (and not undone by :func:`unpatch`).

    Examples:
        >>> is_patched()
        False
    """
    return _patched[0]


@contextlib.contextmanager
def patched() -> Iterator[None]:
    """Patch for the ``with`` block; unpatch after it unless it was patched before.

    Examples:
        >>> with patched():                # doctest: +SKIP
        ...     metrics = runner.val()     # mmengine's Runner on commlib
    """
    already = is_patched()
    patch()
    try:
        yield
    finally:
        if not already:
            unpatch()
