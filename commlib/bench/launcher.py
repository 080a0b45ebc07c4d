"""Starting the benchmark's ranks: torch's own launcher, an engine's, or torchrun's ranks.

``commlib bench`` on its own starts ``--nproc`` local ranks on 127.0.0.1
through ``torch.distributed.launcher.api.elastic_launch`` (c10d rendezvous on
a free port, no restarts), or through the backend's own launcher where it
has one (:meth:`commlib.Backend.launch_command`: ``mpiexec`` for ``mpi``).
Under torchrun (one machine or several) the process already is a rank: it
runs its share and rank 0 reports.

A rank that fails ends the run: the launcher's monitor stops the other ranks
and :class:`RankFailure` carries the failed rank's error to the caller.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import pickle
import socket
import subprocess
import sys
import tempfile
import time
import traceback
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import torch.distributed as dist


class RankFailure(RuntimeError):
    """One or more ranks failed; ``failures`` maps global rank to its error text.

    ``first`` is the rank that failed first (the likely cause; the others
    often only lost their peer) and ``traceback`` its traceback when known.
    """

    def __init__(self, failures: dict[int, str], first: int, traceback: str = ""):
        self.failures, self.first, self.traceback = failures, first, traceback
        others = "".join(
            f"\n  rank {r} also failed: {_short(msg)}" for r, msg in failures.items() if r != first
        )
        super().__init__(f"rank {first} failed: {failures[first]}{others}")


def _short(message: str, limit: int = 160) -> str:
    """First line of ``message``, cut at ``limit``: the others' errors are mostly echoes."""
    line = message.strip().splitlines()[0] if message.strip() else ""
    return line if len(line) <= limit else line[: limit - 3] + "..."


def under_torchrun() -> bool:
    """Whether this process is already one rank of a launched job (torchrun or alike).

    Examples:
        >>> under_torchrun()          # plain `commlib bench`
        False
    """
    return dist.is_torchelastic_launched() or ("RANK" in os.environ and "WORLD_SIZE" in os.environ)


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on ``host`` that was free a moment ago.

    Examples:
        >>> 1024 <= free_port() < 65536
        True
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def launch_local(nproc: int, fn: Callable[..., Any], *args: Any, timeout: float = 120.0) -> Any:
    """Run ``fn(*args)`` on ``nproc`` local ranks; rank 0's return value.

    ``timeout`` bounds the rendezvous; the ranks' own process-group timeout
    is the caller's to set. Raises :class:`RankFailure` if any rank fails.

    Examples:
        >>> from commlib.bench import BenchOptions, run_rank
        >>> launch_local(2, run_rank, BenchOptions(ops="all_reduce"))  # doctest: +SKIP
        [{'case': 'all_reduce', ...}, ...]
    """
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    with (
        tempfile.TemporaryDirectory(prefix="commlib-bench-") as logs,
        _env_default("OMP_NUM_THREADS", "1"),
    ):
        noted = _NoteFailures(fn, logs)
        config = LaunchConfig(
            min_nodes=1,
            max_nodes=1,
            nproc_per_node=nproc,
            run_id=f"commlib-bench-{uuid.uuid4().hex[:12]}",
            rdzv_backend="c10d",
            rdzv_endpoint=f"127.0.0.1:{free_port()}",
            rdzv_configs={"join_timeout": int(timeout)},
            local_addr="127.0.0.1",
            max_restarts=0,
            monitor_interval=0.1,
            # how long a rank may ignore SIGTERM once another failed (e.g. one
            # stuck in native code) before it is killed
            shutdown_timeout=5,
            start_method="spawn",
            logs_specs=DefaultLogsSpecs(log_dir=logs),
        )
        try:
            with _quiet_torch_launcher():
                results = elastic_launch(config, noted)(*args)
        except ChildFailedError as exc:
            raise _rank_failure(exc, noted.notes()) from None
        except SignalException as exc:  # the launcher stopped the ranks first
            raise KeyboardInterrupt(str(exc)) from None
    return results[0]


def launch_with(command: list[str], opts: Any, timeout: float = 120.0) -> Any:
    """Run the benchmark on ranks that ``command`` starts (an engine's own launcher).

    ``command`` (from :meth:`commlib.Backend.launch_command`, ``mpiexec -n N``)
    runs ``python -m commlib.bench.launched``: each rank runs
    :func:`~commlib.bench.run_rank`, rank 0 writes its rows to a file this
    process reads. A rank that fails ends the run (the launcher ends the
    others) and :class:`RankFailure` carries the launcher's output.

    Examples:
        >>> launch_with(["mpiexec", "-n", "2"], BenchOptions(backend="mpi"))  # doctest: +SKIP
        [{'case': 'all_reduce', ...}, ...]
    """
    with (
        tempfile.TemporaryDirectory(prefix="commlib-bench-") as folder,
        _env_default("OMP_NUM_THREADS", "1"),
    ):
        out = os.path.join(folder, "rows.pickle")
        spec = pickle.dumps(opts).hex()
        # a run's own budget on top of the ranks' timeout per call
        limit = max(timeout, 60.0) * 20
        try:
            done = subprocess.run(
                [*command, sys.executable, "-m", "commlib.bench.launched", spec, out],
                stdout=None if opts.progress else subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
                timeout=limit,
            )
        except subprocess.TimeoutExpired:
            raise RankFailure({0: f"the ranks did not finish in {limit:.0f} s"}, 0) from None
        if done.returncode != 0 or not os.path.exists(out):
            text = (done.stderr or "").strip()
            raise RankFailure(
                {0: f"{command[0]} exited with status {done.returncode}"}, 0, text[-4000:]
            )
        with open(out, "rb") as f:
            return pickle.load(f)


@contextlib.contextmanager
def _env_default(name: str, value: str) -> Iterator[None]:
    """``name=value`` in the environment the ranks inherit, unless the user set it.

    OMP_NUM_THREADS=1 as torchrun does: ranks sharing a few cores must not
    each start a thread per core (torch's parallel fill of a 64 KiB buffer
    took 15 ms instead of 2 us with two ranks on two cores).
    """
    had = name in os.environ
    os.environ.setdefault(name, value)
    try:
        yield
    finally:
        if not had:
            os.environ.pop(name, None)


@contextlib.contextmanager
def _quiet_torch_launcher() -> Iterator[None]:
    """Mute the launcher's own logs: a failure is reported once, by :class:`RankFailure`.

    torch's elastic modules each set their logger's level, so the parent
    logger's level would not reach them; each is set and restored.
    """
    prefixes = ("torch.distributed.elastic", "torch.distributed.launcher", "torch.multiprocessing")
    loggers = [
        logging.getLogger(name)
        for name in list(logging.root.manager.loggerDict)
        if name.startswith(prefixes)
    ]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)


_NOTES_ENV = "COMMLIB_BENCH_FAILURE_NOTES"


def note_failure(exc: BaseException) -> None:
    """Write down, to the microsecond, how this rank failed (when started by :func:`launch_local`).

    Call it where the exception is caught, before any cleanup: tearing down
    the process group wakes the peers with errors of their own, and torch's
    error files carry whole seconds, so without the note the rank that only
    lost its peer can pass for the cause. Does nothing under other launchers.

    Examples:
        >>> try:                                 # in a rank of launch_local  # doctest: +SKIP
        ...     sweep(comm, opts)
        ... except BaseException as exc:
        ...     note_failure(exc)
        ...     raise
    """
    folder = os.environ.get(_NOTES_ENV)
    if not folder:
        return
    note = {
        "time": time.time(),
        "error": f"{type(exc).__name__}: {exc}",
        "traceback": "".join(traceback.format_exception(exc)),
    }
    rank = os.environ.get("RANK", "unknown")
    with open(os.path.join(folder, f"failed-{rank}.json"), "w") as f:
        json.dump(note, f)


class _NoteFailures:
    """``fn`` run with failure notes on (see :func:`note_failure`), in ``folder``.

    Picklable, so it can be the spawned ranks' entry point.
    """

    def __init__(self, fn: Callable[..., Any], folder: str):
        self.fn, self.folder = fn, folder
        # the launcher names its entry point in logs and events
        self.__name__ = getattr(fn, "__name__", "fn")
        self.__qualname__ = getattr(fn, "__qualname__", self.__name__)

    def __call__(self, *args: Any) -> Any:
        os.environ[_NOTES_ENV] = self.folder
        return self.fn(*args)

    def notes(self) -> dict[int, dict[str, Any]]:
        """Global rank -> its failure note, for the ranks that wrote one."""
        out = {}
        for name in os.listdir(self.folder):
            rank = name.removeprefix("failed-").removesuffix(".json")
            if name.startswith("failed-") and rank.isdigit():
                with open(os.path.join(self.folder, name)) as f:
                    out[int(rank)] = json.load(f)
        return out


def _rank_failure(exc: Any, notes: dict[int, dict[str, Any]]) -> RankFailure:
    """Every failed rank's own message, the first failure first.

    The notes decide which rank failed first and supply the messages of
    ranks the launcher stopped before they could exit with their own error;
    torch's ``ChildFailedError`` covers ranks that left no note (a crash).
    """
    failures, tb = {}, ""
    for rank, failure in sorted(exc.failures.items()):
        message = failure.message
        if isinstance(message, dict):  # what torch's @record writes: text plus a traceback
            message = message.get("message", json.dumps(message))
        failures[rank] = str(message)
    for rank, note in notes.items():
        failures[rank] = note["error"]
    if notes:
        first = min(notes, key=lambda r: notes[r]["time"])
        tb = notes[first]["traceback"]
    else:
        first = exc.get_first_failure()[0]
        message = exc.failures[first].message
        if isinstance(message, dict):
            tb = message.get("extraInfo", {}).get("py_callstack", "")
    return RankFailure(dict(sorted(failures.items())), first, tb)
