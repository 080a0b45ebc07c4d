"""``commlib run``: start a job's ranks so that the others live on when one dies.

torchrun's agent treats its ranks as one group: torch 2.13's
``LocalElasticAgent`` polls one ``PContext`` for all local ranks, and
``PContext`` is all-or-nothing (the first failure closes every process), after
which the agent restarts the whole group or gives up. Neither can be
configured otherwise, so a survivor never reaches its ``except`` to shrink.

This launcher is built from the same pieces: each rank is its own
``torch.distributed.elastic.multiprocessing`` context (one process, torch's
log and error-file handling), so a rank that ends ends alone. When one fails
and ``--max-restarts`` allows, a replacement starts in its place with
``COMMLIB_NEWCOMER=1`` and calls :func:`commlib.join`. The rendezvous store
is a ``TCPStore`` hosted by the launcher of node 0 (never by a rank, so a
dead rank never takes the store with it); ranks find it through
``MASTER_ADDR`` / ``MASTER_PORT`` with ``TORCHELASTIC_USE_AGENT_STORE=True``,
as under torchrun.

The job succeeds (exit 0) when every process that failed on this node was
replaced (``--max-restarts``) or left out by the survivors' ``shrink`` (they
note each process they leave out in the store); any other failure is the
job's exit code (the first such one; 1 for a signal), so a scheduler reads a
failed job as non-zero and a survived one as 0. Without ``--log-dir`` torch's
per-rank log folder is a temporary one, removed when the job ends.
"""

from __future__ import annotations

import argparse
import datetime
import os
import shutil
import socket
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch.distributed as dist
from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, start_processes
from torch.distributed.elastic.multiprocessing.api import PContext, SignalException

from commlib import _survivors
from commlib.launch import NEWCOMER_ENV

_FINISHED = "commlib/run/finished"


@dataclass
class Slot:
    """One rank's place on this node: the process in it now, and how each one ended.

    Examples:
        >>> Slot(local_rank=0, rank=0).starts
        0
    """

    local_rank: int
    rank: int
    context: PContext | None = None
    pid: int | None = None
    starts: int = 0
    #: (exit code, time it ended, pid) of every process that ran in this slot
    ends: list[tuple[int, float, int | None]] = field(default_factory=list)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """torchrun's common flags, for ``commlib run``.

    Examples:
        >>> p = argparse.ArgumentParser(); add_arguments(p)
        >>> p.parse_args(["--nproc-per-node", "2", "train.py"]).nproc_per_node
        2
    """
    a = parser.add_argument
    a("--nproc-per-node", "--nproc_per_node", type=int, default=1, help="ranks on this node")
    a("--nnodes", type=int, default=1, help="nodes of the job (a fixed number)")
    a("--node-rank", "--node_rank", type=int, default=0, help="this node's index")
    a(
        "--rdzv-endpoint",
        "--rdzv_endpoint",
        default="",
        help="HOST:PORT of the store (node 0's launcher hosts it; default 127.0.0.1, a free port)",
    )
    a("--rdzv-backend", "--rdzv_backend", default="c10d", choices=["c10d", "static"])
    a("--rdzv-id", "--rdzv_id", default="", help="the job's id (the logs' directory name)")
    a("--master-addr", "--master_addr", default="", help="as --rdzv-endpoint's host")
    a("--master-port", "--master_port", type=int, default=0, help="as --rdzv-endpoint's port")
    a("--standalone", action="store_true", help="one node, a free port (the default anyway)")
    a(
        "--max-restarts",
        "--max_restarts",
        type=int,
        default=0,
        help="replacements this node may start in all (each for one lost rank, which joins "
        "the survivors with commlib.join())",
    )
    a("--monitor-interval", "--monitor_interval", type=float, default=0.1, help="seconds")
    a("--log-dir", "--log_dir", default="", help="where torch's per-rank error files go")
    a("-m", "--module", action="store_true", help="run the script as a module (python -m)")
    a("--no-python", "--no_python", action="store_true", help="the script is a program")
    a("script", help="the training script (or module, or program)")
    a("script_args", nargs=argparse.REMAINDER)


def _endpoint(args: argparse.Namespace) -> tuple[str, int]:
    host, port = args.master_addr, args.master_port
    if args.rdzv_endpoint:
        host, _, port_text = args.rdzv_endpoint.rpartition(":")
        if not host:
            host, port_text = port_text, ""
        port = int(port_text) if port_text else 0
    if args.nnodes > 1 and (not host or not port):
        raise ValueError("--nnodes > 1 needs --rdzv-endpoint HOST:PORT (node 0 hosts the store)")
    return host or "127.0.0.1", port


def _store(args: argparse.Namespace, host: str, port: int) -> dist.TCPStore:
    if args.node_rank == 0:
        # the launcher hosts the store: it outlives every rank
        return dist.TCPStore(host, port, is_master=True, wait_for_workers=False)
    return dist.TCPStore(host, port, is_master=False, timeout=datetime.timedelta(minutes=10))


def _command(args: argparse.Namespace) -> tuple[str, tuple[str, ...]]:
    if args.no_python:
        return args.script, tuple(args.script_args)
    if args.module:
        return sys.executable, ("-u", "-m", args.script, *args.script_args)
    return sys.executable, ("-u", args.script, *args.script_args)


class Launcher:
    """This node's ranks, each in its own torch elastic process context.

    Examples:
        >>> launcher = Launcher(parsed_args)  # doctest: +SKIP
        >>> launcher.run()  # doctest: +SKIP
        0
    """

    def __init__(self, args: argparse.Namespace):
        if args.nproc_per_node < 1 or args.nnodes < 1:
            raise ValueError("--nproc-per-node and --nnodes must be at least 1")
        if not 0 <= args.node_rank < args.nnodes:
            raise ValueError(f"--node-rank must be in [0, {args.nnodes}), got {args.node_rank}")
        self.args = args
        host, port = _endpoint(args)
        self.store = _store(args, host, port)
        self.host, self.port = host, self.store.port
        self.run_id = args.rdzv_id or uuid.uuid4().hex[:8]
        #: torch's per-rank log folder: a temporary one (removed at the end) unless asked
        self.temporary_logs = not args.log_dir
        self.log_dir = args.log_dir or tempfile.mkdtemp(prefix="commlib_run_")
        self.entrypoint, self.entry_args = _command(args)
        self.restarts_left = args.max_restarts
        n = args.nproc_per_node
        self.slots = [Slot(i, args.node_rank * n + i) for i in range(n)]

    def _env(self, slot: Slot, newcomer: bool) -> dict[str, str]:
        n, world = self.args.nproc_per_node, self.args.nproc_per_node * self.args.nnodes
        env = {
            "RANK": str(slot.rank),
            "LOCAL_RANK": str(slot.local_rank),
            "GROUP_RANK": str(self.args.node_rank),
            "ROLE_RANK": str(slot.rank),
            "ROLE_NAME": "default",
            "WORLD_SIZE": str(world),
            "LOCAL_WORLD_SIZE": str(n),
            "ROLE_WORLD_SIZE": str(world),
            "MASTER_ADDR": self.host,
            "MASTER_PORT": str(self.port),
            "TORCHELASTIC_USE_AGENT_STORE": "True",
            "TORCHELASTIC_RUN_ID": self.run_id,
            "TORCHELASTIC_RESTART_COUNT": str(slot.starts),
            "TORCHELASTIC_MAX_RESTARTS": str(self.args.max_restarts),
            NEWCOMER_ENV: "1" if newcomer else "0",
        }
        if n > 1 and "OMP_NUM_THREADS" not in os.environ:
            env["OMP_NUM_THREADS"] = "1"  # as torchrun: n ranks sharing the cores
        return env

    def _start(self, slot: Slot, newcomer: bool) -> None:
        logs = DefaultLogsSpecs(log_dir=os.path.join(self.log_dir, f"rank{slot.rank}"))
        context = start_processes(
            name=f"rank{slot.rank}",
            entrypoint=self.entrypoint,
            args={0: self.entry_args},
            envs={0: self._env(slot, newcomer)},
            logs_specs=logs,
        )
        slot.context, slot.pid = context, context.pids()[0]
        slot.starts += 1

    def _poll(self, slot: Slot) -> None:
        assert slot.context is not None
        result = slot.context.wait(0)
        if result is None:
            return
        code = 0
        if result.is_failed():
            failure = result.failures[0]
            code = failure.exitcode
            how = failure.signal_name() if code < 0 else f"exit code {code}"
            print(
                f"commlib run: rank {slot.rank} (pid {slot.pid}) ended: {how}",
                file=sys.stderr,
                flush=True,
            )
        slot.ends.append((code, time.monotonic(), slot.pid))
        slot.context = None
        if code != 0 and self.restarts_left > 0:
            self.restarts_left -= 1
            self._start(slot, newcomer=True)
            print(
                f"commlib run: started a replacement for rank {slot.rank} (pid {slot.pid}); "
                f"{self.restarts_left} replacement(s) left",
                file=sys.stderr,
                flush=True,
            )

    def _close(self, sig: Any) -> None:
        for slot in self.slots:
            if slot.context is not None:
                slot.context.close(sig)
                slot.context = None

    def run(self) -> int:
        """Start the ranks, replace the lost ones while allowed; the job's exit code.

        Examples:
            >>> Launcher(parsed_args).run()  # doctest: +SKIP
            0
        """
        try:
            for slot in self.slots:
                self._start(slot, newcomer=False)
            while any(slot.context is not None for slot in self.slots):
                time.sleep(self.args.monitor_interval)
                for slot in self.slots:
                    if slot.context is not None:
                        self._poll(slot)
            self._finish()
        except SignalException as exc:
            print(f"commlib run: got {exc.sigval.name}; ending the ranks", file=sys.stderr)
            self._close(exc.sigval)
            return 128 + int(exc.sigval)
        finally:
            if self.temporary_logs:
                shutil.rmtree(self.log_dir, ignore_errors=True)
        return self._exit_code()

    def _finish(self) -> None:
        """Node 0 keeps the store up until every node's ranks have ended."""
        self.store.add(_FINISHED, 1)
        if self.args.node_rank == 0:
            while int(self.store.add(_FINISHED, 0)) < self.args.nnodes:
                time.sleep(self.args.monitor_interval)

    def _exit_code(self) -> int:
        """0 when every failed process was replaced or shrunk away; else the first failure's.

        Examples:
            >>> launcher._exit_code()  # doctest: +SKIP
            0
        """
        failed = []
        for slot in self.slots:
            for i, (code, at, pid) in enumerate(slot.ends):
                replaced = i < len(slot.ends) - 1  # a replacement ran in its slot
                if code != 0 and not replaced and not self._shrunk_away(pid):
                    failed.append((at, code))
        if failed:
            code = min(failed)[1]
            return code if 0 < code < 256 else 1
        return 0

    def _shrunk_away(self, pid: int | None) -> bool:
        """Whether the survivors' shrink left process ``pid`` of this node out (they note it)."""
        record = _survivors.process_record()
        if pid is None or record is None:
            return False
        here = record.rpartition(" ")[0]
        try:
            return bool(self.store.check([f"{_survivors.LEFT_OUT}/{here} {pid}"]))
        except Exception:  # the store is gone: nothing forgives the failure
            return False


def main(argv: Sequence[str] | None = None) -> int:
    """``commlib run ...``: parse torchrun's common flags and run the job.

    Examples:
        $ commlib run --nproc-per-node 4 --max-restarts 2 train.py --epochs 3
    """
    parser = argparse.ArgumentParser(
        prog="commlib run", description=__doc__.split("\n")[0].replace("``", "")
    )
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        launcher = Launcher(args)
    except (ValueError, OSError) as exc:
        print(f"commlib run: {exc}", file=sys.stderr)
        return 2
    logs = "" if launcher.temporary_logs else f", logs in {launcher.log_dir}"
    print(
        f"commlib run: {args.nproc_per_node * args.nnodes} rank(s), store at "
        f"{launcher.host}:{launcher.port} on {socket.gethostname()}{logs}",
        file=sys.stderr,
        flush=True,
    )
    return launcher.run()
