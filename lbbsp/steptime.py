"""Online per-worker step-time model t_i(b) = max(f_i, (k_i + b) / v_i) (numpy only; one instance, all workers).

v_i: the batch-free speed (k_i + b) / t of the worker's last step above its floor. k_i: the fixed cost in samples,
an instrumental-variables fit over pairs of steps above the floor (pooled across GPU workers). f_i (GPU workers):
the time of a step whose batch fell without its time (at most the step's before). A step off its prediction beyond
noise is a speed change; a first step at a new batch shape measures the shape's set-up. See docs/method.md, section 1.
"""
import dataclasses
import math

import numpy as np

from .allocation import step_times
from .checks import number
from .metrics import median

__all__ = ["StepTimeParams", "StepTimeModel", "batch_free_speed", "GPU_SHAPE_COST", "GPU_MEAN_RATE", "GPU_OFFSET_SHARE"]

#: Seconds a new batch shape costs a GPU worker until one is measured (cuDNN autotuning).
GPU_SHAPE_COST = 4.0
#: Weight of the newest step in a GPU worker's running mean speed.
GPU_MEAN_RATE = 0.2
#: A GPU worker's k until it is fitted, as a share of the equal batch (kernel launches, the optimizer's update).
GPU_OFFSET_SHARE = 0.2


def batch_free_speed(batch, compute, offset=0.0):
    """(b + k) / t: the speed of a step with its fixed cost counted as k samples (NaN without a valid time)."""
    return (batch + offset) / compute if compute > 0 and math.isfinite(compute) else math.nan


@dataclasses.dataclass(frozen=True)
class StepTimeParams:
    """The step-time model's parameters (checked on construction). None: the default of the workers' device."""

    forgetting: float = 0.98  # weight of the past per step in the sums that fit k
    min_spread: float = 0.05  # rms relative batch change between steps below which k is not fitted
    max_error: float = 0.25  # standard error (share of the batch) below which a fit of k is taken alone
    max_offset: float = 16.0  # cap on k in units of the worker's mean batch
    offset: float = None  # k until fitted: 0 on CPU workers, GPU_OFFSET_SHARE of the equal batch on GPUs
    change: float = 0.25  # |log(t / predicted)| beyond max(change, sigmas x spread) is a speed change
    sigmas: float = 4.0
    noise_rate: float = 0.2  # weight of the newest squared log residual in a worker's spread
    shape_cost: float = None  # a new shape's set-up in seconds until measured: 0 on CPUs, GPU_SHAPE_COST on GPUs
    mean_rate: float = None  # weight of the newest step in the running mean speed: 1 (the last speed) on CPUs

    #: (low, high, low open, high open) of every parameter; those in OPTIONAL may also be None.
    RANGES = {"forgetting": (0.0, 1.0, True, True), "min_spread": (0.0, 1.0, True, False),
              "max_error": (0.0, math.inf, True, True), "max_offset": (0.0, math.inf, False, True),
              "offset": (0.0, math.inf, False, True), "change": (0.0, math.inf, True, True),
              "sigmas": (0.0, math.inf, False, True), "noise_rate": (0.0, 1.0, True, False),
              "shape_cost": (0.0, math.inf, False, True), "mean_rate": (0.0, 1.0, True, False)}
    OPTIONAL = ("shape_cost", "mean_rate", "offset")

    def __post_init__(self):
        for name, (low, high, low_open, high_open) in self.RANGES.items():
            number(name, getattr(self, name), low, high, low_open, high_open, optional=name in self.OPTIONAL)

    @classmethod
    def of(cls, params):
        """StepTimeParams from an instance, a dict of its fields, or None (the defaults)."""
        if params is None or isinstance(params, cls):
            return params or cls()
        if isinstance(params, dict) and set(params) <= {f.name for f in dataclasses.fields(cls)}:
            return cls(**params)
        raise ValueError(f"model={params!r} is not allowed: give a lbbsp.steptime.StepTimeParams or a dict of its "
                         f"fields {[f.name for f in dataclasses.fields(cls)]}")


class StepTimeModel:
    """Fits k_i and f_i, tracks v_i and each worker's set-up cost of new batch shapes (see the module docstring)."""

    #: Per-worker state (worker axis last) and what a newcomer starts from: "mean" (of the others) or a value.
    PER_WORKER = {"sums": 0.0, "last": math.nan, "offsets": "mean", "identified": False, "speeds": "mean",
                  "spread2": "mean", "floors": 0.0, "changed": False, "setup": 0.0, "shapes": frozenset(),
                  "measured": math.nan, "means": "mean", "above": False}

    #: Fits of k from which they are pooled on GPU workers.
    POOL_FROM = 3

    def __init__(self, params=None):
        self.params = StepTimeParams.of(params)
        self.start(1)

    def start(self, num_workers, gpu=False, share=0.0):
        """Forget everything. `gpu`: some worker trains on a GPU (device defaults, floors, pooling); `share`: the
        equal batch (the GPU prior of k)."""
        n, p = int(num_workers), self.params
        self.gpu = bool(gpu)

        def device_default(value, on_gpu, on_cpu):
            return value if value is not None else on_gpu if gpu else on_cpu

        self.shape_prior = device_default(p.shape_cost, GPU_SHAPE_COST, 0.0)
        self.mean_rate = device_default(p.mean_rate, GPU_MEAN_RATE, 1.0)
        self.offset_prior = float(device_default(p.offset, GPU_OFFSET_SHARE * share, 0.0))
        # Discounted sums over pairs of steps: moved pairs, b^2, z^2, z x, z y, z^2 y^2, z^2 x y, z^2 x^2, all pairs.
        self.sums = np.zeros((9, n))
        self.last = np.full((2, n), np.nan)  # batch and time of the last step above the floor
        self.above = np.zeros(n, dtype=bool)  # the latest measured step was above the floor
        self.offsets = np.full(n, self.offset_prior)
        self.identified = np.zeros(n, dtype=bool)
        self.speeds = np.full(n, np.nan)
        self.spread2 = np.zeros(n)
        self.floors = np.zeros(n)
        self.changed = np.zeros(n, dtype=bool)
        self.setup = np.zeros((2, n))  # set-ups measured, and their seconds
        self.shapes = [frozenset()] * n  # the batch sizes each worker has run
        self.measured = np.full(n, np.nan)  # the batch-free speed of the last step, where it is one
        self.means = np.full(n, np.nan)  # the running mean of the measured speeds

    def state(self):
        """Everything fitted so far, for checkpoints."""
        return {name: (list(value) if isinstance(value, list) else np.copy(value))
                for name, value in ((name, getattr(self, name)) for name in self.PER_WORKER)}

    def load_state(self, state):
        """Continue from `state()` of a model of the same number of workers."""
        missing = [name for name in self.PER_WORKER if name not in state]
        if missing:
            raise ValueError(f"a step-time state without {missing} cannot be loaded (saved by another version)")
        if np.shape(state["offsets"]) != self.offsets.shape:
            raise ValueError(f"a step-time state for {np.size(state['offsets'])} workers cannot be loaded into a "
                             f"model of {self.num_workers}")
        for name in self.PER_WORKER:
            value = state[name]
            setattr(self, name, [frozenset(s) for s in value] if name == "shapes" else np.array(value))

    @property
    def num_workers(self):
        return self.offsets.size

    @property
    def threshold(self):
        """Each worker's largest |log| departure from its prediction that noise explains."""
        return np.maximum(self.params.change, self.params.sigmas * np.sqrt(self.spread2))

    def predict(self, batches, speeds=None):
        """Predicted compute seconds of each worker at `batches` (at `speeds`, default the tracked ones)."""
        v = self.speeds if speeds is None else np.asarray(speeds, dtype=np.float64)
        return step_times(batches, v, self.offsets, self.floors)

    def setup_cost(self):
        """Seconds a new batch shape is expected to cost: the median of the workers' mean measured set-ups (a speed
        change that coincides with a first visit reads as set-up), else the prior."""
        count, total = self.setup
        measured = count > 0
        return median(total[measured] / count[measured]) if measured.any() else self.shape_prior

    def new_shapes(self, batches):
        """True for each worker whose batch in `batches` it has not run yet."""
        return np.array([b not in known for b, known in zip(np.asarray(batches, dtype=np.int64).tolist(),
                                                              self.shapes)])

    def seen(self, batches, new=None):
        """Note the batch sizes the workers ran (also in steps whose timings are not used)."""
        batches = np.asarray(batches, dtype=np.int64)
        for w in np.flatnonzero(self.new_shapes(batches) if new is None else new).tolist():
            self.shapes[w] = self.shapes[w] | {int(batches[w])}

    def update(self, batches, compute):
        """Feed one step's batches and compute times (NaN or <= 0 compute is skipped); returns True for each worker
        whose batch size was new to it."""
        b = np.asarray(batches, dtype=np.float64).reshape(-1)
        t = np.asarray(compute, dtype=np.float64).reshape(-1)
        if b.size != self.num_workers or t.size != self.num_workers:
            raise ValueError(f"batches and compute must have {self.num_workers} entries; got {b.size} and {t.size}")
        new = self.new_shapes(b)
        self.seen(b, new)
        with np.errstate(all="ignore"):
            self._update(b, t, new)
        return new

    def _update(self, b, t, new):
        p = self.params
        ok = np.isfinite(t) & (t > 0) & np.isfinite(b) & (b > 0)
        threshold = self.threshold
        predicted = self.predict(b)
        # A first visit's excess over the prediction is its set-up. Where a set-up costs more than a step (a GPU), a
        # first step slow beyond noise measures nothing else; elsewhere it is an ordinary measurement.
        first = ok & new & np.isfinite(predicted)
        costly = first & (np.log(t / predicted) > threshold)
        if costly.any():
            costly &= self.setup_cost() > predicted
        self.setup += np.where(first, np.array([np.ones_like(t), np.maximum(t - predicted, 0.0)]), 0.0)
        ok &= ~costly
        b0, t0 = self.last
        line = (self.offsets + b) / self.speeds
        # A floor (GPUs only: CPU noise would pass for floors): the batch fell and the time stayed above the line beyond
        # noise without rising (so does an unknown fixed cost's). It is at most the time of the larger batch before it,
        # and a step more than `change` under it refutes it, whatever the worker's noise (docs/method.md, section 1).
        floored = ok & self.gpu & (b < b0) & (np.log(t / line) > threshold) & (np.log(t / t0) < threshold)
        self.floors = np.where(floored, np.minimum(t, t0),
                               np.where(ok & (np.log(t / self.floors) < -p.change), 0.0, self.floors))
        on_floor = floored | (ok & (line <= self.floors) & (np.log(t / self.floors) <= threshold))
        above = ok & ~on_floor
        resid = np.log(t / np.maximum(self.floors, line))
        scored = above & np.isfinite(resid)
        self.changed = scored & (np.abs(resid) > threshold)
        self.floors = np.where(self.changed, 0.0, self.floors)  # measured under other contention
        steady = scored & ~self.changed
        # Every scored step feeds the spread, a change as a residual at the threshold: fed by steady steps alone, the
        # spread of noise that crosses the threshold from the start stays below it.
        self.spread2 = np.where(scored, self.spread2 + p.noise_rate * (
            np.minimum(resid ** 2, threshold ** 2) - self.spread2), self.spread2)
        # A pair: two steady steps above the floor with none on it between them (a set-up step is skipped). Across a
        # visit to the floor the batch change answers the noise it would be fitted against.
        pair = steady & self.above
        self.above = np.where(ok, above, self.above)
        z, x, y = b - b0, t - t0, t0 * b - t * b0
        zz = z * z
        self.sums *= np.where(pair, p.forgetting, 1.0)
        self.sums += np.where(pair, np.array([(z != 0).astype(np.float64), b * b, zz, z * x, z * y, zz * y * y,
                                              zz * x * y, zz * x * x, np.ones_like(b)]), 0.0)
        self.last = np.where(above, np.array([b, t]), self.last)
        self._fit()
        self.measured = np.where(above, (self.offsets + b) / t, np.nan)
        self.speeds = np.where(above, self.measured, self.speeds)
        mean = (1.0 - self.mean_rate) * self.means + self.mean_rate * self.measured
        self.means = np.where(above, np.where(np.isfinite(mean), mean, self.measured), self.means)

    def _fit(self):
        p = self.params
        moved, sbb, szz, szx, szy, syy, sxy, sxx, w = self.sums
        k = szy / szx
        scale = np.sqrt(sbb / w)  # root-mean-square batch of the pairs
        # Heteroskedasticity-robust standard error of the IV estimate, at least 1% of the batch.
        error = np.maximum(np.sqrt(np.maximum(syy - 2 * k * sxy + k * k * sxx, 0.0)) / np.abs(szx), 0.01 * scale)
        three_pairs = 1.0 + p.forgetting + p.forgetting ** 2  # one or two moved pairs leave no residual
        fit = (moved >= three_pairs - 1e-9) & (szx > 0) & np.isfinite(k) & np.isfinite(error) & \
            (np.sqrt(szz / sbb) >= p.min_spread)
        if self.gpu and np.count_nonzero(fit) >= self.POOL_FROM:
            # Workers that train the same model have about the same k: each fit is shrunk towards the fits'
            # precision-weighted mean by its error's share of the spread between workers (empirical Bayes), and a
            # worker without a fit takes the mean. On its floor a GPU seldom has a fit precise enough alone.
            variance = error[fit] ** 2
            center = float(np.sum(k[fit] / variance) / np.sum(1.0 / variance))
            between = max(float(np.var(k[fit]) - np.mean(variance)), 0.0)
            pooled = np.full(k.size, center)
            pooled[fit] = center + between / (between + variance) * (k[fit] - center)
            take = fit | ~self.identified
        else:
            pooled, take = k, fit & (error < p.max_error * scale)
        cap = np.where(np.isfinite(scale), p.max_offset * scale, np.inf)
        self.offsets = np.where(take, np.clip(pooled, 0.0, cap), self.offsets)
        self.identified |= take & fit
