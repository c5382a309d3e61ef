"""Online per-worker step-time model t_i(b) = (k_i + b) / v_i (numpy only, one instance serves all workers).

Why: a step has a fixed cost, so a worker's samples/s depends on the batch the
balancer gave it; a forecaster of raw samples/s chases the balancer's own
decisions. Writing the fixed cost in samples, k_i (= fixed seconds x v_i),
separates what contention changes from what the split changes: when a worker
is slowed (a CPU quota, a co-located process, a throttled GPU) its fixed and
its per-sample work slow alike, so k_i stays and only v_i moves. The
batch-free speed (b + k_i) / t is then what forecasters see and predict.

The model is fitted on every rank from the gathered (batch, compute time) of
every worker, so all ranks hold the same numbers and take the same decisions.

Parameters, all in one place:

==============  =======  =================================================================
parameter       default  meaning
==============  =======  =================================================================
forgetting      0.9      weight of the past per step in the running sums (memory about
                         1 / (1 - forgetting) = 10 steps)
min_spread      0.05     relative spread (std / mean) of the batches in the window below
                         which k is not identifiable; k then keeps its last value (AdaptDL
                         pins its fixed cost the same way while one batch size was seen)
max_error       0.25     a fit is accepted only when the standard error of its per-sample
                         time is below this fraction of it (noisy timings over a narrow
                         range of batches would otherwise give absurd fixed costs)
change          0.25     |log(t / predicted t)| above max(change, 4 x the worker's residual
                         scale) at a step whose batch the model could predict means the
                         speed changed: the worker's sums restart from that step, k is kept
max_offset      16       cap on k in units of the worker's mean batch (a step that is
                         almost all fixed cost then gives the worker b_min, as it should)
offset          0        prior k in samples while it is not identified; 0 makes the split
                         proportional to measured samples/s, whose fixed point has equal
                         step times
==============  =======  =================================================================
"""
import math

import numpy as np

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
    """Fits k_i and v_i for N workers from per-step (batch, compute seconds) pairs; see the module docstring."""

    def __init__(self, forgetting=0.9, min_spread=0.05, max_error=0.25, change=0.25, max_offset=16.0, offset=0.0):
        self.forgetting = _number("forgetting", forgetting, 0.0, 1.0, low_open=True, high_open=True)
        self.min_spread = _number("min_spread", min_spread, 0.0, 1.0, low_open=True)
        self.max_error = _number("max_error", max_error, 0.0, np.inf, low_open=True, high_open=True)
        self.change = _number("change", change, 0.0, np.inf, low_open=True, high_open=True)
        self.max_offset = _number("max_offset", max_offset, 0.0, np.inf, high_open=True)
        self.prior_offset = _number("offset", offset, 0.0, np.inf, high_open=True)
        self.start(1)

    def start(self, num_workers):
        """Forget everything (start of training)."""
        n = int(num_workers)
        self._sums = np.zeros((6, n))  # weight, sum b, sum b^2, sum t, sum b*t, sum t^2
        self.offsets = np.full(n, self.prior_offset)
        self.identified = np.zeros(n, dtype=bool)
        self.speeds = np.full(n, np.nan)
        self.changed = np.zeros(n, dtype=bool)
        self._resid = np.zeros(n)
        self._last_batch = np.full(n, np.nan)
        self.updates = 0

    _STATE = ("_sums", "offsets", "identified", "speeds", "changed", "_resid", "_last_batch", "updates")
    #: What a worker new to the job starts with (lbbsp.membership): no observations of its own, so its
    #: first step is fitted in full; its fixed cost and speed start from the others' mean.
    EMPTY = {"_sums": 0.0, "_last_batch": np.nan}

    def state(self):
        """Everything fitted so far (numpy arrays), for checkpoints."""
        return {name: np.copy(getattr(self, name)) for name in self._STATE}

    def load_state(self, state):
        """Continue from `state()` of a model of the same number of workers."""
        if np.shape(state["offsets"]) != self.offsets.shape:
            raise ValueError(f"a step-time state for {np.size(state['offsets'])} workers cannot be loaded into a "
                             f"model of {self.num_workers}")
        for name in self._STATE:
            setattr(self, name, np.copy(state[name]))

    @property
    def num_workers(self):
        return self.offsets.size

    @property
    def spread(self):
        """Each worker's step-to-step noise: the standard deviation of log(measured / predicted time)."""
        return np.sqrt(self._resid)

    def predict(self, batches, speeds=None):
        """Predicted compute seconds of each worker at `batches` (with `speeds`, default the fitted ones)."""
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
        same_batch = np.abs(np.log(b / self._last_batch)) < 0.1
        known = ok & np.isfinite(resid)
        comparable = known & (self.identified | same_batch)
        self.changed = comparable & (np.abs(resid) > np.maximum(self.change, 4.0 * np.sqrt(self._resid)))
        steady = comparable & ~self.changed
        self._resid[steady] = 0.8 * self._resid[steady] + 0.2 * resid[steady] ** 2
        s = self._sums
        s[:, self.changed] = 0.0
        s[:, ok] *= self.forgetting
        s[:, ok] += np.stack([np.ones_like(b), b, b * b, t, b * t, t * t])[:, ok]
        self._last_batch[ok] = b[ok]
        self._fit()

    def _fit(self):
        w, sb, sbb, st, sbt, stt = self._sums
        seen = w > 0
        mb, mt = sb / w, st / w
        var_b = sbb / w - mb * mb
        cov = sbt / w - mb * mt
        slope = cov / var_b
        intercept = mt - slope * mb
        spread = np.sqrt(np.maximum(var_b, 0.0)) / mb
        resid = np.maximum(stt / w - mt * mt - slope * cov, 0.0)
        error = np.sqrt(resid / (np.maximum(w - 2.0, 1e-9) * var_b)) / slope
        fit = seen & (w > 2.5) & (spread >= self.min_spread) & (slope > 0) & np.isfinite(intercept) & \
            (error < self.max_error)
        k = np.clip(intercept / slope, 0.0, self.max_offset * mb)
        self.offsets = np.where(fit, k, self.offsets)
        self.identified |= fit
        self.speeds = np.where(seen, (sb + self.offsets * w) / st, self.speeds)
