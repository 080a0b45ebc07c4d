"""Handle.get_future's completions: one watcher per process, callbacks on a reused pool."""

from __future__ import annotations

import threading

import pytest
import torch

from commlib import _completions as completions
from commlib.handle import Handle


def _pending_handle(ended: threading.Event, value: torch.Tensor) -> Handle:
    # an engine's work in flight until `ended` is set (wait() then returns at once)
    handle = Handle(lambda timeout: None, None, object(), value=[value])
    handle.is_completed = ended.is_set  # type: ignore[method-assign]
    return handle


def _commlib_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("commlib-future")]


@pytest.mark.timeout(60)
def test_many_pending_futures_are_watched_by_one_thread_not_one_each():
    ended = threading.Event()
    values = [torch.full((2,), float(i)) for i in range(300)]
    futures = [_pending_handle(ended, v).get_future() for v in values]
    assert completions.pending() >= 300
    # a thread per call before: 300 threads here
    assert len(_commlib_threads()) <= 2, _commlib_threads()
    chained = [f.then(lambda f: f.value()[0][0].item()) for f in futures]
    ended.set()
    assert [c.wait() for c in chained] == [float(i) for i in range(300)]
    assert completions.pending() == 0
    # the pool grows only while every thread of it is busy: a few, reused
    assert len(_commlib_threads()) <= 1 + 3, _commlib_threads()


@pytest.mark.timeout(60)
def test_futures_asked_in_turn_reuse_the_same_threads():
    names: set[str] = set()
    for _ in range(50):
        ended = threading.Event()
        future = _pending_handle(ended, torch.zeros(1)).get_future()
        ran_on = future.then(lambda f: threading.current_thread().name)
        ended.set()
        names.add(ran_on.wait())
    assert len(names) <= 3, names  # not 50 threads started


@pytest.mark.timeout(60)
def test_a_callback_may_wait_for_another_commlib_future():
    # torch's PowerSGD hook waits, inside a `then` callback, for the future of a call it
    # starts there: the callback must not hold up the watcher that completes that future
    first_ended, second_ended = threading.Event(), threading.Event()
    first = _pending_handle(first_ended, torch.ones(1))

    def inner_wait(f):
        second = _pending_handle(second_ended, torch.full((1,), 2.0)).get_future()
        threading.Timer(0.05, second_ended.set).start()
        return f.value()[0].item() + second.wait()[0].item()

    chained = first.get_future().then(inner_wait)
    first_ended.set()
    assert chained.wait() == 3.0


@pytest.mark.timeout(60)
def test_an_error_of_the_call_is_the_future_s_and_the_watcher_goes_on():
    from commlib.errors import CommTimeoutError

    def times_out(timeout):
        raise CommTimeoutError("all_reduce did not complete")

    ended = threading.Event()
    failing = Handle(times_out, None, object(), value=[torch.ones(1)])
    failing.is_completed = ended.is_set  # type: ignore[method-assign]
    bad = failing.get_future()
    good = _pending_handle(ended, torch.ones(1)).get_future()
    ended.set()
    with pytest.raises(CommTimeoutError, match="did not complete"):
        bad.wait()
    assert good.wait()[0].tolist() == [1.0]
