"""A third-party commlib observer used by the tests: it keeps what it is told."""

from commlib import hookimpl

#: ("start" | "end", collective, sequence number, communicator, details or state)
seen = []


@hookimpl
def commlib_collective_start(event):
    seen.append(("start", event.name, event.seq, event.group, event.describe()))


@hookimpl
def commlib_collective_end(event):
    seen.append(("end", event.name, event.seq, event.group, event.state))
