"""``commlib bench``: size parsing, bandwidth formulas, case selection, reports, end to end.

The end-to-end tests run the real console script as a subprocess (2 local
ranks, a tiny sweep) with a timeout; they check shape, never timings.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from commlib.bench import bandwidth, report, stats
from commlib.bench.cases import CASES, select_cases
from commlib.bench.options import BenchOptions
from commlib.bench.units import format_size, iterations_for, parse_size, size_sweep

IMPL_COLUMNS = ("time_us", "algbw_gbps", "busbw_gbps", "peak_rss_mib", "trials_us")
ROW_COLUMNS = {
    "case",
    "op",
    "payload",
    "kind",
    "backend",
    "device",
    "world_size",
    "size_bytes",
    "count",
    "iters",
    "warmup",
    "trials",
    "busbw_factor",
    "ratio",
    "ratio_low",
    "ratio_high",
    "noise",
    "strict",
    "checks",
    *(f"{impl}_{col}" for impl in ("commlib", "torch") for col in IMPL_COLUMNS),
}
# --strict both: the unchecked side, its ratio to torch and the check's price
BOTH_COLUMNS = {
    *(f"unchecked_{col}" for col in IMPL_COLUMNS),
    *(
        f"{p}{key}"
        for p in ("unchecked_", "check_")
        for key in ("ratio", "ratio_low", "ratio_high", "noise")
    ),
}


# -- sizes -------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "text, expected",
    [
        ("0", 0),
        ("512", 512),
        ("1K", 1024),
        ("1k", 1024),
        ("8M", 8 << 20),
        ("8MB", 8 << 20),
        ("8MiB", 8 << 20),
        ("1G", 1 << 30),
        ("1.5K", 1536),
        (" 2 M ", 2 << 20),
        (64, 64),
    ],
)
def test_parse_size(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "K", "1X", "-1K", "1KK", "one"])
def test_parse_size_rejects(text):
    with pytest.raises(ValueError, match="size"):
        parse_size(text)


def test_format_size_round_trips():
    for size in (1, 100, 1024, 1536, 4 << 20, 3 << 30):
        assert parse_size(format_size(size)) == size
    assert format_size(16 << 20) == "16M"


def test_size_sweep():
    assert size_sweep(1024, 16 << 20, 4) == [1 << k for k in range(10, 25, 2)]
    assert size_sweep(1024, 1024, 2) == [1024]
    assert size_sweep(1000, 9000, 3) == [1000, 3000, 9000]
    for bad in ((0, 1024, 2), (2048, 1024, 2), (1024, 4096, 1)):
        with pytest.raises(ValueError):
            size_sweep(*bad)


def test_iterations_shrink_with_size_but_not_below_floor():
    assert iterations_for(1 << 10, 20) == 20
    assert iterations_for(1 << 20, 20) == 20
    assert iterations_for(4 << 20, 20) == 5
    assert iterations_for(1 << 30, 20) == 3
    assert iterations_for(1 << 30, 2) == 2  # never more than asked for
    assert iterations_for(16 << 20, 3, floor=1) == 1


# -- bandwidth ---------------------------------------------------------------------------
@pytest.mark.parametrize("n", [1, 2, 3, 4, 8])
def test_busbw_factors_follow_nccl_tests(n):
    assert bandwidth.busbw_factor("all_reduce", n) == pytest.approx(2 * (n - 1) / n)
    assert bandwidth.busbw_factor("all_reduce_params", n) == pytest.approx(2 * (n - 1) / n)
    for op in ("all_gather", "all_gather_into_tensor", "reduce_scatter"):
        assert bandwidth.busbw_factor(op, n) == pytest.approx((n - 1) / n)
    for op in ("all_gather_object", "gather_object"):
        assert bandwidth.busbw_factor(op, n) == pytest.approx((n - 1) / n)
    assert bandwidth.busbw_factor("broadcast", n) == 1.0
    assert bandwidth.busbw_factor("broadcast_object_list", n) == 1.0


def test_algbw_and_busbw():
    assert bandwidth.algbw(10**9, 0.5) == pytest.approx(2.0)
    assert bandwidth.busbw("all_reduce", 10**9, 1.0, 4) == pytest.approx(1.5)
    assert bandwidth.busbw("all_gather", 10**9, 1.0, 4) == pytest.approx(0.75)
    assert math.isnan(bandwidth.algbw(1, 0.0))
    with pytest.raises(ValueError):
        bandwidth.busbw_factor("barrier", 2)


def test_every_case_has_a_busbw_factor():
    for case in CASES:
        assert bandwidth.factor_text(case.op)


# -- case selection ----------------------------------------------------------------------
def test_select_cases():
    assert select_cases(None) == CASES
    assert select_cases("all") == CASES
    assert [c.name for c in select_cases("all_reduce")] == ["all_reduce"]
    names = [c.name for c in select_cases("broadcast_object_list")]
    assert names == [
        "broadcast_object_list[numpy]",
        "broadcast_object_list[tensor]",
        "broadcast_object_list[small]",
    ]
    assert {c.kind for c in select_cases("tensor")} == {"tensor"}
    assert len(select_cases("tensor")) == 11
    both = select_cases(["gather_object[numpy]", "all_reduce"])
    assert [c.name for c in both] == ["all_reduce", "gather_object[numpy]"]  # standard order
    with pytest.raises(ValueError, match="unknown --ops"):
        select_cases("all_reduce,nope")


def test_cases_cover_every_collective():
    ops = {c.op for c in CASES}
    assert ops == set(bandwidth.BUSBW_FACTORS)
    payloads = {c.payload for c in CASES if c.kind == "object"}
    assert payloads == {"numpy", "tensor"}


def test_options_reject_a_bad_sweep_before_starting_ranks():
    from commlib.cli import main

    assert main(["bench", "--min-bytes", "8M", "--max-bytes", "1M"]) == 2
    assert main(["bench", "--ops", "nope"]) == 2
    assert main(["bench", "--backend", "single"]) == 2  # no process group: nothing to compare
    assert main(["bench", "--backend", "no-such-backend"]) == 2
    with pytest.raises(SystemExit):
        main(["bench", "--strict", "sometimes"])
    with pytest.raises(SystemExit):
        main(["bench", "--max-bytes", "lots"])


# -- reports -----------------------------------------------------------------------------
def _fake_rows() -> list[dict]:
    rows = []
    for case in select_cases("all_reduce,all_gather_object[numpy],all_gather_object[small]"):
        for size in [0] if case.fixed_size else [1024, 4096]:
            row = {
                "case": case.name,
                "op": case.op,
                "payload": case.payload,
                "kind": case.kind,
                "backend": "gloo",
                "device": "cpu",
                "world_size": 2,
                "size_bytes": size or 100,
                "count": 1,
                "iters": 3,
                "warmup": 1,
                "trials": 3,
                "busbw_factor": 1.0,
                "ratio": 0.5,
                "ratio_low": 0.45,
                "ratio_high": 0.55,
                "noise": False,
            }
            for impl, t in (("commlib", 100.0), ("torch", 200.0)):
                row.update(
                    {
                        f"{impl}_time_us": t,
                        f"{impl}_algbw_gbps": 0.01,
                        f"{impl}_busbw_gbps": 0.01,
                        f"{impl}_peak_rss_mib": 0.5,
                        f"{impl}_trials_us": [t, t, t],
                    }
                )
            rows.append(row)
    return rows


def test_text_and_markdown_tables():
    rows = _fake_rows()
    text = report.format_table(rows)
    assert "commlib" in text and "torch.distributed" in text
    assert text.count("all_reduce ") == 2 and "0.50" in text
    assert "0.45-0.55" in text and "noise" not in text.split("\n", 3)[-1]
    md = report.format_markdown(rows).splitlines()
    assert len(md) == 2 + len(rows)
    assert all(line.startswith("|") and line.endswith("|") for line in md)
    assert all(line.count("|") == md[0].count("|") for line in md)
    assert "`all_gather_object[small]`" in md[-1] and "**0.50**" in md[-1]
    lines = report.summary(rows)
    assert [line.split()[0] for line in lines] == ["tensor", "object", "small", "worst", "noise"]
    assert all("0.50" in line for line in lines[:3])
    assert "0 noise" in lines[0]
    assert lines[3].startswith("worst row") and lines[3].endswith("not noise")
    assert lines[4].startswith("noise                0 of 5 rows")


def test_noise_rows_are_marked_in_the_tables():
    rows = _fake_rows()
    rows[1].update(ratio=1.5, ratio_low=0.9, ratio_high=1.8, noise=True)
    text = report.format_table(rows).splitlines()
    assert text[3].endswith("1.50 0.90-1.80 noise")
    md = report.format_markdown(rows).splitlines()
    assert "| 1.50 | 0.90-1.80 | noise |" in md[3]  # not bold: the run cannot vouch for it
    lines = report.summary(rows)
    assert "2 rows, 1 noise" in lines[0]
    assert lines[3] == "worst row            all_reduce 1K: 0.50 (spread 0.45-0.55), not noise"
    assert lines[4] == "worst of all         all_reduce 4K: 1.50 (spread 0.90-1.80), noise"
    assert lines[5].startswith("noise                1 of 5 rows")


def test_rows_without_trials_still_render():
    """A JSON file written before trials (no spread, no noise flag) is still readable."""
    rows = _fake_rows()
    for row in rows:
        for key in ("trials", "ratio_low", "ratio_high", "noise"):
            del row[key]
    text = report.format_table(rows)
    assert " 0.50         -" in text
    md = report.format_markdown(rows)
    assert "| **0.50** | - |  |" in md
    lines = report.summary(rows)
    assert lines[-1].startswith("worst row") and not any(
        line.startswith("noise") for line in lines
    )


def test_missing_rss_shows_as_dash():
    rows = _fake_rows()
    for row in rows:
        row["commlib_peak_rss_mib"] = row["torch_peak_rss_mib"] = None
    assert " - " in report.format_table(rows)


# -- statistics --------------------------------------------------------------------------
def test_median():
    assert stats.median([3.0, 1.0, 2.0]) == 2.0
    assert stats.median([4.0, 1.0, 2.0, 3.0]) == 2.5
    assert stats.median([7.0]) == 7.0
    with pytest.raises(ValueError):
        stats.median([])


def test_spread_is_the_range_of_the_per_trial_ratio():
    ratios = stats.trial_ratios([1.0, 1.2, 3.0], [2.0, 1.0, 2.0])
    assert ratios == pytest.approx([0.5, 1.2, 1.5])
    assert stats.spread(ratios) == (0.5, 1.5)
    assert stats.spread([0.8]) == (0.8, 0.8)
    with pytest.raises(ValueError):
        stats.trial_ratios([1.0], [1.0, 2.0])
    with pytest.raises(ValueError):
        stats.spread([])


@pytest.mark.parametrize(
    "low, high, noise",
    [
        (0.8, 1.1, True),  # trials disagree on which side is faster
        (1.0, 1.3, True),  # one trial was a tie
        (0.7, 1.0, True),
        (1.01, 1.3, False),  # every trial: torch faster
        (0.5, 0.99, False),  # every trial: commlib faster
        (1.0, 1.0, False),  # one trial: no spread, nothing to judge
    ],
)
def test_noise_flag(low, high, noise):
    assert stats.is_noise(low, high) is noise


def test_confidence_of_the_spread():
    assert stats.confidence(1) == 0.0
    assert stats.confidence(2) == 0.5
    assert stats.confidence(5) == pytest.approx(0.9375)


def test_row_stats_with_fixed_numbers():
    s = stats.row_stats([10.0, 12.0, 30.0, 11.0, 9.0], [10.0, 10.0, 10.0, 11.0, 10.0])
    assert s["commlib"] == 11.0 and s["torch"] == 10.0
    assert s["ratio"] == pytest.approx(1.1)  # ratio of the medians: one slow trial is ignored
    assert (s["ratio_low"], s["ratio_high"]) == (pytest.approx(0.9), pytest.approx(3.0))
    assert s["noise"] is True
    s = stats.row_stats([5.0, 6.0, 5.5], [10.0, 9.0, 10.5])
    assert s["ratio"] == pytest.approx(0.55) and s["noise"] is False
    assert s["ratio_low"] <= s["ratio"] <= s["ratio_high"]


def test_ratio_of_medians_lies_within_the_spread():
    import random

    rng = random.Random(0)
    for n in (1, 2, 3, 4, 5, 8):
        for _ in range(200):
            c = [rng.uniform(0.1, 10) for _ in range(n)]
            t = [rng.uniform(0.1, 10) for _ in range(n)]
            s = stats.row_stats(c, t)
            assert s["ratio_low"] - 1e-12 <= s["ratio"] <= s["ratio_high"] + 1e-12


def test_worst_row():
    rows = [
        {"case": "a", "ratio": 1.5, "noise": True},
        {"case": "b", "ratio": 1.2, "noise": False},
        {"case": "c", "ratio": 0.7, "noise": False},
        {"case": "d", "ratio": 1.4, "ratio_low": 0.95, "ratio_high": 1.6},  # noise by spread
    ]
    assert stats.worst(rows)["case"] == "a"
    assert stats.worst(rows, skip_noise=True)["case"] == "b"
    assert stats.worst([rows[0]], skip_noise=True) is None
    assert stats.worst([]) is None
    assert stats.spread_width({"ratio": 2.0, "ratio_low": 1.5, "ratio_high": 2.5}) == 0.5
    assert stats.spread_width({"ratio": 2.0}) is None


def test_measurement_reduces_calls_to_trials():
    from commlib.bench.timing import Measurement

    m = Measurement(times={"commlib": [[3.0, 1.0, 2.0], [5.0, 4.0]], "torch": [[1.0], [2.0]]})
    assert m.trial_medians("commlib") == [2.0, 4.5]
    assert m.median("commlib") == 3.25
    assert m.median("torch") == 1.5


def test_geomean():
    assert report.geomean([0.5, 2.0]) == pytest.approx(1.0)
    assert math.isnan(report.geomean([]))


def test_plot_writes_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    out = tmp_path / "bench.png"
    report.plot(str(out), _fake_rows())
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_without_matplotlib_says_how_to_get_it(tmp_path):
    code = (
        "import sys; sys.modules['matplotlib'] = None\n"
        "from commlib.cli import main\n"
        f"sys.exit(main(['bench', '--plot', {str(tmp_path / 'x.png')!r}]))"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "pip install 'commlib[plot]'" in proc.stderr
    assert not (tmp_path / "x.png").exists()


# -- launcher, progress, memory --------------------------------------------------------
def test_under_torchrun(monkeypatch):
    from commlib.bench.launcher import under_torchrun

    for name in ("RANK", "WORLD_SIZE", "TORCHELASTIC_RUN_ID"):
        monkeypatch.delenv(name, raising=False)
    assert not under_torchrun()
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert under_torchrun()


def test_rank_failure_names_the_first_rank_and_shortens_the_echoes():
    from commlib.bench.launcher import RankFailure

    echo = "Connection closed by peer " + "x" * 500 + "\nsecond line"
    err = RankFailure({0: echo, 1: "RuntimeError: boom"}, first=1)
    text = str(err)
    assert text.startswith("rank 1 failed: RuntimeError: boom")
    assert "rank 0 also failed: Connection closed by peer" in text
    assert "second line" not in text and len(text) < 300


def test_progress_draws_only_on_a_terminal():
    import io

    from commlib.bench.progress import Progress

    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    tty = Tty()
    bar = Progress(2, stream=tty)
    bar.step("all_reduce 1K")
    bar.step("all_reduce 4K")
    bar.close()
    assert "0/2  all_reduce 1K" in tty.getvalue() and "1/2" in tty.getvalue()
    assert tty.getvalue().endswith("\r")

    pipe = io.StringIO()
    bar = Progress(2, stream=pipe)
    bar.step("x")
    bar.close()
    assert pipe.getvalue() == ""


def test_peak_growth_sees_a_large_temporary():
    from commlib.bench.memory import peak_growth

    def temporary() -> int:
        buf = b"\x01" * (96 << 20)  # written, so every page is resident
        return len(buf)

    grown, result = peak_growth(temporary)
    assert result == 96 << 20
    assert grown >= 64 << 20


# -- end to end --------------------------------------------------------------------------
def _commlib() -> list[str]:
    exe = shutil.which("commlib")
    return [exe] if exe else [sys.executable, "-m", "commlib.cli"]


def _bench_env(tmp_path: Path) -> dict[str, str]:
    # torch's launcher leaves a pytorch-errorfile-*.pickle per failed rank in the temp dir
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "TORCHELASTIC_RUN_ID"):
        env.pop(name, None)  # a test run under torchrun must still start its own ranks
    env.pop("COMMLIB_BENCH_FAIL_RANK", None)
    return env


def test_bench_end_to_end(tmp_path):
    out = tmp_path / "bench.json"
    args = ["bench", "--nproc", "2", "--min-bytes", "1K", "--max-bytes", "4K"]
    args += ["--iters", "1", "--trials", "2", "--warmup", "1", "--json", str(out)]
    args += ["--no-progress"]
    plot = report.have_matplotlib()
    if plot:
        args += ["--plot", str(tmp_path / "bench.png")]
    proc = subprocess.run(
        _commlib() + args, capture_output=True, text=True, timeout=180, env=_bench_env(tmp_path)
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    for case in CASES:
        assert case.name in proc.stdout
    assert "ratio" in proc.stdout and "geometric mean" in proc.stdout
    assert "spread" in proc.stdout and "worst row" in proc.stdout

    data = json.loads(out.read_text())
    assert data["meta"]["command"].startswith("commlib bench")
    rows = data["rows"]
    assert {r["case"] for r in rows} == {c.name for c in CASES}
    swept = [c for c in CASES if not c.fixed_size]
    assert len(rows) == 2 * len(swept) + (len(CASES) - len(swept))
    for row in rows:
        assert set(row) == ROW_COLUMNS, row["case"]
        assert (row["strict"], row["checks"]) == ("default", "guard")
        assert row["world_size"] == 2 and row["backend"] == "gloo"
        assert row["commlib_time_us"] > 0 and row["torch_time_us"] > 0
        assert row["ratio"] == pytest.approx(row["commlib_time_us"] / row["torch_time_us"])
        assert row["trials"] == 2 and row["iters"] == 1
        for impl in ("commlib", "torch"):
            assert len(row[f"{impl}_trials_us"]) == 2
            assert row[f"{impl}_time_us"] == pytest.approx(stats.median(row[f"{impl}_trials_us"]))
        ratios = stats.trial_ratios(row["commlib_trials_us"], row["torch_trials_us"])
        assert (row["ratio_low"], row["ratio_high"]) == pytest.approx(stats.spread(ratios))
        assert row["noise"] == stats.is_noise(row["ratio_low"], row["ratio_high"])
        assert row["commlib_peak_rss_mib"] >= 0 and row["torch_peak_rss_mib"] >= 0
    if plot:
        assert (tmp_path / "bench.png").read_bytes()[:4] == b"\x89PNG"


def test_bench_strict_both_measures_checked_and_unchecked_in_one_run(tmp_path):
    out = tmp_path / "bench.json"
    args = ["bench", "--strict", "both", "--ops", "broadcast,scatter", "--max-bytes", "1K"]
    args += ["--iters", "2", "--trials", "2", "--warmup", "1", "--json", str(out)]
    args += ["--no-progress", "--no-memory"]
    proc = subprocess.run(
        _commlib() + args, capture_output=True, text=True, timeout=120, env=_bench_env(tmp_path)
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "commlib checked (guard)" in proc.stdout and "check cost" in proc.stdout
    assert "unchecked/torch time" in proc.stdout and "checked/unchecked time" in proc.stdout
    rows = json.loads(out.read_text())["rows"]
    assert [r["case"] for r in rows] == ["broadcast", "scatter"]
    for row in rows:
        assert set(row) == ROW_COLUMNS | BOTH_COLUMNS, row["case"]
        assert (row["strict"], row["checks"]) == ("both", "guard")
        for side in ("commlib", "unchecked", "torch"):
            assert len(row[f"{side}_trials_us"]) == 2
            assert row[f"{side}_time_us"] == pytest.approx(stats.median(row[f"{side}_trials_us"]))
        for prefix, (mine, theirs) in (
            ("unchecked_", ("unchecked", "torch")),
            ("check_", ("commlib", "unchecked")),
        ):
            ratios = stats.trial_ratios(row[f"{mine}_trials_us"], row[f"{theirs}_trials_us"])
            assert row[prefix + "ratio"] == pytest.approx(
                row[f"{mine}_time_us"] / row[f"{theirs}_time_us"]
            )
            assert (row[prefix + "ratio_low"], row[prefix + "ratio_high"]) == pytest.approx(
                stats.spread(ratios)
            )
    md = report.format_markdown(rows).splitlines()
    assert "unchecked / torch" in md[0] and "check cost" in md[0]
    assert all(line.count("|") == md[0].count("|") for line in md)


def test_sides_take_turns():
    from commlib.bench.timing import order

    two, three = ("commlib", "torch"), ("commlib", "unchecked", "torch")
    assert [order(two, i)[0] for i in range(4)] == ["commlib", "torch"] * 2
    rounds = [order(three, i) for i in range(6)]
    # each side goes first, in the middle and last twice in six rounds
    for position in range(3):
        assert sorted(o[position] for o in rounds) == sorted(three * 2)
    # and comes right after each other side three times, never after itself (a call's
    # time depends on the one before it: torch's on gloo leaves the ranks apart)
    calls = [side for o in rounds for side in o]
    after = Counter(zip(calls[-1:] + calls[:-1], calls))
    assert after == {(a, b): 3 for a in three for b in three if a != b}
    assert order(three, 6) == order(three, 0)


def test_a_failed_rank_ends_the_run_with_its_error(tmp_path):
    env = _bench_env(tmp_path)
    env["COMMLIB_BENCH_FAIL_RANK"] = "1"
    args = ["bench", "--ops", "all_reduce", "--max-bytes", "2K", "--iters", "1", "--no-memory"]
    proc = subprocess.run(_commlib() + args, capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 1
    assert "rank 1 failed: RuntimeError: injected failure on rank 1" in proc.stderr
    assert "ratio" not in proc.stdout


def test_options_are_picklable_for_the_ranks():
    import pickle

    opts = BenchOptions(ops="tensor", max_bytes=4096)
    assert pickle.loads(pickle.dumps(opts)) == opts


# -- the dispatch kind: torch's fake process group, in one process -----------------------
DISPATCH_SIDES = ("unchecked", "observer", "recorder")
DISPATCH_COLUMNS = {
    "case",
    "op",
    "kind",
    "backend",
    "plugin",
    "engine",
    "device",
    "world_size",
    "size_bytes",
    "calls",
    "warmup",
    "trials",
    "observers",
    "simulated",
    "torch_time_us",
    "torch_trials_us",
    *(
        f"{side}_{col}"
        for side in DISPATCH_SIDES
        for col in (
            "time_us",
            "added_us",
            "ratio",
            "ratio_low",
            "ratio_high",
            "noise",
            "trials_us",
        )
    ),
}


def test_select_dispatch():
    from commlib.bench.dispatch_cases import CASES as DISPATCH
    from commlib.bench.dispatch_cases import select_dispatch

    assert select_dispatch("dispatch") == DISPATCH
    assert select_dispatch(None) == [] and select_dispatch("all") == []
    assert select_dispatch("all_reduce") == []  # a collective alone: the case across ranks
    picked = select_dispatch(["broadcast[dispatch]", "all_reduce[dispatch]", "tensor"])
    assert [c.op for c in picked] == ["all_reduce", "broadcast"]  # standard order
    with pytest.raises(ValueError, match="the dispatch cases are"):
        select_dispatch("nope[dispatch]")
    # the cases across ranks are not changed by dispatch tokens
    assert select_cases("dispatch") == []
    assert select_cases("all_reduce[dispatch]") == []
    assert select_cases("dispatch,all_reduce") == select_cases("all_reduce")
    assert select_cases("dispatch,all") == CASES
    ops = {c.op for c in DISPATCH}
    assert {c.op for c in CASES if c.kind == "tensor"} - {"send_recv"} <= ops
    assert {"all_to_all", "barrier", "send", "recv", "gather"} <= ops


def test_dispatch_options_are_checked_before_anything_runs():
    from commlib.cli import main

    assert main(["bench", "--ops", "nope[dispatch]"]) == 2
    assert main(["bench", "--ops", "dispatch", "--backend", "single"]) == 2
    assert main(["bench", "--ops", "dispatch", "--plot", "x.png"]) == 2  # no bandwidth to draw
    with pytest.raises(SystemExit):
        main(["bench", "--ops", "dispatch", "--calls", "0"])


def test_the_dispatch_plugin_is_the_backend_s_own_on_the_fake_group():
    from commlib import plugins
    from commlib.bench.fake_world import dispatch_plugin

    base = plugins.resolve_backend("gloo")
    plugin = dispatch_plugin(base)
    assert isinstance(plugin, type(base)) and plugin.device() == base.device()
    assert (plugin.name, plugin.torch_backend) == ("gloo@fake", "fake")
    # no size-based engine paths: with nothing sent they would only add local work
    assert plugin.small_exchange_bytes is None and plugin.p2p_gather_bytes is None
    assert plugin.reduce_scatter_by_all_to_all is False
    assert base.small_exchange_bytes is not None  # the real plugin is untouched
    with pytest.raises(ValueError, match="nothing to compare"):
        dispatch_plugin(plugins.resolve_backend("single"))


def test_dispatch_sides_take_turns_and_register_their_observer_for_their_block_only():
    from commlib import plugins
    from commlib.bench.dispatch import SIDES, _Sides, measure
    from commlib.bench.dispatch_cases import DispatchCase

    seen: dict[str, list[int]] = {"torch": [], "commlib": []}

    def prepare(comm):
        return {
            impl: (lambda impl=impl: seen[impl].append(len(plugins.list_observers())))
            for impl in seen
        }

    before = plugins.list_observers()
    times = measure(None, DispatchCase("x", prepare), calls=5, trials=4, warmup=2, sides=_Sides())
    assert plugins.list_observers() == before
    assert set(times) == set(SIDES) and all(len(t) == 4 for t in times.values())
    assert all(t > 0 for side in times.values() for t in side)
    # per side: the warm-up, then per trial one untimed call and the timed block
    assert len(seen["torch"]) == 2 + 4 * (1 + 5)
    assert len(seen["commlib"]) == 3 * (2 + 4 * (1 + 5))
    # the commlib calls ran a third with no observer, a third with one, a third with the recorder
    counts = [seen["commlib"].count(len(before) + k) for k in (0, 1)]
    assert counts == [len(seen["torch"]), 2 * len(seen["torch"])]
    assert set(seen["torch"]) == {len(before)}


def _dispatch_rows() -> list[dict]:
    rows = []
    for case, torch_us in (("all_reduce", 4.0), ("broadcast", 5.0)):
        row = {"case": case, "op": case, "kind": "dispatch", "torch_time_us": torch_us}
        row.update(world_size=2, plugin="gloo@fake", device="cpu", size_bytes=16)
        row.update(calls=100, trials=3, observers=[])
        for side, factor in (("unchecked", 2.0), ("observer", 3.0), ("recorder", 4.0)):
            row.update(
                {
                    f"{side}_time_us": torch_us * factor,
                    f"{side}_added_us": torch_us * (factor - 1),
                    f"{side}_ratio": factor,
                    f"{side}_ratio_low": factor - 0.5,
                    f"{side}_ratio_high": factor + 0.5,
                    f"{side}_noise": False,
                }
            )
        rows.append(row)
    return rows


def test_dispatch_tables_show_every_row_and_side():
    import io

    from commlib.bench import dispatch_report

    rows = _dispatch_rows()
    rows[1].update(unchecked_ratio=1.0, unchecked_ratio_low=0.9, unchecked_noise=True)
    text = dispatch_report.format_table(rows).splitlines()
    assert "commlib unchecked" in text[0] and "flight recorder" in text[0]
    assert text[2].startswith("all_reduce") and "8.0    4.0   2.00   1.50-2.50" in text[2]
    assert "0.90-2.50 noise" in text[3]
    md = dispatch_report.format_markdown(rows).splitlines()
    assert len(md) == 2 + len(rows)
    assert all(line.count("|") == md[0].count("|") for line in md)
    assert "| `all_reduce` | 4.0 | 8.0 (+4.0) | **2.00** | 1.50-2.50 |" in md[2]
    assert "| 1.00 (noise) |" in md[3]  # not bold: the run cannot vouch for it
    lines = dispatch_report.summary(rows)
    assert [line.split()[0] for line in lines] == ["commlib", "one", "flight"]
    assert "target 1.00: met by 1 of 2 rows" in lines[0]
    assert "worst all_reduce 2.00" in lines[0]
    out = io.StringIO()
    report.print_table(_fake_rows() + rows, out=out)  # both kinds: a table each
    printed = out.getvalue()
    assert "torch.distributed" in printed and "torch's fake process group" in printed
    assert printed.index("worst row") < printed.index("fake process group")


def test_bench_dispatch_end_to_end(tmp_path):
    from commlib.bench.dispatch_cases import CASES as DISPATCH

    out = tmp_path / "dispatch.json"
    args = ["bench", "--ops", "dispatch", "--calls", "20", "--trials", "2", "--warmup", "1"]
    args += ["--nproc", "4", "--json", str(out), "--no-progress"]
    proc = subprocess.run(
        _commlib() + args, capture_output=True, text=True, timeout=180, env=_bench_env(tmp_path)
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    for case in DISPATCH:
        assert f"\n{case.op} " in proc.stdout
    assert "world size 4" in proc.stdout and "fake process group" in proc.stdout
    for label in ("commlib unchecked", "one observer", "flight recorder"):
        assert f"\n{label} " in proc.stdout  # its summary line

    rows = json.loads(out.read_text())["rows"]
    assert [r["case"] for r in rows] == [c.op for c in DISPATCH]
    for row in rows:
        assert set(row) == DISPATCH_COLUMNS, row["case"]
        assert row["kind"] == "dispatch" and row["engine"] == "fake"
        assert row["world_size"] == 4 and row["plugin"] == "gloo@fake"
        assert row["trials"] == 2 and row["calls"] == 20
        assert row["torch_time_us"] == pytest.approx(stats.median(row["torch_trials_us"]))
        for side in DISPATCH_SIDES:
            assert len(row[f"{side}_trials_us"]) == 2
            assert row[f"{side}_time_us"] == pytest.approx(stats.median(row[f"{side}_trials_us"]))
            assert row[f"{side}_ratio"] == pytest.approx(
                row[f"{side}_time_us"] / row["torch_time_us"]
            )
            low, high = row[f"{side}_ratio_low"], row[f"{side}_ratio_high"]
            assert low <= row[f"{side}_ratio"] <= high
            assert row[f"{side}_noise"] == stats.is_noise(low, high)


def test_dispatch_takes_an_absent_accelerator_or_a_plugin_class_as_its_backend():
    from commlib.bench.options import backend_plugin, options_from
    from commlib.cli import main

    # dispatch alone: an accelerator absent here is timed over simulated devices
    assert backend_plugin("cncl", dispatch=True).name == "cncl"
    with pytest.raises(ValueError, match="cannot run here"):
        backend_plugin("cncl")  # across ranks: its ranks would need the device
    assert main(["bench", "--ops", "dispatch,all_reduce", "--backend", "hccl"]) == 2
    # a plugin class by module:Class, imported and registered under its own name
    plugin = backend_plugin("commlib_backends.gloo:GlooBackend", dispatch=True)
    assert plugin is backend_plugin("gloo")
    assert main(["bench", "--ops", "dispatch", "--backend", "nope.mod:Nope"]) == 2
    import argparse

    from commlib.bench.options import add_arguments

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    opts = options_from(parser.parse_args(["--ops", "dispatch", "--backend", "nccl"]))
    assert opts.backend == "nccl"


@pytest.mark.parametrize(
    "backend, plugin",
    [
        ("cncl", "cncl@fake"),
        ("tests.backends.test_lanes_per_engine:Minimal", "lanes-minimal@fake"),
    ],
    ids=["simulated", "plugin-class"],
)
def test_bench_dispatch_of_a_simulated_accelerator_or_a_plugin_class(tmp_path, backend, plugin):
    out = tmp_path / "dispatch.json"
    args = ["bench", "--ops", "all_reduce[dispatch],barrier[dispatch]", "--backend", backend]
    args += ["--calls", "10", "--trials", "1", "--nproc", "2", "--json", str(out)]
    root = str(Path(__file__).resolve().parents[2])  # the plugin class's package: tests
    env = {**_bench_env(tmp_path), "PYTHONPATH": root}
    proc = subprocess.run(
        [*_commlib(), *args, "--no-progress"], capture_output=True, text=True, timeout=180, env=env
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = {r["case"]: r for r in json.loads(out.read_text())["rows"]}
    assert rows["all_reduce"]["plugin"] == plugin
    simulated = backend == "cncl"
    assert rows["all_reduce"]["simulated"] is simulated
    assert ("simulated device" in proc.stdout) is simulated
    # torch's own barrier asks the accelerator runtime: the simulated mlu registers its hooks
    assert "barrier" in rows and rows["barrier"]["torch_time_us"] > 0
    assert "not timed" not in proc.stderr


def test_bench_dispatch_and_ranks_in_one_run(tmp_path):
    args = ["bench", "--ops", "all_reduce[dispatch],all_reduce", "--max-bytes", "1K"]
    args += ["--calls", "10", "--trials", "2", "--iters", "1", "--no-memory", "--no-progress"]
    proc = subprocess.run(
        _commlib() + args, capture_output=True, text=True, timeout=180, env=_bench_env(tmp_path)
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "torch.distributed" in proc.stdout and "fake process group" in proc.stdout
    assert proc.stdout.count("\nall_reduce ") == 2  # a row in each table
