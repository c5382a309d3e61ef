"""Batch-size allocation for load-balanced BSP (numpy only, no TensorFlow).

Every rank calls these functions with the same gathered numbers, so every
function here is deterministic: no randomness, ties broken by worker index.
"""
import numpy as np

__all__ = [
    "validate_bounds",
    "sanitize_speeds",
    "proportional_shares",
    "allocate",
    "predicted_step_time",
    "Rebalancer",
    "ROUNDINGS",
]


def _as_int(name, value, minimum):
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"{name}={value!r} is not allowed: it must be an integer >= {minimum}")
    if value < minimum:
        raise ValueError(f"{name}={value!r} is not allowed: it must be an integer >= {minimum}")
    return int(value)


def validate_bounds(num_workers, global_batch, b_min=1, b_max=None):
    """Check (N, B, b_min, b_max) and return (B, b_min, b_max as an int array of length N).

    b_max may be None (no upper bound), an int (same for all) or one value per
    worker (memory differs between GPUs). Raises ValueError naming the value.
    """
    num_workers = _as_int("num_workers", num_workers, 1)
    global_batch = _as_int("global_batch", global_batch, 1)
    b_min = _as_int("b_min", b_min, 1)
    if b_max is None:
        upper = np.full(num_workers, global_batch, dtype=np.int64)
    else:
        raw = np.atleast_1d(np.asarray(b_max))
        if raw.ndim != 1 or raw.size not in (1, num_workers):
            raise ValueError(
                f"b_max={b_max!r} is not allowed: give one integer or {num_workers} integers (one per worker)"
            )
        for value in raw.tolist():
            _as_int("b_max", value, b_min)
        upper = np.broadcast_to(raw.astype(np.int64), (num_workers,)).copy()
    if global_batch < num_workers * b_min:
        raise ValueError(
            f"global_batch={global_batch} is not allowed with {num_workers} workers and b_min={b_min}: "
            f"it must be at least num_workers * b_min = {num_workers * b_min}"
        )
    if global_batch > int(upper.sum()):
        raise ValueError(
            f"global_batch={global_batch} is not allowed with b_max={upper.tolist()}: "
            f"it must be at most sum(b_max) = {int(upper.sum())}"
        )
    return global_batch, b_min, upper


def sanitize_speeds(speeds):
    """Return positive finite speeds: invalid entries (NaN, inf, <= 0) become the median of the valid ones.

    If no entry is valid every worker gets speed 1.0, which yields equal batches.
    """
    v = np.array(speeds, dtype=np.float64).reshape(-1)
    valid = np.isfinite(v) & (v > 0)
    if valid.all():
        return v
    if not valid.any():
        return np.ones_like(v)
    v[~valid] = np.median(v[valid])
    return v


def proportional_shares(weights, total, lower, upper):
    """Real-valued x with sum(x) = total, lower <= x <= upper, x proportional to weights where unclipped.

    Water-filling: workers whose proportional share violates a bound are pinned
    to it and the rest is shared again among the others, until nothing moves.
    """
    w = sanitize_speeds(weights)
    share = total * (w / w.sum())
    if np.all(share >= lower) and np.all(share <= upper):
        return share
    n = w.size
    lower = np.broadcast_to(np.asarray(lower, dtype=np.float64), (n,))
    upper = np.broadcast_to(np.asarray(upper, dtype=np.float64), (n,))
    x = np.zeros(n)
    free = np.ones(n, dtype=bool)
    remaining = float(total)
    for _ in range(n + 1):
        share = np.zeros(n)
        share[free] = remaining * w[free] / w[free].sum()
        over = free & (share > upper)
        under = free & (share < lower)
        if not over.any() and not under.any():
            x[free] = share[free]
            return x
        # Pin the side with the larger total violation first; pinning both at
        # once can overshoot when the bounds are tight.
        if (share[over] - upper[over]).sum() >= (lower[under] - share[under]).sum():
            pinned, values = over, upper
        else:
            pinned, values = under, lower
        x[pinned] = values[pinned]
        remaining -= values[pinned].sum()
        free &= ~pinned
        if not free.any():
            return x
    raise RuntimeError("proportional_shares did not converge")  # unreachable: each pass pins a worker


ROUNDINGS = ("remainder", "time")


def _check_rounding(rounding):
    if rounding not in ROUNDINGS:
        raise ValueError(f"rounding={rounding!r} is not allowed: use one of {ROUNDINGS}")


def _round(x, global_batch, b_min, upper, weights=None):
    """Integer batches from real shares: floor, then hand out what is left one sample at a time.

    Without `weights` the extra samples go by largest remainder; with the
    workers' speeds as `weights` they go where they lengthen the step least
    (smallest (floor + 1) / speed), which minimises the slowest worker's time
    among the allocations within one sample of the shares. Ties go to the
    lower index either way.
    """
    base = np.clip(np.floor(x + 1e-9).astype(np.int64), b_min, upper)
    left = global_batch - int(base.sum())
    if left == 0:
        return base
    if left > 0:
        key = -(x - base) if weights is None else (base + 1) / weights
        order = np.argsort(key, kind="stable")
        order = order[(upper - base)[order] > 0]
    else:
        key = (x - base) if weights is None else -(base - 1) / weights
        order = np.argsort(key, kind="stable")
        order = order[(base - b_min)[order] > 0]
    base[order[:abs(left)]] += 1 if left > 0 else -1
    return base


def allocate(speeds, global_batch, b_min=1, b_max=None, rounding="remainder"):
    """Integer batch sizes b_i proportional to speeds with sum(b) == global_batch and bounds respected.

    Floors the water-filled real shares, then hands the remaining samples out
    by largest remainder (`rounding="remainder"`) or to the workers whose step
    time grows least (`rounding="time"`); ties go to the lower worker index.
    """
    _check_rounding(rounding)
    speeds = np.asarray(speeds, dtype=np.float64).reshape(-1)
    global_batch, b_min, upper = validate_bounds(speeds.size, global_batch, b_min, b_max)
    x = proportional_shares(speeds, global_batch, b_min, upper)
    return _round(x, global_batch, b_min, upper, sanitize_speeds(speeds) if rounding == "time" else None)


def predicted_step_time(batches, speeds):
    """max_i b_i / v_i: the compute time of a synchronous step under the given speeds."""
    v = sanitize_speeds(speeds)
    return float(np.max(np.asarray(batches, dtype=np.float64) / v))


class Rebalancer:
    """Stateful allocation with hysteresis and damping (the semi-dynamic variant).

    A new allocation is adopted only if it shortens the predicted step by more
    than `min_gain` (relative). Each worker's step size halves every time its
    adjustment reverses direction (down to `min_step`) and resets to 1 after a
    move in the same direction, which stops oscillation around the balance
    point under noisy forecasts; when the damped step would not improve the
    step time, the undamped target is taken. Rounding defaults to "time" (the
    allocation with the shortest predicted step among those within one sample
    of the shares): at 1024 simulated workers with 64 samples each, the
    oracle's efficiency is 0.992 with it and 0.944 with largest remainder.
    State depends only on the inputs, so ranks that feed it the same gathered
    speeds stay in lockstep.
    """

    def __init__(self, num_workers, global_batch, b_min=1, b_max=None, min_gain=0.0, min_step=0.125,
                 rounding="time"):
        validate_bounds(num_workers, global_batch, b_min, b_max)
        _check_rounding(rounding)
        self.rounding = rounding
        if not (isinstance(min_gain, (int, float)) and 0.0 <= min_gain < 1.0):
            raise ValueError(f"min_gain={min_gain!r} is not allowed: it must be a number in [0, 1)")
        if not (isinstance(min_step, (int, float)) and 0.0 < min_step <= 1.0):
            raise ValueError(f"min_step={min_step!r} is not allowed: it must be a number in (0, 1]")
        self.num_workers = int(num_workers)
        self.b_min = int(b_min)
        self.b_max = b_max
        self.min_gain = float(min_gain)
        self.min_step = float(min_step)
        self.reset(global_batch)

    def _allocate(self, weights):
        """Allocation for weights that are already positive and finite (sanitized speeds, batches, blends)."""
        return _round(proportional_shares(weights, self.global_batch, self.b_min, self._upper),
                      self.global_batch, self.b_min, self._upper, weights if self.rounding == "time" else None)

    def reset(self, global_batch, batches=None):
        """Start again from equal batches (or `batches`) with undamped steps."""
        self.global_batch, _, self._upper = validate_bounds(self.num_workers, global_batch, self.b_min, self.b_max)
        if batches is None:
            batches = self._allocate(np.ones(self.num_workers))
        self.batches = np.asarray(batches, dtype=np.int64).copy()
        self._step = np.ones(self.num_workers)
        self._last_dir = np.zeros(self.num_workers, dtype=np.int64)

    def update(self, speeds, global_batch=None):
        """Return the batch sizes for the next step given predicted speeds (and that step's global batch)."""
        if global_batch is not None and int(global_batch) != int(self.batches.sum()):
            # The global batch changes (end of epoch): rescale the current shares, no hysteresis.
            self.global_batch, _, self._upper = validate_bounds(self.num_workers, global_batch, self.b_min,
                                                                self.b_max)
            self.batches = self._allocate(self.batches.astype(np.float64))
        speeds = sanitize_speeds(speeds)
        target = self._allocate(speeds)
        if np.array_equal(target, self.batches):
            return self.batches.copy()  # balanced already: the common case in steady state
        now = predicted_step_time(self.batches, speeds)
        best = predicted_step_time(target, speeds)
        if now <= 0 or (now - best) / now <= self.min_gain:
            return self.batches.copy()
        delta = (target - self.batches).astype(np.float64)
        direction = np.sign(delta).astype(np.int64)
        reversed_ = (direction != 0) & (self._last_dir != 0) & (direction != self._last_dir)
        same = (direction != 0) & ~reversed_
        self._step[reversed_] = np.maximum(self._step[reversed_] / 2.0, self.min_step)
        self._step[same] = 1.0
        blended = self.batches + self._step * delta
        proposal = self._allocate(blended)
        if predicted_step_time(proposal, speeds) >= now:
            # Damped steps too small to move a whole sample: take the (better) target undamped.
            proposal = target
            self._step[:] = 1.0
        moved = np.sign(proposal - self.batches).astype(np.int64)
        self._last_dir = np.where(moved != 0, moved, self._last_dir)
        self.batches = proposal
        return self.batches.copy()
