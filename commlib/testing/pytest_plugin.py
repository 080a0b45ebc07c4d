"""pytest plugin: ``pytest --commlib-backend NAME`` runs the conformance kit against NAME.

The ``pytest11`` entry point is the top-level ``_commlib_pytestplugin``, which
declares the options and the marker without importing torch; it registers this
module (which does) only when ``--commlib-backend`` is given. Each (check,
world size) becomes one test item, marked ``commlib_conformance``:

Examples:
    $ pytest --commlib-backend gloo
    $ pytest --commlib-backend mybackend --commlib-world-sizes 1,2 -m commlib_conformance
    $ pytest --commlib-backend hccl --commlib-setup commlib.testing.simulated:setup_hccl
"""

from __future__ import annotations

import importlib
from typing import Any

import pytest

from _commlib_pytestplugin import MARKER

# pytest_addoption lives in _commlib_pytestplugin: this module is registered late and
# pytest would replay that hook for it, declaring every option twice


def _setup_function(spec: str | None) -> Any:
    if not spec:
        return None
    module, _, name = spec.partition(":")
    if not name:
        raise pytest.UsageError(f"--commlib-setup wants MODULE:FUNCTION, got {spec!r}")
    return getattr(importlib.import_module(module), name)


class ConformanceFailure(AssertionError):
    """A conformance check failed; the message says on which rank and why."""


class ConformanceItem(pytest.Item):
    """One check at one world size against one backend."""

    def __init__(self, *, backend: str, world_size: int, check: str, **kwargs: Any):
        super().__init__(**kwargs)
        self.backend, self.world_size, self.check = backend, world_size, check
        self.add_marker(MARKER)

    def runtest(self) -> None:
        kit = self.config.stash[_KITS].get(
            self.backend,
            setup=_setup_function(self.config.getoption("commlib_setup")),
            timeout=self.config.getoption("commlib_timeout"),
        )
        result = kit.run(self.check, self.world_size)
        if result.status == "skipped":
            pytest.skip(result.detail)
        if result.status == "failed":
            raise ConformanceFailure(result.detail)

    def repr_failure(self, excinfo: Any, style: Any = None) -> Any:
        if isinstance(excinfo.value, ConformanceFailure):
            return f"{self.name}\n{excinfo.value}"
        return super().repr_failure(excinfo)

    def reportinfo(self) -> tuple[Any, int | None, str]:
        return self.path, None, f"commlib conformance: {self.name}"


_KITS = pytest.StashKey[Any]()  # a conformance.KitPool


def _refuse_unknown(name: str) -> None:
    """Stop the session with one clear error when ``name`` is no backend commlib knows.

    Examples:
        >>> _refuse_unknown("gloo")
        >>> _refuse_unknown("no-such-backend")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        pytest.UsageError: --commlib-backend no-such-backend: unknown commlib backend ...
    """
    from commlib.errors import BackendUnavailableError
    from commlib.plugins import resolve_backend

    try:
        resolve_backend(name)
    except (ValueError, BackendUnavailableError) as exc:
        raise pytest.UsageError(
            f"--commlib-backend {name}: {exc} (is the plugin installed in this "
            "interpreter's environment? `commlib info` lists what it finds)"
        ) from None


@pytest.hookimpl(tryfirst=True)  # before -k / -m deselect
def pytest_collection_modifyitems(session: Any, config: Any, items: list) -> None:
    backends = config.getoption("commlib_backend")
    if not backends:
        return
    from commlib.testing.conformance import CHECKS, KitPool

    try:
        sizes = [int(s) for s in config.getoption("commlib_world_sizes").split(",") if s]
    except ValueError:
        raise pytest.UsageError("--commlib-world-sizes wants numbers like 1,2,3") from None
    if not config.getoption("commlib_setup"):
        # a setup function may register the backend in the ranks; without one an
        # unknown name is one usage error here, not one failure per check
        for backend in backends:
            _refuse_unknown(backend)
    config.stash[_KITS] = KitPool()
    # one world size after the other, so each backend keeps one world of ranks alive
    for backend in backends:
        for size in sizes:
            for check in CHECKS.values():
                if check.applies(size):
                    items.append(
                        ConformanceItem.from_parent(
                            session,
                            name=f"conformance[{backend}-world{size}-{check.name}]",
                            backend=backend,
                            world_size=size,
                            check=check.name,
                        )
                    )


def pytest_sessionfinish(session: Any, exitstatus: Any) -> None:
    pool = session.config.stash.get(_KITS, None)
    if pool is not None:
        pool.close()
