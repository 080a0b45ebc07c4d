"""One line of text cut to a width between words, for ``commlib trace`` and the trace files."""

from __future__ import annotations

ELLIPSIS = "..."


def shorten(text: str, limit: int) -> str:
    """``text``'s first line, at most ``limit`` characters, cut between words with ``...``.

    A word longer than half the line (a path, say) is cut inside it, so most
    of the line is still shown.

    Examples:
        >>> shorten("CommError: rank 3 did not arrive in all_reduce #7", 30)
        'CommError: rank 3 did not...'
        >>> shorten("short\\nsecond line", 30)
        'short'
    """
    lines = text.splitlines()
    line = lines[0] if lines else ""
    if len(line) <= limit:
        return line
    room = limit - len(ELLIPSIS)
    cut = line.rfind(" ", 0, room + 1)
    if cut < room // 2:
        cut = room
    return line[:cut].rstrip() + ELLIPSIS
