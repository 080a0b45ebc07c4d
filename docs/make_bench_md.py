"""Write docs/bench.md, the docs site's benchmark page, from a ``commlib bench --json`` file.

The page is generated whole: edit this script, not docs/bench.md. Usage, from the
repository root::

    commlib bench --json docs/bench.json --plot docs/bench.png
    python docs/make_bench_md.py docs/bench.json docs/bench.md
"""

import json
import math
import sys

from commlib.bench import report

with open(sys.argv[1]) as f:
    d = json.load(f)
rows, meta = d["rows"], d["meta"]
KEEP = {4 << 10, 1 << 20, 16 << 20}
short = [r for r in rows if r["kind"] == "latency" or r["size_bytes"] in KEEP]


def rng(vals):
    return f"{report.geomean(vals):.2f} ({min(vals):.2f}-{max(vals):.2f})"


obj_big = [r for r in rows if r["kind"] == "object" and r["size_bytes"] == 16 << 20]
obj_4m = [r for r in rows if r["kind"] == "object" and r["size_bytes"] == 4 << 20]
obj_mid = [r for r in rows if r["kind"] == "object" and 16 << 10 <= r["size_bytes"] <= 1 << 20]
obj_small = [r for r in rows if r["kind"] == "object" and r["size_bytes"] <= 4 << 10]
lat = [r for r in rows if r["kind"] == "latency"]
ten = [r for r in rows if r["kind"] == "tensor"]
ten_big = [r for r in ten if r["size_bytes"] >= 4 << 20 and r["op"] != "all_gather"]
ten_small = [r for r in ten if r["size_bytes"] <= 64 << 10 and r["op"] != "all_gather"]
ag = [r for r in ten if r["op"] == "all_gather"]
par = [r for r in rows if r["kind"] == "helper"]
mem = [
    (r["torch_peak_rss_mib"] / r["commlib_peak_rss_mib"])
    for r in rows
    if r["kind"] == "object" and r["size_bytes"] == 16 << 20 and r["commlib_peak_rss_mib"]
]

out = []
w = out.append
w(
    "<!-- Generated, do not edit: commlib bench --json docs/bench.json --plot docs/bench.png"
    " && python docs/make_bench_md.py docs/bench.json docs/bench.md -->\n"
)
w("# Benchmark: `commlib bench`\n")
w(
    "`commlib bench` measures every collective twice in the same run, through commlib and "
    "through the plain `torch.distributed` call a program would otherwise make, and prints one "
    "row per size in the style of nccl-tests: time, algorithm bandwidth, bus bandwidth, the "
    "commlib/torch time ratio and the peak memory each call needs. It starts its own ranks "
    "(2 by default) on 127.0.0.1 with torch's launcher, on the machine's default backend "
    "(gloo on a CPU-only machine); the defaults finish in under a minute on two cores.\n"
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
    "`--iters` timed calls per size (default 20 up to 1 MiB, proportionally fewer above, at "
    "least 3); `--warmup` (default 3; the first call of each side is checked for a correct "
    "result); `--ops` cases, collectives or kinds (`tensor`, `object`, `latency`, `helper`); "
    "`--json FILE` every row and column; `--plot FILE.png` bus bandwidth against size "
    "(`pip install 'commlib[plot]'`); `--format markdown`; `--timeout SECONDS` (default 120): "
    "a rank that fails or hangs ends the run with that rank's error and a non-zero exit.\n"
)
cpu = meta.get("cpu_count")
w(f"## Results: {rows[0]['world_size']} ranks, {rows[0]['backend']}, {cpu} CPU cores\n")
w(
    f"Produced by `{meta['command']}` (torch {meta['torch']}, Python {meta['python']}, "
    f"commlib {meta['commlib']}, {meta['date'][:10]}) on a {cpu}-core Linux VM: ratios move by "
    "10-30 % from run to run, and small-size times are mostly scheduling latency. Run it on "
    "your machine for your numbers.\n"
)
w("```text\n" + "\n".join(report.summary(rows)) + "\n```\n")
w(
    "What it shows; each figure is commlib time / torch time, the geometric mean over the "
    "rows with their range in brackets:\n"
)
bullets = []
w = bullets.append
w(
    f"- **Object collectives, large payloads**: at 16M (numpy arrays or tensors in a dict) "
    f"{rng([r['ratio'] for r in obj_big])}, with {min(mem):.1f}-{max(mem):.1f}x less peak "
    "memory: buffers travel out of band instead of inside one pickled byte string. At 4M: "
    f"{rng([r['ratio'] for r in obj_4m])}.\n"
)
w(
    f"- **Small objects** (a 4-key dict, done in one round): {rng([r['ratio'] for r in lat])}; "
    f"payloads of 1K-4K: {rng([r['ratio'] for r in obj_small])}.\n"
)
mid = [r["ratio"] for r in obj_mid]
w(
    f"- **Object collectives, 16K-1M**: {rng(mid)}: objects that do not fit the first round "
    "(a 4 KiB slot per rank) pay a second round, "
    + (
        "so in this range commlib is on average slower than torch.\n"
        if math.exp(sum(math.log(x) for x in mid) / len(mid)) > 1
        else "and still come out ahead of torch's two rounds and extra copies on average.\n"
    )
)
w(
    f"- **Tensor collectives** run the same engine call: {rng([r['ratio'] for r in ten_big])} "
    f"at 4M-16M, {rng([r['ratio'] for r in ten_small])} at 1K-64K, where commlib's own work per "
    "call (argument checks, dispatch, a wait that can time out) shows against ~0.3 ms "
    f"collectives. `all_gather`, {rng([r['ratio'] for r in ag])}, returns a list and accepts "
    "different shapes on different ranks: tensors up to the 4 KiB slot travel with their "
    "shapes in one round, larger ones pay one extra small round to learn the shapes first; "
    "with equal shapes, `all_gather_into_tensor` costs what the other tensor collectives "
    "cost.\n"
)
w(
    f"- **`all_reduce_params`** over {par[0]['payload']}: {rng([r['ratio'] for r in par])} "
    "against one torch `all_reduce` per tensor: it coalesces them into one collective.\n"
)
w = out.append
w("".join(bullets))
w("![bus bandwidth against size, commlib and torch.distributed](bench.png)\n")
w("Every case at 4K, 1M and 16M (small objects at their own size); the full table is below.\n")
w(report.format_markdown(short) + "\n")
# markdown="1": the docs site (md_in_html) renders the table inside; GitHub ignores it
w(
    '<details markdown="1"><summary>Every row</summary>\n\n'
    + report.format_markdown(rows)
    + "\n\n</details>\n"
)
w("## How to read it\n")
w(
    "- **time**: the median of the timed calls on each rank, then the slowest rank's median "
    "(a collective is as slow as its slowest rank). commlib and torch calls alternate call by "
    "call, the order alternates too, each call starts right after a barrier, and accelerator "
    "work is synchronised before the clock stops.\n"
    "- **size**: the bytes of the operation, as nccl-tests counts them: the gathered output for "
    "all_gather-like collectives (world size x each rank's part), the full input for "
    "reduce_scatter, the buffer for all_reduce and broadcast. Object collectives count the raw "
    "payload (the array or tensor in the object, not the pickle): gathered total for "
    "`all_gather_object` / `gather_object`, the broadcast payload for `broadcast_object_list`.\n"
    "- **algbw** = size / time; **busbw** = algbw x 2(n-1)/n for all_reduce and "
    "all_reduce_params, (n-1)/n for all_gather, all_gather_into_tensor, reduce_scatter, "
    "all_gather_object and gather_object (the root's link carries (n-1)/n of the gathered data), "
    "1 for broadcast and broadcast_object_list. GB/s are 10^9 bytes per second.\n"
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
with open(sys.argv[2], "w") as f:
    f.write("\n".join(out))
