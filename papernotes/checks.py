"""Argument checks that every module shares.

A hyper-parameter of the wrong type is a TypeError and one outside its range a ValueError, each
naming the argument and what it allows, so that bad input fails where it enters: never a silent
clamp, a NaN further on, or a hang.
"""

from __future__ import annotations

import math
import numbers


def integer(name: str, value, low: int = 1) -> int:
    """`value` as an int, if it is an integer (not a bool) of at least `low`."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an integer; got {type(value).__name__}")
    if value < low:
        raise ValueError(f"{name} must be an integer >= {low}; got {value}")
    return int(value)


def number(
    name: str,
    value,
    low: float = -math.inf,
    high: float = math.inf,
    *,
    low_open: bool = False,
    high_open: bool = False,
) -> float:
    """`value` as a float, if it is a finite real number (not a bool) in the interval from
    `low` to `high`, each end closed unless `low_open` / `high_open`."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a number; got {type(value).__name__}")
    value = float(value)
    below = value <= low if low_open else value < low
    above = value >= high if high_open else value > high
    if not math.isfinite(value) or below or above:
        interval = f"{'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"
        interval = interval.replace("[-inf", "(-inf").replace("inf]", "inf)")
        raise ValueError(f"{name} must be a finite number in {interval}; got {value:g}")
    return value
