"""Which of several candidate splits would have been fastest, judged once the step has run (numpy only).

A split planned for a step can be scored exactly after the step: the
step-time model turns each worker's measured time into a batch-free speed
v_i that does not depend on the batch it ran (lbbsp.steptime), so any
other split b' would have taken max_i (k_i + b'_i) / v_i. Scoring every
candidate on every step, whichever was taken, is full-information
feedback: no exploration is needed, and the choice settles as fast as the
scores separate.

lbbsp uses it to choose between balancing the forecast means and
balancing a high quantile (lbbsp.uncertainty, lbbsp.allocation.tail_speeds),
and between shrinking small departures for noise or not.
Which is faster depends on what the simulator and live runs cannot settle
in advance: how many workers there are, how heavy the noise's tails are and
how much of it the forecasts already carry. With a few workers, or little
noise, balancing the means wins (the slowest of a few draws is rarely far
out); with hundreds of noisy workers the tail wins by 20-30%.

Each candidate's score is an exponentially weighted mean of log(its step
time / the first candidate's), weight `rate` for the newest step. The
choice starts at the first candidate and moves to another only when that
one's score is lower than the current choice's by more than `margin`
(log of a relative step time): a move changes the split, which costs a
step or two of settling, so candidates that differ by less than that are
not worth switching between, and a few lucky steps do not move it (the
scores start at 0 and approach their mean over about 1 / rate steps).
Every rank scores the same gathered numbers, so all choose alike.
"""
import numpy as np

__all__ = ["Hindsight"]


class Hindsight:
    """Scores candidate splits against the speeds then measured; `best` is the index of the one chosen
    (see the module docstring)."""

    def __init__(self, candidates, rate=0.05, margin=0.01):
        if isinstance(candidates, bool) or not isinstance(candidates, int) or candidates < 1:
            raise ValueError(f"candidates={candidates!r} is not allowed: give the number of candidates, "
                             "an integer >= 1")
        if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not 0.0 < rate <= 1.0:
            raise ValueError(f"rate={rate!r} is not allowed: give the weight of the newest step, in (0, 1]")
        if isinstance(margin, bool) or not isinstance(margin, (int, float)) or not 0.0 <= margin < 1.0:
            raise ValueError(f"margin={margin!r} is not allowed: give a log relative step time in [0, 1)")
        self.candidates, self.rate, self.margin = candidates, float(rate), float(margin)
        self.start()

    def start(self):
        """Forget every score and proposal (start of training)."""
        self.scores = np.zeros(self.candidates)
        self.scored = self.best = 0
        self._proposed = {}

    def state(self):
        # The scores are per candidate, not per worker: a list, which lbbsp.membership leaves as it is.
        return {"scores": self.scores.tolist(), "scored": self.scored, "best": self.best,
                "_proposed": {step: v.copy() for step, v in self._proposed.items()}}

    def load_state(self, state):
        scores = np.asarray(state["scores"], dtype=np.float64)
        if scores.shape != (self.candidates,):
            raise ValueError(f"scores for {scores.size} candidates cannot be loaded into a choice among "
                             f"{self.candidates}")
        self.scores, self.scored, self.best = scores.copy(), int(state["scored"]), int(state["best"])
        self._proposed = {int(step): np.array(v, dtype=np.float64) for step, v in state["_proposed"].items()}

    def propose(self, step, splits):
        """Remember the candidate splits (one row per candidate) for global step `step`."""
        splits = np.array(splits, dtype=np.float64)  # a copy: the caller may reuse its array for the next step
        if splits.ndim != 2 or splits.shape[0] != self.candidates:
            raise ValueError(f"splits of shape {splits.shape} are not allowed: give {self.candidates} rows")
        self._proposed[int(step)] = splits

    def observe(self, step, speeds, offsets):
        """Score the candidates proposed for global step `step` (if any) on the batch-free speeds measured there."""
        splits = self._proposed.pop(int(step), None)
        self._proposed = {s: v for s, v in self._proposed.items() if s > step}
        speeds = np.asarray(speeds, dtype=np.float64)
        if splits is None or splits.shape[1:] != speeds.shape:
            return
        offsets = np.asarray(offsets, dtype=np.float64)
        ok = np.isfinite(speeds) & (speeds > 0)
        if not ok.all():  # score on the workers measured (indexing costs as much as the scoring at 1024 workers)
            if not ok.any():
                return
            offsets, splits, speeds = offsets[ok], splits[:, ok], speeds[ok]
        times = ((offsets + splits) / speeds).max(axis=1)
        with np.errstate(all="ignore"):
            relative = np.log(times / times[0])
        if np.isfinite(relative).all():
            self.scores += self.rate * (relative - self.scores)
            self.scored += 1
            challenger = int(np.argmin(self.scores))  # the first on ties
            if self.scores[challenger] < self.scores[self.best] - self.margin:
                self.best = challenger
