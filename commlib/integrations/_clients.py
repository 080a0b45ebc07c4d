"""Importing a client library on first use, with the command that installs it."""

from __future__ import annotations

import importlib
from types import ModuleType


def require(module: str, distribution: str, needed_by: str) -> ModuleType:
    """Import ``module`` of the client ``distribution``, or say how to install it.

    Raises ``ImportError`` naming what needed it and the pip command; the
    integration modules call this at the moment a client is used, so that
    importing them costs nothing and needs no client.

    Examples:
        >>> require("json", "json", "this example").__name__
        'json'
        >>> require("no_such_client", "no-such-client", "commlib.integrations.x")
        Traceback (most recent call last):
        ...
        ImportError: commlib.integrations.x needs no-such-client, which is not installed: ...
    """
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ImportError(
            f"{needed_by} needs {distribution}, which is not installed: "
            f"pip install {distribution} (or commlib[integrations]) ({exc})"
        ) from exc
