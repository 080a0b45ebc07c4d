"""The built-in observers, switched on by environment variables or by a call.

``COMMLIB_TRACE_DIR=<dir>`` registers the flight recorder (writing into
``dir``; ``COMMLIB_TRACE_CAPACITY`` collectives kept, 2000 by default);
``COMMLIB_STATS=1`` (or ``=<dir>``) registers the statistics observer. The
plugin manager calls :func:`register_from_env` when it starts, so they are
registered exactly as third-party observers are.
"""

from __future__ import annotations

import atexit
import os
import warnings
from pathlib import Path
from typing import Any

from commlib import _manager
from commlib.observe.alarm import Alarm
from commlib.observe.recorder import DEFAULT_CAPACITY, FlightRecorder
from commlib.observe.stats import CollectiveStats

TRACE_DIR_ENV = "COMMLIB_TRACE_DIR"
TRACE_CAPACITY_ENV = "COMMLIB_TRACE_CAPACITY"
STATS_ENV = "COMMLIB_STATS"
RECORDER_NAME = "commlib.flight_recorder"
STATS_NAME = "commlib.stats"

#: where the program was at ``import commlib``: a relative trace directory is from here
_STARTED_IN = os.getcwd()

_recorder: FlightRecorder | None = None
_alarm: Alarm | None = None
_stats: CollectiveStats | None = None


_env_registered_at_start = 0  # the manager start whose environment was read


def started_manager() -> Any:
    """The plugin manager, with the built-in observers the environment asks for registered.

    The environment (``COMMLIB_TRACE_DIR``, ``COMMLIB_STATS``) is read once per
    manager start: the manager itself knows nothing of observers.

    Examples:
        >>> started_manager().get_plugin("gloo") is not None
        True
    """
    global _env_registered_at_start
    pm = _manager.plugin_manager()
    with _manager.lock:
        if _env_registered_at_start != _manager.registrations.starts:
            _env_registered_at_start = _manager.registrations.starts
            register_from_env(pm)
    return pm


def _manager_of(pm: Any) -> Any:
    return started_manager() if pm is None else pm


def _register(pm: Any, plugin: Any, name: str) -> None:
    if pm.get_plugin(name) is None and not pm.is_registered(plugin):
        pm.register(plugin, name=name)


def _capacity_from_env() -> int:
    text = os.environ.get(TRACE_CAPACITY_ENV)
    if not text:
        return DEFAULT_CAPACITY
    try:
        capacity = int(text)
    except ValueError:
        capacity = 0
    if capacity < 1:
        # observing must never stop the job: the default, and say so once
        warnings.warn(
            f"{TRACE_CAPACITY_ENV}={text!r} is not a positive whole number: the flight "
            f"recorder keeps the last {DEFAULT_CAPACITY} collectives",
            stacklevel=2,
        )
        return DEFAULT_CAPACITY
    return capacity


def enable_flight_recorder(
    directory: str | os.PathLike[str] | None = None,
    *,
    capacity: int | None = None,
    pm: Any = None,
) -> FlightRecorder:
    """Register this process's flight recorder (once) and return it.

    With a ``directory`` it also writes there: when a collective fails here or
    on another rank, on ``SIGUSR1`` and at exit (:mod:`commlib.observe.alarm`).
    ``COMMLIB_TRACE_DIR`` does the same at start-up.

    Args:
        directory: where each rank writes its file.
        capacity: collectives kept (``COMMLIB_TRACE_CAPACITY``, else 2000).
        pm: the plugin manager (commlib's by default).

    Examples:
        >>> from commlib.observe import enable_flight_recorder, disable_flight_recorder
        >>> recorder = enable_flight_recorder()
        >>> comm.barrier()
        >>> recorder.snapshot()["entries"][-1]["name"]
        'barrier'
        >>> disable_flight_recorder()
    """
    global _recorder, _alarm
    if capacity is None:
        capacity = _capacity_from_env()
    if _recorder is None:
        _recorder = FlightRecorder(capacity, directory)
    elif directory is not None:
        _recorder.directory = Path(directory).absolute()
    if _recorder.directory is not None and _alarm is None:
        _alarm = Alarm(_recorder)
        _alarm.arm()
    _register(_manager_of(pm), _recorder, RECORDER_NAME)
    return _recorder


def disable_flight_recorder(pm: Any = None) -> None:
    """Unregister the flight recorder (its records are kept until it is enabled again).

    Examples:
        >>> from commlib.observe import disable_flight_recorder
        >>> disable_flight_recorder()
    """
    manager = _manager_of(pm)
    if _recorder is not None and manager.is_registered(_recorder):
        manager.unregister(_recorder)


def flight_recorder() -> FlightRecorder | None:
    """The flight recorder, if it was ever enabled.

    Examples:
        >>> from commlib.observe import flight_recorder
        >>> flight_recorder() is None or flight_recorder().capacity > 0
        True
    """
    return _recorder


def dump_flight_recorders(reason: str = "asked", *, all_ranks: bool = True) -> Path | None:
    """Write this rank's flight recorder now, and ask every other rank to do the same.

    Returns this rank's file (``None`` without a trace directory).

    Examples:
        >>> from commlib.observe import dump_flight_recorders
        >>> dump_flight_recorders("before the evaluation")  # doctest: +SKIP
        PosixPath('/tmp/trace/commlib_trace_rank0.json')
    """
    if _recorder is None:
        return None
    written = _recorder.dump(reason)
    if all_ranks and _alarm is not None:
        _alarm.ask_others(reason, wait=False)
    return written


def enable_stats(destination: str | None = "1", *, pm: Any = None) -> CollectiveStats:
    """Register the statistics observer (once); report it at exit unless ``destination`` is None.

    ``destination`` as for ``COMMLIB_STATS``: ``"1"`` prints to stderr, a
    directory gets one JSON file per rank.

    Examples:
        >>> from commlib.observe import enable_stats
        >>> from commlib.plugins import plugin_manager
        >>> stats = enable_stats(None)
        >>> comm.all_reduce(torch.ones(1))
        >>> [name for rows in stats.as_dict().values() for name in rows]
        ['all_reduce']
        >>> _ = plugin_manager().unregister(stats)
    """
    global _stats
    if _stats is None:
        _stats = CollectiveStats()
        if destination:
            atexit.register(_report_stats, _stats, destination)
    _register(_manager_of(pm), _stats, STATS_NAME)
    return _stats


def _report_stats(stats: CollectiveStats, destination: str) -> None:
    try:
        stats.report(destination)
    except OSError as exc:
        print(f"commlib could not write its statistics: {exc}")


def register_from_env(pm: Any) -> None:
    """Register the built-in observers the environment asks for into ``pm``.

    Examples:
        >>> from commlib.plugins import plugin_manager
        >>> register_from_env(plugin_manager())   # nothing set: nothing registered
    """
    directory = os.environ.get(TRACE_DIR_ENV)
    if directory:
        # relative to where the program started: commlib is looked at lazily, and a
        # program may change directory before its first collective (hydra does)
        enable_flight_recorder(os.path.join(_STARTED_IN, directory), pm=pm)
    stats = os.environ.get(STATS_ENV)
    if stats and stats.lower() not in ("0", "false", "no", "off"):
        enable_stats(stats, pm=pm)
