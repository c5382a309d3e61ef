"""Integer batch sizes that minimise the slowest worker's predicted step time (numpy only).

Worker i's compute time for a batch of b samples is modelled as affine,

    t_i(b) = (k_i + b) / v_i

with v_i its batch-free speed (samples/s) and k_i >= 0 its fixed per-step cost
expressed in samples (k_i / v_i seconds: kernel launches, Python and Keras
work). `allocate` solves

    minimise max_i t_i(b_i)   subject to  sum_i b_i = B,  b_min <= b_i <= b_max_i,  b_i integer.

Continuous part: with every worker unclipped, all finish at
T = (B + sum k_i) / sum v_i and b_i = v_i T - k_i; bounds are handled
exactly by sweeping T over the breakpoints where workers hit a bound.
Integer part: floors of the continuous split, then each remaining sample to
the worker whose time grows least, argmin_i t_i(b_i + 1): this greedy is
optimal for the min-max of separable non-decreasing costs. With k = 0 the
split is proportional to v (the original LB-BSP rule).

Batch grid: with `multiple` = q > 1 every batch is a multiple of q (the same
problem solved in units of q samples; a remainder B mod q goes out sample by
sample as above). A batch shape a worker has never run costs a one-off setup:
oneDNN primitives on CPU (3-6 ms per new shape on the conv workload),
cuDNN autotuning or an XLA compile on GPUs. A grid bounds the number of
shapes a run ever sees to B / q + 1 per worker; on GPUs, multiples of 8 also
suit tensor cores.

Every rank calls this with the same gathered numbers, so everything here is
deterministic: no randomness, ties go to the lower worker index.
"""
import numpy as np

__all__ = ["validate_bounds", "sanitize", "allocate", "allocate_clean", "continuous_split", "predicted_time",
           "dithered", "tail_speeds", "shrink_to_current", "default_multiple", "grid_units", "finer_grid",
           "Rebalancer"]


def _as_int(name, value, minimum):
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"{name}={value!r} is not allowed: it must be an integer >= {minimum}")
    return int(value)


def validate_bounds(num_workers, global_batch, b_min=1, b_max=None, multiple=1):
    """Check (N, B, b_min, b_max, multiple) and return (B, b_min, b_max as an int array of length N).

    b_max may be None (no upper bound), an int (same for all) or one value per
    worker (memory differs between GPUs). `multiple` (the batch grid) must be
    an integer >= 1. Raises ValueError naming the value.
    """
    num_workers = _as_int("num_workers", num_workers, 1)
    global_batch = _as_int("global_batch", global_batch, 1)
    b_min = _as_int("b_min", b_min, 1)
    _as_int("multiple", multiple, 1)
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


def default_multiple(global_batch, num_workers, largest=8, steps=8):
    """The batch grid to use when none is given: the largest power of two q <= `largest` that divides the
    equal share B / N and leaves it at least `steps` grid steps (B / N >= steps * q); 1 otherwise.

    Equal batches then stay on the grid (exactly B / N each), and a worker's batch can still move in
    steps of at most 1 / `steps` of its equal share; B = 256 gives q = 8 for 2 or 4 workers and q = 1
    for 3 (256 is not a multiple of 3), B = 24 gives q = 1 for 2 workers (a share of 12).
    """
    global_batch, num_workers = int(global_batch), int(num_workers)
    if num_workers < 1 or global_batch % num_workers:
        return 1
    share, q = global_batch // num_workers, int(largest)
    while q > 1 and (share % q or share < steps * q):
        q //= 2
    return max(q, 1)


def sanitize(values, fallback=None, positive=True):
    """Finite values (> 0 with `positive`, else >= 0); bad entries become the median of the good ones.

    With no good entry at all, every entry becomes `fallback` (default 1.0 for
    speeds, 0.0 for offsets), so equal speeds yield equal batches.
    """
    v = np.array(values, dtype=np.float64).reshape(-1)
    good = np.isfinite(v) & ((v > 0) if positive else (v >= 0))
    if good.all():
        return v
    if not good.any():
        v[:] = (1.0 if positive else 0.0) if fallback is None else fallback
        return v
    v[~good] = np.median(v[good])
    return v


#: Newton steps `_clipped_split` takes before it sorts the breakpoints instead.
_NEWTON_STEPS = 8


def _filled_at_breakpoints(lo_bp, hi_bp, v, base):
    """Sorted breakpoints T_j and f(T_j) = sum_i clip(v_i T_j - k_i, lower_i, upper_i), by one sort (O(N log N)).

    Worker i adds slope v_i to f between its breakpoints lo_bp_i (leaves its lower bound) and hi_bp_i
    (reaches its upper bound), so f is piecewise linear: the running sum of those slope changes gives
    the slope of every segment, and f at each breakpoint is `base` (= sum of the lower bounds, f at the
    first breakpoint) plus the areas of the segments before it.
    """
    points = np.concatenate([lo_bp, hi_bp])
    order = np.argsort(points, kind="stable")
    points = points[order]
    slope = np.maximum(np.cumsum(np.concatenate([v, -v])[order]), 0.0)  # clipped: rounding must not bend f down
    f = np.empty_like(points)
    f[0] = base
    np.cumsum(slope[:-1] * np.diff(points), out=f[1:])
    f[1:] += base
    return points, f


def continuous_split(offsets, speeds, total, lower, upper):
    """Real b with sum(b) = total, lower <= b <= upper, minimising max_i (k_i + b_i) / v_i.

    Returns (b, T) with T the common finish time of the unclipped workers.
    `speeds` may hold several rows, each split on its own (b and T then
    have a row each): the candidates of one decision in one call.
    """
    k, v = offsets, speeds
    T = (total + k.sum()) / v.sum(axis=-1, keepdims=True)
    b = v * T - k
    inside = ((b >= lower) & (b <= upper)).all(axis=-1)
    if v.ndim == 1:
        return (b, float(T[0])) if inside else _clipped_split(k, v, total, lower, upper, T[0])
    T = T[:, 0]
    for row in np.flatnonzero(~inside):
        b[row], T[row] = _clipped_split(k, v[row], total, lower, upper, T[row])
    return b, T


def _clipped_split(k, v, total, lower, upper, T):
    """`continuous_split` of one row where some worker is held at a bound; `T` the unbounded finish time."""
    # f(T) = sum_i clip(v_i T - k_i, lower_i, upper_i) is piecewise linear and non-decreasing. Newton's
    # method on it: the workers held at a bound at the current T fix their batch, the rest share what
    # is left at one finish time. Where that new T holds the same workers at the same bounds, it solves
    # f(T) = total exactly; it usually does after one step (a few O(N) passes, no sort).
    held_lo = held_hi = None
    for _ in range(_NEWTON_STEPS):
        b = v * T - k
        lo, hi = b < lower, b > upper
        if held_lo is not None and (lo == held_lo).all() and (hi == held_hi).all():
            return b.clip(lower, upper), float(T)
        free = ~(lo | hi)
        slope = (v * free).sum()  # numpy's own sums, not BLAS: the same bits on every rank's CPU
        if not slope > 0:
            break
        held_lo, held_hi = lo, hi
        T = (total - (lower * lo).sum() - (upper * hi).sum() + (k * free).sum()) / slope
    # Newton may cycle where f bends both ways (workers at both bounds) or rounding sits on a bound:
    # then find T among the sorted breakpoints where a worker leaves or reaches a bound.
    cand, f = _filled_at_breakpoints((lower + k) / v, (upper + k) / v, v, float(lower.sum()))
    j = int(np.searchsorted(f, total - 1e-9 * max(total, 1.0)))
    if j >= cand.size:
        return upper.astype(np.float64), float(cand[-1])
    if j == 0:
        return lower.astype(np.float64), float(cand[0])
    t0, t1, f0, f1 = cand[j - 1], cand[j], f[j - 1], f[j]
    T = t1 if f1 == f0 else t0 + (total - f0) * (t1 - t0) / (f1 - f0)
    return (v * T - k).clip(lower, upper), float(T)


def _round(x, total, k, v, lower, upper):
    """Floors of `x`, then each remaining sample to argmin_i (k_i + b_i + 1) / v_i (ties: lower index)."""
    base = np.floor(x + 1e-9).astype(np.int64).clip(lower, upper)
    left = int(total - base.sum())
    if left <= 0:
        return base
    # The greedy takes the `left` smallest of all candidate finish times (k_i + base_i + m) / v_i,
    # m = 1, 2, ...; per worker these increase, so a few candidates per worker suffice unless one
    # worker takes them all, in which case more are generated.
    depth, start, room = 4, k + base, upper - base
    while True:
        times = (start[:, None] + np.arange(1.0, depth + 1.0)) / v[:, None]
        if (room >= depth).all():  # the usual case: no mask to apply (it costs as much as the rest)
            t, w = times.reshape(-1), np.repeat(np.arange(base.size), depth)
        else:
            fits = room[:, None] >= np.arange(1, depth + 1)
            t, w = times[fits], np.broadcast_to(np.arange(base.size)[:, None], times.shape)[fits]
        chosen = np.bincount(w[_smallest(t, w, left)], minlength=base.size)
        if chosen.max() < depth or depth >= left:
            return base + chosen
        depth *= 4


def _smallest(t, w, count):
    """Indices of the `count` smallest `t`, ties to the lower `w`: the first `count` of lexsort((w, t)), in
    O(n) (a partition and a sort of the ties only) instead of O(n log n); `t` is distinct within each `w`."""
    if count >= t.size:
        return np.arange(t.size)
    threshold = np.partition(t, count - 1)[count - 1]
    below = (t < threshold).nonzero()[0]
    ties = (t == threshold).nonzero()[0]
    return np.concatenate([below, ties[np.argsort(w[ties], kind="stable")[:count - below.size]]])


def allocate(speeds, global_batch, b_min=1, b_max=None, offsets=None, near=None, max_change=2.0, multiple=1):
    """Integer batch sizes minimising max_i (k_i + b_i) / v_i with sum(b) == global_batch, bounds kept.

    `speeds` are batch-free speeds v_i; `offsets` the fixed costs k_i in
    samples (default 0: the split is then proportional to the speeds). Bad
    speeds (NaN, inf, <= 0) and offsets (NaN, inf, < 0) are replaced by the
    median of the good ones. With `near` (a current split of the same total)
    every worker's batch stays within [near_i / max_change, near_i * max_change + 1]:
    a trust region, because a step-time model fitted on nearby batch sizes
    must not be extrapolated far (an overestimated fixed cost would otherwise
    send a throttled worker many times its batch in one move). With
    `multiple` > 1 every batch is a multiple of it (the module's batch grid)
    where the bounds and the total allow; a total that is not a multiple
    hands its remainder out sample by sample.
    """
    v = sanitize(speeds)
    global_batch, b_min, upper = validate_bounds(v.size, global_batch, b_min, b_max, multiple)
    k = np.zeros_like(v) if offsets is None else sanitize(offsets, positive=False)
    if k.shape != v.shape:
        raise ValueError(f"offsets={np.asarray(offsets).tolist()!r} is not allowed: give {v.size} values")
    return allocate_clean(v, k, global_batch, np.full(v.size, b_min, dtype=np.int64), upper, near, max_change,
                          int(multiple))


def dithered(batches, unknown, sign, fraction, lower, upper, multiple=1):
    """`batches` with a zero-sum move that makes the fixed costs of the `unknown` workers identifiable.

    The unknown workers are taken in pairs (in index order; with an odd count
    the worker with the largest batch among the others, or among the unknown
    if there is no other, completes the last pair): within a pair the first
    gains and the second loses `fraction` of the smaller batch (at least one
    grid unit), the other way round where `sign` < 0, so that alternating the
    sign from step to step moves every unknown worker's batch by twice that
    between steps while the total stays the same. Moves stay on the grid
    `multiple` and within [lower, upper] (on the grid: `grid_units`); a pair
    that cannot move keeps its batches.
    """
    b = np.asarray(batches, dtype=np.int64).copy()
    unknown = np.flatnonzero(np.asarray(unknown, dtype=bool))
    if unknown.size % 2:  # the last one's partner: the largest batch among the others, else among the unknown
        others = np.setdiff1d(np.arange(b.size), unknown)
        pool = others if others.size else unknown[:-1]
        unknown = np.append(unknown, pool[np.argmax(b[pool])]) if pool.size else unknown[:0]
    gain, lose = (unknown[0::2], unknown[1::2]) if sign >= 0 else (unknown[1::2], unknown[0::2])
    lo, hi = (np.asarray(x) * multiple for x in grid_units(np.asarray(lower), np.asarray(upper), multiple))
    lo, hi = np.broadcast_to(lo, b.shape), np.broadcast_to(hi, b.shape)
    # Only the last pair can share a worker with another (the partner of an odd count among the unknown alone),
    # so it moves after the others, within the room they left.
    for pairs in (slice(0, -1), slice(-1, None)):
        up, down = gain[pairs], lose[pairs]
        step = np.maximum(np.floor(fraction * np.minimum(b[up], b[down]) / multiple), 1) * multiple
        step = np.minimum(step, np.minimum(hi[up] - b[up], b[down] - lo[down])).clip(0) // multiple * multiple
        b[up] += step.astype(np.int64)
        b[down] -= step.astype(np.int64)
    return b


def grid_units(lower, upper, multiple):
    """The per-worker bounds on the batch grid, in units of `multiple`: rounded inwards (b_min = 1 with q = 8
    makes a floor of one unit, 8 samples)."""
    return -(-lower // multiple), upper // multiple


def finer_grid(best, lower, upper, multiple, finest=1):
    """The coarsest grid between `multiple` and `finest` (a divisor of it) that holds no worker above its best
    batch: the largest q, a divisor of `multiple` and a multiple of `finest`, whose floor (`grid_units`:
    ceil(lower_i / q) q) is at most max(best_i, lower_i) for every worker; `finest` where none is.

    `best` is the split the workers would get without a grid (e.g. `continuous_split`). A worker a quarter
    as fast as the others with B / N = 64 may be best at 4-6 samples; a grid of 8 holds it at 8, which on
    that worker sets every step. Every division of the grid multiplies the batch shapes all the other
    workers may run, so `finest` bounds it.
    """
    best = np.maximum(np.asarray(best, dtype=np.float64), lower)
    multiple, finest = int(multiple), int(finest)
    for q in range(multiple, finest, -1):
        if multiple % q == 0 and q % finest == 0 and np.all(grid_units(lower, upper, q)[0] * q <= best + 1e-9):
            return q
    return finest


def allocate_clean(speeds, offsets, total, lower, upper, near=None, max_change=2.0, multiple=1):
    """`allocate` for inputs already checked: positive finite speeds, finite offsets >= 0, integer bound
    arrays with sum(lower) <= total <= sum(upper), an integer multiple >= 1. The per-step path of the
    policies, where the bounds were validated once at the start of training. `max_change` may be one
    factor per worker."""
    if multiple > 1:
        units, (lo, hi) = total // multiple, grid_units(lower, upper, multiple)
        if np.all(lo <= hi) and lo.sum() <= units <= hi.sum():
            on_grid = _allocate_within(speeds / multiple, offsets / multiple, units, lo, hi,
                                       None if near is None else np.asarray(near) / multiple, max_change)
            return _round(multiple * on_grid.astype(np.float64), total, offsets, speeds, lower, upper)
    return _allocate_within(speeds, offsets, total, lower, upper, near, max_change)


def _allocate_within(speeds, offsets, total, lower, upper, near, max_change):
    """The optimal integer split within the bounds, narrowed to the trust region around `near` where it fits."""
    if near is not None:
        near = np.asarray(near, dtype=np.float64)
        if near.shape == speeds.shape and abs(near.sum() - total) < 1 and (np.asarray(max_change) > 1).all():
            low = np.maximum(lower, np.floor(near / max_change).astype(np.int64))
            high = np.minimum(upper, np.ceil(near * max_change).astype(np.int64) + 1)
            if low.sum() <= total <= high.sum():
                lower, upper = low, high
    x, _ = continuous_split(offsets, speeds, total, lower, upper)
    return _round(x, total, offsets, speeds, lower, upper)


def tail_speeds(speeds, spread, z=None):
    """Speeds that plan for a high quantile of each worker's time instead of its mean (variance-aware split).

    With log-normal step-time noise of standard deviation spread_i, the
    quantile exp(z * spread_i) of worker i's time is balanced instead of its
    mean, so noisier workers get slack; z defaults to sqrt(2 ln N), about
    where the largest of N standard normal draws falls. With equal spreads
    the split is the mean-balanced one.
    """
    v = np.asarray(speeds, dtype=np.float64)
    s = np.asarray(spread, dtype=np.float64)
    s = np.where(np.isfinite(s), s, 0.0).clip(0.0, 2.0)
    if z is None:
        z = np.sqrt(2.0 * np.log(max(v.size, 2)))
    return v * np.exp(-z * s)


def shrink_to_current(speeds, offsets, batches, noise, free):
    """Speeds whose departures from the balance point of the current split are shrunk by their evidence.

    The current split `batches` finishes together at speeds proportional to
    k_i + b_i. A free worker's log departure from those, d_i (after the free
    workers' common factor is removed), becomes d_i (1 - noise_i^2 / d_i^2)
    where |d_i| > noise_i and 0 otherwise (a non-negative garrote):
    a departure within one per-step noise of a worker is taken for noise and
    leaves the split where it is, a large one passes almost whole; the free
    workers' mean log speed is kept (their level against the others). On
    identical workers a forecast that wanders with timing noise then stops
    moving batches back and forth, while a real difference (a slower GPU, a
    quota) still moves them at once. Workers not `free` (at a bound, so the
    split is not balanced for them, or just measured to jump) keep their
    speeds, and so does everyone with fewer than two free workers. Inputs
    must be clean (see `sanitize`); `noise` is each worker's standard
    deviation of one log speed measurement. `speeds`, `batches` and `free`
    may also hold several splits, one per row (along the last axis), each
    shrunk towards its own batches in one call.
    """
    v = np.asarray(speeds, dtype=np.float64)
    free = np.asarray(free, dtype=bool)
    if free.shape != v.shape:
        free = np.broadcast_to(free, v.shape)
    count = free.sum(axis=-1, keepdims=True)
    if (count < 2).all():
        return v.copy()
    share = np.maximum(count, 1)

    def free_mean(x):
        return np.where(free, x, 0.0).sum(axis=-1, keepdims=True) / share

    log_v = np.log(v)
    departure = log_v - np.log(np.asarray(offsets, dtype=np.float64) + np.asarray(batches, dtype=np.float64))
    departure -= free_mean(departure)
    noise = np.asarray(noise, dtype=np.float64)
    noise2 = np.square(np.where(np.isfinite(noise), noise, 0.0))
    square = departure * departure
    keep = 1.0 - np.divide(noise2, square, out=np.ones_like(square), where=square > noise2)
    pull = (1.0 - keep) * departure
    return np.where(free & (count >= 2), np.exp(log_v - pull + free_mean(pull)), v)


def _floor(lower, multiple, upper=None):
    """The smallest batch each worker can get on the grid `multiple`: its lower bound rounded up to the grid,
    unless that passes its upper bound (the grid then does not hold for it, see `allocate_clean`)."""
    floor = -(-np.asarray(lower) // multiple) * multiple
    return floor if upper is None else np.where(floor <= upper, floor, lower)


def _finish(batches, speeds, offsets):
    """max_i (k_i + b_i) / v_i for clean speeds and offsets."""
    return float(((offsets + np.asarray(batches, dtype=np.float64)) / speeds).max())


def predicted_time(batches, speeds, offsets=None):
    """max_i (k_i + b_i) / v_i: the predicted compute time of a synchronous step."""
    return _finish(batches, sanitize(speeds), 0.0 if offsets is None else sanitize(offsets, positive=False))


class Rebalancer:
    """Hysteresis and damping over successive allocations (the semi-dynamic variant of LB-BSP).

    A new split is adopted only if it shortens the predicted step by more than
    `min_gain` (relative). A worker's move halves every time its direction
    reverses (down to `min_step` of the full move) and returns to the full
    move after a move in the same direction, which stops oscillation around
    the balance point under noisy forecasts; when the damped move would not
    shorten the predicted step, the target is taken undamped. When a worker's
    speed was just measured to change (`jumped`), the damping restarts for
    all: the balance point itself moved, so the moves that follow are not
    oscillation, and a damping built up by noise would otherwise slow them
    down up to 1 / min_step times. The state
    depends only on the inputs, so ranks that feed it the same numbers stay in
    lockstep.
    """

    def __init__(self, min_gain=0.02, min_step=0.125):
        if isinstance(min_gain, bool) or not isinstance(min_gain, (int, float)) or not 0.0 <= min_gain < 1.0:
            raise ValueError(f"min_gain={min_gain!r} is not allowed: it must be a number in [0, 1)")
        if isinstance(min_step, bool) or not isinstance(min_step, (int, float)) or not 0.0 < min_step <= 1.0:
            raise ValueError(f"min_step={min_step!r} is not allowed: it must be a number in (0, 1]")
        self.min_gain, self.min_step = float(min_gain), float(min_step)
        self.start(1)

    def state(self):
        return {"step": self._step.copy(), "last_dir": self._last_dir.copy()}

    def load_state(self, state):
        self._step, self._last_dir = np.copy(state["step"]), np.copy(state["last_dir"])

    def start(self, num_workers):
        """Forget past moves (undamped steps)."""
        self._step = np.ones(num_workers)
        self._last_dir = np.zeros(num_workers, dtype=np.int64)

    def keeps(self, current, speeds, offsets, lower, jumped=None, multiple=1):
        """True when `update` would keep `current` whatever the target, so the allocation can be skipped.

        That holds when every worker is above its floor (all of them then count in `update`'s
        comparison) and the current predicted step is within `min_gain` of (B + sum k_i) / sum v_i, the
        continuous optimum without bounds, which no split beats. Restarts the damping on `jumped` as
        `update` does. Arguments as in `update`.
        """
        if jumped is not None and np.asarray(jumped).any():
            self.start(self._step.size)
        current = np.asarray(current)
        if not (current > _floor(lower, multiple)).all():
            return False
        now = _finish(current, speeds, offsets)
        bound = (float(current.sum()) + float(np.asarray(offsets).sum())) / float(np.asarray(speeds).sum())
        return now > 0 and (now - bound) / now <= self.min_gain

    def update(self, current, target, speeds, offsets, lower, upper, jumped=None, multiple=1):
        """The batches to use next: `target` (or a damped move towards it), or `current` if the gain is too small.

        `speeds` and `offsets` must be clean (positive and non-negative finite; see `sanitize`), `lower`
        and `upper` the per-worker bounds (integer arrays); `jumped` marks workers whose speed just changed;
        `multiple` is the batch grid: a damped move stays on it, and a worker at its lower bound as the grid
        rounds it is held there.
        """
        if jumped is not None and np.any(jumped):
            self.start(self._step.size)
        current, target = np.asarray(current, dtype=np.int64), np.asarray(target)
        if np.array_equal(target, current):
            return current.copy()
        # A worker held at its floor (its lower bound as the grid rounds it) in both splits finishes when it
        # finishes under either; when it is the slowest, comparing maxima would see no gain and keep a stale
        # split for all the others.
        floor = _floor(lower, multiple, upper)
        free = (target > floor) | (current > floor)
        speeds, offsets = speeds[free], np.broadcast_to(offsets, free.shape)[free]
        now = _finish(current[free], speeds, offsets)
        best = _finish(target[free], speeds, offsets)
        if now <= 0 or (now - best) / now <= self.min_gain:
            return current.copy()
        delta = (target - current).astype(np.float64)
        direction = np.sign(delta).astype(np.int64)
        reversed_ = (direction != 0) & (self._last_dir != 0) & (direction != self._last_dir)
        same = (direction != 0) & ~reversed_
        self._step[reversed_] = np.maximum(self._step[reversed_] / 2.0, self.min_step)
        self._step[same] = 1.0
        proposal = target
        if reversed_.any():
            blended = current + self._step * delta
            damped = allocate_clean(np.maximum(blended, 1e-9), np.zeros_like(blended), int(current.sum()), lower, upper,
                                    multiple=multiple)
            if _finish(damped[free], speeds, offsets) < now:
                proposal = damped
            else:
                self._step[:] = 1.0
        moved = np.sign(proposal - current).astype(np.int64)
        self._last_dir = np.where(moved != 0, moved, self._last_dir)
        return np.asarray(proposal, dtype=np.int64).copy()
