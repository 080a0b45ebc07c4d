"""Fresh rank processes that do not each pay torch's import: forked from one that did.

A test of how a process *exits* cannot run its ranks in a :class:`commlib.testing.World`
(those end through multiprocessing, not through the interpreter's own exit) and
``python script.py`` pays torch's import in each process (about 1.5 s of CPU, most of
a rank's start on 2 cores; ``test_exit.py`` starts about 50). :class:`Preimported`
starts this module once as a server that imports torch; each process a test asks for
is forked from it and then runs its script as ``python script.py ARGS`` would: its own
argv, environment, working directory, ``sys.path[0]``, stdout and stderr (files), the
script run as ``__main__`` (``runpy``), then the interpreter's ordinary exit (atexit
handlers, thread joins, torch's C++ teardown) with the exit code Python gives (1 and
the traceback for an uncaught error, ``-9`` for a SIGKILL). The server is one thread
(forking from a process with threads is unsafe): it forks, reaps, and reports each
exit with the time it was seen (within 10 ms).

Examples:
    >>> with Preimported() as launcher:                      # doctest: +SKIP
    ...     pid = launcher.spawn(SCRIPT, ["a"], dict(os.environ), ROOT, out, err)
    ...     launcher.wait([pid], deadline=time.monotonic() + 60)
    {1234: (0, 1795804552.77)}
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterable

_PRELOAD = ("torch", "torch.distributed")  # what every rank script imports first


class Preimported:
    """A server process that imported torch; :meth:`spawn` forks a process from it."""

    def __init__(self, start_timeout: float = 120.0):
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "OMP_NUM_THREADS": "1"}
        self._proc = subprocess.Popen(
            [sys.executable, __file__], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env
        )
        self._changed = threading.Condition()
        self._next_id = 0
        self._pids: dict[int, int] = {}  # request id -> pid
        self._ended: dict[int, tuple[int, float]] = {}  # pid -> (returncode, ended at)
        self._ready = False
        self._reader = threading.Thread(target=self._read, name="preimported", daemon=True)
        self._reader.start()
        with self._changed:
            if not self._changed.wait_for(
                lambda: self._ready or self._proc.poll() is not None, start_timeout
            ):
                self.close()
                raise TimeoutError(f"the preimported server did not start in {start_timeout} s")
        if not self._ready:
            raise RuntimeError(f"the preimported server exited {self._proc.returncode}")

    def _read(self) -> None:
        assert self._proc.stdout is not None
        for line in self._proc.stdout:
            event = json.loads(line)
            with self._changed:
                if "ready" in event:
                    self._ready = True
                elif "returncode" in event:
                    self._ended[event["pid"]] = (event["returncode"], event["ended_at"])
                else:
                    self._pids[event["id"]] = event["pid"]
                self._changed.notify_all()
        with self._changed:
            self._changed.notify_all()

    def spawn(
        self,
        script: str | os.PathLike[str],
        args: Iterable[str],
        env: dict[str, str],
        cwd: str | os.PathLike[str],
        stdout: str | os.PathLike[str],
        stderr: str | os.PathLike[str],
    ) -> int:
        """Fork a process that runs ``python script *args`` in ``cwd`` with ``env``; its pid.

        Its output goes to the files ``stdout`` and ``stderr``.
        """
        assert self._proc.stdin is not None
        with self._changed:
            request_id = self._next_id
            self._next_id += 1
            request = {
                "id": request_id,
                "script": os.fspath(script),
                "args": list(args),
                "env": env,
                "cwd": os.fspath(cwd),
                "stdout": os.fspath(stdout),
                "stderr": os.fspath(stderr),
            }
            self._proc.stdin.write(json.dumps(request).encode() + b"\n")
            self._proc.stdin.flush()
            if not self._changed.wait_for(
                lambda: request_id in self._pids or self._proc.poll() is not None, 60
            ):
                raise TimeoutError("the preimported server did not fork in 60 s")
            if request_id not in self._pids:
                raise RuntimeError(f"the preimported server exited {self._proc.returncode}")
            return self._pids.pop(request_id)

    def ended(self, pid: int) -> tuple[int, float] | None:
        """``(returncode, time.time() it was seen to end)``, or None while it runs."""
        with self._changed:
            return self._ended.get(pid)

    def wait(self, pids: Iterable[int], deadline: float) -> dict[int, tuple[int, float]]:
        """Wait until every pid ended or ``time.monotonic()`` passes ``deadline``; the ended."""
        pids = list(pids)
        with self._changed:
            self._changed.wait_for(
                lambda: all(p in self._ended for p in pids) or self._proc.poll() is not None,
                max(0.0, deadline - time.monotonic()),
            )
            return {p: self._ended[p] for p in pids if p in self._ended}

    def kill(self, pids: Iterable[int]) -> None:
        """SIGKILL those of ``pids`` (forked here) that have not ended; the server does it.

        The server sends the signal only to a child it has not reaped, so a pid the
        system has given to another process since is never signalled.
        """
        assert self._proc.stdin is not None
        with self._changed:
            self._proc.stdin.write(json.dumps({"kill": list(pids)}).encode() + b"\n")
            self._proc.stdin.flush()

    def close(self) -> None:
        """End the server (its stdin closes); it waits for its children first."""
        if self._proc.stdin is not None and not self._proc.stdin.closed:
            self._proc.stdin.close()
        try:
            self._proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self._proc.kill()  # ours, by pid
            self._proc.wait()

    def __enter__(self) -> Preimported:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# -- the server ----------------------------------------------------------------------------
_script_globals: dict = {}  # the script's module, alive until the exit, as __main__ is


def _send(event: dict) -> None:
    os.write(1, json.dumps(event).encode() + b"\n")  # unbuffered: nothing for a fork to copy


def _become(request: dict) -> None:
    """In the forked child: turn into ``python script args``; never returns to the server."""
    global _script_globals
    import runpy

    for fd, path, flags in (
        (0, os.devnull, os.O_RDONLY),
        (1, request["stdout"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
        (2, request["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
    ):
        opened = os.open(path, flags, 0o644)
        os.dup2(opened, fd)  # the server's pipes are no longer this process's
        os.close(opened)
    os.environ.clear()
    os.environ.update(request["env"])
    if "tempfile" in sys.modules:  # read from TMPDIR once: as a fresh process would now
        sys.modules["tempfile"].tempdir = None
    os.chdir(request["cwd"])
    script = os.path.abspath(request["script"])
    sys.argv = [script, *request["args"]]
    sys.path[0] = os.path.dirname(script)
    # an uncaught error goes up from here to the interpreter, as from a script
    _script_globals = runpy.run_path(script, run_name="__main__")
    raise SystemExit(0)


def _serve() -> None:
    for name in _PRELOAD:
        __import__(name)
    _send({"ready": True})
    children: set[int] = set()
    pending = b""
    reading = True
    while reading or children:
        if reading and select.select([0], [], [], 0.01)[0]:
            chunk = os.read(0, 1 << 16)
            reading = bool(chunk)  # the test closed our stdin: end once the children did
            pending += chunk
            while b"\n" in pending:
                line, pending = pending.split(b"\n", 1)
                request = json.loads(line)
                if "kill" in request:
                    for pid in set(request["kill"]) & children:
                        os.kill(pid, signal.SIGKILL)
                    continue
                pid = os.fork()
                if pid == 0:
                    _become(request)
                children.add(pid)
                _send({"id": request["id"], "pid": pid})
        elif not reading:
            time.sleep(0.01)
        while children:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            children.discard(pid)
            code = os.waitstatus_to_exitcode(status)
            _send({"pid": pid, "returncode": code, "ended_at": time.time()})


if __name__ == "__main__":
    _serve()
