"""commlib-traced: a commlib backend that records every collective it serves.

Examples:
    >>> import commlib as dist, commlib_traced
    >>> dist.init_dist("pytorch", backend="traced")
    >>> dist.all_reduce(torch.ones(1024))
    >>> commlib_traced.summary()["all_reduce"]["bytes"]
    4096
"""

from __future__ import annotations

from commlib import hookimpl
from commlib_traced.backend import TracedBackend
from commlib_traced.trace import Event, events, format_summary, reset, summary

__all__ = ["Event", "TracedBackend", "events", "format_summary", "reset", "summary"]
__version__ = "0.1.0"


@hookimpl
def commlib_backends():
    """The backends this distribution adds to commlib (its entry point's hook)."""
    return [TracedBackend]
