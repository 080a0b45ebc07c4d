"""Observing collectives: hooks for plugins, the flight recorder, statistics, ``commlib trace``.

* Observer hooks: a plugin implements ``commlib_collective_start`` /
  ``commlib_collective_end`` (:mod:`commlib.hookspecs`) and is told about every
  collective, as a :class:`CollectiveEvent`. Nothing is paid when no plugin
  observes (:mod:`commlib.observe.dispatch`).
* The flight recorder (:class:`FlightRecorder`): each rank's bounded record of
  its recent collectives, written to ``COMMLIB_TRACE_DIR`` when a collective
  fails on any rank, on ``SIGUSR1`` and at exit; ``commlib trace DIR`` reads
  every rank's file and names the rank and collective that diverged
  (:mod:`commlib.observe.diagnosis`).
* Statistics (:class:`CollectiveStats`): count, bytes and time per collective,
  reported at exit with ``COMMLIB_STATS``.
* ``torch.profiler`` shows each collective as ``commlib.<name>(<sizes>)``.

Examples:
    >>> from commlib.observe import enable_flight_recorder, disable_flight_recorder
    >>> recorder = enable_flight_recorder()
    >>> comm.all_reduce(torch.ones(4))
    >>> entry = recorder.snapshot()["entries"][-1]
    >>> entry["name"], entry["shapes"], entry["state"]
    ('all_reduce', [[4]], 'completed')
    >>> disable_flight_recorder()
"""

from commlib.observe.builtin import (
    disable_flight_recorder,
    dump_flight_recorders,
    enable_flight_recorder,
    enable_stats,
    flight_recorder,
)
from commlib.observe.event import CollectiveEvent
from commlib.observe.recorder import FlightRecorder
from commlib.observe.stats import CollectiveStats

__all__ = [
    "CollectiveEvent",
    "CollectiveStats",
    "FlightRecorder",
    "disable_flight_recorder",
    "dump_flight_recorders",
    "enable_flight_recorder",
    "enable_stats",
    "flight_recorder",
]
