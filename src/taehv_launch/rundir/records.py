"""The values a run directory's JSON records hold, checked as their readers read them: a field of
another type than its writer's (a hand edit, a damaged file) reads as unknown (None), never raises."""

from __future__ import annotations

import math
from typing import Any

LATEST_TIME = 1e10  # seconds since the epoch (year 2286): a later "time" is no clock's reading
LONGEST_S = 1e9  # seconds (about 30 years): a longer ETA or age is no estimate


def number(value: Any, most: float = math.inf) -> float | None:
    """A finite number from 0 to `most` (a JSON number: not a bool, a string, NaN or Infinity), else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) and 0 <= value <= most else None


def count(value: Any) -> int | None:
    """A whole number 0 or more (not a bool), else None."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def timestamp(value: Any) -> float | None:
    """Seconds since the epoch that a clock could show, else None."""
    return number(value, LATEST_TIME)
