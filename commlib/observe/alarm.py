"""When one rank's collective fails, every live rank writes its flight recorder.

The failing rank writes its own file, then tells the others through the
default process group's store, as torch's NCCL flight recorder does: it
leaves the reason under ``commlib/trace/`` and bumps a counter. A watcher
thread on every rank polls the counter (one store round trip every ``poll``
seconds, only while a trace directory is set), writes its file when the
counter moves and acknowledges. The failing rank waits (at most ``patience``
seconds) for the acknowledgements before its error goes up, so that a launcher
that ends the job on the first failure (torchrun) finds the files written.

``SIGUSR1`` asks the same of a live job: ``kill -USR1 <pid>`` on one rank and
every rank writes its file. A Python signal handler runs only once the main
thread is back in Python, which a rank blocked in a collective is not; so the
signal reaches the watcher thread through ``signal.set_wakeup_fd``. A program
that handles ``SIGUSR1`` itself, or owns the wakeup fd, is left alone (a
signal then writes when the main thread is free).
"""

from __future__ import annotations

import atexit
import os
import select
import signal
import socket
import threading
import time
import warnings
from types import FrameType
from typing import Any

import torch.distributed as dist

from commlib._world import default_store, store_failed
from commlib.observe import trace_files
from commlib.observe.recorder import FlightRecorder

_COUNTER = "commlib/trace/requests"
_REASON = "commlib/trace/reason"
_ACKS = "commlib/trace/acks/"


class Alarm:
    """Writes a recorder's file on failure, on request of another rank, on SIGUSR1 and at exit.

    Args:
        recorder: the flight recorder to write (it must have a directory).
        poll: seconds between two looks at the store.
        patience: seconds a failing rank waits for the others to write.
        quiet: seconds after asking the others before a failure asks again.

    Examples:
        >>> alarm = Alarm(FlightRecorder(directory="/tmp/trace"))  # doctest: +SKIP
        >>> alarm.arm()                                            # doctest: +SKIP
    """

    def __init__(
        self,
        recorder: FlightRecorder,
        poll: float = 0.5,
        patience: float = 3.0,
        quiet: float = 10.0,
    ):
        self.recorder, self.poll, self.patience, self.quiet = recorder, poll, patience, quiet
        self._last_ask = -quiet
        self._lock = threading.Lock()
        self._seen = 0  # the last request this rank answered
        self._mine: set[int] = set()  # requests this rank made: no need to answer them
        self._wakeup: int | None = None
        self._wakeup_write: int | None = None
        self._stop = threading.Event()
        self._gone: Any = None  # the store whose host has exited
        self._thread: threading.Thread | None = None
        self._warned = False
        self._announced = False

    def arm(self) -> None:
        """Start: the watcher thread, ``SIGUSR1`` (from the main thread), the write at exit."""
        if self._thread is not None:
            return
        self.recorder.on_failure = self.failed
        self._install_signal()
        self._thread = threading.Thread(target=self._watch, name="commlib-trace", daemon=True)
        self._thread.start()
        atexit.register(self._at_exit)

    # -- what asks for a write ---------------------------------------------------------
    def failed(self, reason: str) -> None:
        """A collective failed here: write this rank's file, ask the others, wait a little.

        The others are asked at most once every ``quiet`` seconds: a program
        that goes on calling a failed communicator must not wait each time.
        """
        self._write(reason)
        now = time.monotonic()
        if now - self._last_ask >= self.quiet:
            self._last_ask = now
            self.ask_others(reason, wait=True)

    def signalled(self) -> None:
        """``SIGUSR1``: write this rank's file and ask the others."""
        reason = f"SIGUSR1 on rank {self.recorder.rank}"
        self._write(reason)
        self.ask_others(reason, wait=False)

    def ask_others(self, reason: str, wait: bool) -> None:
        """Ask every other rank to write its file; with ``wait``, give them ``patience``."""
        store = default_store()
        if store is None:
            return
        rank, world = self.recorder.identity()
        try:
            store.set(_REASON, f"rank {rank}: {reason}")
            request = int(store.add(_COUNTER, 1))
            with self._lock:
                self._mine.add(request)
            if not wait or world < 2:
                return
            deadline = time.monotonic() + self.patience
            while time.monotonic() < deadline:
                if int(store.add(f"{_ACKS}{request}", 0)) >= world - 1:
                    return
                time.sleep(0.05)
        except Exception as exc:  # the store may be what failed; the error still goes up
            store_failed(exc)

    # -- the watcher -------------------------------------------------------------------
    def _watch(self) -> None:
        while not self._stop.is_set():
            if self._wakeup is not None:
                ready, _, _ = select.select([self._wakeup], [], [], self.poll)
                if ready and self._signal_read():
                    self.signalled()
            else:
                self._stop.wait(self.poll)
            self._answer()
            if not self._announced:
                self._announce()

    def _announce(self) -> None:
        """Leave this rank's pid in the directory once its rank is known (``commlib stacks``)."""
        if not (self.recorder.recorded or (dist.is_available() and dist.is_initialized())):
            return
        self._announced = True
        rank, world = self.recorder.identity()
        directory = self.recorder.directory
        if directory is None:
            return
        try:
            trace_files.write_live(
                directory,
                {
                    "rank": rank,
                    "world_size": world,
                    "pid": os.getpid(),
                    "host": socket.gethostname(),
                    "started": process_started(os.getpid()),
                    # whether SIGUSR1 reaches this alarm (or the program's own handler)
                    "signal": signal.getsignal(signal.SIGUSR1) == self._on_signal,
                },
            )
        except OSError:
            pass  # the trace file itself will say why it cannot be written

    def _answer(self) -> None:
        store = default_store()
        if store is None or store is self._gone:
            return
        try:
            latest = int(store.add(_COUNTER, 0))
            if latest <= self._seen:
                return
            reason = store.get(_REASON).decode(errors="replace")
            with self._lock:
                asked = [r for r in range(self._seen + 1, latest + 1) if r not in self._mine]
                self._seen = latest
            if asked:
                self._write(f"asked by {reason}")
                for request in asked:
                    store.add(f"{_ACKS}{request}", 1)
        except Exception as exc:
            # the store's host (rank 0 under env://) has exited: nothing to answer,
            # and each look would log torch's connection warning again
            store_failed(exc)
            self._gone = store  # a group started again has another store: asked again

    def _write(self, reason: str, stacks: bool = True) -> None:
        try:
            self.recorder.dump(reason, stacks=stacks)
        except OSError as exc:
            if not self._warned:
                self._warned = True
                warnings.warn(f"commlib could not write its trace: {exc}", stacklevel=2)

    def _at_exit(self) -> None:
        self._stop.set()
        # a process that ran no collective (``commlib info`` in a shell with
        # COMMLIB_TRACE_DIR exported) must not replace a rank's file
        if self.recorder.recorded:
            self._write("exit", stacks=False)  # the stacks of the exit say nothing

    # -- SIGUSR1 -----------------------------------------------------------------------
    def _install_signal(self) -> None:
        if not hasattr(signal, "SIGUSR1"):
            return
        if threading.current_thread() is not threading.main_thread():
            return
        if signal.getsignal(signal.SIGUSR1) not in (signal.SIG_DFL, None):
            return  # the program handles SIGUSR1 itself
        signal.signal(signal.SIGUSR1, self._on_signal)
        read, write = os.pipe()
        os.set_blocking(read, False)
        os.set_blocking(write, False)
        previous = signal.set_wakeup_fd(write, warn_on_full_buffer=False)
        if previous != -1:  # someone else reads signals this way: leave it to them
            signal.set_wakeup_fd(previous)
            os.close(read)
            os.close(write)
            return
        self._wakeup, self._wakeup_write = read, write

    def _signal_read(self) -> bool:
        assert self._wakeup is not None
        try:
            data = os.read(self._wakeup, 512)
        except OSError:
            return False
        return signal.SIGUSR1 in data

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        # the watcher has already seen it, unless another owner took the wakeup fd since
        current = signal.set_wakeup_fd(-1)
        signal.set_wakeup_fd(current)
        if self._wakeup is None or current != self._wakeup_write:
            # not in the handler: taking stacks and writing there is heavy work (pytorch#167023)
            threading.Thread(
                target=self.signalled, name="commlib-trace-signal", daemon=True
            ).start()


def process_started(pid: int) -> str | None:
    """When process ``pid`` started, as the kernel counts it (Linux); ``None`` elsewhere.

    A pid left in a file may belong to another process by the time it is read:
    ``commlib stacks`` signals it only if this still matches.

    Examples:
        >>> process_started(os.getpid()) is None or process_started(os.getpid()).isdigit()
        True
    """
    try:
        with open(f"/proc/{pid}/stat") as f:
            # the fields after the command name, which may hold spaces and parentheses
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None
