"""How far each worker's planned speed falls from the speed it then ran at (numpy only).

A split is planned from a speed per worker, a forecast made steps before the
step runs. What the allocator needs to give a worker slack is the spread of
that planning error, not of the raw speed: a worker whose speed is noisy
but well forecast needs little, one that jumps often needs much. With many
workers the slowest of them sets the pace, so a split that balances means
only loses most where one worker's error is largest (the variance-aware
split, lbbsp.allocation.tail_speeds, balances a high quantile instead).

The spread is the root of a discounted mean of squared log errors, with a
long memory: which workers are erratic is a lasting property of their
hardware and neighbours, and a short window would both miss rare jumps and
be too noisy to rank workers by. Each worker's mean square is then shrunk
towards the cluster's (empirical Bayes): by how much follows from how far
the workers' estimates differ beyond what their own sampling error
explains (lbbsp.pooling). Workers alike in truth then share one spread, so
sampling noise (a straggler step that happened to fall in one worker's
window) does not move batches; workers that really differ keep their own.
A newcomer, or a worker with no error yet, gets the cluster's. Every rank
feeds the same gathered numbers, so all hold the same spreads.

The errors also say which way a forecast errs. Speeds vary around a
level that moves slowly (contention comes and goes), and a worker's step
noise is only partly carried to the next steps: a forecast that has moved
far above the worker's recent level is too high more often than not. The
planning error is therefore regressed, pooled over all workers, on the
departure of the planned log speed from the worker's level (an
exponential average of its measured log speeds): e = beta d + residual.
`plan` corrects each worker's speed by exp(beta d) (beta is about -0.5 on
the recorded traces, 0 where forecasts are already unbiased), except for a
worker whose speed the step-time model has just seen jump beyond its noise
(a quota cut, a co-located job starting): that departure does not fall
back, and correcting it would undo part of the move the jump asks for.
The spreads are those of the residuals, the errors left after that
correction. One coefficient for the cluster is learnt in a few steps,
since every worker adds a pair at every step.

Parameters:

============  =======  ============================================================
forgetting    0.995    weight of the past per step (memory about 200 steps)
max_error     2.0      |log error| is clipped here: one stalled step (a pause of
                       the process) may widen a spread, not dominate it
level_rate    0.2      weight of the newest measurement in a worker's level
                       (memory about 5 steps: the level follows contention)
min_pairs     16       (departure, error) pairs before beta is used; beta is
                       held within [-1, 0.5] (-1: plan at the level)
============  =======  ============================================================
"""
import numpy as np

from .pooling import shrink_towards

__all__ = ["PlanningError"]


class PlanningError:
    """Per-worker spread of log(measured speed / planned speed), and the pooled bias of the forecasts it
    corrects; see the module docstring."""

    #: Per worker, discounted sums of: 1, the squared weight (for the effective count), e^2 and e^4.
    _SUMS = 4
    #: A worker new to the job has no errors and no level of its own (lbbsp.membership).
    EMPTY = {"_moments": 0.0, "_level": np.nan}
    #: The range beta is held to.
    BIAS_RANGE = (-1.0, 0.5)

    def __init__(self, forgetting=0.995, max_error=2.0, level_rate=0.2, min_pairs=16):
        for name, value, ok in (("forgetting", forgetting, lambda v: 0.0 < v < 1.0),
                                ("max_error", max_error, lambda v: v > 0.0),
                                ("level_rate", level_rate, lambda v: 0.0 < v <= 1.0),
                                ("min_pairs", min_pairs, lambda v: v >= 1)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not np.isfinite(value) or not ok(value):
                raise ValueError(f"{name}={value!r} is not allowed: forgetting must be in (0, 1), max_error > 0, "
                                 "level_rate in (0, 1] and min_pairs >= 1")
        self.forgetting, self.max_error, self.level_rate = float(forgetting), float(max_error), float(level_rate)
        self.min_pairs = float(min_pairs)
        f = self.forgetting
        self._decay = np.array([[f], [f * f], [f], [f]])
        self.start(1)

    def start(self, num_workers):
        """Forget every error, level and plan (start of training)."""
        self._moments = np.zeros((self._SUMS, int(num_workers)))
        self._level = np.full(int(num_workers), np.nan)
        self._fit = np.zeros(3)  # pooled, discounted sums of d e, d^2 and the number of pairs
        self._planned = {}

    def state(self):
        # _fit is pooled, not per worker: a list, which lbbsp.membership leaves as it is whatever its length.
        return {"_moments": self._moments.copy(), "_level": self._level.copy(), "_fit": self._fit.tolist(),
                "_planned": {step: v.copy() for step, v in self._planned.items()}}

    def load_state(self, state):
        if np.shape(state["_moments"]) != self._moments.shape:
            raise ValueError(f"a planning-error state of shape {np.shape(state['_moments'])} cannot be loaded into "
                             f"one for {self._moments.shape[1]} workers")
        self._moments = np.array(state["_moments"], dtype=np.float64)
        # A state saved before the bias was learnt has no levels: they start anew from the next measurement.
        self._level = np.array(state.get("_level", np.full(self._moments.shape[1], np.nan)), dtype=np.float64)
        self._fit = np.array(state.get("_fit", np.zeros(3)), dtype=np.float64)
        self._planned = {int(step): self._as_plan(v) for step, v in state["_planned"].items()}

    @staticmethod
    def _as_plan(saved):
        """A remembered plan as rows (forecast, planned, departure); an older state kept the planned speeds only."""
        saved = np.array(saved, dtype=np.float64)
        return saved if saved.ndim == 2 else np.stack([saved, saved, np.zeros_like(saved)])

    @property
    def bias(self):
        """beta: the pooled slope of the log planning error on the departure from the level (0 until min_pairs)."""
        de, dd, pairs = self._fit
        if pairs < self.min_pairs or not dd > 0:
            return 0.0
        low, high = self.BIAS_RANGE
        return min(max(float(de / dd), low), high)

    def plan(self, step, speeds, jumped=None):
        """The speeds to plan global step `step` with: `speeds` (forecasts) corrected by the learnt bias.

        Workers `jumped` (a boolean per worker: a change of speed the step-time model measured beyond its
        noise) keep their forecast: the correction undoes part of a departure from the level because noise
        falls back, and a measured jump does not. Remembered to be compared with the speeds measured at that
        step; `step` None remembers nothing.
        """
        forecast = np.asarray(speeds, dtype=np.float64)
        with np.errstate(all="ignore"):
            departure = np.log(forecast) - self._level
        departure = np.where(np.isfinite(departure), departure, 0.0)
        corrected = departure if jumped is None else np.where(jumped, 0.0, departure)
        planned = forecast * np.exp(self.bias * corrected)
        if step is not None:
            self._planned[int(step)] = np.array([forecast, planned, departure])
        return planned

    def observe(self, step, measured):
        """Compare the speeds measured at global step `step` with those it was planned with (if any), and
        move each worker's level towards its measurement."""
        measured = np.asarray(measured, dtype=np.float64)
        plan = self._planned.pop(int(step), None)
        self._planned = {s: v for s, v in self._planned.items() if s > step}
        with np.errstate(all="ignore"):  # a worker without a measurement (NaN or 0) is masked out below
            if plan is not None and plan.shape[1:] == self._moments.shape[1:]:
                forecast, planned, departure = plan
                raw, error = np.log(measured / forecast), np.log(measured / planned)
                ok = np.isfinite(error) & np.isfinite(raw)
                raw = raw[ok].clip(-self.max_error, self.max_error)
                d = departure[ok]
                self._fit = self._fit * self.forgetting + np.array([d @ raw, d @ d, d.size])
                error = np.where(ok, error, 0.0).clip(-self.max_error, self.max_error)
                square, one = error * error, np.ones_like(error)
                self._moments = np.where(ok, self._moments * self._decay +
                                         np.array([one, one, square, square * square]), self._moments)
            if measured.shape == self._level.shape:
                x = np.log(measured)
                fresh = np.isfinite(x)
                self._level = np.where(fresh & np.isfinite(self._level),
                                       self._level + self.level_rate * (x - self._level), np.where(fresh, x, self._level))

    @property
    def spread(self):
        """Each worker's planning-error spread (standard deviation of the log error); 0 before any error."""
        weight, weight2, s2, s4 = self._moments
        seen = weight > 0
        if not seen.any():
            return np.zeros(weight.size)
        weight, weight2, s2, s4 = weight[seen], weight2[seen], s2[seen], s4[seen]
        mean = s2 / weight  # each worker's mean square
        pooled = float(mean.sum() / mean.size)  # np.mean's value, at a third of its cost
        # Sampling variance of that mean: the variance of e^2 (at least a normal error's, 2 pooled^2, so that a
        # worker with one or two errors is not taken as exact) over the effective count.
        sampling = np.maximum(s4 / weight - mean ** 2, 2.0 * pooled ** 2) * weight2 / weight ** 2
        shrunk = np.full(seen.size, pooled)
        shrunk[seen] = shrink_towards(pooled, mean, sampling)
        return np.sqrt(shrunk)
