"""The statistics of a row: repeated trials reduced to a median, a spread and a noise flag.

Every (case, size) runs ``trials`` trials; in each, commlib and torch calls
alternate (see :mod:`commlib.bench.timing`), and a trial's figure for an
implementation is the median of its timed calls, the slowest rank's. From the
per-trial figures:

* **time**: the median over the trials, for commlib and for torch;
* **ratio**: commlib's median over torch's median (below 1: commlib is faster);
* **spread**: the lowest and highest *per-trial* ratio (commlib's figure over
  torch's in the same trial). With ``n`` independent trials, the chance that
  the median per-trial ratio lies outside [lowest, highest] is ``2**(1 - n)``
  (both ends on the same side of it), so with 5 trials the spread is a 94 %
  confidence interval, with no assumption on how the times are distributed;
  the ratio of the medians always lies inside it;
* **noise**: the spread reaches 1.0 from both sides (``lowest <= 1 <= highest``):
  some trials had commlib faster and others torch, so the run cannot tell which
  is faster; the difference is smaller than the spread. A single trial has no
  spread and is never flagged.

Examples:
    >>> s = row_stats([1.0, 1.1, 0.9], [2.0, 2.1, 1.9])
    >>> round(s["ratio"], 3), s["noise"]
    (0.5, False)
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

Row = dict[str, Any]


def median(values: Sequence[float]) -> float:
    """The median of ``values`` (the mean of the middle two for an even count).

    Examples:
        >>> median([3.0, 1.0, 2.0]), median([4.0, 1.0, 2.0, 3.0])
        (2.0, 2.5)
    """
    if not values:
        raise ValueError("median of no values")
    return float(statistics.median(values))


def trial_ratios(commlib: Sequence[float], torch: Sequence[float]) -> list[float]:
    """commlib's time over torch's, trial by trial (both lists in trial order).

    Examples:
        >>> trial_ratios([1.0, 3.0], [2.0, 2.0])
        [0.5, 1.5]
    """
    if len(commlib) != len(torch):
        raise ValueError(f"{len(commlib)} commlib trials but {len(torch)} torch trials")
    return [c / t for c, t in zip(commlib, torch)]


def spread(ratios: Sequence[float]) -> tuple[float, float]:
    """The lowest and the highest per-trial ratio.

    Examples:
        >>> spread([0.9, 1.2, 1.05])
        (0.9, 1.2)
    """
    if not ratios:
        raise ValueError("spread of no trials")
    return min(ratios), max(ratios)


def is_noise(low: float, high: float) -> bool:
    """Whether a spread ``[low, high]`` of per-trial ratios reaches 1.0 from both sides.

    Such a row's trials disagree on which implementation is faster.

    Examples:
        >>> is_noise(0.8, 1.1), is_noise(1.02, 1.3), is_noise(0.5, 0.9)
        (True, False, False)
    """
    return low <= 1.0 <= high and low < high


def confidence(trials: int) -> float:
    """How likely the median per-trial ratio lies within the spread of ``trials`` trials.

    ``1 - 2**(1 - trials)``: the spread misses the median only when every trial
    falls on the same side of it.

    Examples:
        >>> confidence(1), confidence(3), confidence(5)
        (0.0, 0.75, 0.9375)
    """
    return 1.0 - 2.0 ** (1 - trials) if trials > 0 else 0.0


def row_stats(commlib: Sequence[float], torch: Sequence[float]) -> dict[str, Any]:
    """A row's figures from per-trial times (seconds, slowest rank, in trial order).

    Returns ``commlib`` and ``torch`` (median over the trials), ``ratio`` (of the
    medians), ``ratio_low`` / ``ratio_high`` (the spread of the per-trial ratio)
    and ``noise`` (:func:`is_noise`).

    Examples:
        >>> s = row_stats([1.0, 1.2, 0.8, 1.1, 0.9], [1.0, 1.0, 1.0, 1.0, 1.0])
        >>> s["ratio"], s["ratio_low"], s["ratio_high"], s["noise"]
        (1.0, 0.8, 1.2, True)
    """
    ratios = trial_ratios(commlib, torch)
    low, high = spread(ratios)
    c, t = median(commlib), median(torch)
    return {
        "commlib": c,
        "torch": t,
        "ratio": c / t,
        "ratio_low": low,
        "ratio_high": high,
        "noise": is_noise(low, high),
    }


def row_noise(row: Row, prefix: str = "") -> bool:
    """Whether ``row`` is flagged as noise; rows from before trials (no spread) are not.

    ``prefix`` picks another of the row's ratios: ``"unchecked_"`` (unchecked
    against torch) or ``"check_"`` (checked against unchecked), with
    ``--strict both``.

    Examples:
        >>> row_noise({"ratio": 1.1, "ratio_low": 0.9, "ratio_high": 1.3})
        True
        >>> row_noise({"ratio": 1.1})                    # an older JSON file's row
        False
        >>> row_noise({"check_ratio": 1.4, "check_ratio_low": 1.2, "check_ratio_high": 1.5},
        ...           "check_")
        False
    """
    if prefix + "noise" in row:
        return bool(row[prefix + "noise"])
    low, high = prefix + "ratio_low", prefix + "ratio_high"
    if low in row and high in row:
        return is_noise(row[low], row[high])
    return False


def worst(rows: Sequence[Row], *, skip_noise: bool = False, prefix: str = "") -> Row | None:
    """The row with the highest ratio (commlib slowest against torch), or ``None``.

    With ``skip_noise``, rows flagged as noise are left out: the worst row the
    run can vouch for. ``prefix`` picks another ratio (see :func:`row_noise`).

    Examples:
        >>> rows = [
        ...     {"case": "a", "ratio": 1.5, "noise": True},
        ...     {"case": "b", "ratio": 1.2, "noise": False},
        ...     {"case": "c", "ratio": 0.7, "noise": False},
        ... ]
        >>> worst(rows)["case"], worst(rows, skip_noise=True)["case"]
        ('a', 'b')
        >>> worst(rows[:1], skip_noise=True) is None
        True
    """
    candidates = [r for r in rows if not (skip_noise and row_noise(r, prefix))]
    return max(candidates, key=lambda r: r[prefix + "ratio"], default=None)


def spread_width(row: Row, prefix: str = "") -> float | None:
    """How wide ``row``'s spread is, relative to its ratio; ``None`` without one.

    Examples:
        >>> spread_width({"ratio": 0.5, "ratio_low": 0.45, "ratio_high": 0.55})
        0.2
    """
    low, high = prefix + "ratio_low", prefix + "ratio_high"
    if low not in row or high not in row:
        return None
    return round((row[high] - row[low]) / row[prefix + "ratio"], 12)
