"""Showing the dispatch kind's rows: its header, table (text or markdown) and summary.

A row is one collective: torch's own call, then each of commlib's sides
(:data:`~commlib.bench.dispatch_cases.VARIANTS`) with its time, the microseconds
it adds, its ratio to torch and the spread of that ratio over the trials.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, TextIO

from commlib.bench import stats
from commlib.bench.dispatch_cases import LABELS, TARGETS, VARIANTS

Row = dict[str, Any]


def _us(v: float) -> str:
    return f"{v:.1f}" if v < 1000 else f"{v:.0f}"


def _spread(row: Row, side: str) -> str:
    return f"{row[f'{side}_ratio_low']:.2f}-{row[f'{side}_ratio_high']:.2f}"


def _noisy(row: Row, side: str) -> bool:
    return bool(row.get(f"{side}_noise"))


def _geomean(values: Sequence[float]) -> float:
    good = [v for v in values if v > 0 and math.isfinite(v)]
    return math.exp(sum(map(math.log, good)) / len(good)) if good else float("nan")


def header(rows: Sequence[Row]) -> list[str]:
    """The lines that say what was run and how to read the table.

    Examples:
        >>> row = {"world_size": 2, "plugin": "gloo@fake", "device": "cpu", "size_bytes": 16,
        ...        "calls": 1000, "trials": 5, "observers": []}
        >>> header([row])[0].startswith("# commlib bench, dispatch: torch's fake process group")
        True
    """
    import torch

    import commlib

    r0 = rows[0]
    simulated = ", simulated device" if r0.get("simulated") else ""
    lines = [
        f"# commlib bench, dispatch: torch's fake process group (nothing is sent), world size "
        f"{r0['world_size']}, this process rank 0; commlib through plugin {r0['plugin']} "
        f"({r0['device']}{simulated}); {r0['size_bytes'] // 4} float32 per rank; "
        f"torch {torch.__version__}, commlib {commlib.__version__}",
        f"# time: us per call, median over {r0['trials']} trials of {r0['calls']} calls a side "
        "in a row, the sides taking turns in an order that rotates each trial; +us: commlib's "
        "time less torch's",
        "# ratio = commlib time / torch's own call; spread = lowest-highest per-trial ratio; "
        "noise: the spread reaches 1.0 from both sides",
    ]
    if r0.get("observers"):
        lines.append(
            f"# observers registered before the run, in every commlib column: "
            f"{', '.join(r0['observers'])}"
        )
    return lines


def format_table(rows: Sequence[Row]) -> str:
    """The rows as a fixed-width text table: torch, then each commlib side.

    Examples:
        >>> print(format_table(rows))          # rows: what run_dispatch returned  # doctest: +SKIP
                   |  torch |        commlib unchecked        | ...
        case       |     us |     us    +us  ratio     spread | ...
        all_reduce |    4.1 |    9.4    5.3   2.29  2.10-2.40 | ...
    """
    name_w = max([len("case"), *(len(r["case"]) for r in rows)])
    cell_w = 38
    top = " " * name_w + " | " + "torch".rjust(6)
    sub = "case".ljust(name_w) + " | " + "us".rjust(6)
    for side in VARIANTS:
        top += " | " + LABELS[side].center(cell_w)
        sub += " | " + f"{'us':>6} {'+us':>6} {'ratio':>6} {'spread':>11}".ljust(cell_w)
    lines = [top.rstrip(), sub.rstrip()]
    for r in rows:
        line = r["case"].ljust(name_w) + " | " + _us(r["torch_time_us"]).rjust(6)
        for side in VARIANTS:
            cell = (
                f"{_us(r[f'{side}_time_us']):>6} {r[f'{side}_added_us']:>6.1f} "
                f"{r[f'{side}_ratio']:>6.2f} {_spread(r, side):>11}"
                + (" noise" if _noisy(r, side) else "")
            )
            line += " | " + cell.ljust(cell_w)
        lines.append(line.rstrip())
    return "\n".join(lines)


def format_markdown(rows: Sequence[Row]) -> str:
    """The rows as a markdown table; a ratio is bold unless its row is noise for that side.

    Examples:
        >>> print(format_markdown([]).splitlines()[0])
        | collective | torch (us) | commlib unchecked (us) | ratio | spread | one observer ...
    """
    head = ["collective", "torch (us)"]
    align = ["---", "---:"]
    for side in VARIANTS:
        head += [f"{LABELS[side]} (us)", "ratio", "spread"]
        align += ["---:", "---:", "---:"]
    lines = ["| " + " | ".join(head) + " |", "|" + "".join(a + "|" for a in align)]
    for r in rows:
        cells = [f"`{r['case']}`", _us(r["torch_time_us"])]
        for side in VARIANTS:
            ratio = f"{r[f'{side}_ratio']:.2f}"
            noisy = _noisy(r, side)
            cells += [
                f"{_us(r[f'{side}_time_us'])} (+{r[f'{side}_added_us']:.1f})",
                f"{ratio} (noise)" if noisy else f"**{ratio}**",
                _spread(r, side),
            ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def summary(rows: Sequence[Row]) -> list[str]:
    """Per commlib side: the geometric mean ratio, the target, the rows that meet it, the worst.

    Examples:
        >>> row = {"case": "all_reduce", "torch_time_us": 4.0}
        >>> for side, t in (("unchecked", 8.0), ("observer", 12.0), ("recorder", 16.0)):
        ...     row.update({f"{side}_time_us": t, f"{side}_added_us": t - 4.0,
        ...                 f"{side}_ratio": t / 4.0, f"{side}_ratio_low": t / 4.4,
        ...                 f"{side}_ratio_high": t / 3.6, f"{side}_noise": False})
        >>> lines = summary([row])
        >>> lines[0].split("; ")
        ['commlib unchecked  2.00 x torch (geometric mean of 1 rows), +4.0 us (median)',
         'target 1.00: met by 0 of 1 rows', 'worst all_reduce 2.00 (1.82-2.22)']
    """
    out = []
    for side in VARIANTS:
        ratios = [r[f"{side}_ratio"] for r in rows]
        added = stats.median([r[f"{side}_added_us"] for r in rows])
        target = TARGETS[side]
        meet = sum(ratio <= target for ratio in ratios)
        worst = max(rows, key=lambda r: r[f"{side}_ratio"])
        noise = " noise" if _noisy(worst, side) else ""
        out.append(
            f"{LABELS[side]:<18} {_geomean(ratios):.2f} x torch (geometric mean of {len(rows)} "
            f"rows), +{added:.1f} us (median); target {target:.2f}: met by {meet} of "
            f"{len(rows)} rows; worst {worst['case']} {worst[f'{side}_ratio']:.2f} "
            f"({_spread(worst, side)}{noise})"
        )
    return out


def print_table(rows: Sequence[Row], fmt: str = "text", out: TextIO | None = None) -> None:
    """Print the header, the table and the summary (markdown: the table alone).

    Examples:
        >>> print_table(rows, fmt="markdown")  # rows: what run_dispatch returned  # doctest: +SKIP
    """
    import sys

    out = out or sys.stdout
    if fmt == "markdown":
        print(format_markdown(rows), file=out)
        return
    print("\n".join(header(rows)), file=out)
    print(format_table(rows), file=out)
    print("", file=out)
    print("\n".join(summary(rows)), file=out)
