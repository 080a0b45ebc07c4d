"""pytest plugin: ``pytest --commlib-backend NAME`` runs the conformance kit (in progress)."""

from __future__ import annotations


def pytest_addoption(parser):
    group = parser.getgroup("commlib", "commlib backend conformance kit")
    group.addoption(
        "--commlib-backend",
        action="append",
        default=[],
        metavar="NAME",
        help="run commlib's conformance kit against backend NAME (repeatable)",
    )
