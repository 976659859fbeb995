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


def one_of(name: str, value, options):
    """`value`, if it is one of `options`; else a ValueError listing them."""
    options = tuple(options)
    if value not in options:
        allowed = ", ".join(repr(o) for o in options)
        raise ValueError(f"{name} must be one of {allowed}; got {value!r}")
    return value


def tensor(name: str, value, shape: str, *, dtype=None, **sizes) -> dict[str, int]:
    """Check that `value` is a tensor of the shape written as "(B, T, D)"; return the sizes.

    A letter names a dimension of any size (a letter used twice must have one size), a number
    fixes it, and keyword arguments fix letters (`checks.tensor("x", x, "(B, T, D)", D=8)`).
    `dtype`, when given, is a torch dtype or a tuple of them (or "floating").
    """
    import torch

    dims = [d.strip() for d in shape.strip("() ").split(",") if d.strip()]
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name} must be a tensor of shape {shape}; got {type(value).__name__}")
    if value.dim() != len(dims):
        raise ValueError(f"{name} must have shape {shape}; got {tuple(value.shape)}")
    found = dict(sizes)
    for dim, size in zip(dims, value.shape, strict=True):
        expected = int(dim) if dim.isdigit() else found.setdefault(dim, size)
        if size != expected:
            raise ValueError(
                f"{name} must have shape {shape}"
                + (f" with {dim} = {expected}" if not dim.isdigit() else "")
                + f"; got {tuple(value.shape)}"
            )
    if dtype == "floating" and not value.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor; got {value.dtype}")
    if dtype not in (None, "floating"):
        allowed = dtype if isinstance(dtype, tuple) else (dtype,)
        if value.dtype not in allowed:
            names = " or ".join(str(d) for d in allowed)
            raise TypeError(f"{name} must be a {names} tensor; got {value.dtype}")
    return {d: s for d, s in found.items() if not d.isdigit()}


def boolean(name: str, value) -> bool:
    """`value`, if it is a bool (or a NumPy bool); 1 and 0 are not flags and are refused."""
    import numpy as np

    if not isinstance(value, bool | np.bool_):
        raise TypeError(f"{name} must be True or False; got {value!r}")
    return bool(value)
