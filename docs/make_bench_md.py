"""Write docs/bench.md, the docs site's benchmark page, from ``commlib bench --json`` files.

The page is generated whole: edit this script, not docs/bench.md. One results
section per JSON file, in the order given (the docs show world 2, then world 4).
Usage, from the repository root::

    commlib bench --strict both --json docs/bench.json --plot docs/bench.png
    commlib bench --nproc 4 --max-bytes 4M --iters 5 --json docs/bench-4.json \\
        --plot docs/bench-4.png
    commlib bench --ops dispatch --nproc 8 --trials 9 --json docs/bench-dispatch.json
    python docs/make_bench_md.py docs/bench.json docs/bench-4.json docs/bench-dispatch.json \\
        docs/bench.md

A file of ``--ops dispatch`` rows gets the dispatch section (:func:`dispatch_section`).

A JSON file written before ``--trials`` (no spread, no noise flag) still renders.
"""

import json
import os
import sys

from commlib.bench import bandwidth, dispatch_report, report, stats
from commlib.bench.dispatch_cases import KIND as DISPATCH
from commlib.bench.units import format_size

*inputs, target = sys.argv[1:]
if not inputs:
    sys.exit("usage: make_bench_md.py RESULTS.json [RESULTS.json ...] OUT.md")
runs = []
for path in inputs:
    with open(path) as f:
        d = json.load(f)
    runs.append((path, d["meta"], d["rows"]))


def rng(rows):
    """Geometric mean of the rows' ratios, their range, and how many are noise."""
    vals = [r["ratio"] for r in rows]
    noisy = sum(stats.row_noise(r) for r in rows)
    return (
        f"{report.geomean(vals):.2f} ({min(vals):.2f}-{max(vals):.2f}, "
        f"{noisy} of {len(vals)} noise)"
    )


def sizes_text(rows):
    sizes = sorted({r["size_bytes"] for r in rows})
    return (
        format_size(sizes[0])
        if len(sizes) == 1
        else f"{format_size(sizes[0])}-{format_size(sizes[-1])}"
    )


def findings(rows):
    """The bullets under a run's summary; each only when the run has its rows."""
    objects = [r for r in rows if r["kind"] == "object"]
    obj_sizes = sorted({r["size_bytes"] for r in objects})
    out = []
    if len(obj_sizes) >= 3:
        big = [r for r in objects if r["size_bytes"] == obj_sizes[-1]]
        next_big = [r for r in objects if r["size_bytes"] == obj_sizes[-2]]
        mem = [
            r["torch_peak_rss_mib"] / r["commlib_peak_rss_mib"]
            for r in big
            if r.get("commlib_peak_rss_mib")
        ]
        less = f", with {min(mem):.1f}-{max(mem):.1f}x less peak memory" if mem else ""
        out.append(
            f"- **Object collectives, large payloads**: at {format_size(obj_sizes[-1])} (numpy "
            f"arrays or tensors in a dict) {rng(big)}{less}: buffers travel out of band instead "
            f"of inside one pickled byte string. At {format_size(obj_sizes[-2])}: {rng(next_big)}."
        )
    lat = [r for r in rows if r["kind"] == "latency"]
    small = [r for r in objects if r["size_bytes"] <= 4 << 10]
    if lat and small:
        out.append(
            f"- **Small objects** (a 4-key dict, done in one round): {rng(lat)}; "
            f"payloads of {sizes_text(small)}: {rng(small)}."
        )
    mid = [r for r in objects if 16 << 10 <= r["size_bytes"] <= 1 << 20]
    if mid:
        slower = report.geomean([r["ratio"] for r in mid]) > 1
        out.append(
            f"- **Object collectives, {sizes_text(mid)}**: {rng(mid)}: objects that do not fit "
            "the first round (a 4 KiB slot per rank, grown to what the last calls needed, "
            "up to 128 KiB for objects) pay a second round, "
            + (
                "so in this range commlib is on average slower than torch."
                if slower
                else "and still come out ahead of torch's two rounds and extra copies on average."
            )
        )
    ten = [r for r in rows if r["kind"] == "tensor"]
    ten_big = [r for r in ten if r["size_bytes"] >= 4 << 20 and r["op"] != "all_gather"]
    ten_small = [r for r in ten if r["size_bytes"] <= 64 << 10 and r["op"] != "all_gather"]
    ag = [r for r in ten if r["op"] == "all_gather"]
    if ten_big and ten_small and ag:
        out.append(
            f"- **Tensor collectives** run the same engine call: {rng(ten_big)} at "
            f"{sizes_text(ten_big)}, {rng(ten_small)} at {sizes_text(ten_small)}, where commlib's "
            "own work per call shows against sub-millisecond collectives: dispatch, a wait that "
            "can time out, and on gloo the default argument check of the tensor collectives: "
            "data that fits its slot travels in it (one round, as unchecked), larger data pays "
            "one more small round; the slot learns the size of the last calls' data, up to "
            "2 MiB over all ranks "
            "([what it costs](reliability.md#mismatched-arguments-the-check); `strict=False` or "
            "`COMMLIB_STRICT=0` turns it off). On gloo, gathers, all_reduces and reduces of up "
            "to 1 MiB in all, and every reduce_scatter, go through gloo's all_to_all (or its "
            "gather) and a local reduction, which measured cheaper than gloo's own "
            "([the measurements](benchmarks.md#gloos-own-collectives-bench_engine_pathspy)). "
            f"`all_gather`, {rng(ag)}, returns a list and accepts different shapes on different "
            "ranks: tensors that fit the slot travel with their shapes in one round, larger ones "
            "pay one extra small round to learn the shapes first; with equal shapes, "
            "`all_gather_into_tensor` is the call to compare."
        )
    par = [r for r in rows if r["kind"] == "helper"]
    if par:
        out.append(
            f"- **`all_reduce_params`** over {par[0]['payload']}: {rng(par)} against one torch "
            "`all_reduce` per tensor: it coalesces them into one collective."
        )
    return out


def busbw_factors():
    by_factor = {}
    ops = (r["op"] for _, _, rows in runs for r in rows if r["kind"] != DISPATCH)
    for op in dict.fromkeys(ops):
        by_factor.setdefault(bandwidth.factor_text(op), []).append(op)
    return "; ".join(f"{f} for {', '.join(ops)}" for f, ops in by_factor.items())


def commands():
    cmds = [meta["command"] for _, meta, _ in runs]
    names = [f"docs/{os.path.basename(p)}" for p in inputs]
    make = " ".join(["python docs/make_bench_md.py", *names, "docs/bench.md"])
    return " && ".join([*cmds, make])


def plot_of(path, meta):
    """The PNG a run drew (its --plot) relative to its JSON file's folder, if it exists there."""
    png = (meta.get("options") or {}).get("plot")
    if png and os.path.exists(png):
        return os.path.relpath(os.path.abspath(png), os.path.dirname(os.path.abspath(path)))
    return None


out = []
w = out.append
w(f"<!-- Generated, do not edit: {commands()} -->\n")
w("# Benchmark: `commlib bench`\n")
w(
    "`commlib bench` measures every collective twice in the same run, through commlib and "
    "through the plain `torch.distributed` call a program would otherwise make, and prints one "
    "row per size in the style of nccl-tests: time, algorithm bandwidth, bus bandwidth, the "
    "commlib/torch time ratio with its spread over repeated trials, and the peak memory each "
    "call needs. It starts its own ranks (2 by default) on 127.0.0.1 with torch's launcher, on "
    "the machine's default backend (gloo on a CPU-only machine); the defaults take a few "
    "minutes on two cores.\n"
)
w(
    "```console\n$ pip install torch==2.13.0 && pip install -e . && commlib bench\n"
    "$ commlib bench --nproc 4 --min-bytes 64K --max-bytes 256M --ops object --json out.json "
    "--plot out.png\n"
    "$ torchrun --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint HOST:29500 \\\n"
    "      --no-python commlib bench          # several machines: rank 0 prints\n```\n"
)
w(
    "Options: `--nproc N` local ranks; `--backend NAME` (a commlib or torch.distributed backend); "
    "`--min-bytes/--max-bytes/--factor` the sweep (`1K`, `8M`, `1G`; default 1K to 16M, x4); "
    "`--trials` repeated trials per size (default 5); `--iters` timed calls of each side per "
    "trial (default 10 up to 1 MiB, proportionally fewer above, at least 3); `--warmup` "
    "(default 3; the first call of each side is checked for a correct result); `--ops` cases, "
    "collectives or kinds (`tensor`, `object`, `latency`, `helper`); `--json FILE` every row "
    "and column, the per-trial times included; `--plot FILE.png` bus bandwidth against size "
    "(`pip install 'commlib[plot]'`); `--format markdown`; `--timeout SECONDS` (default 120): "
    "a rank that fails or hangs ends the run with that rank's error and a non-zero exit; "
    "`--strict` how commlib's side checks its arguments across ranks: `default` (what a "
    "program gets: `COMMLIB_STRICT`, else the backend's default, checked on gloo), `on`, "
    "`off`, or `both`: checked and unchecked in the same run, interleaved, a column each, "
    "with the check's price per row. "
    "`--ops dispatch` (not part of the default) times what a call costs on its way to the "
    "engine, in this process on torch's fake process group, with `--calls` timed calls of each "
    "side per trial (default 1000) and `--nproc` the fake world's size: "
    "[Dispatch](#dispatch-what-a-call-costs-before-the-engine).\n"
)
w("## Trials, spread and noise\n")
w(
    "A shared machine drifts: other work starts and stops, and a figure taken once can be off "
    "by more than the difference it claims. So every row is measured in repeated *trials*:\n\n"
    "- **In a trial**, each side makes `--iters` timed calls, commlib and torch alternating call "
    "by call (which goes first alternates too; with `--strict both` the three sides take six "
    "orders in turn, each right after each other side alike: a call's time depends on the call "
    "before it), every call right after a barrier. A trial's "
    "figure for a side is the median of its calls on each rank, then the slowest rank's (a "
    "collective is as slow as its slowest rank). Drift hits both sides of a trial alike.\n"
    "- **time** is the median over the trials of that figure, for each side; **ratio** is "
    "commlib's time over torch's.\n"
    "- **spread** is the lowest and the highest *per-trial* ratio (commlib's figure over "
    "torch's in the same trial). With n independent trials, the median per-trial ratio lies "
    "outside that range only when every trial falls on the same side of it, a chance of "
    "2^(1-n): with the default 5 trials the spread is a 94 % confidence interval, whatever "
    "the distribution of the times. The ratio always lies inside it. We use the range rather "
    "than the interquartile range because five values have no meaningful quartiles.\n"
    "- **noise**: a row is flagged when its spread reaches 1.0 from both sides "
    "(lowest <= 1 <= highest, and the two differ): some trials had commlib faster, others "
    "torch, so the run cannot say which is faster; the difference between the two is within "
    "the spread. Its ratio is not bold in the tables. A single trial (`--trials 1`) has no "
    "spread and flags nothing.\n"
    "- **The summary** gives the geometric mean of the ratios per kind of case (with how many "
    "of its rows are noise), then the **worst row**, the highest ratio that is not noise, and, "
    "when another row is higher but noise, the **worst of all**, then how many rows are noise "
    "and the median width of the spread relative to the ratio.\n"
)


def world_section(path, meta, rows):
    r0 = rows[0]
    n = r0["world_size"]
    cpu = meta.get("cpu_count")
    load = meta.get("load_average")
    trials = r0.get("trials")
    sec = []
    s = sec.append
    s(f"## Results: {n} ranks, {r0['backend']}, {cpu} CPU cores\n")
    busy = (
        f" The 1/5/15-minute load averages when it ended were {load[0]:.1f}/{load[1]:.1f}/"
        f"{load[2]:.1f} (the run's own ranks count in the first; a figure well above {n} "
        "means other work shared the machine, and the rows are noisier)."
        if load
        else ""
    )
    oversub = (
        f" {n} ranks on {cpu} cores: every rank also waits for a CPU, so these figures are "
        "mostly scheduling; they say how the two compare under contention, not what either "
        "would do on a core of its own."
        if cpu and n > cpu
        else ""
    )
    how = f"{trials} trials per row" if trials else "one trial per row (before --trials)"
    s(
        f"Produced by `{meta['command']}` ({how}; torch {meta['torch']}, Python "
        f"{meta['python']}, commlib {meta['commlib']}, {meta['date'][:10]}) on a {cpu}-core "
        f"Linux VM.{busy}{oversub} Run it on your "
        "machine for your numbers.\n"
    )
    if "unchecked_ratio" in r0:
        s(
            f"`--strict {r0['strict']}`: the commlib column is {report.commlib_label(rows)}, "
            "what a program gets by default; **unchecked** is the same call through a "
            "communicator of the group with `strict=False`, interleaved with the other two "
            "in every trial. **check cost** is the checked time over the unchecked one, "
            "trial by trial: what the argument check costs on that row "
            "([what it does](reliability.md#mismatched-arguments-the-check)). The summary "
            "gives each of the three ratios.\n"
        )
    s("```text\n" + "\n".join(report.summaries(rows)) + "\n```\n")
    bullets = findings(rows)
    if bullets:
        s(
            "What it shows; each figure is commlib time / torch time, the geometric mean over "
            "the rows, their range and how many of them are noise in brackets:\n"
        )
        s("\n".join(bullets) + "\n")
    png = plot_of(path, meta)
    if png:
        s(f"![{n} ranks: bus bandwidth against size, commlib and torch.distributed]({png})\n")
    sizes = sorted({r["size_bytes"] for r in rows if r["kind"] != "latency"})
    keep = {k for k in (4 << 10, 1 << 20, 16 << 20) if k in sizes} or set(sizes[-1:])
    short = [r for r in rows if r["kind"] == "latency" or r["size_bytes"] in keep]
    shown = ", ".join(format_size(k) for k in sorted(keep))
    s(f"Every case at {shown} (small objects at their own size); every row below.\n")
    s(report.format_markdown(short) + "\n")
    # markdown="1": the docs site (md_in_html) renders the table inside; GitHub ignores it
    s(
        f'<details markdown="1"><summary>Every row, {n} ranks</summary>\n\n'
        + report.format_markdown(rows)
        + "\n\n</details>\n"
    )
    return sec


def load_note(meta):
    """How busy the machine was: a run on a loaded machine says so."""
    cpu, load = meta.get("cpu_count"), meta.get("load_average")
    if not load:
        return "The machine's load was not recorded."
    busy = cpu and load[0] >= 0.5 * cpu
    return (
        f"The 1/5/15-minute load averages when it ended were {load[0]:.1f}/{load[1]:.1f}/"
        f"{load[2]:.1f} on {cpu} cores: "
        + (
            "**taken on a loaded machine**, shared with other work; a quiet machine gives lower "
            "times, and ratios that move less."
            if busy
            else "a quiet machine."
        )
    )


def dispatch_section(path, meta, rows):
    r0 = rows[0]
    sec = []
    s = sec.append
    s("## Dispatch: what a call costs before the engine\n")
    s(
        "`commlib bench --ops dispatch` runs in one process, with no ranks to start: a world on "
        "torch's fake process group (`torch.testing._internal.distributed.fake_pg`), whose "
        "collectives return at once without sending anything, so a call's time is the work "
        "between the caller and the engine. Per collective it times torch's own call "
        "(`torch.distributed.all_reduce(t, group=pg)`, ...) and commlib's `Communicator` method "
        "three ways: **unchecked** (`strict=False`), with **one observer** plugin registered "
        "(both hooks, doing nothing: what any observer costs at least) and with the **flight "
        "recorder** registered. commlib's side goes through the plugin of the machine's default "
        "backend (`--backend` picks another), re-pointed at the fake group with its own "
        "collectives, device and dtype handling, but without its size-based engine paths (on "
        "gloo, small all_reduces as an all_to_all): with nothing sent those would only add "
        f"local work. Tensors of {r0['size_bytes'] // 4} float32 elements per rank; this "
        "process is rank 0 of the fake world (the root of rooted collectives, rank 1 the peer "
        "of point to point).\n"
    )
    s(
        f"The sides take turns in blocks of `--calls` calls ({r0['calls']} here), the "
        "observer and the recorder registered for their own block only, in an order that "
        "rotates from trial to trial, so drift in the machine hits them alike; the garbage "
        "collector is off inside a block. A cell is the median time per call over the trials "
        "with, in brackets, what commlib adds to torch's time; **ratio** is commlib's time "
        "over torch's, **spread** the lowest and highest per-trial ratio, and a ratio whose "
        "spread reaches 1.0 from both sides is marked noise (see "
        "[Trials, spread and noise](#trials-spread-and-noise)). The summary checks the call "
        "path's targets (issue 28): unchecked at most 1.0x torch's own call, one observer "
        "1.3x, the flight recorder 1.5x.\n"
    )
    s(
        f"Produced by `{meta['command']}` (world size {r0['world_size']}, plugin "
        f"`{r0['plugin']}` on {r0['device']}, {r0['trials']} trials; torch {meta['torch']}, "
        f"Python {meta['python']}, commlib {meta['commlib']}, {meta['date'][:10]}). "
        f"{load_note(meta)} To take it again and rebuild this page:\n"
    )
    names = [f"docs/{os.path.basename(p)}" for p in inputs]
    s(
        "```console\n$ "
        + f"{meta['command']} && python docs/make_bench_md.py {' '.join(names)} docs/bench.md"
        + "\n```\n"
    )
    if r0.get("observers"):
        s(
            "Observers were registered before the run and are in every commlib column: "
            + ", ".join(f"`{o}`" for o in r0["observers"])
            + ".\n"
        )
    s("```text\n" + "\n".join(dispatch_report.summary(rows)) + "\n```\n")
    s(dispatch_report.format_markdown(rows) + "\n")
    return sec


for path, meta, rows in runs:
    ranked = [r for r in rows if r["kind"] != DISPATCH]
    if ranked:
        out.extend(world_section(path, meta, ranked))
for path, meta, rows in runs:
    dispatched = [r for r in rows if r["kind"] == DISPATCH]
    if dispatched:
        out.extend(dispatch_section(path, meta, dispatched))

w("## How to read it\n")
w(
    "- **time**, **ratio**, **spread**, **noise**: see "
    "[Trials, spread and noise](#trials-spread-and-noise). Accelerator work is synchronised "
    "before the clock stops.\n"
    "- **size**: the bytes of the operation, as nccl-tests counts them: the gathered output for "
    "all_gather-like collectives (world size x each rank's part), the full input for "
    "reduce_scatter, the buffer for all_reduce and broadcast. Object collectives count the raw "
    "payload (the array or tensor in the object, not the pickle): gathered total for "
    "`all_gather_object` / `gather_object`, the broadcast payload for `broadcast_object_list`.\n"
    f"- **algbw** = size / time; **busbw** = algbw x {busbw_factors()}, as nccl-tests counts "
    "it (for gather_object the root's link carries (n-1)/n of the gathered data). GB/s are "
    "10^9 bytes per second.\n"
    "- **ratio** = commlib time / torch time: below 1, commlib is faster.\n"
    "- **peak RSS**: how far one call raises the process's peak resident memory (`VmHWM` reset "
    "through `/proc/self/clear_refs`), largest rank, measured in a separate pass after all "
    "timing with glibc set to return every large temporary buffer, so each call's temporaries "
    "show. Host memory only.\n"
    "- **The torch side** is what a program without commlib calls: `all_reduce`, `all_gather` "
    "(allocating its output list, as commlib returns one), `all_gather_single` (the name torch "
    "2.13 gives `all_gather_into_tensor`), `broadcast`, `reduce_scatter_single`, "
    "`all_gather_object`, `gather_object`, `broadcast_object_list`; for `all_reduce_params` one "
    "`all_reduce` per tensor (torch's coalesced `all_reduce_coalesced` is deprecated and warns "
    "on every call).\n"
)
with open(target, "w") as f:
    f.write("\n".join(out))
