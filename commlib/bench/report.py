"""Showing the rows: the table (text or markdown), a summary, JSON, and the plot."""

from __future__ import annotations

import datetime
import json
import math
import platform
import sys
from collections.abc import Callable, Sequence
from itertools import groupby
from typing import Any, TextIO

from commlib.bench import bandwidth, memory
from commlib.bench.units import format_size

Row = dict[str, Any]

PLOT_HINT = "--plot needs matplotlib: pip install 'commlib[plot]' (or pip install matplotlib)"


def _us(v: float) -> str:
    return f"{v:.1f}" if v < 1000 else f"{v:.0f}"


def _num(v: float) -> str:
    return f"{v:.2f}"


def _mib(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f}"  # None: run with --no-memory


def _size(row: Row) -> str:
    return format_size(row["size_bytes"])


# (header, width, cell); the two implementations get the same four columns
def _impl_columns(impl: str) -> list[tuple[str, int, Callable[[Row], str]]]:
    return [
        ("time(us)", 10, lambda r: _us(r[f"{impl}_time_us"])),
        ("algbw", 7, lambda r: _num(r[f"{impl}_algbw_gbps"])),
        ("busbw", 7, lambda r: _num(r[f"{impl}_busbw_gbps"])),
        ("rss(MiB)", 8, lambda r: _mib(r[f"{impl}_peak_rss_mib"])),
    ]


def format_table(rows: Sequence[Row]) -> str:
    """The rows as a fixed-width text table, one block per case.

    Examples:
        >>> print(format_table(rows))           # rows: what run_rank returned  # doctest: +SKIP
                                |               commlib               | ...
        case         size iters |   time(us)   algbw   busbw rss(MiB) | ...
        all_reduce     1K    20 |       41.2    0.02    0.02      0.1 | ...
    """
    name_w = max([len("case"), *(len(r["case"]) for r in rows)])
    left = [("size", 6, _size), ("iters", 5, lambda r: str(r["iters"]))]
    impls = {impl: _impl_columns(impl) for impl in ("commlib", "torch")}
    span = {impl: sum(w + 1 for _, w, _ in cols) - 1 for impl, cols in impls.items()}
    lead = name_w + sum(w + 1 for _, w, _ in left)
    lines = [
        " " * lead
        + " | "
        + "commlib".center(span["commlib"])
        + " | "
        + "torch.distributed".center(span["torch"])
        + " |",
        "case".ljust(name_w)
        + "".join(" " + h.rjust(w) for h, w, _ in left)
        + "".join(" | " + " ".join(h.rjust(w) for h, w, _ in cols) for cols in impls.values())
        + " |  ratio",
    ]
    for i, (_, block) in enumerate(groupby(rows, key=lambda r: r["case"])):
        if i:
            lines.append("")
        for r in block:
            lines.append(
                r["case"].ljust(name_w)
                + "".join(" " + cell(r).rjust(w) for _, w, cell in left)
                + "".join(
                    " | " + " ".join(cell(r).rjust(w) for _, w, cell in cols)
                    for cols in impls.values()
                )
                + f" | {r['ratio']:6.2f}"
            )
    return "\n".join(lines)


def format_markdown(rows: Sequence[Row]) -> str:
    """The rows as a GitHub markdown table (commlib / torch side by side per cell).

    Examples:
        >>> print(format_markdown([]))          # the head; a line per row follows
        | case | size | commlib (us) | torch (us) | commlib / torch | ...
        |---|---|---:|---:|---:|---:|---:|
    """
    head = [
        "case",
        "size",
        "commlib (us)",
        "torch (us)",
        "commlib / torch",
        "busbw GB/s commlib / torch",
        "peak RSS MiB commlib / torch",
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * 2 + "---:|" * (len(head) - 2)]
    for r in rows:
        cells = [
            f"`{r['case']}`",
            _size(r),
            _us(r["commlib_time_us"]),
            _us(r["torch_time_us"]),
            f"**{r['ratio']:.2f}**",
            f"{_num(r['commlib_busbw_gbps'])} / {_num(r['torch_busbw_gbps'])}",
            f"{_mib(r['commlib_peak_rss_mib'])} / {_mib(r['torch_peak_rss_mib'])}",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def geomean(values: Sequence[float]) -> float:
    """Geometric mean: the fair average of ratios.

    Examples:
        >>> geomean([0.5, 2.0])
        1.0
    """
    good = [v for v in values if v > 0 and math.isfinite(v)]
    return math.exp(sum(map(math.log, good)) / len(good)) if good else float("nan")


def summary(rows: Sequence[Row]) -> list[str]:
    """One line per kind of case: the geometric mean of commlib/torch time.

    Examples:
        >>> summary([{"kind": "tensor", "ratio": 0.5}, {"kind": "tensor", "ratio": 2.0}])
        ['tensor collectives   commlib/torch time  1.00 (geometric mean of 2 rows)']
    """
    names = {
        "tensor": "tensor collectives",
        "object": "object collectives",
        "latency": "small objects",
        "helper": "all_reduce_params",
    }
    out = []
    for kind, label in names.items():
        ratios = [r["ratio"] for r in rows if r["kind"] == kind]
        if ratios:
            out.append(
                f"{label:<20} commlib/torch time {geomean(ratios):5.2f} "
                f"(geometric mean of {len(ratios)} rows)"
            )
    return out


def header(rows: Sequence[Row]) -> list[str]:
    """The lines that say what was run and how to read the table.

    Examples:
        >>> rows = [{"world_size": 2, "backend": "gloo", "device": "cpu", "op": "all_reduce"}]
        >>> header(rows)[0]
        '# commlib bench: 2 ranks, backend gloo (cpu), torch ..., commlib ...'
    """
    import torch

    import commlib

    r0 = rows[0] if rows else {"world_size": "?", "backend": "?", "device": "?"}
    by_factor: dict[str, list[str]] = {}
    for op in dict.fromkeys(r["op"] for r in rows):
        by_factor.setdefault(bandwidth.factor_text(op), []).append(op)
    factors = "; ".join(f"{f} for {', '.join(ops)}" for f, ops in by_factor.items())
    rss = "peak RSS growth of one call" + (
        "" if memory.method() == "vmhwm" else " (a lower bound: ru_maxrss delta)"
    )
    return [
        f"# commlib bench: {r0['world_size']} ranks, backend {r0['backend']} ({r0['device']}), "
        f"torch {torch.__version__}, commlib {commlib.__version__}",
        "# time: median over the timed calls, slowest rank; algbw/busbw in GB/s; "
        f"rss(MiB): {rss}, largest rank",
        f"# busbw = algbw x {factors}",
        "# ratio = commlib time / torch.distributed time (below 1: commlib is faster)",
    ]


def print_table(rows: Sequence[Row], fmt: str = "text", out: TextIO | None = None) -> None:
    """Print the header, the table and the summary to ``out`` (stdout).

    Examples:
        >>> print_table(rows, fmt="markdown")   # rows: what run_rank returned  # doctest: +SKIP
    """
    out = out or sys.stdout
    if fmt == "markdown":
        print(format_markdown(rows), file=out)
        return
    print("\n".join(header(rows)), file=out)
    print(format_table(rows), file=out)
    print("", file=out)
    print("\n".join(summary(rows)), file=out)


def metadata(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Where and how the numbers were taken, for the JSON file.

    Examples:
        >>> metadata(["commlib", "bench"])["command"]
        'commlib bench'
    """
    import torch

    import commlib

    argv = list(sys.argv if argv is None else argv)
    return {
        "command": " ".join(["commlib", *argv[1:]]) if argv else "commlib bench",
        "commlib": commlib.__version__,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "system": platform.system(),
        "cpu_count": _cpu_count(),
        "rss_method": memory.method(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }


def _cpu_count() -> int | None:
    import os

    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count()


def write_json(path: str, rows: Sequence[Row], meta: dict[str, Any]) -> None:
    """Write ``{"meta": ..., "rows": [...]}``; every row has every column.

    Examples:
        >>> write_json("bench.json", rows, metadata())  # writes a file  # doctest: +SKIP
    """
    with open(path, "w") as f:
        json.dump({"meta": meta, "rows": list(rows)}, f, indent=1, allow_nan=True)
        f.write("\n")


def have_matplotlib() -> bool:
    """Whether ``--plot`` can work here.

    Examples:
        >>> have_matplotlib()                   # with the plot extra  # doctest: +SKIP
        True
    """
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def plot(path: str, rows: Sequence[Row]) -> None:
    """Draw bus bandwidth against size, commlib and torch, one panel per swept case.

    Fixed-size cases (small-object latency) are left out: one point is no curve.

    Examples:
        >>> plot("docs/bench.png", rows)        # writes a file  # doctest: +SKIP
    """
    try:
        import matplotlib

        matplotlib.use("Agg")  # files only; never needs a display
        import matplotlib.pyplot as plt
    except ImportError:
        raise RuntimeError(PLOT_HINT) from None

    swept: dict[str, list[Row]] = {}
    for r in rows:
        if r["kind"] != "latency":
            swept.setdefault(r["case"], []).append(r)
    if not swept:
        raise ValueError("nothing to plot: only fixed-size (latency) cases ran")
    cols = min(4, len(swept))
    nrows = math.ceil(len(swept) / cols)
    fig, axes = plt.subplots(
        nrows, cols, figsize=(4 * cols, 3.1 * nrows), squeeze=False, constrained_layout=True
    )
    for ax, (name, rs) in zip(axes.flat, swept.items()):
        sizes = [r["size_bytes"] for r in rs]
        for impl, label, style in (
            ("commlib", "commlib", "-o"),
            ("torch", "torch.distributed", "--s"),
        ):
            ax.plot(sizes, [r[f"{impl}_busbw_gbps"] for r in rs], style, label=label, ms=4)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ticks = sizes[:: max(1, len(sizes) // 5)]
        ax.set_xticks(ticks, [format_size(s) for s in ticks])
        ax.minorticks_off()
        ax.set_title(name, fontsize=10)
        ax.set_xlabel("size (bytes)", fontsize=8)
        ax.set_ylabel("busbw (GB/s)", fontsize=8)
        ax.grid(True, which="major", alpha=0.3)
        ax.tick_params(labelsize=8)
    for ax in list(axes.flat)[len(swept) :]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=8)
    r0 = rows[0]
    fig.suptitle(
        f"commlib bench: {r0['world_size']} ranks, {r0['backend']} ({r0['device']}); "
        "bus bandwidth, higher is better"
    )
    fig.savefig(path, dpi=110)
    plt.close(fig)
