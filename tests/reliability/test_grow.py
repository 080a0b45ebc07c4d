"""Growing back under ``commlib run``: ranks die, the survivors shrink, replacements join.

Each test is one ``commlib run`` (the way docs/reliability.md starts a job),
in this process as the command runs it, of ``grow_rank.py`` with short
timeouts: kill, shrink and grow back twice in a row (world 2, gloo); a
replacement that dies while the group forms with it, then a survivor that
dies while the group forms, then a grow nobody joins (world 3, gloo); two
replacements at once (world 4, the simulated hccl
plugin over gloo). The training state the members send each newcomer must
match theirs, and every process that was not killed must exit 0 (the launcher
too). Then the training loop of docs/reliability.md itself, at world 4 on
gloo: every rank, the replacement included, ends with the same weights. The
seconds each grow took are printed (``pytest -s``) for the reliability notes.
"""

from __future__ import annotations

import json
import re
import signal
from pathlib import Path

import pytest

from commlib import cli

# slow: each test starts a job of its own (2 to 4 ranks and their replacements)
pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

ROOT = Path(__file__).parents[2]
RANK_SCRIPT = Path(__file__).with_name("grow_rank.py")


def _commlib_run(capfd, tmp_path: Path, world: int, restarts: int, killed: int, *script) -> str:
    """``commlib run`` in this process, as the command runs it; the ranks' output.

    ``killed`` processes end by SIGKILL (the launcher names each); every other exits 0.
    """
    handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    args = ["--nproc-per-node", str(world), "--max-restarts", str(restarts)]
    try:
        code = cli.main(["run", *args, "--log-dir", str(tmp_path / "logs"), *map(str, script)])
    finally:  # torch's process contexts turn these signals into exceptions in the launcher
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
    out, err = capfd.readouterr()
    ended = [line for line in err.splitlines() if ") ended: " in line]
    assert code == 0 and len(ended) == killed, err[-3000:]
    assert all(line.endswith("SIGKILL") for line in ended), ended
    return out


def _launch(
    capfd, tmp_path: Path, scenario: str, world: int, restarts: int, killed: int, *backend: str
) -> dict[int, list[dict]]:
    """One job of ``grow_rank.py``; each process's records, by pid."""
    out = tmp_path / scenario
    out.mkdir()
    _commlib_run(capfd, tmp_path, world, restarts, killed, RANK_SCRIPT, scenario, out, *backend)
    records: dict[int, list[dict]] = {}
    for path in out.glob("*.jsonl"):
        lines = [json.loads(line) for line in path.read_text().splitlines()]
        records[lines[0]["pid"]] = lines
    return records


def _events(records: dict[int, list[dict]], event: str) -> list[dict]:
    return [r for lines in records.values() for r in lines if r["event"] == event]


def _check_ends(records: dict[int, list[dict]], world: int) -> None:
    """``world`` processes finish together, agreeing on the state; every other one was killed."""
    done = _events(records, "done")
    assert sorted(d["rank"] for d in done) == list(range(world))
    assert all(d["size"] == world and d["agree"] for d in done)
    for lines in records.values():
        assert lines[-1]["event"] in ("done", "dying"), lines


def _check_states(records: dict[int, list[dict]]) -> None:
    """Every newcomer received exactly the state the members held at that step."""
    by_step: dict[int, set[float]] = {}
    for s in _events(records, "state"):
        by_step.setdefault(s["step"], set()).add(s["checksum"])
    assert by_step and all(len(sums) == 1 for sums in by_step.values()), by_step


def _grow_seconds(records: dict[int, list[dict]], grow: dict) -> float:
    """How long a grow took once its newcomers had asked (or the members called it)."""
    asked = sorted(a["at"] for a in _events(records, "asked") if a["at"] <= grow["ended"])
    return grow["ended"] - max(
        [grow["started"], *asked[-(grow["size_after"] - grow["size_before"]) :]]
    )


@pytest.mark.parametrize("world", [2])
def test_kill_shrink_grow_twice(capfd, tmp_path, world):
    records = _launch(capfd, tmp_path, "twice", world, restarts=2, killed=2)
    grows = _events(records, "grow")
    assert [(g["size_before"], g["size_after"]) for g in grows] == [(world - 1, world)] * 2
    joined = _events(records, "joined")
    assert [j["rank"] for j in joined] == [1, 1]  # the survivor keeps rank 0
    _check_states(records)
    _check_ends(records, world)
    print("grow, 1 newcomer (s):", [round(_grow_seconds(records, g), 3) for g in grows])


def test_a_newcomer_then_a_survivor_die_mid_grow_then_nobody_joins(capfd, tmp_path):
    records = _launch(capfd, tmp_path, "mid_grow", 3, restarts=4, killed=4)
    first = [
        r for lines in records.values() for r in lines if r["slot"] == 0 and r["restart"] == 0
    ]
    grows = [g for g in first if g["event"] == "grow"]
    # rank 0 throughout: the newcomer that died leaves the group of two; the next one
    # joins; then survivor 1 dies in the grow: rank 0 and that grow's newcomer form
    # the group of two, and survivor 1's replacement joins the next grow
    assert [(g["size_before"], g["size_after"]) for g in grows] == [(2, 2), (2, 3), (2, 2), (2, 3)]
    nobody = _events(records, "nobody")
    assert len(nobody) == 3 and all(n["same"] for n in nobody)
    _check_states(records)
    _check_ends(records, 3)
    asked = {(a["slot"], a["restart"]): a["at"] for a in _events(records, "asked")}

    def cost(grow: dict, newcomer: tuple[int, int]) -> float:  # from that grow's newcomer's ask
        return round(grow["ended"] - max(grow["started"], asked[newcomer]), 3)

    print(
        "failed grows (s): newcomer died",
        cost(grows[0], (2, 1)),
        "| survivor died",
        cost(grows[2], (2, 3)),
        "| grow nobody joins, wait=1 s (s):",
        [round(n["ended"] - n["started"], 3) for n in nobody],
    )


def test_two_newcomers_at_once_simulated_accelerator(capfd, tmp_path):
    records = _launch(capfd, tmp_path, "two_newcomers", 4, 2, 2, "hccl")
    grows = _events(records, "grow")
    assert [(g["size_before"], g["size_after"]) for g in grows] == [(2, 4)] * 2
    joined = _events(records, "joined")
    assert sorted(j["rank"] for j in joined) == [2, 3]
    assert {j["backend"] for j in joined + _events(records, "done")} == {"hccl"}
    _check_states(records)
    _check_ends(records, 4)
    print("grow, 2 newcomers (s):", [round(_grow_seconds(records, g), 3) for g in grows])


def _docs_example() -> str:
    page = (ROOT / "docs" / "reliability.md").read_text()
    marker = "<!-- run by: tests/reliability/test_grow.py -->"
    return page.split(marker, 1)[1].split("```python\n", 1)[1].split("```", 1)[0]


def test_the_docs_training_loop(capfd, tmp_path):
    script = tmp_path / "train.py"
    script.write_text(_docs_example())
    out = _commlib_run(capfd, tmp_path, 4, 1, 1, script)
    # Ranks print at once: two lines can share one (no newline between them), so a
    # weight is matched by its own digits, not up to the next space.
    lines = re.findall(r"rank (\d) of (\d): step (\d+), weights (-?\d+\.\d{6})", out)
    assert sorted(int(r) for r, *_ in lines) == [0, 1, 2, 3], out
    assert {(size, step) for _, size, step, _ in lines} == {("4", "30")}
    assert len({w for *_, w in lines}) == 1, lines  # the replacement got the state
