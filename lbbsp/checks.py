"""Argument checks shared by lbbsp's classes: a bad value is a ValueError that names it and says what is allowed."""
import math

import numpy as np

__all__ = ["integer", "number", "check_budget"]


def integer(name, value, low=None, high=None, optional=False, what=""):
    """`value` as an int if it is an integer in [low, high] (a bound of None: none; None itself where `optional`);
    `what`: a note on what the value means, added to the error."""
    if optional and value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or \
            (low is not None and value < low) or (high is not None and value > high):
        allowed = f" in [{low}, {high}]" if high is not None else f" >= {low}" if low is not None else ""
        raise ValueError(f"{name}={value!r} is not allowed: it must be an integer{allowed}"
                         f"{', or None' if optional else ''}{what}")
    return int(value)


def number(name, value, low=0.0, high=math.inf, low_open=False, high_open=True, optional=False, what=""):
    """`value` as a float if it is a finite number between `low` and `high` (each bound open or closed; None itself
    where `optional`); `what`: a note on what the value means, added to the error."""
    if optional and value is None:
        return None
    ok = isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool) and \
        math.isfinite(value)
    if not (ok and (value > low if low_open else value >= low) and (value < high if high_open else value <= high)):
        interval = f"{'(' if low_open else '['}{low}, {high}{')' if high_open else ']'}"
        raise ValueError(f"{name}={value!r} is not allowed: it must be a number in {interval}"
                         f"{', or None' if optional else ''}{what}")
    return float(value)


def check_budget(budget, name="forecast_budget"):
    """`budget` (a share of the step's compute time that some per-step work may take) as a float, or None (no
    budget: the work runs at every step)."""
    return number(name, budget, optional=True, what=" (a share of the step's compute time, e.g. 0.01; None: the "
                                                    "work runs at every step)")
