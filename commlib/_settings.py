"""Settings read from the environment, and the one way timeouts are spelled.

``COMMLIB_TIMEOUT`` (seconds) replaces the default timeout of 30 minutes;
``COMMLIB_STRICT=1`` turns on strict mode for communicators that do not say,
``COMMLIB_STRICT=0`` turns every argument check off (hot loops).
"""

from __future__ import annotations

import datetime
import os

# as torch.distributed's own default
DEFAULT_TIMEOUT = datetime.timedelta(minutes=30)


def as_timedelta(value: datetime.timedelta | float | None) -> datetime.timedelta | None:
    """Seconds (or a timedelta, or None) as a timedelta.

    Examples:
        >>> as_timedelta(1.5)
        datetime.timedelta(seconds=1, microseconds=500000)
        >>> as_timedelta(0)
        Traceback (most recent call last):
        ...
        ValueError: timeout must be a positive number of seconds, got 0
    """
    if value is None or isinstance(value, datetime.timedelta):
        return value
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not 0 < value <= _LONGEST  # NaN fails this too
    ):
        raise ValueError(f"timeout must be a positive number of seconds, got {value!r}")
    return datetime.timedelta(seconds=value)


# what timedelta can hold (inf, 1e300 overflow it)
_LONGEST = datetime.timedelta.max.total_seconds()


def default_timeout() -> datetime.timedelta:
    """The timeout of a communicator that names none: ``COMMLIB_TIMEOUT`` or 30 minutes.

    Examples:
        >>> default_timeout()
        datetime.timedelta(seconds=1800)
    """
    env = os.environ.get("COMMLIB_TIMEOUT")
    if not env:
        return DEFAULT_TIMEOUT
    try:
        seconds = float(env)
    except ValueError:
        raise ValueError(f"COMMLIB_TIMEOUT must be a number of seconds, got {env!r}") from None
    return as_timedelta(seconds) or DEFAULT_TIMEOUT


def strict_from_env() -> bool | None:
    """``COMMLIB_STRICT``: ``True`` (strict mode), ``False`` (no checks) or ``None`` (unset).

    Examples:
        >>> strict_from_env() is None     # unset: each backend's default
        True
    """
    value = os.environ.get("COMMLIB_STRICT", "").strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    if value:
        raise ValueError(f"COMMLIB_STRICT must be 1 or 0, got {value!r}")
    return None
