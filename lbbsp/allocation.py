"""Integer batch sizes that minimise the slowest worker's predicted step time (numpy only).

`split` solves  minimise max_i t_i(b_i)  subject to  sum_i b_i = B, lower_i <= b_i <= upper_i, b_i on the
grid, for t_i(b) = max(f_i, (k_i + b) / v_i). The optimum T* is the larger of where the capacities
sum_i clip(v_i T - k_i, lower_i, upper_i) reach B (one sort of the breakpoints) and max_i t_i(lower_i);
every worker starts at its capacity at T*, then grid units go to the worker whose time grows least, or come
from the one that finishes last: optimal for separable non-decreasing costs, and of the optimal splits the
most balanced. Ties go to the smaller batch when adding and the larger when taking, so workers tied on
their floors keep equal batches. Deterministic (no BLAS, fixed tie-breaks): every rank computes the same.
"""
import dataclasses

import numpy as np

from .checks import integer

__all__ = ["Bounds", "split", "step_times", "expected_slowest", "default_multiple", "sanitize"]


@dataclasses.dataclass(frozen=True)
class Bounds:
    """Per-worker batch bounds and the batch grid, checked once: `Bounds.of(N, B, b_min, b_max, multiple)`."""

    lower: np.ndarray
    upper: np.ndarray
    multiple: int = 1

    @classmethod
    def of(cls, num_workers, global_batch, b_min=1, b_max=None, multiple=1):
        """Bounds for N workers and global batch B; `b_max` is None (no bound), one integer or one per worker
        (GPUs with different memory). Raises ValueError naming a bad value."""
        num_workers = integer("num_workers", num_workers, 1)
        global_batch = integer("global_batch", global_batch, 1)
        b_min = integer("b_min", b_min, 1)
        multiple = integer("multiple", multiple, 1)
        if b_max is None:
            upper = np.full(num_workers, global_batch, dtype=np.int64)
        else:
            raw = np.atleast_1d(np.asarray(b_max))
            if raw.ndim != 1 or raw.size not in (1, num_workers):
                raise ValueError(f"b_max={b_max!r} is not allowed: give one integer or {num_workers} integers "
                                 "(one per worker)")
            for value in raw.tolist():
                integer("b_max", value, b_min)
            upper = np.broadcast_to(raw.astype(np.int64), (num_workers,)).copy()
        bounds = cls(np.full(num_workers, b_min, dtype=np.int64), upper, multiple)
        bounds.check(global_batch)
        bounds.lower.setflags(write=False)
        bounds.upper.setflags(write=False)
        return bounds

    @property
    def num_workers(self):
        return self.lower.size

    def check(self, total):
        """`total` as an int if the workers can hold it within their bounds; else ValueError."""
        total = integer("global_batch", total, 1)
        if total < int(self.lower.sum()):
            raise ValueError(f"global_batch={total} is not allowed with {self.num_workers} workers and "
                             f"b_min={int(self.lower[0])}: it must be at least num_workers * b_min = "
                             f"{int(self.lower.sum())}")
        if total > int(self.upper.sum()):
            raise ValueError(f"global_batch={total} is not allowed with b_max={self.upper.tolist()}: it must be at "
                             f"most sum(b_max) = {int(self.upper.sum())}")
        return total

    def grid(self, total):
        """(lower, upper, q) in units of q for splitting `total`: the bounds rounded inwards to the grid, or q = 1
        where the grid cannot hold `total` (then any batch size)."""
        q = self.multiple
        lo, hi = -(-self.lower // q), self.upper // q
        if q > 1 and np.all(lo <= hi) and lo.sum() <= total // q <= hi.sum():
            return lo, hi, q
        return self.lower, self.upper, 1


def default_multiple(global_batch, num_workers, gpu=False, largest=8, steps=8):
    """The batch grid when none is given. With `gpu` (some worker trains on a GPU: tensor cores, seconds of set-up
    per shape) the largest power of two q <= `largest` that divides the equal share B / N with B / N >= steps * q
    (equal batches stay on the grid, and a move can be 1 / `steps` of the share); else 1. A CPU's new shape costs a
    fraction of a step, which the policy weighs, and a grid's lowest unit would hold a slow worker above its best."""
    global_batch, num_workers = int(global_batch), int(num_workers)
    if not gpu or num_workers < 1 or global_batch % num_workers:
        return 1
    share, q = global_batch // num_workers, int(largest)
    while q > 1 and (share % q or share < steps * q):
        q //= 2
    return max(q, 1)


def sanitize(values, fallback, positive=True):
    """Finite values (> 0 with `positive`, else >= 0); bad entries become the median of the good ones, or
    `fallback` where none is good."""
    v = np.array(values, dtype=np.float64).reshape(-1)
    good = np.isfinite(v) & ((v > 0) if positive else (v >= 0))
    if not good.all():
        v[~good] = np.median(v[good]) if good.any() else fallback
    return v


def step_times(batches, speeds, offsets, floors):
    """t_i(b_i) = max(f_i, (k_i + b_i) / v_i) for every worker."""
    return np.maximum(floors, (offsets + np.asarray(batches, dtype=np.float64)) / speeds)


def expected_slowest(times, noise):
    """E[max_i t_i exp(s_i z_i)]: the slowest worker's expected time where worker i's time scatters lognormally by s_i,
    on `noise` = exp(s_i z_i) for fixed standard normal rows z (alike on every rank). Balancing brings more workers
    near the slowest, and the noise of each then counts. `times` of several splits (rows): one estimate per split."""
    slowest = np.max(np.asarray(times, dtype=np.float64)[..., None, :] * noise, axis=-1)
    return np.mean(slowest, axis=-1) if slowest.ndim > 1 else float(np.mean(slowest))


def _balance_time(total, lower, upper, k, v):
    """The T where sum_i clip(v_i T - k_i, lower_i, upper_i) = total: worker i adds slope v_i between its breakpoints
    (lower_i + k_i) / v_i and (upper_i + k_i) / v_i; one sort gives every segment's slope and the sum at each."""
    points = np.concatenate([(lower + k) / v, (upper + k) / v])
    order = np.argsort(points, kind="stable")
    points = points[order]
    slope = np.maximum(np.cumsum(np.concatenate([v, -v])[order]), 0.0)  # rounding must not bend the sum down
    filled = np.empty_like(points)
    filled[0] = lower.sum()
    np.cumsum(slope[:-1] * np.diff(points), out=filled[1:])
    filled[1:] += lower.sum()
    j = int(np.searchsorted(filled, total - 1e-9 * max(total, 1.0)))
    if j == 0:
        return float(points[0])
    if j >= points.size:
        return float(points[-1])
    t0, t1, f0, f1 = points[j - 1], points[j], filled[j - 1], filled[j]
    return float(t1 if f1 == f0 else t0 + (total - f0) * (t1 - t0) / (f1 - f0))


def _first(keys, count):
    """Indices of the `count` smallest rows of `keys` (columns: primary key first), in O(n) but for the ties of
    the primary key at the threshold, which are ordered by the other columns."""
    primary = keys[0]
    if count >= primary.size:
        return np.arange(primary.size)
    threshold = np.partition(primary, count - 1)[count - 1]
    below = np.flatnonzero(primary < threshold)
    ties = np.flatnonzero(primary == threshold)
    order = np.lexsort(tuple(key[ties] for key in keys[:0:-1]))
    return np.concatenate([below, ties[order[:count - below.size]]])


def _move(b, count, k, v, f, lo, hi, add):
    """`b` with `count` units added (to argmin t_i(b_i + 1)) or taken (from argmax t_i(b_i)), one at a time.

    First, at once, the units the continuous problem moves (the greedy moves all of them); then the rest. A worker's
    times are monotone in its batch, so greedy equals taking the best of all candidates, the first few per worker.
    """
    total = int(b.sum()) + (count if add else -count)
    if count > b.size:
        if add:  # every unit whose time is strictly below the continuous finish time T
            finish = _balance_time(total, b, hi, k, v)
            below = np.clip(np.ceil(v * finish - k) - 1 - b, 0, hi - b)
            b = b + np.where(f < finish, below, 0).astype(np.int64)
        else:  # every unit the continuous split takes, rounded to keep more
            b = np.clip(np.ceil(v * _balance_time(total, lo, b, k, v) - k), lo, b).astype(np.int64)
        count = abs(total - int(b.sum()))
    room = (hi - b) if add else (b - lo)
    depth = 4
    while count > 0:
        steps = np.arange(1, depth + 1)
        batch = b[:, None] + steps if add else b[:, None] - steps + 1
        times = step_times(batch, v[:, None], k[:, None], f[:, None])
        fits = room[:, None] >= steps
        worker = np.broadcast_to(np.arange(b.size)[:, None], times.shape)[fits]
        times, batch = times[fits], batch[fits]
        # adding: the smallest time, then the smaller batch, then the lower index; taking: the largest time,
        # then the larger batch, then the higher index
        keys = (times, batch, worker) if add else (-times, -batch, -worker)
        chosen = np.bincount(worker[_first(keys, count)], minlength=b.size)
        if chosen.max() < depth or depth >= count:
            return b + chosen if add else b - chosen
        depth *= 4
    return b


def split(total, bounds, speeds, offsets, floors):
    """Integer batches minimising max_i t_i(b_i) with sum(b) = `total`, within `bounds` and on its grid (a remainder
    off the grid is handed out sample by sample). `speeds` > 0, `offsets` >= 0 and `floors` >= 0 must be clean."""
    lo, hi, q = bounds.grid(total)
    units = total // q
    k, v = offsets / q, speeds / q  # the same curves in units of q samples
    finish = max(_balance_time(units, lo, hi, k, v), float(np.max(step_times(lo, v, k, floors))))
    capacity = np.clip(np.floor(v * finish - k + 1e-9), lo, hi).astype(np.int64)
    left = units - int(capacity.sum())
    b = _move(capacity, abs(left), k, v, floors, lo, hi, add=left > 0) if left else capacity
    b = b * q
    rest = total - int(b.sum())
    if rest:
        b = _move(b, rest, offsets, speeds, floors, bounds.lower, bounds.upper, add=True)
    return b
