"""Online per-worker step-time model t_i(b) = (k_i + b) / v_i (numpy only, one instance serves all workers).

Why: a step has a fixed cost, so a worker's samples/s depends on the batch the
balancer gave it; a forecaster of raw samples/s chases the balancer's own
decisions. Writing the fixed cost in samples, k_i (= fixed seconds x v_i),
separates what contention changes from what the split changes: when a worker
is slowed (a CPU quota, a co-located process, a throttled GPU) its fixed and
its per-sample work slow alike, so k_i stays and only v_i moves. The
batch-free speed (b + k_i) / t is then what forecasters see and predict.

Two time scales, estimated differently:

- v_i moves from step to step (contention), so the model keeps the freshest
  measurement, (b + k_i) / t of the last valid step: any average over past
  steps lags a drifting speed, and a lag costs more than per-step noise
  (the simulator shows it). Forecasters refine it (lbbsp.forecasting).
- k_i is a property of the workload on the worker's hardware and changes
  slowly, so it is fitted with a long memory. A regression of t on b would
  be confounded: the balancer moves b because v moved. Consecutive steps
  remove the drift: with v constant over two steps,
  k (t_s - t_{s-1}) = t_{s-1} b_s - t_s b_{s-1}, and the batch change
  z = b_s - b_{s-1}, decided from older timings and so independent of this
  step's noise, is the instrument: k = sum z y / sum z x (instrumental
  variables; x = t_s - t_{s-1}, y = t_{s-1} b_s - t_s b_{s-1}). Pairs that
  straddle a detected speed change are left out.

Each worker's estimate has a standard error, and with large batches (k a
few % of the step) or noisy timings that error is large: on 1024 simulated
workers with 512 samples each and a true k of 16, the per-worker fits
spread from 0 to 300. Workers that run the same model have about the same
k in samples, so the fits are pooled (empirical Bayes, lbbsp.pooling, as
for the spreads in lbbsp.uncertainty): the precision-weighted mean of the
workers' fits, the variance of the true k between workers beyond their
standard errors, and each worker's fit shrunk towards the mean by its own
error. Workers that truly differ (a GPU and a CPU) keep their own k;
imprecise fits borrow from the others. A worker whose batch has never
moved enough takes the pooled k, not the prior, once three workers have
fits; with fewer (or `pool=False`), a fit is taken alone if precise
enough (`max_error`), and k otherwise keeps its prior (AdaptDL pins its
fixed cost the same way while one batch size was seen).

The model is fitted on every rank from the gathered (batch, compute time) of
every worker, so all ranks hold the same numbers and take the same decisions.

Parameters, all in one place:

==============  =======  =================================================================
parameter       default  meaning
==============  =======  =================================================================
forgetting      0.98     weight of the past per step in the fixed cost's sums (memory
                         about 1 / (1 - forgetting) = 50 steps)
min_spread      0.05     root-mean-square batch change between steps, relative to the
                         batch, below which k is not identifiable and keeps its value
max_error       0.25     with fewer than three workers' fits to pool, a fit of k is
                         accepted only when its standard error is below this fraction
                         of the mean batch (noisy timings over small batch moves would
                         otherwise give absurd fixed costs)
pool            True     pool the workers' fits (above); False fits each worker alone,
                         with the `max_error` rule
min_error       0.01     timings do not resolve k finer than this fraction of the mean
                         batch: when pooling, a fit whose standard error is below it
                         has a chance near-zero residual (a fit on the one pair whose
                         batch moved has none) and counts as precise as the median
                         fit, so that it does not outweigh every other worker's fit
change          0.25     |log(t / predicted t)| above max(change, 4 x the worker's
                         step-to-step spread) means the speed changed (a quota cut, a
                         co-located job): that pair is not used for k
max_offset      16       cap on k in units of the worker's mean batch (a step that is
                         almost all fixed cost then gives the worker b_min, as it should)
offset          0        prior k in samples while it is not identified; 0 makes the split
                         proportional to measured samples/s, whose fixed point has equal
                         step times
==============  =======  =================================================================
"""
import math

import numpy as np

from .pooling import shrink_towards

__all__ = ["StepTimeModel", "batch_free_speed"]


def _number(name, value, low, high, low_open=False, high_open=False):
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and np.isfinite(value)
    ok = ok and (value > low if low_open else value >= low) and (value < high if high_open else value <= high)
    if not ok:
        lb, hb = "(" if low_open else "[", ")" if high_open else "]"
        raise ValueError(f"{name}={value!r} is not allowed: it must be a number in {lb}{low}, {high}{hb}")
    return float(value)


def batch_free_speed(batch, compute, offset=0.0):
    """(b + k) / t: the speed of a step with its fixed cost counted as k samples (NaN without a valid time)."""
    return (batch + offset) / compute if compute > 0 and math.isfinite(compute) else math.nan


class StepTimeModel:
    """Fits k_i and tracks v_i for N workers from per-step (batch, compute seconds) pairs; see the module docstring."""

    def __init__(self, forgetting=0.98, min_spread=0.05, max_error=0.25, change=0.25, max_offset=16.0, offset=0.0,
                 min_error=0.01, pool=True):
        self.forgetting = _number("forgetting", forgetting, 0.0, 1.0, low_open=True, high_open=True)
        self.min_spread = _number("min_spread", min_spread, 0.0, 1.0, low_open=True)
        self.max_error = _number("max_error", max_error, 0.0, np.inf, low_open=True, high_open=True)
        self.min_error = _number("min_error", min_error, 0.0, 1.0, low_open=True)
        if not isinstance(pool, bool):
            raise ValueError(f"pool={pool!r} is not allowed: it must be True or False")
        self.pool = pool
        self.change = _number("change", change, 0.0, np.inf, low_open=True, high_open=True)
        self.max_offset = _number("max_offset", max_offset, 0.0, np.inf, high_open=True)
        self.prior_offset = _number("offset", offset, 0.0, np.inf, high_open=True)
        self.start(1)

    def start(self, num_workers):
        """Forget everything (start of training)."""
        n = int(num_workers)
        # Discounted sums over consecutive-step pairs: weight, b^2, z^2, z x, z y, z^2 y^2, z^2 x y, z^2 x^2.
        self._sums = np.zeros((8, n))
        self._last = np.full((2, n), np.nan)  # batch and compute time of the last valid step
        self.offsets = np.full(n, self.prior_offset)
        self.identified = np.zeros(n, dtype=bool)
        self.speeds = np.full(n, np.nan)
        self.changed = np.zeros(n, dtype=bool)
        self._resid = np.zeros(n)
        self.updates = 0

    _STATE = ("_sums", "_last", "offsets", "identified", "speeds", "changed", "_resid", "updates")
    #: Fits needed before they are pooled: shrinking towards a mean estimated from the same fits beats taking
    #: each alone from three on (Stein), and with two the variance between workers has one degree of freedom.
    MIN_POOLED = 3
    #: What a worker new to the job starts with (lbbsp.membership): no observations of its own, so its
    #: first steps are fitted in full; its fixed cost and speed start from the others' mean.
    EMPTY = {"_sums": 0.0, "_last": np.nan}

    def state(self):
        """Everything fitted so far (numpy arrays), for checkpoints."""
        return {name: np.copy(getattr(self, name)) for name in self._STATE}

    def load_state(self, state):
        """Continue from `state()` of a model of the same number of workers."""
        if np.shape(state["offsets"]) != self.offsets.shape:
            raise ValueError(f"a step-time state for {np.size(state['offsets'])} workers cannot be loaded into a "
                             f"model of {self.num_workers}")
        missing = [name for name in self._STATE if name not in state]
        if missing:
            raise ValueError(f"a step-time state without {missing} cannot be loaded (saved by another version)")
        for name in self._STATE:
            setattr(self, name, np.copy(state[name]))

    @property
    def num_workers(self):
        return self.offsets.size

    @property
    def spread(self):
        """Each worker's step-to-step noise: the standard deviation of log(measured / predicted time)."""
        return np.sqrt(self._resid)

    @property
    def noise(self):
        """Each worker's noise of one log speed measurement: its spread over sqrt(2), since the spread is of
        the difference of two consecutive steps' independent noises."""
        return self.spread / math.sqrt(2.0)

    @property
    def threshold(self):
        """Each worker's largest |log| deviation from its last measurement that noise explains, max(change, 4 x spread)."""
        return np.maximum(self.change, 4.0 * np.sqrt(self._resid))

    def predict(self, batches, speeds=None):
        """Predicted compute seconds of each worker at `batches` (with `speeds`, default the tracked ones)."""
        v = self.speeds if speeds is None else np.asarray(speeds, dtype=np.float64)
        return (self.offsets + np.asarray(batches, dtype=np.float64)) / v

    def update(self, batches, compute):
        """Feed one step's batches and compute times of all workers (NaN or <= 0 compute is skipped)."""
        b = np.asarray(batches, dtype=np.float64).reshape(-1)
        t = np.asarray(compute, dtype=np.float64).reshape(-1)
        if b.size != self.num_workers or t.size != self.num_workers:
            raise ValueError(f"batches and compute must have {self.num_workers} entries; got {b.size} and {t.size}")
        with np.errstate(all="ignore"):
            self._update(b, t)
        self.updates += 1

    def _update(self, b, t):
        ok = np.isfinite(t) & (t > 0) & np.isfinite(b) & (b > 0)
        resid = np.log(t / self.predict(b))
        known = ok & np.isfinite(resid)
        self.changed = known & (np.abs(resid) > self.threshold)
        steady = known & ~self.changed
        self._resid = np.where(steady, 0.8 * self._resid + 0.2 * resid ** 2, self._resid)
        b0, t0 = self._last
        pair = steady & np.isfinite(b0)
        z, x, y = b - b0, t - t0, t0 * b - t * b0
        zz = z * z
        s = self._sums
        s *= np.where(pair, self.forgetting, 1.0)
        s += np.where(pair, np.array([np.ones_like(b), b * b, zz, z * x, z * y, zz * y * y, zz * x * y, zz * x * x]), 0.0)
        self._last = np.where(ok, np.array([b, t]), self._last)
        self._fit()
        self.speeds = np.where(np.isfinite(self._last[1]), (self.offsets + self._last[0]) / self._last[1],
                               self.speeds)

    def _fit(self):
        w, sbb, szz, szx, szy, syy, sxy, sxx = self._sums
        k = szy / szx
        # Heteroskedasticity-robust standard error of the instrumental-variables estimate.
        error = np.sqrt(np.maximum(syy - 2 * k * sxy + k * k * sxx, 0.0)) / np.abs(szx)
        scale = np.sqrt(sbb / w)  # root-mean-square batch of the pairs
        three_pairs = 1.0 + self.forgetting + self.forgetting ** 2  # w after three pairs: one pair has no residual
        fit = (w >= three_pairs - 1e-9) & (szx > 0) & np.isfinite(k) & np.isfinite(error) & \
            (np.sqrt(szz / sbb) >= self.min_spread)
        if not self.pool or np.count_nonzero(fit) < self.MIN_POOLED:
            fit &= error < self.max_error * scale
            self.offsets = np.where(fit, k.clip(0.0, self.max_offset * scale), self.offsets)
            self.identified |= fit
            return
        floor = self.min_error * scale[fit]
        errors = np.maximum(error[fit], floor)
        # An error below what timings resolve is a chance near-zero residual (a fit on the one pair whose batch
        # moved has none): it says nothing of the fit's precision, which then counts as the median fit's
        # instead of outweighing every other worker's.
        errors = np.where(error[fit] < floor, np.maximum(_median(errors), floor), errors)
        pooled, shrunk = _pool(k[fit], errors)
        own = np.full(k.size, pooled)
        own[fit] = shrunk
        # A worker never fitted takes the pooled k; one fitted before whose batch has since settled keeps its own.
        take = fit | ~self.identified
        cap = np.where(np.isfinite(scale), self.max_offset * scale, np.inf)
        self.offsets = np.where(take, own.clip(0.0, cap), self.offsets)
        self.identified |= fit


def _median(x):
    """np.median of a 1-D float array without NaN: the same value, by one partition (np.median costs ten
    times that on a few workers)."""
    middle = x.size // 2
    part = np.partition(x, (middle - 1, middle) if x.size % 2 == 0 else middle)
    return part[middle] if x.size % 2 else (part[middle - 1] + part[middle]) / 2


def _pool(estimates, errors):
    """(pooled mean, each estimate shrunk towards it) for estimates with standard errors: the precision-weighted
    mean, and each estimate pulled towards it by lbbsp.pooling."""
    variance = errors * errors
    precision = 1.0 / variance
    pooled = float(precision @ estimates / precision.sum())
    return pooled, shrink_towards(pooled, estimates, variance)
