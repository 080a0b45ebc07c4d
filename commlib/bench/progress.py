"""A one-line progress bar on stderr, redrawn in place; silent when not a terminal."""

from __future__ import annotations

import sys
import time
from typing import TextIO


class Progress:
    """``[#####.....] 12/40  all_gather 4M  0:07`` on one line of ``stream``.

    Drawn only when ``enabled`` and ``stream`` is a terminal, so logs and
    pipes get no carriage-return noise.

    Examples:
        >>> bar = Progress(3)
        >>> for label in ("a", "b", "c"):
        ...     bar.step(label)
        >>> bar.close()
    """

    def __init__(
        self, total: int, enabled: bool = True, stream: TextIO | None = None, width: int = 24
    ):
        self.stream = stream or sys.stderr
        self.total, self.width, self.done = max(1, total), width, 0
        self.enabled = enabled and getattr(self.stream, "isatty", lambda: False)()
        self.start = time.monotonic()
        self._drawn = 0

    def step(self, label: str) -> None:
        """Show that work on ``label`` begins (``done`` counts the finished steps)."""
        if self.enabled:
            self._draw(label)
        self.done += 1

    def _draw(self, label: str) -> None:
        filled = self.width * self.done // self.total
        secs = int(time.monotonic() - self.start)
        line = (
            f"[{'#' * filled}{'.' * (self.width - filled)}] {self.done}/{self.total}  "
            f"{label}  {secs // 60}:{secs % 60:02d}"
        )
        # pad over a longer previous line instead of relying on terminal escapes
        self.stream.write("\r" + line.ljust(self._drawn))
        self.stream.flush()
        self._drawn = len(line)

    def close(self) -> None:
        """Erase the bar, leaving the line clean for the table."""
        if self.enabled and self._drawn:
            self.stream.write("\r" + " " * self._drawn + "\r")
            self.stream.flush()
        self._drawn = 0
