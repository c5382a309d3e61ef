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
explains. Workers alike in truth then share one spread, so sampling noise
(a straggler step that happened to fall in one worker's window) does not
move batches; workers that really differ keep their own. A newcomer, or a
worker with no error yet, gets the cluster's. Every rank feeds the same
gathered numbers, so all hold the same spreads.

Parameters:

============  =======  ============================================================
forgetting    0.995    weight of the past per step (memory about 200 steps)
max_error     2.0      |log error| is clipped here: one stalled step (a pause of
                       the process) may widen a spread, not dominate it
============  =======  ============================================================
"""
import numpy as np

__all__ = ["PlanningError"]


class PlanningError:
    """Per-worker spread of log(measured speed / planned speed); see the module docstring."""

    #: Per worker, discounted sums of: 1, the squared weight (for the effective count), e^2 and e^4.
    _SUMS = 4
    #: A worker new to the job has no errors of its own (lbbsp.membership).
    EMPTY = {"_moments": 0.0}

    def __init__(self, forgetting=0.995, max_error=2.0):
        for name, value, ok in (("forgetting", forgetting, lambda v: 0.0 < v < 1.0),
                                ("max_error", max_error, lambda v: v > 0.0)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not np.isfinite(value) or not ok(value):
                raise ValueError(f"{name}={value!r} is not allowed: forgetting must be in (0, 1) and max_error > 0")
        self.forgetting, self.max_error = float(forgetting), float(max_error)
        f = self.forgetting
        self._decay = np.array([[f], [f * f], [f], [f]])
        self.start(1)

    def start(self, num_workers):
        """Forget every error and plan (start of training)."""
        self._moments = np.zeros((self._SUMS, int(num_workers)))
        self._planned = {}

    def state(self):
        return {"_moments": self._moments.copy(), "_planned": {step: v.copy() for step, v in self._planned.items()}}

    def load_state(self, state):
        if np.shape(state["_moments"]) != self._moments.shape:
            raise ValueError(f"a planning-error state of shape {np.shape(state['_moments'])} cannot be loaded into "
                             f"one for {self._moments.shape[1]} workers")
        self._moments = np.array(state["_moments"], dtype=np.float64)
        self._planned = {int(step): np.array(v, dtype=np.float64) for step, v in state["_planned"].items()}

    def plan(self, step, speeds):
        """Remember the speeds the split of global step `step` was planned with."""
        self._planned[int(step)] = np.array(speeds, dtype=np.float64)

    def observe(self, step, measured):
        """Compare the speeds measured at global step `step` with those it was planned with (if any)."""
        planned = self._planned.pop(int(step), None)
        self._planned = {s: v for s, v in self._planned.items() if s > step}
        if planned is None or planned.shape != self._moments.shape[1:]:
            return
        with np.errstate(all="ignore"):
            error = np.log(np.asarray(measured, dtype=np.float64) / planned)
        ok = np.isfinite(error)
        error = np.clip(np.where(ok, error, 0.0), -self.max_error, self.max_error)
        square, one = error * error, np.ones_like(error)
        self._moments = np.where(ok, self._moments * self._decay + np.stack([one, one, square, square * square]),
                              self._moments)

    @property
    def spread(self):
        """Each worker's planning-error spread (standard deviation of the log error); 0 before any error."""
        weight, weight2, s2, s4 = self._moments
        seen = weight > 0
        if not seen.any():
            return np.zeros(weight.size)
        with np.errstate(all="ignore"):
            mean = np.where(seen, s2 / weight, np.nan)  # each worker's mean square
        pooled = float(np.mean(mean[seen]))
        with np.errstate(all="ignore"):
            # Sampling variance of that mean: the variance of e^2 (at least a normal error's, 2 pooled^2, so
            # that a worker with one or two errors is not taken as exact) over the effective count.
            spread_of_square = np.maximum(s4 / weight - mean ** 2, 2.0 * pooled ** 2)
            sampling = np.where(seen, spread_of_square * weight2 / weight ** 2, np.inf)
        between = max(float(np.var(mean[seen])) - float(np.mean(sampling[seen])), 0.0)
        with np.errstate(all="ignore"):
            keep = np.where(seen & (between + sampling > 0), between / (between + sampling), 0.0)
        return np.sqrt(pooled + keep * np.where(seen, mean - pooled, 0.0))
