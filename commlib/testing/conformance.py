"""The conformance kit: commlib's backend contract, runnable against any backend plugin.

One call runs every check at world sizes 1, 2 and 3:

Examples:
    >>> from commlib.testing.conformance import run_conformance
    >>> report = run_conformance("gloo")       # starts ranks  # doctest: +SKIP
    >>> print(report)                          # doctest: +SKIP
    gloo: 126 passed, 9 skipped, 0 failed
    >>> # a vendor backend, simulated on this machine
    >>> from commlib.testing import simulated
    >>> run_conformance("hccl", setup=simulated.setup("hccl"))  # doctest: +SKIP

or, through the pytest plugin, ``pytest --commlib-backend NAME``.

The checks live in :mod:`commlib.testing.checks` (one registry, :data:`CHECKS`);
ranks start once per world size (:class:`~commlib.testing.World`) and every
check runs on all of them. A backend without a process group (``single``)
runs in this process, at world size 1 only.
"""

from __future__ import annotations

import shutil
import tempfile
import time
import traceback
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from commlib.hookspecs import hookimpl
from commlib.testing.checks import CHECKS, Check
from commlib.testing.checks import collectives as _collectives  # noqa: F401
from commlib.testing.checks import errors as _errors  # noqa: F401  (registers checks)
from commlib.testing.checks import helpers as _helpers  # noqa: F401
from commlib.testing.checks import object_collectives as _objects  # noqa: F401
from commlib.testing.checks import point_to_point as _point_to_point  # noqa: F401
from commlib.testing.checks import structures as _structures  # noqa: F401
from commlib.testing.checks import tensors as _tensors  # noqa: F401
from commlib.testing.harness import RankFailed, World, WorldTimeout

__all__ = [
    "CHECKS",
    "DEFAULT_WORLD_SIZES",
    "CheckResult",
    "ConformanceError",
    "Kit",
    "Report",
    "run_conformance",
]

DEFAULT_WORLD_SIZES = (1, 2, 3)


@dataclass
class CheckResult:
    """How one check went at one world size: ``passed``, ``failed`` or ``skipped``."""

    backend: str
    world_size: int
    check: str
    status: str
    detail: str = ""
    seconds: float = 0.0

    @property
    def id(self) -> str:
        """``backend-worldN-check``, as the pytest plugin names the item."""
        return f"{self.backend}-world{self.world_size}-{self.check}"


@dataclass
class Report:
    """Every result of a kit run; ``str(report)`` is a summary with the failures.

    Examples:
        >>> report = run_conformance("single", raise_on_failure=False)   # in this process
        >>> report.ok, len(report.failures)
        (True, 0)
        >>> print(report)
        single: ... passed, ... skipped, 0 failed
    """

    backend: str
    results: list[CheckResult] = field(default_factory=list)

    @property
    def failures(self) -> list[CheckResult]:
        return [r for r in self.results if r.status == "failed"]

    @property
    def ok(self) -> bool:
        return not self.failures

    def __str__(self) -> str:
        counts = {s: sum(r.status == s for r in self.results) for s in ("passed", "skipped")}
        lines = [
            f"{self.backend}: {counts['passed']} passed, {counts['skipped']} skipped, "
            f"{len(self.failures)} failed"
        ]
        lines += [f"  FAILED {r.id}: {r.detail}" for r in self.failures]
        return "\n".join(lines)


class ConformanceError(AssertionError):
    """A backend broke the contract; ``report`` has the details."""

    def __init__(self, report: Report):
        self.report = report
        super().__init__(str(report))


class _LocalWorld:
    """A world of one in this process, for backends without a process group."""

    size = 1

    def __init__(self, backend: str):
        self.backend = backend

    def run(self, fn: Callable[..., Any], *args: Any, timeout: float | None = None) -> list:
        from commlib import Communicator

        return [fn(Communicator(backend=self.backend), *args)]

    def close(self) -> None:
        pass


class _FirstFailure:
    """An observer in each rank: the first collective of a check that ended in an error."""

    event: Any = None

    @hookimpl
    def commlib_collective_end(self, event: Any) -> None:
        if event.error is not None and self.event is None:
            self.event = event


_failure = _FirstFailure()


def _run_check(comm: Any, fn: Callable[[Any, dict], None], ctx: dict) -> None:
    """Run a check in a rank; an engine error names the collective and what it was given.

    The error alone ("Invalid scalar type") does not say which of a check's
    dtypes, roots and devices the backend lacks.
    """
    from commlib import plugins

    manager = plugins.plugin_manager()
    manager.register(_failure, name="commlib.testing.first-failure")  # for this check only
    _failure.event = None
    try:
        fn(comm, ctx)
    except AssertionError:
        raise
    except Exception as exc:
        event = _failure.event
        if event is None:
            raise
        raise AssertionError(
            f"{event.name}({event.describe()}) raised {type(exc).__name__}: {exc}"
        ) from exc
    finally:
        _failure.event = None
        manager.unregister(_failure)


def _summary(exc: BaseException) -> str:
    if isinstance(exc, RankFailed):
        failed = [o for o in exc.outcomes if not o.ok]
        first = failed[0]
        tail = "".join(first.traceback.strip().splitlines(keepends=True)[-6:])
        ranks = ", ".join(str(o.rank) for o in failed)
        return f"rank(s) {ranks} failed; rank {first.rank}: {first.error!r}\n{tail}"
    tail = "".join(traceback.format_exception(exc)[-4:])
    return f"{type(exc).__name__}: {exc}\n{tail}"


class Kit:
    """Runs checks against one backend, keeping one world of ranks alive at a time.

    Args:
        backend: plugin name, torch backend or multi-device spec (as
            :class:`~commlib.testing.World` takes).
        setup: importable ``setup(rank, size)`` run in each rank first (e.g.
            :func:`commlib.testing.simulated.setup`).
        timeout: seconds a check may take on all ranks.
        drawn: how many hypothesis-drawn objects the serialization check adds.

    Examples:
        >>> with Kit("gloo") as kit:                # starts 2 ranks  # doctest: +SKIP
        ...     kit.run("all_reduce_ops", 2).status
        'passed'
    """

    def __init__(
        self,
        backend: str,
        *,
        setup: Callable[[int, int], None] | None = None,
        timeout: float = 60.0,
        drawn: int = 20,
    ):
        self.backend, self.setup, self.timeout, self.drawn = backend, setup, timeout, drawn
        self._world: Any = None
        self._world_error: str | None = None
        self._failed_size = 0
        self._tmpdir = tempfile.mkdtemp(prefix="commlib-kit-")
        self._local, self._unavailable = self._inspect()

    def _inspect(self) -> tuple[bool, str | None]:
        """(runs in this process, why it cannot run here) as far as this process can tell."""
        from commlib.plugins import resolve_backend

        try:
            plugin = resolve_backend(self.backend)
        except ValueError:
            return False, None  # registered only inside the ranks (by setup); let them say
        reason = None if self.setup is not None else plugin.unavailable_reason()
        return plugin.torch_backend is None, reason

    def checks(self, world_size: int) -> list[Check]:
        """The registered checks that apply at ``world_size``.

        Examples:
            >>> with Kit("gloo") as kit:
            ...     [c.name for c in kit.checks(1)][:2]
            ['reduce', 'scatter']
        """
        return [c for c in CHECKS.values() if c.applies(world_size)]

    def _world_of(self, size: int) -> Any:
        if self._world is not None and self._world.size == size:
            return self._world
        if self._world_error is not None and self._failed_size == size:
            return None  # it failed to start once; do not pay for that per check
        self.close_world()
        if self._local:
            if size != 1:
                return None
            self._world = _LocalWorld(self.backend)
            return self._world
        world = World(size, backend=self.backend, setup=self.setup, timeout=self.timeout)
        try:
            world.start()
        except (RankFailed, WorldTimeout) as exc:
            self._world_error = f"the world of {size} did not start: {_summary(exc)}"
            self._failed_size = size
            world.kill()
            return None
        self._world, self._world_error = world, None
        return world

    def run(self, name: str, world_size: int) -> CheckResult:
        """Run check ``name`` on a world of ``world_size`` ranks.

        Examples:
            >>> with Kit("single") as kit:             # runs in this process
            ...     kit.run("gather", 1).status, kit.run("gather", 2).status
            ('passed', 'skipped')
        """
        check = CHECKS[name]
        result = CheckResult(self.backend, world_size, name, "passed")
        if not check.applies(world_size):
            result.status, result.detail = "skipped", f"{name} does not apply at {world_size}"
            return result
        if self._unavailable is not None:
            result.status = "skipped"
            result.detail = f"backend {self.backend!r} cannot run here: {self._unavailable}"
            return result
        world = self._world_of(world_size)
        if world is None:
            if self._local:
                result.status = "skipped"
                result.detail = "a backend without a process group runs at world size 1 only"
            else:
                result.status, result.detail = "failed", self._world_error or "no world"
            return result
        ctx = {"world_size": world_size, "tmpdir": self._tmpdir, "drawn": self.drawn}
        start = time.perf_counter()
        try:
            world.run(_run_check, check.fn, ctx, timeout=self.timeout)
        except Exception as exc:
            result.status, result.detail = "failed", _summary(exc)
            if isinstance(exc, WorldTimeout):
                self._world = None  # it was killed; the next check starts a fresh one
            else:
                # a failed collective leaves the ranks' communicators broken (as it
                # must): the next check starts on fresh ranks, not on this failure
                self.close_world()
        result.seconds = time.perf_counter() - start
        return result

    def call(self, world_size: int, fn: Callable[..., Any], *args: Any) -> list:
        """Run any importable ``fn(comm, *args)`` on the kit's world; results by rank.

        Lets a plugin's own tests reuse the ranks the kit started.

        Examples:
            >>> kit.call(3, my_checks.device_report)   # starts 3 ranks  # doctest: +SKIP
            [{'index': 0}, {'index': 1}, {'index': 2}]
        """
        world = self._world_of(world_size)
        if world is None:
            raise RuntimeError(self._world_error or f"no world of {world_size} for {self.backend}")
        return world.run(fn, *args, timeout=self.timeout)

    def run_all(
        self, world_sizes: Iterable[int] = DEFAULT_WORLD_SIZES, names: Iterable[str] | None = None
    ) -> Report:
        """Run ``names`` (every registered check by default) at each world size.

        Examples:
            >>> with Kit("gloo") as kit:                # starts ranks  # doctest: +SKIP
            ...     print(kit.run_all((1, 2)))
            gloo: 82 passed, 8 skipped, 0 failed
        """
        report = Report(self.backend)
        wanted = list(names) if names is not None else list(CHECKS)
        for size in world_sizes:
            for name in wanted:
                report.results.append(self.run(name, size))
        return report

    def close_world(self) -> None:
        """End the current world's ranks; the next check starts a fresh one.

        Examples:
            >>> kit.close_world()   # before starting another kit's ranks  # doctest: +SKIP
        """
        if self._world is not None:
            self._world.close()
        self._world = None

    def close(self) -> None:
        """End the ranks (by pid) and remove the kit's temporary directory."""
        self.close_world()
        shutil.rmtree(self._tmpdir, ignore_errors=True)

    def __enter__(self) -> Kit:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class KitPool:
    """Kits by backend, with the ranks of only one of them alive at a time.

    On a small machine several worlds of ranks at once would compete for the
    cores; a kit whose world was closed starts it again when next used.

    Examples:
        >>> pool = KitPool()
        >>> pool.get("gloo").run("all_reduce_ops", 2).status   # starts ranks  # doctest: +SKIP
        'passed'
        >>> pool.close()
    """

    def __init__(self) -> None:
        self._kits: dict[str, Kit] = {}

    def get(self, backend: str, **options: Any) -> Kit:
        """The kit for ``backend`` (made with ``options`` the first time)."""
        kit = self._kits.get(backend)
        if kit is None:
            for other in self._kits.values():
                other.close_world()
            kit = self._kits[backend] = Kit(backend, **options)
        return kit

    def close(self) -> None:
        """Close every kit (their ranks and temporary directories)."""
        for kit in self._kits.values():
            kit.close()
        self._kits.clear()


def run_conformance(
    backend: str,
    world_sizes: Iterable[int] = DEFAULT_WORLD_SIZES,
    *,
    setup: Callable[[int, int], None] | None = None,
    checks: Iterable[str] | None = None,
    timeout: float = 60.0,
    raise_on_failure: bool = True,
) -> Report:
    """Run the whole contract (or ``checks``) against ``backend`` at each world size.

    Raises :class:`ConformanceError` listing every failure unless
    ``raise_on_failure=False``.

    Examples:
        >>> run_conformance("gloo", world_sizes=(1, 2, 3)).ok   # starts ranks  # doctest: +SKIP
        True
        >>> run_conformance("mybackend", setup=my_package.testing.setup)  # doctest: +SKIP
    """
    with Kit(backend, setup=setup, timeout=timeout) as kit:
        report = kit.run_all(world_sizes, checks)
    if raise_on_failure and not report.ok:
        raise ConformanceError(report)
    return report
