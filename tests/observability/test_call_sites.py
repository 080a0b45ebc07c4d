"""Call sites: the caller's line in events and in the flight recorder, one process."""

from __future__ import annotations

import sys

import pytest
import torch

from commlib import Communicator, hookimpl
from commlib.observe import call_site, disable_flight_recorder, enable_flight_recorder
from commlib.observe.call_site import CallSite
from commlib.plugins import plugin_manager


class Sites:
    """An observer that keeps the call site of each collective, asked for or looked up."""

    def __init__(self, asks: bool) -> None:
        self.commlib_call_sites = asks
        self.given: list[CallSite | None] = []
        self.looked_up: list[CallSite | None] = []

    @hookimpl
    def commlib_collective_start(self, event):
        self.given.append(event.call_site)
        self.looked_up.append(call_site.call_site())


@pytest.fixture(params=[True, False], ids=["asks", "does not ask"])
def sites(request):
    observer = Sites(request.param)
    plugin_manager().register(observer)
    yield observer
    plugin_manager().unregister(observer)


def _line() -> int:
    return sys._getframe(1).f_lineno


def test_an_observer_that_asks_gets_the_caller_s_line(sites):
    comm = Communicator()
    here = _line() + 1
    comm.all_reduce(torch.ones(2))
    there = _line() + 1
    comm.broadcast(torch.ones(2), src=0)
    expected = [
        CallSite(__file__, here, "test_an_observer_that_asks_gets_the_caller_s_line"),
        CallSite(__file__, there, "test_an_observer_that_asks_gets_the_caller_s_line"),
    ]
    # looked up from the start hook it is the same line; given only to an observer that asks
    assert sites.looked_up == expected
    assert sites.given == (expected if sites.commlib_call_sites else [None, None])


def _helper(comm: Communicator) -> None:
    import commlib

    commlib.all_reduce(torch.ones(1))  # through the module function: still this line


def test_sites_are_told_apart_by_line_and_by_code_object(sites):
    comm = Communicator()
    for _ in range(2):  # the same line twice: the same site
        comm.all_reduce(torch.ones(1))
    here = _line() - 1
    # the same source compiled for two files: equal code objects, two callers (code
    # objects are known by identity; the first is not freed and its id reused)
    for name in ("/job/a.py", "/job/b.py"):
        code = compile("comm.all_reduce(torch.ones(1))", name, "exec")
        exec(code, {"comm": comm, "torch": torch})
    assert [s.line for s in sites.looked_up[:2]] == [here, here]
    assert [(s.file, s.line) for s in sites.looked_up[2:]] == [("/job/a.py", 1), ("/job/b.py", 1)]
    assert sites.given == (sites.looked_up if sites.commlib_call_sites else [None] * 4)


def test_the_call_site_passes_over_commlib_s_own_frames():
    recorder = enable_flight_recorder()
    try:
        _helper(Communicator())
        site = recorder.snapshot()["entries"][-1]["call_site"]
    finally:
        disable_flight_recorder()
    assert site["file"] == __file__ and site["function"] == "_helper"
    assert open(__file__).read().splitlines()[site["line"] - 1].strip().startswith("commlib.all")


def test_outside_a_collective_there_is_no_call_site():
    assert call_site.call_site() is None
    assert CallSite("/a/train.py", 88, "step").short() == "train.py:88 (step)"


def test_commlib_bench_calls_as_a_program_does():
    # the bench's own lines are its calls' sites: otherwise every timed call's walk
    # would climb through the bench to the console script, which no program pays
    import commlib.bench.dispatch
    import commlib.communicator

    assert not call_site.is_commlib_file(commlib.bench.dispatch.__file__)
    assert call_site.is_commlib_file(commlib.communicator.__file__)
