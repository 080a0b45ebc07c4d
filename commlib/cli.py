"""The ``commlib`` command: ``info``, ``bench``, ``trace``, ``stacks``, ``stats`` and ``run``."""

from __future__ import annotations

import argparse
import platform
import sys
from collections.abc import Sequence


def info(out=None) -> int:
    """Print the registered backends, their availability and the environment.

    Examples:
        $ commlib info
    """
    out = out or sys.stdout
    import torch

    import commlib
    from commlib import plugins

    print(
        f"commlib {commlib.__version__}  torch {torch.__version__}  "
        f"python {platform.python_version()}",
        file=out,
    )
    try:
        default = plugins.backend_for_group()
        line = f"default backend: {default.name} (torch backend {default.torch_backend}, "
        line += f"device {default.current_device()})"
    except Exception as exc:  # a machine with no working backend still gets its table
        line = f"default backend: none ({exc})"
    print(line, file=out)
    rows = [("backend", "torch backend", "device", "available", "plugin / reason")]
    for b in commlib.list_backends():
        rows.append(
            (
                b.name,
                b.torch_backend or "-",
                b.device_type,
                "yes" if b.available else "no",
                (f"{b.plugin}: {b.description}" if b.description else b.plugin)
                if b.available
                else b.reason or "",
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)) + "  " + r[4], file=out)
    from commlib.observe import dispatch

    watching = plugins.list_observers()
    print(f"observers: {', '.join(watching) if watching else 'none'}", file=out)
    for name, why in dispatch.disabled().items():
        print(f"observer disabled: {name}: {why}", file=out)
    return 0


def bench(args: argparse.Namespace, argv: Sequence[str] | None = None) -> int:
    """Benchmark every collective, commlib against torch.distributed, and print the table.

    Examples:
        $ commlib bench
        $ commlib bench --nproc 4 --max-bytes 64M --json bench.json --plot bench.png
        $ torchrun --nnodes 2 --nproc-per-node 8 ... --no-python commlib bench
    """
    from commlib.bench import run
    from commlib.bench.options import options_from

    try:
        opts = options_from(args)
    except ValueError as exc:
        print(f"commlib bench: {exc}", file=sys.stderr)
        return 2
    return run(opts, ["commlib", *(sys.argv[1:] if argv is None else argv)])


def trace(directory: str, as_json: bool = False, out=None, stacks: bool = False) -> int:
    """Read every rank's flight recorder file in ``directory`` and print where the ranks diverged.

    Examples:
        $ COMMLIB_TRACE_DIR=/tmp/trace torchrun --nproc-per-node 4 train.py
        $ commlib trace /tmp/trace
        $ commlib trace /tmp/trace --stacks
        $ commlib trace /tmp/trace --json

    Exits 1 when the folder holds no trace file (it says so), 2 when it is no folder.
    """
    import json
    from pathlib import Path

    from commlib.observe.diagnosis import diagnose, render

    out = out or sys.stdout
    if not Path(directory).is_dir():
        print(f"commlib trace: {directory} is not a directory", file=sys.stderr)
        return 2
    found = diagnose(directory)
    print(json.dumps(found, indent=1) if as_json else render(found, stacks=stacks), file=out)
    # nothing to read is a failure a script can tell: a wrong folder, or no rank wrote
    return 0 if found.get("ranks_with_files") else 1


def stacks(directory: str, timeout: float = 15.0, as_json: bool = False, out=None) -> int:
    """Ask a running job (``COMMLIB_TRACE_DIR=directory``) for every rank's stacks and print them.

    Examples:
        $ commlib stacks /tmp/trace
    """
    import json
    from pathlib import Path

    from commlib.observe.asking import ask_for_stacks
    from commlib.observe.diagnosis import diagnose, render

    out = out or sys.stdout
    if not Path(directory).is_dir():
        print(f"commlib stacks: {directory} is not a directory", file=sys.stderr)
        return 2
    try:
        chosen, answered, silent = ask_for_stacks(directory, timeout)
    except LookupError as exc:
        print(f"commlib stacks: {exc}", file=sys.stderr)
        return 1
    found = diagnose(directory)
    if as_json:
        print(json.dumps(found, indent=1), file=out)
        return 0 if not silent else 1
    print(
        f"asked rank {chosen['rank']} (pid {chosen['pid']}) with SIGUSR1; "
        f"answered: {', '.join(map(str, answered)) or 'none'}"
        + (f"; no answer within {timeout:g}s: {', '.join(map(str, silent))}" if silent else ""),
        file=out,
    )
    print(render(found, stacks=True), file=out)
    return 0 if not silent else 1


def stats(directory: str, as_json: bool = False, out=None) -> int:
    """Read every rank's statistics file (``COMMLIB_STATS=directory``) and print them merged.

    Examples:
        $ COMMLIB_STATS=/tmp/stats torchrun --nproc-per-node 4 train.py
        $ commlib stats /tmp/stats

    Exits 1 when the folder holds no statistics file (it says so), 2 when it is no folder.
    """
    import json
    from pathlib import Path

    from commlib.observe.stats_report import merge, render

    out = out or sys.stdout
    if not Path(directory).is_dir():
        print(f"commlib stats: {directory} is not a directory", file=sys.stderr)
        return 2
    merged = merge(directory)
    print(json.dumps(merged, indent=1) if as_json else render(merged), file=out)
    return 0 if merged["ranks"] else 1  # no file: a wrong folder, or no rank wrote one


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``commlib`` console script."""
    args_in = list(sys.argv[1:] if argv is None else argv)
    if args_in[:1] == ["run"]:
        # everything after the script is the script's: argparse's subparsers would take it
        from commlib.run import main as run_main

        return run_main(args_in[1:])
    parser = argparse.ArgumentParser(
        prog="commlib",
        description="commlib's command line: the backends found here (info), every collective "
        "against torch.distributed (bench), the flight recorder's files read (trace), a live "
        "job's stacks (stacks), the statistics files merged (stats), a launcher whose "
        "survivors live on when a rank dies (run).",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("info", help="registered backends, availability, torch version, device")
    bench_parser = sub.add_parser(
        "bench",
        help="every collective, commlib against torch.distributed (algbw and busbw tables)",
        description="Benchmark every collective through commlib and through plain "
        "torch.distributed in the same run, in repeated interleaved trials: time, algbw, busbw, "
        "their ratio with its spread over the trials (rows within the noise flagged), peak RSS. "
        "--ops dispatch: what a call costs before the engine, commlib against torch, on torch's "
        "fake process group in this process.",
    )
    from commlib.bench.options import add_arguments

    add_arguments(bench_parser)
    trace_parser = sub.add_parser(
        "trace",
        help="read every rank's flight recorder (COMMLIB_TRACE_DIR) and name the rank that "
        "diverged",
        description="Read the files the flight recorder wrote into DIR (one per rank, from "
        "this machine or others) and print the first collective where the ranks disagree, "
        "what each rank was doing, the ranks that never arrived and the missing files.",
    )
    trace_parser.add_argument("directory", metavar="DIR")
    sub.add_parser(
        "run",
        help="start the ranks (torchrun's flags) so that survivors live on when one dies, "
        "and start replacements that join them (`commlib run --help`)",
        add_help=False,
    )
    trace_parser.add_argument("--json", action="store_true", help="print the diagnosis as JSON")
    trace_parser.add_argument(
        "--stacks",
        action="store_true",
        help="also print every rank's Python stacks (taken on a failure, a request or SIGUSR1), "
        "ranks with the same stack together",
    )
    stacks_parser = sub.add_parser(
        "stacks",
        help="ask a running job (COMMLIB_TRACE_DIR=DIR) for every rank's Python stacks",
        description="Send SIGUSR1 to one rank of the job on this machine (its pid is in DIR): "
        "every rank writes its trace file with the stacks of all its threads, the job goes on. "
        "Then print them, ranks with the same stack together, with the trace's diagnosis.",
    )
    stacks_parser.add_argument("directory", metavar="DIR")
    stacks_parser.add_argument(
        "--timeout", type=float, default=15.0, help="seconds to wait for every rank (15)"
    )
    stacks_parser.add_argument("--json", action="store_true", help="print the diagnosis as JSON")
    stats_parser = sub.add_parser(
        "stats",
        help="read every rank's statistics (COMMLIB_STATS=DIR): by op and size, stragglers",
        description="Merge the files each rank wrote into DIR: calls, median and longest time, "
        "algbw and busbw by collective and message size, and which rank arrives last at the "
        "collectives and how long the others wait for it.",
    )
    stats_parser.add_argument("directory", metavar="DIR")
    stats_parser.add_argument("--json", action="store_true", help="print the merge as JSON")
    args = parser.parse_args(argv)
    if args.command == "info":
        return info()
    if args.command == "bench":
        return bench(args, argv)
    if args.command == "trace":
        return trace(args.directory, args.json, stacks=args.stacks)
    if args.command == "stats":
        return stats(args.directory, args.json)
    if args.command == "stacks":
        return stacks(args.directory, args.timeout, args.json)
    return 2


if __name__ == "__main__":
    sys.exit(main())
