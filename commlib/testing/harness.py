"""A multi-rank test harness: start N local ranks once, run many functions on them.

Starting torch processes costs seconds; tests should not pay it per test.
:class:`World` starts its ranks once (``spawn``, or forked from a server that
imported torch once: ``start_method="forkserver"``), joins them into a process
group through a ``TCPStore`` the parent owns on 127.0.0.1 (the OS picks the
port, so there is no race for a free one), and then runs functions on every
rank on request. Each run has a timeout: a hung collective kills the world's
processes (by pid) and raises :class:`WorldTimeout`; the next run starts a
fresh world.

Functions must be importable by the ranks (module-level functions of a test
module or package). Each is called as ``fn(comm, *args, **kwargs)`` with the
world :class:`~commlib.Communicator`; its return value comes back pickled.

Examples:
    >>> def total(comm, x):                   # module-level in a test module
    ...     t = torch.tensor([x + comm.rank])
    ...     comm.all_reduce(t)
    ...     return int(t)
    >>> with World(3) as world:               # starts 3 ranks  # doctest: +SKIP
    ...     world.run(total, 10)
    [33, 33, 33]
"""

from __future__ import annotations

import datetime
import multiprocessing as mp
import multiprocessing.connection
import os
import pickle
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch.distributed as dist


class WorldTimeout(TimeoutError):
    """A run did not finish on every rank in time; the world was torn down."""


@dataclass
class Outcome:
    """What one rank's call ended with: a value, or an exception."""

    rank: int
    value: Any = None
    error: BaseException | None = None
    traceback: str = ""
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.error is None


class RankDied(RuntimeError):
    """A rank process ended (e.g. killed) before it answered."""


class RankFailed(AssertionError):
    """Raised by :meth:`World.run` when any rank raised; shows each rank's traceback."""

    def __init__(self, outcomes: list[Outcome]):
        self.outcomes = outcomes
        parts = [f"--- rank {o.rank}: {o.error!r}\n{o.traceback}" for o in outcomes if not o.ok]
        super().__init__("ranks failed:\n" + "\n".join(parts))


#: what a forkserver imports once, before it forks any rank: torch's import is most
#: of a rank's start
_PRELOAD = ["torch", "torch.distributed"]


def _worker(
    rank: int,
    size: int,
    port: int,
    backend: str,
    setup: Any,
    conn: Any,
    pg_timeout: float,
    environ: dict[str, str],
) -> None:
    # the parent's environment at start(): a forked rank would otherwise have the
    # forkserver's, as it was when the server started
    os.environ.clear()
    os.environ.update(environ)
    try:
        # as torchrun does: N ranks on few cores must not each spin up a thread pool
        os.environ.setdefault("OMP_NUM_THREADS", "1")
        import torch

        torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
        if setup is not None:
            setup(rank, size)
        import commlib
        from commlib.plugins import resolve_backend

        os.environ.update(
            RANK=str(rank), WORLD_SIZE=str(size), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(size)
        )
        store = dist.TCPStore(
            "127.0.0.1", port, None, False, timeout=datetime.timedelta(seconds=pg_timeout)
        )
        plugin = resolve_backend(backend)
        plugin.setup_device(rank)
        plugin.init_process_group(
            store=store, rank=rank, world_size=size, timeout=datetime.timedelta(seconds=pg_timeout)
        )
        comm = commlib.Communicator(backend=plugin)
        commlib.set_default_communicator(comm)
        conn.send(("ready", None, ""))
    except BaseException as exc:
        conn.send(("error", _picklable(exc), traceback.format_exc()))
        return
    serve(comm, conn)
    del comm
    leave()


def serve(comm: Any, conn: Any) -> None:
    """A rank's loop: run each ``(fn, args, kwargs)`` sent on ``conn``, reply with the outcome.

    Ends when ``conn`` closes or sends ``None``; the caller then drops ``comm``
    and calls :func:`leave`.

    Examples:
        >>> serve(comm, conn)       # in a rank, once its world is up  # doctest: +SKIP
    """
    while True:
        try:
            msg = conn.recv()
        except EOFError:
            break
        if msg is None:
            break
        fn, args, kwargs = msg
        start = time.perf_counter()
        try:
            value = fn(comm, *args, **kwargs)
            reply = ("ok", value, "")
        except BaseException as exc:
            reply = ("error", _picklable(exc), traceback.format_exc())
        try:
            conn.send((*reply, time.perf_counter() - start))
        except Exception as exc:  # the result itself would not pickle
            conn.send(
                (
                    "error",
                    RuntimeError(f"result not picklable: {exc}"),
                    traceback.format_exc(),
                    time.perf_counter() - start,
                )
            )


def leave() -> None:
    """A rank's last step: forget its communicators, then leave the process group.

    Examples:
        >>> leave()                 # in a rank, after serve()  # doctest: +SKIP
    """
    import commlib

    commlib.forget_communicators()
    try:
        dist.destroy_process_group()
    except Exception:
        pass


def _picklable(exc: BaseException) -> BaseException:
    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:
        return RuntimeError(f"{type(exc).__name__}: {exc}")


class _Launched:
    """The launcher that started a world's ranks, as the world handles a rank's process."""

    def __init__(self, popen: subprocess.Popen):
        self.popen = popen
        self.pid = popen.pid

    def is_alive(self) -> bool:
        return self.popen.poll() is None

    def kill(self) -> None:
        if self.popen.poll() is None:
            os.killpg(self.popen.pid, signal.SIGKILL)  # the group start_new_session made

    def join(self, timeout: float | None = None) -> None:
        try:
            self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            pass

    @property
    def exitcode(self) -> int | None:
        return self.popen.poll()

    def output(self) -> str:
        if self.popen.poll() is None or self.popen.stdout is None:
            return "(still running)"
        return self.popen.stdout.read().decode(errors="replace")[-3000:]


def _accept(listener: Any, size: int, deadline: float, launched: subprocess.Popen) -> list[Any]:
    """``size`` connections on ``listener`` before ``deadline``, or TimeoutError.

    ``accept`` has no timeout: a thread accepts, this one watches the clock
    and the launcher (closing the listener ends a thread still accepting).
    """
    conns: list[Any] = []

    def accept_all() -> None:
        try:
            while len(conns) < size:
                conns.append(listener.accept())
        except (OSError, EOFError, mp.AuthenticationError):
            pass

    thread = threading.Thread(target=accept_all, daemon=True, name="commlib-world-accept")
    thread.start()
    while thread.is_alive():
        thread.join(0.1)
        if time.monotonic() > deadline or (thread.is_alive() and launched.poll() is not None):
            break
    if len(conns) < size:
        for conn in conns:
            conn.close()
        raise TimeoutError(f"{len(conns)} of {size} ranks called back")
    return conns


class _RegisterThen:
    """A setup that registers a backend added at run time in the rank, then runs ``setup``."""

    def __init__(self, backend: type, setup: Callable[[int, int], None] | None):
        self.backend, self.setup = backend, setup

    def __call__(self, rank: int, size: int) -> None:
        from commlib.plugins import register_backend

        register_backend(self.backend, replace=True)
        if self.setup is not None:
            self.setup(rank, size)


def _registered_here(backend: str) -> type | None:
    """The class of ``backend`` if this process registered it at run time, importable by the ranks.

    Raises ``ValueError`` for a class the ranks could not import (defined in
    a function, say), saying what works instead.
    """
    from commlib.plugins import registered_at_run_time

    cls = registered_at_run_time(backend)
    if cls is None:
        return None
    try:
        pickle.dumps(cls)
    except Exception as exc:
        raise ValueError(
            f"backend {backend!r} was registered with register_backend(), but its class "
            f"{cls.__module__}.{cls.__qualname__} cannot reach the ranks ({exc}): define it at "
            "the top level of an importable module (a conftest.py is one), or pass setup=, a "
            "module-level function setup(rank, size) that registers it in each rank "
            "(--commlib-setup module:function for the pytest kit)"
        ) from None
    return cls


class World:
    """``size`` local ranks on ``backend``, started once, reused for many runs.

    A backend added with :func:`commlib.register_backend` in this process is
    registered in each rank too (its class, by import), before ``setup``.

    Args:
        size: number of ranks.
        backend: commlib backend plugin name (``"gloo"`` by default), or a
            torch backend / multi-device spec (``"cpu:gloo,cuda:nccl"``).
        timeout: default seconds a :meth:`run` may take.
        setup: importable ``setup(rank, size)`` run in each rank before the
            process group starts (e.g. to install a simulated device); where
            the backend's own launcher starts the ranks
            (:meth:`~commlib.Backend.launch_command`), right after it started.
        pg_timeout: torch.distributed's own timeout inside the ranks.
        start_method: how the ranks' processes start (unless the backend has a
            launcher of its own): ``"spawn"``, a fresh interpreter each, or
            ``"forkserver"``, forked from a server process that imported torch
            once (started with the first such world, kept until this process
            exits), so a rank starts in a fraction of the time. Either way a
            rank gets this process's environment as it is at :meth:`start`;
            torch itself was imported in the server with the environment of
            then. ``None``: :attr:`default_start_method`.
    """

    #: the ``start_method`` of worlds made without one; a test suite may set it once
    #: (commlib's own tests/conftest.py sets ``"forkserver"``)
    default_start_method = "spawn"

    def __init__(
        self,
        size: int,
        backend: str = "gloo",
        timeout: float = 60.0,
        setup: Callable[[int, int], None] | None = None,
        pg_timeout: float = 30.0,
        start_method: str | None = None,
    ):
        if size < 1:
            raise ValueError(f"a world needs at least one rank, got {size}")
        method = start_method or self.default_start_method
        if method not in ("spawn", "forkserver") or method not in mp.get_all_start_methods():
            raise ValueError(
                f"start_method must be 'spawn' or 'forkserver' (where this platform has it), "
                f"got {method!r}"
            )
        self.start_method = method
        self.size, self.backend, self.timeout = size, backend, timeout
        self.setup, self.pg_timeout = setup, pg_timeout
        registered = _registered_here(backend)
        if registered is not None:  # the ranks register it too, before the setup
            self.setup = _RegisterThen(registered, setup)
        self._procs: list[Any] = []
        self._conns: list[Any] = []
        self._store: Any = None
        self._broken = False
        self._pids: list[int] = []
        self._plugin_class = ""

    # -- lifecycle -------------------------------------------------------------------
    def start(self) -> World:
        if self._broken:  # a rank died: the process group cannot be trusted
            self.kill()
        if self._procs:
            return self
        command = self._launch_command()
        if command is not None:
            return self._start_launched(command)
        ctx: Any = mp.get_context(self.start_method)  # a SpawnContext or a ForkServerContext
        if self.start_method == "forkserver":
            ctx.set_forkserver_preload(_PRELOAD)  # no effect once the server runs
        self._store = dist.TCPStore(
            "127.0.0.1",
            0,
            None,
            True,
            timeout=datetime.timedelta(seconds=self.pg_timeout),
            wait_for_workers=False,
        )
        for rank in range(self.size):
            parent, child = ctx.Pipe()
            proc = ctx.Process(
                target=_worker,
                daemon=True,
                name=f"commlib-rank{rank}",
                args=(
                    rank,
                    self.size,
                    self._store.port,
                    self.backend,
                    self.setup,
                    child,
                    self.pg_timeout,
                    dict(os.environ),
                ),
            )
            proc.start()
            child.close()
            self._procs.append(proc)
            self._conns.append(parent)
        outcomes = self._collect(time.monotonic() + max(self.timeout, 60.0), "start")
        if not all(o.ok for o in outcomes):
            self.kill()
            raise RankFailed(outcomes)
        return self

    def _launch_command(self) -> list[str] | None:
        from commlib.plugins import resolve_backend

        try:
            plugin = resolve_backend(self.backend)
        except ValueError:
            return None  # registered only inside the ranks (by setup)
        command = plugin.launch_command(self.size)
        if command is not None:
            self._plugin_class = f"{type(plugin).__module__}:{type(plugin).__qualname__}"
        return command

    def _start_launched(self, command: list[str]) -> World:
        """Start the ranks with the engine's launcher; they call back on a local socket."""
        key = os.urandom(16)
        listener = mp.connection.Listener(("127.0.0.1", 0), authkey=key)
        deadline = time.monotonic() + max(self.timeout, 60.0)
        env = dict(
            os.environ,
            COMMLIB_WORLD_ADDRESS=f"{listener.address[0]}:{listener.address[1]}",
            COMMLIB_WORLD_KEY=key.hex(),
            COMMLIB_WORLD_PLUGIN=self._plugin_class,
        )
        spec = pickle.dumps((self.backend, self.setup, self.pg_timeout))
        launched = subprocess.Popen(
            [*command, sys.executable, "-m", "commlib.testing.launched_rank", spec.hex()],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: kill() ends the launcher's ranks
        )
        proc = _Launched(launched)
        try:
            conns = _accept(listener, self.size, deadline, launched)
        except TimeoutError as exc:
            proc.kill()
            raise WorldTimeout(f"start: {exc}; launcher output:\n{proc.output()}") from None
        finally:
            listener.close()
        self._procs, self._conns = [proc] * self.size, conns
        outcomes = self._collect(deadline, "start")
        if not all(o.ok for o in outcomes):
            self.kill()
            raise RankFailed(outcomes)
        # the ranks said who they are: put their connections in rank order
        order = sorted(range(self.size), key=lambda i: outcomes[i].value[0])
        self._conns = [conns[i] for i in order]
        self._pids = [outcomes[i].value[1] for i in order]
        return self

    def kill(self) -> None:
        """End this world's rank processes (by pid) right away."""
        for proc in self._procs:
            if proc.is_alive():
                proc.kill()
        for proc in self._procs:
            proc.join(5)
        for conn in self._conns:
            conn.close()
        self._procs, self._conns, self._store, self._pids = [], [], None, []
        self._broken = False

    def close(self) -> None:
        """Ask the ranks to leave, then make sure they are gone."""
        for conn in self._conns:
            try:
                conn.send(None)
            except OSError:
                pass
        deadline = time.monotonic() + 10
        for proc in self._procs:
            proc.join(max(0.1, deadline - time.monotonic()))
        self.kill()

    def __enter__(self) -> World:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.close()

    @property
    def pids(self) -> list[int]:
        return self._pids or [p.pid for p in self._procs]

    # -- running -----------------------------------------------------------------------
    def outcomes(
        self, fn: Callable[..., Any], *args: Any, timeout: float | None = None, **kwargs: Any
    ) -> list[Outcome]:
        """Run ``fn(comm, *args, **kwargs)`` on every rank; each rank's :class:`Outcome`.

        Examples:
            >>> [o.ok for o in world.outcomes(maybe_fails)]   # doctest: +SKIP
            [True, False]
        """
        self.start()
        for conn in self._conns:
            conn.send((fn, args, kwargs))
        return self._collect(time.monotonic() + (timeout or self.timeout), fn.__name__)

    def run(
        self, fn: Callable[..., Any], *args: Any, timeout: float | None = None, **kwargs: Any
    ) -> list[Any]:
        """Run ``fn`` on every rank; its return values by rank, or :class:`RankFailed`.

        Examples:
            >>> world.run(lambda_free_function, 3)   # doctest: +SKIP
            [3, 3]
        """
        outcomes = self.outcomes(fn, *args, timeout=timeout, **kwargs)
        if not all(o.ok for o in outcomes):
            raise RankFailed(outcomes)
        return [o.value for o in outcomes]

    def _collect(self, deadline: float, what: str) -> list[Outcome]:
        results: dict[int, Outcome] = {}
        while len(results) < self.size:
            pending = [r for r in range(self.size) if r not in results]
            remaining = deadline - time.monotonic()
            ready = mp.connection.wait([self._conns[r] for r in pending], max(0.0, remaining))
            if not ready:
                if remaining > 0:
                    continue
                self.kill()
                raise WorldTimeout(
                    f"{what}: rank(s) {pending} did not finish in time; the world was killed"
                )
            for r in pending:
                conn = self._conns[r]
                if conn not in ready:
                    continue
                try:
                    status, value, tb, *rest = conn.recv()
                except (EOFError, OSError):
                    self._procs[r].join(5)
                    code = self._procs[r].exitcode
                    self._broken = True
                    results[r] = Outcome(
                        r, error=RankDied(f"rank {r} died (exit code {code}) during {what}")
                    )
                    continue
                secs = rest[0] if rest else 0.0
                if status in ("ok", "ready"):
                    results[r] = Outcome(r, value=value, seconds=secs)
                else:
                    results[r] = Outcome(r, error=value, traceback=tb, seconds=secs)
        return [results[r] for r in range(self.size)]
