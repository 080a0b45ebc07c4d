"""The bandwidth formulas ``commlib bench`` reports with, kept in :mod:`commlib.bandwidth`.

The statistics observer (``COMMLIB_STATS``) reports with the same ones.
"""

from __future__ import annotations

from commlib.bandwidth import (
    BUSBW_FACTORS,
    FACTOR_TEXT,
    algbw,
    busbw,
    busbw_factor,
    factor_text,
)

__all__ = ["BUSBW_FACTORS", "FACTOR_TEXT", "algbw", "busbw", "busbw_factor", "factor_text"]
