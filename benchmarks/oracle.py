"""The oracle and the reachable ideal: every worker's measured step-time curve under each scenario state.

A curve is t(b) = c + u * b (seconds), fitted per (worker, state) from the
per-step records of earlier runs of the same scenario (every policy's
records pooled, so the batch varies enough to separate c from u). From the
curves:

- `OraclePolicy` knows, before every step, each worker's true curve for that
  step (the scenario says which state every worker is in at every step, so
  every rank computes the same split locally, with no exchange and no wait)
  and takes the min-max split of lbbsp.allocation without hysteresis;
- `reachable_step` is the best compute time any split can reach under the
  curves, the "reachable ideal" (nominal quotas ignore that a throttled
  worker also stalls and runs its part of the allreduce);
- `best_static_split` is the hindsight-best fixed split over a run's states.
"""
import json

import numpy as np

from lbbsp.allocation import allocate, predicted_time
from lbbsp.policies import Policy

__all__ = ["fit_curves", "save_curves", "load_curves", "CurveBook", "OraclePolicy"]


def _key(speed, hog):
    return f"{float(speed):.6g}|{int(bool(hog))}"


def fit_curves(records, min_points=3):
    """{(worker, state key): (c, u)} from records (worker, speed, hog, batch, compute) of earlier runs.

    Robust to outliers: a least-squares line, refitted once without points
    more than 3 median absolute deviations off it. u is kept positive and c
    non-negative.
    """
    groups = {}
    for worker, speed, hog, batch, compute in records:
        if compute > 0 and np.isfinite(compute):
            groups.setdefault((int(worker), _key(speed, hog)), []).append((batch, compute))
    curves = {}
    for key, pairs in groups.items():
        if len(pairs) < min_points:
            continue
        b, t = np.array(pairs, dtype=np.float64).T
        keep = np.ones(b.size, dtype=bool)
        for _ in range(2):
            if np.ptp(b[keep]) > 0:
                u, c = np.polyfit(b[keep], t[keep], 1)
            else:
                u, c = float(np.median(t[keep] / b[keep])), 0.0
            resid = t - (c + u * b)
            mad = np.median(np.abs(resid - np.median(resid))) + 1e-12
            keep = np.abs(resid) <= 3 * 1.4826 * mad + 1e-9
        if u <= 0:
            u, c = float(np.median(t / b)), 0.0
        curves[key] = (max(float(c), 0.0), float(u))
    return curves


def save_curves(path, curves):
    with open(path, "w") as fh:
        json.dump({f"{w}|{s}": cu for (w, s), cu in curves.items()}, fh, indent=1)


def load_curves(path):
    with open(path) as fh:
        raw = json.load(fh)
    out = {}
    for name, cu in raw.items():
        worker, state = name.split("|", 1)
        out[(int(worker), state)] = tuple(cu)
    return out


class CurveBook:
    """Each worker's (k, v) at every step of a scenario: k = c / u fixed cost in samples, v = 1 / u."""

    def __init__(self, scenario, curves):
        missing = [(w, s) for w in range(scenario.workers) for s in scenario.states(w)
                   if (w, _key(*s)) not in curves]
        if missing:
            raise ValueError(f"no measured curve for (worker, state) {missing}: run the other variants first")
        self.scenario, self.curves = scenario, curves

    def at(self, step):
        """(offsets k, speeds v) of every worker at global step `step`."""
        cu = np.array([self.curves[(w, _key(*self.scenario.state(w, step)))] for w in range(self.scenario.workers)])
        c, u = cu[:, 0], cu[:, 1]
        return c / u, 1.0 / u

    def reachable_step(self, step, global_batch, b_min=1):
        """The shortest compute time any integer split reaches at `step` under the curves."""
        k, v = self.at(step)
        return predicted_time(allocate(v, global_batch, b_min, offsets=k), v, k)

    def equal_step(self, step, global_batch):
        k, v = self.at(step)
        return predicted_time(allocate(np.ones_like(v), global_batch), v, k)

    def best_static_split(self, steps, global_batch):
        """The fixed split that minimises the summed compute time over `steps` (hindsight), by local search."""
        ks, vs = zip(*(self.at(s) for s in steps))
        k, v = np.array(ks), np.array(vs)

        def total(b):
            return float(np.max((k + b) / v, axis=1).sum())

        best = allocate(np.mean(v, axis=0), global_batch, offsets=np.mean(k, axis=0))
        score = total(best)
        improved = True
        while improved:
            improved = False
            for i in range(best.size):
                for j in range(best.size):
                    if i != j and best[i] > 1:
                        trial = best.copy()
                        trial[i] -= 1
                        trial[j] += 1
                        s = total(trial)
                        if s < score - 1e-12:
                            best, score, improved = trial, s, True
        return best, score / len(steps)


class OraclePolicy(Policy):
    """Knows every worker's true step-time curve for the coming step (benchmarks only); no hysteresis.

    `truth(step)` returns (offsets k, speeds v) at global step `step` (counted
    from the start of training); use with warmup_steps=0.
    """

    name = "oracle"

    def __init__(self, truth):
        if not callable(truth):
            raise ValueError(f"truth={truth!r} is not allowed: give a callable step -> (offsets, speeds)")
        self.truth = truth

    def start(self, num_workers, global_batch, b_min=1, b_max=None, multiple=1, finest_multiple=None):
        super().start(num_workers, global_batch, b_min, b_max, multiple, finest_multiple)
        self._next = 0
        self.batches = self._split(global_batch)
        return self.batches.copy()

    def _split(self, global_batch):
        k, v = self.truth(self._next)
        return self._allocate(v, global_batch, offsets=k)

    def after_step(self, stats, next_global_batch):
        self._next = stats.target
        self.batches = self._split(int(self.batches.sum()))
        return self.resize(next_global_batch)

    def resize(self, global_batch):
        return self._split(global_batch)
