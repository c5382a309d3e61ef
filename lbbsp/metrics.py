"""Statistics of synchronous steps (numpy only): balanced time, efficiency and straggler level, and the median."""
import math

import numpy as np

__all__ = ["balanced_time", "step_balance", "summarize_steps", "median"]


def median(values):
    """np.median's value of `values` (NaN if one is NaN), at a fraction of its cost on a few numbers."""
    s = np.sort(np.asarray(values, dtype=np.float64).reshape(-1))
    n = s.size
    if n == 0 or math.isnan(s[-1]):
        return math.nan
    return float(s[n // 2]) if n % 2 else float((s[n // 2 - 1] + s[n // 2]) / 2)


def balanced_time(batches, compute):
    """T* = B / sum_i v_i with v_i = b_i / t_i: the compute time of a perfectly balanced step.

    One step (arrays of N): a float; several steps (arrays of shape (steps, N)): one T* per step.
    """
    batches = np.asarray(batches, dtype=np.float64)
    compute = np.asarray(compute, dtype=np.float64)
    ideal = batches.sum(axis=-1) / np.sum(batches / compute, axis=-1)
    return float(ideal) if ideal.ndim == 0 else ideal


def step_balance(batches, compute):
    """(T*, max_i t_i) of one step: its balanced and its actual compute time (NaN where a time is missing)."""
    t = np.asarray(compute, dtype=np.float64)
    if not (np.isfinite(t).all() and (t > 0).all()):
        return math.nan, math.nan
    return balanced_time(batches, t), float(t.max())


def summarize_steps(batches, compute):
    """Epoch-level eta (sum of T* over sum of T) and mean straggler level from per-step arrays of shape (steps, N)."""
    batches = np.atleast_2d(np.asarray(batches, dtype=np.float64))
    compute = np.atleast_2d(np.asarray(compute, dtype=np.float64))
    ok = np.all(np.isfinite(compute) & (compute > 0), axis=1)
    if not ok.any():
        return {"efficiency": float("nan"), "straggler": float("nan")}
    b, t = batches[ok], compute[ok]
    ideal = balanced_time(b, t)
    actual = t.max(axis=1)
    straggler = (t.max(axis=1) - t.min(axis=1)) / t.mean(axis=1)
    return {"efficiency": float(ideal.sum() / actual.sum()), "straggler": float(straggler.mean())}
