"""commlib's pytest entry point: the options and the marker, without importing commlib or torch.

pytest loads every ``pytest11`` plugin of the environment in every session, so
this module is deliberately tiny: it only registers ``--commlib-backend`` and
its companions. The conformance kit (``commlib.testing.pytest_plugin``, which
imports torch) is loaded only when ``--commlib-backend`` is given, so unrelated
projects that share an environment with commlib do not pay for torch. With
``--commlib-backend`` and no paths on the command line, the kit runs alone:
the project's own tests (``testpaths``, the current directory) are not collected.

Examples:
    $ pytest --commlib-backend gloo
    $ pytest --commlib-backend mybackend --commlib-world-sizes 1,2 -m commlib_conformance
    $ pytest --commlib-backend hccl --commlib-setup commlib.testing.simulated:setup_hccl
"""

from __future__ import annotations

import importlib
from typing import Any

MARKER = "commlib_conformance"
KIT_PLUGIN = "commlib.testing.pytest_plugin"


def pytest_addoption(parser: Any) -> None:
    """Register the ``--commlib-*`` options (pytest calls this once per session).

    Examples:
        >>> class Parser:  # a stand-in for pytest's, printing what is registered
        ...     def getgroup(self, name, description=""):
        ...         return self
        ...     def addoption(self, name, **kwargs):
        ...         print(name)
        >>> pytest_addoption(Parser())
        --commlib-backend
        --commlib-world-sizes
        --commlib-setup
        --commlib-timeout
    """
    group = parser.getgroup("commlib", "commlib backend conformance kit")
    group.addoption(
        "--commlib-backend",
        action="append",
        default=[],
        metavar="NAME",
        help="run commlib's conformance kit against backend NAME (repeatable)",
    )
    group.addoption(
        "--commlib-world-sizes",
        default="1,2,3",
        metavar="N,N,...",
        help="world sizes the kit runs at (default 1,2,3)",
    )
    group.addoption(
        "--commlib-setup",
        default=None,
        metavar="MODULE:FUNCTION",
        help="setup(rank, size) run in every rank first, e.g. "
        "commlib.testing.simulated:setup_nccl",
    )
    group.addoption(
        "--commlib-timeout",
        type=float,
        default=60.0,
        metavar="SECONDS",
        help="how long one check may take on all ranks (default 60)",
    )


def pytest_configure(config: Any) -> None:
    """Declare the marker; load the conformance kit only if a backend was asked for.

    The marker is declared either way so that ``-m commlib_conformance`` under
    ``--strict-markers`` is not an error in a session without the kit.

    Examples:
        >>> class Config:  # a stand-in: no backend asked for, so nothing is imported
        ...     lines = []
        ...     def addinivalue_line(self, name, line):
        ...         self.lines.append((name, line))
        ...     def getoption(self, name):
        ...         return []
        >>> config = Config()
        >>> pytest_configure(config)
        >>> config.lines[0][1].startswith("commlib_conformance:")
        True
    """
    config.addinivalue_line("markers", f"{MARKER}: a commlib backend conformance check")
    if config.getoption("commlib_backend") and not config.pluginmanager.has_plugin(KIT_PLUGIN):
        # registered late on purpose: pytest replays the historic hooks for it and
        # calls its collection hooks as usual; it declares no options of its own,
        # as pytest_addoption would be replayed too and clash with the ones above
        config.pluginmanager.register(importlib.import_module(KIT_PLUGIN), KIT_PLUGIN)


def pytest_ignore_collect(collection_path: Any, config: Any) -> bool | None:
    """With ``--commlib-backend`` and no paths on the command line, collect the kit alone.

    Typed in a project's checkout, ``pytest --commlib-backend NAME`` would
    otherwise collect the project's own tests too (its ``testpaths``, or the
    current directory). Paths given on the command line are collected as
    usual, beside the kit.

    Examples:
        >>> class Config:  # a stand-in: no backend asked for, so pytest decides
        ...     def getoption(self, name):
        ...         return []
        >>> pytest_ignore_collect("tests", Config()) is None
        True
    """
    if not config.getoption("commlib_backend"):
        return None
    source = getattr(config, "args_source", None)  # pytest >= 7.2
    if source is not None and source.name == "ARGS":
        return None  # the user named what to collect
    return True
