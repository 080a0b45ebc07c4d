"""Growing back without processes: what grow, join and `commlib run` refuse; the exit rule."""

from __future__ import annotations

import argparse

import pytest

import commlib
from commlib import _survivors, cli
from commlib.run import Launcher, Slot, add_arguments


def test_grow_needs_a_distributed_job():
    with pytest.raises(ValueError, match="grow needs a distributed job"):
        commlib.Communicator().grow()


@pytest.mark.parametrize(
    ("count", "error"), [(0, ValueError), (1.5, TypeError), (True, TypeError)]
)
def test_grow_count_is_a_positive_int(count, error):
    with pytest.raises(error, match="count"):
        commlib.Communicator().grow(count=count)


def test_init_dist_refuses_in_a_replacement(monkeypatch):
    monkeypatch.setenv("COMMLIB_NEWCOMER", "1")
    assert commlib.is_newcomer()
    with pytest.raises(RuntimeError, match=r"commlib\.join\(\)"):
        commlib.init_dist("pytorch")


def test_join_outside_a_newcomer_refuses_at_once(monkeypatch):
    monkeypatch.delenv("COMMLIB_NEWCOMER", raising=False)
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")  # a store that would be waited on
    monkeypatch.setenv("MASTER_PORT", "1")
    with pytest.raises(RuntimeError, match=r"not a newcomer.*comm\.grow"):
        commlib.join(timeout=600)


def test_join_without_a_store_says_where_to_start(monkeypatch):
    monkeypatch.setenv("COMMLIB_NEWCOMER", "1")
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    monkeypatch.delenv("MASTER_PORT", raising=False)
    with pytest.raises(ValueError, match="commlib run"):
        commlib.join(timeout=1)


def test_run_refuses_several_nodes_without_an_endpoint(capsys):
    assert cli.main(["run", "--nnodes", "2", "train.py"]) == 2
    assert "--rdzv-endpoint" in capsys.readouterr().err


def test_run_passes_the_scripts_own_flags_through():
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["--nproc-per-node", "2", "train.py", "--lr", "0.1", "--nnodes", "9"])
    assert (args.nproc_per_node, args.nnodes, args.script) == (2, 1, "train.py")
    assert args.script_args == ["--lr", "0.1", "--nnodes", "9"]


class _Store:
    """The launcher's store, as far as the exit code reads it: the keys shrinks left."""

    def __init__(self, keys: set[str]):
        self.keys = keys

    def check(self, keys: list[str]) -> bool:
        return all(k in self.keys for k in keys)


def _launcher_with(ends: list[list[tuple[int, float]]], shrunk_away: tuple[int, ...] = ()):
    """Slot i's processes have pids 100 * i + j; ``shrunk_away``: pids a shrink left out."""
    launcher = Launcher.__new__(Launcher)
    launcher.slots = [
        Slot(i, i, ends=[(code, at, 100 * i + j) for j, (code, at) in enumerate(e)])
        for i, e in enumerate(ends)
    ]
    here = _survivors.process_record().rpartition(" ")[0]
    launcher.store = _Store({f"{_survivors.LEFT_OUT}/{here} {pid}" for pid in shrunk_away})
    return launcher


def test_a_rank_the_survivors_shrank_away_or_replaced_does_not_fail_the_job():
    assert _launcher_with([[(0, 5.0)], [(-9, 1.0)]], shrunk_away=(100,))._exit_code() == 0
    assert _launcher_with([[(0, 5.0)], [(-9, 1.0), (0, 5.0)]])._exit_code() == 0


def test_a_rank_that_failed_and_nobody_went_on_without_fails_the_job():
    # rank 1 died of an uncaught exception; rank 0 ended well later: not a survived job
    assert _launcher_with([[(0, 5.0)], [(1, 1.0)]])._exit_code() == 1
    assert _launcher_with([[(0, 5.0)], [(-9, 1.0)]])._exit_code() == 1
    assert _launcher_with([[(0, 5.0)], [(3, 6.0)]])._exit_code() == 3
    assert _launcher_with([[(1, 5.0)], [(1, 6.0)]])._exit_code() == 1
    assert _launcher_with([[(-9, 5.0)]])._exit_code() == 1
    # shrunk away, but another process failed later: that one is the job's code
    assert _launcher_with([[(4, 5.0)], [(-9, 1.0)]], shrunk_away=(100,))._exit_code() == 4
