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

from commlib.bench import bandwidth, memory, stats
from commlib.bench.dispatch_cases import KIND as DISPATCH
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


def _spread(row: Row, prefix: str = "") -> str:
    low, high = prefix + "ratio_low", prefix + "ratio_high"
    if low not in row or high not in row:
        return "-"  # a row from before trials
    return f"{row[low]:.2f}-{row[high]:.2f}"


def _noise(row: Row) -> str:
    return "noise" if stats.row_noise(row) else ""


def label(row: Row) -> str:
    """A row's name in prose: the case, and the size for swept cases.

    Examples:
        >>> label({"case": "all_reduce", "kind": "tensor", "size_bytes": 1 << 20})
        'all_reduce 1M'
        >>> label({"case": "gather_object[small]", "kind": "latency", "size_bytes": 158})
        'gather_object[small]'
    """
    return row["case"] if row["kind"] == "latency" else f"{row['case']} {_size(row)}"


# (header, width, cell); the two implementations get the same four columns
def _impl_columns(impl: str) -> list[tuple[str, int, Callable[[Row], str]]]:
    return [
        ("time(us)", 10, lambda r: _us(r[f"{impl}_time_us"])),
        ("algbw", 7, lambda r: _num(r[f"{impl}_algbw_gbps"])),
        ("busbw", 7, lambda r: _num(r[f"{impl}_busbw_gbps"])),
        ("rss(MiB)", 8, lambda r: _mib(r[f"{impl}_peak_rss_mib"])),
    ]


def _has_unchecked(rows: Sequence[Row]) -> bool:
    """Whether the rows hold an unchecked commlib side (``--strict both``)."""
    return bool(rows) and all("unchecked_time_us" in r for r in rows)


def _ratio_cells(r: Row, prefix: str = "") -> str:
    """A ratio, its spread and its noise flag: ``prefix`` picks which (``unchecked_``, ...)."""
    noise = "noise" if stats.row_noise(r, prefix) else ""
    return f"{r[prefix + 'ratio']:6.2f} {_spread(r, prefix):>9} {noise:5}"


def commlib_label(rows: Sequence[Row]) -> str:
    """What the commlib column measured: its ``--strict`` mode and what it checked.

    Examples:
        >>> commlib_label([{"strict": "both", "checks": "guard"}])
        'commlib checked (guard)'
        >>> commlib_label([{}])                      # a file from before --strict
        'commlib'
    """
    r0 = rows[0] if rows else {}
    checks = r0.get("checks")
    if checks is None:
        return "commlib"
    return f"commlib {'unchecked' if checks == 'off' else 'checked'} ({checks})"


def format_table(rows: Sequence[Row]) -> str:
    """The rows as a fixed-width text table, one block per case.

    With ``--strict both`` the unchecked side follows commlib's (its time),
    then its ratio to torch and the check's price (checked over unchecked),
    each with its spread.

    Examples:
        >>> print(format_table(rows))           # rows: what run_rank returned  # doctest: +SKIP
                                |          commlib ... | ...
        case         size iters |   time(us) ... | ... |  ratio    spread
        all_reduce     1K    10 |       41.2 ... | ... |   1.02 0.95-1.10
        all_reduce     4K    10 |       52.0 ... | ... |   0.97 0.90-1.04 noise
    """
    name_w = max([len("case"), *(len(r["case"]) for r in rows)])
    left = [("size", 6, _size), ("iters", 5, lambda r: str(r["iters"]))]
    impls = {impl: _impl_columns(impl) for impl in ("commlib", "torch")}
    titles = {"commlib": commlib_label(rows), "torch": "torch.distributed"}
    both = _has_unchecked(rows)
    if both:
        impls = {
            "commlib": impls["commlib"],
            "unchecked": [("time(us)", 10, lambda r: _us(r["unchecked_time_us"]))],
            "torch": impls["torch"],
        }
        titles["unchecked"] = "unchecked"
    span = {impl: sum(w + 1 for _, w, _ in cols) - 1 for impl, cols in impls.items()}
    lead = name_w + sum(w + 1 for _, w, _ in left)
    ratios = [("ratio", "")]
    if both:
        ratios += [("unchecked", "unchecked_"), ("check cost", "check_")]
    ratio_w = 6 + 1 + 9 + 1 + 5
    lines = [
        " " * lead
        + "".join(" | " + titles[impl][: span[impl]].center(span[impl]) for impl in impls)
        + "".join(" | " + title.center(ratio_w) for title, _ in ratios).rstrip(),
        "case".ljust(name_w)
        + "".join(" " + h.rjust(w) for h, w, _ in left)
        + "".join(" | " + " ".join(h.rjust(w) for h, w, _ in cols) for cols in impls.values())
        + "".join(" |  ratio    spread      " for _ in ratios).rstrip(),
    ]
    for i, (_, block) in enumerate(groupby(rows, key=lambda r: r["case"])):
        if i:
            lines.append("")
        for r in block:
            lines.append(
                (
                    r["case"].ljust(name_w)
                    + "".join(" " + cell(r).rjust(w) for _, w, cell in left)
                    + "".join(
                        " | " + " ".join(cell(r).rjust(w) for _, w, cell in cols)
                        for cols in impls.values()
                    )
                    + "".join(" | " + _ratio_cells(r, prefix) for _, prefix in ratios)
                ).rstrip()
            )
    return "\n".join(lines)


def format_markdown(rows: Sequence[Row]) -> str:
    """The rows as a GitHub markdown table (commlib / torch side by side per cell).

    A ratio is bold unless its row is noise. With ``--strict both``, the
    unchecked side's time, its ratio to torch and the check's price
    (checked over unchecked) follow commlib's ratio.

    Examples:
        >>> print(format_markdown([]))          # the head; a line per row follows
        | case | size | commlib (us) | torch (us) | commlib / torch | spread | noise | ...
        |---|---|---:|---:|---:|---:|---|---:|---:|
    """
    both = _has_unchecked(rows)
    head = [
        "case",
        "size",
        "commlib (us)",
        "torch (us)",
        "commlib / torch",
        "spread",
        "noise",
    ]
    align = ["---"] * 2 + ["---:"] * 4 + ["---"]
    if both:
        head += ["unchecked (us)", "unchecked / torch", "spread", "check cost", "spread"]
        align += ["---:"] * 5
    head += ["busbw GB/s commlib / torch", "peak RSS MiB commlib / torch"]
    align += ["---:"] * 2
    lines = ["| " + " | ".join(head) + " |", "|" + "".join(a + "|" for a in align)]
    for r in rows:
        cells = [
            f"`{r['case']}`",
            _size(r),
            _us(r["commlib_time_us"]),
            _us(r["torch_time_us"]),
            _bold_ratio(r),
            _spread(r),
            _noise(r),
        ]
        if both:
            cells += [
                _us(r["unchecked_time_us"]),
                _bold_ratio(r, "unchecked_"),
                _spread(r, "unchecked_"),
                _bold_ratio(r, "check_"),
                _spread(r, "check_"),
            ]
        cells += [
            f"{_num(r['commlib_busbw_gbps'])} / {_num(r['torch_busbw_gbps'])}",
            f"{_mib(r['commlib_peak_rss_mib'])} / {_mib(r['torch_peak_rss_mib'])}",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _bold_ratio(r: Row, prefix: str = "") -> str:
    ratio = f"{r[prefix + 'ratio']:.2f}"
    return ratio if stats.row_noise(r, prefix) else f"**{ratio}**"


def geomean(values: Sequence[float]) -> float:
    """Geometric mean: the fair average of ratios.

    Examples:
        >>> geomean([0.5, 2.0])
        1.0
    """
    good = [v for v in values if v > 0 and math.isfinite(v)]
    return math.exp(sum(map(math.log, good)) / len(good)) if good else float("nan")


def _worst_text(row: Row, prefix: str = "") -> str:
    return f"{label(row)}: {row[prefix + 'ratio']:.2f} (spread {_spread(row, prefix)})"


#: what each of a row's ratios compares (``--strict both`` adds the last two)
RATIOS = {
    "": "commlib/torch",
    "unchecked_": "unchecked/torch",
    "check_": "checked/unchecked",
}


def summary(rows: Sequence[Row], prefix: str = "") -> list[str]:
    """The geometric mean of commlib/torch time per kind of case, then the worst rows.

    One line per kind (with how many of its rows are noise), the worst row that
    is not noise and, when it is another, the worst row of all, and how many
    rows are noise with the median width of the spread. ``prefix`` summarises
    another of the rows' ratios (:data:`RATIOS`): ``"unchecked_"``, unchecked
    against torch, or ``"check_"``, what the check costs (checked against
    unchecked), with ``--strict both``.

    Examples:
        >>> rows = [
        ...     {"case": "all_reduce", "kind": "tensor", "size_bytes": 1024,
        ...      "ratio": 0.5, "ratio_low": 0.45, "ratio_high": 0.55, "noise": False},
        ...     {"case": "all_reduce", "kind": "tensor", "size_bytes": 4096,
        ...      "ratio": 2.0, "ratio_low": 0.9, "ratio_high": 2.5, "noise": True},
        ... ]
        >>> for line in summary(rows):
        ...     print(line)
        tensor collectives   commlib/torch time  1.00 (geometric mean of 2 rows, 1 noise)
        worst row            all_reduce 1K: 0.50 (spread 0.45-0.55), not noise
        worst of all         all_reduce 4K: 2.00 (spread 0.90-2.50), noise
        noise                1 of 2 rows; median spread 50 % of the ratio
    """
    names = {
        "tensor": "tensor collectives",
        "object": "object collectives",
        "latency": "small objects",
        "helper": "all_reduce_params",
    }
    what = RATIOS[prefix]
    ratio = prefix + "ratio"
    out = []
    for kind, name in names.items():
        of_kind = [r for r in rows if r["kind"] == kind]
        if of_kind:
            noisy = sum(stats.row_noise(r, prefix) for r in of_kind)
            out.append(
                f"{name:<20} {what} time {geomean([r[ratio] for r in of_kind]):5.2f} "
                f"(geometric mean of {len(of_kind)} rows, {noisy} noise)"
            )
    if not rows:
        return out
    trusted = stats.worst(rows, skip_noise=True, prefix=prefix)
    overall = stats.worst(rows, prefix=prefix)
    assert overall is not None
    if trusted is None:
        out.append(f"{'worst row':<20} none that is not noise")
    else:
        out.append(f"{'worst row':<20} {_worst_text(trusted, prefix)}, not noise")
    if overall is not trusted:
        out.append(f"{'worst of all':<20} {_worst_text(overall, prefix)}, noise")
    widths = [w for w in (stats.spread_width(r, prefix) for r in rows) if w is not None]
    if widths:
        noisy = sum(stats.row_noise(r, prefix) for r in rows)
        out.append(
            f"{'noise':<20} {noisy} of {len(rows)} rows; "
            f"median spread {100 * stats.median(widths):.0f} % of the ratio"
        )
    return out


def summaries(rows: Sequence[Row]) -> list[str]:
    """:func:`summary` of every ratio the rows hold, a blank line between.

    With ``--strict both``: commlib (checked) against torch, unchecked against
    torch, and the check's price, checked against unchecked.

    Examples:
        >>> summaries(rows)[0]                   # rows: what run_rank returned  # doctest: +SKIP
        'tensor collectives   commlib/torch time  1.17 (geometric mean of 72 rows, 27 noise)'
    """
    out = summary(rows)
    if _has_unchecked(rows):
        for prefix in ("unchecked_", "check_"):
            out += ["", *summary(rows, prefix)]
    return out


def _torch_side(row: Row) -> str:
    """Where torch's calls ran, when not on commlib's engine (an engine torch does not ship)."""
    theirs = row.get("torch_backend")
    if theirs is None:
        return ""
    return f"; the torch side runs torch.distributed on {theirs} in the same ranks"


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
    trials = r0.get("trials", "?")
    return [
        f"# commlib bench: {r0['world_size']} ranks, backend {r0['backend']} ({r0['device']}), "
        f"torch {torch.__version__}, commlib {commlib.__version__}" + _torch_side(r0),
        f"# time: median over {trials} trials of each trial's median call (iters calls a side, "
        "commlib and torch alternating), slowest rank per trial; algbw/busbw in GB/s; "
        f"rss(MiB): {rss}, largest rank",
        f"# busbw = algbw x {factors}",
        "# ratio = commlib time / torch.distributed time (below 1: commlib is faster); "
        "spread = lowest-highest per-trial ratio; noise: the spread reaches 1.0 from both sides",
        *_strict_lines(rows),
    ]


def _strict_lines(rows: Sequence[Row]) -> list[str]:
    """What ``--strict`` measured, for the header (nothing for files from before it)."""
    if not rows or "strict" not in rows[0]:
        return []
    r0 = rows[0]
    line = f"# --strict {r0['strict']}: the commlib column is {commlib_label(rows)}"
    if not _has_unchecked(rows):
        return [line]
    return [
        line + "; unchecked: the same calls through a communicator of the group with "
        "strict=False, interleaved with the others",
        "# unchecked ratio = unchecked time / torch time; check cost = commlib (checked) "
        "time / unchecked time: what the argument check costs",
    ]


def print_table(rows: Sequence[Row], fmt: str = "text", out: TextIO | None = None) -> None:
    """Print the header, the table and the summary to ``out`` (stdout).

    Rows of the dispatch kind follow, in a table of their own
    (:mod:`commlib.bench.dispatch_report`).

    Examples:
        >>> print_table(rows, fmt="markdown")   # rows: what run_rank returned  # doctest: +SKIP
    """
    out = out or sys.stdout
    ranked = [r for r in rows if r["kind"] != DISPATCH]
    if ranked:
        if fmt == "markdown":
            print(format_markdown(ranked), file=out)
        else:
            print("\n".join(header(ranked)), file=out)
            print(format_table(ranked), file=out)
            print("", file=out)
            print("\n".join(summaries(ranked)), file=out)
    dispatch = [r for r in rows if r["kind"] == DISPATCH]
    if dispatch:
        from commlib.bench import dispatch_report

        if ranked:
            print("", file=out)
        dispatch_report.print_table(dispatch, fmt, out)


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
        "load_average": _load_average(),
        "rss_method": memory.method(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }


def _load_average() -> list[float] | None:
    """The 1, 5 and 15 minute load averages as the run ends: how busy the machine was."""
    import os

    try:
        return [round(v, 2) for v in os.getloadavg()]
    except (AttributeError, OSError):  # not on Unix
        return None


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

    Fixed-size cases (small-object latency) are left out: one point is no curve;
    so are the dispatch kind's, which have no bandwidth.

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
        if r["kind"] not in ("latency", DISPATCH):
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
