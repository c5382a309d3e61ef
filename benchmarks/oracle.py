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
- `noisy_reachable_step` is the same under the noise measured in the run:
  each step's deviations from the curves (measured compute / curve at the
  batch run), kept together across workers and grouped by the workers'
  states; the split minimises the mean over those deviations of the slowest
  finish. Like the simulator's mean oracle it knows the noise's distribution
  but not the draw: the reachable ideal puts every step on the mean curves,
  which no split reaches when a worker's steps scatter;
- `noisy_ideal_efficiency` is the balance efficiency (lbbsp.metrics) that
  split shows under the same deviations: where a worker's steps scatter,
  the draw unbalances even the fastest split's steps, so a policy that runs
  as fast as it shows about that efficiency, not 1;
- `best_static_split` is the hindsight-best fixed split over a run's states.
"""
import json

import numpy as np

from lbbsp.allocation import Bounds, sanitize, split, step_times
from lbbsp.metrics import balanced_time
from lbbsp.policies import Policy

__all__ = ["fit_curves", "save_curves", "load_curves", "CurveBook", "OraclePolicy", "best_split", "predicted_time"]


def best_split(speeds, global_batch, b_min=1, offsets=None, floors=None):
    """The min-max split of lbbsp.allocation for known curves (no grid, no hysteresis)."""
    v = sanitize(speeds, 1.0)
    zeros = np.zeros_like(v)
    k = zeros if offsets is None else sanitize(offsets, 0.0, positive=False)
    f = zeros if floors is None else np.asarray(floors, dtype=np.float64)
    return split(int(global_batch), Bounds.of(v.size, global_batch, b_min), v, k, f)


def predicted_time(batches, speeds, offsets=None, floors=None):
    """max_i t_i(b_i): the compute time of a synchronous step under known curves."""
    zeros = np.zeros(np.size(speeds))
    return float(step_times(batches, np.asarray(speeds, dtype=np.float64), zeros if offsets is None else offsets,
                            zeros if floors is None else floors).max())

MIN_NOISE_STEPS = 10  # measured steps of a state combination needed to take its noise


def _key(speed, hog):
    return f"{float(speed):.6g}|{int(bool(hog))}"


def _grouped(records):
    """{(worker, state key): [(batch, compute), ...]} of the records (worker, speed, hog, batch, compute) with a
    valid compute time."""
    groups = {}
    for worker, speed, hog, batch, compute in records:
        if compute > 0 and np.isfinite(compute):
            groups.setdefault((int(worker), _key(speed, hog)), []).append((batch, compute))
    return groups


def fit_curves(records, min_points=3):
    """{(worker, state key): (c, u)} from records (worker, speed, hog, batch, compute) of earlier runs.

    Robust to outliers: a least-squares line, refitted once without points
    more than 3 median absolute deviations off it. u is kept positive and c
    non-negative.
    """
    curves = {}
    for key, pairs in _grouped(records).items():
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


def one_size(records):
    """{(worker, state key): batch} for the curves whose records hold one batch size: fit_curves draws those
    through the origin (no fixed cost), so a smaller batch looks faster on them than it is."""
    sizes = {key: {float(batch) for batch, _ in pairs} for key, pairs in _grouped(records).items()}
    return {key: int(batches.pop()) for key, batches in sizes.items() if len(batches) == 1}


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

    def __init__(self, scenario, curves, measured=()):
        """`measured`: the steps whose deviations from the curves `noisy_reachable_step` plans for, each a list,
        by worker, of ((speed, hog), batch, compute)."""
        missing = [(w, s) for w in range(scenario.workers) for s in scenario.states(w)
                   if (w, _key(*s)) not in curves]
        if missing:
            raise ValueError(f"no measured curve for (worker, state) {missing}: run the other variants first")
        self.scenario, self.curves = scenario, curves
        self._noise, self._noisy = self._deviations(measured), {}

    def _deviations(self, steps):
        """{workers' states: one row per measured step of compute / (c + u * batch) under each worker's curve};
        steps that lack a worker, a curve or a positive finite compute are left out."""
        grouped = {}
        for step in steps:
            if len(step) != self.scenario.workers:
                continue
            states = tuple(_key(*state) for state, _, _ in step)
            if any((w, s) not in self.curves for w, s in enumerate(states)):
                continue
            cu = np.array([self.curves[(w, s)] for w, s in enumerate(states)])
            batch, compute = np.array([[b, t] for _, b, t in step], dtype=np.float64).T
            ratio = compute / (cu[:, 0] + cu[:, 1] * batch)
            if np.all(np.isfinite(ratio) & (ratio > 0)):
                grouped.setdefault(states, []).append(ratio)
        return {states: np.array(rows) for states, rows in grouped.items()}

    def at(self, step):
        """(offsets k, speeds v) of every worker at global step `step`."""
        cu = np.array([self.curves[(w, _key(*self.scenario.state(w, step)))] for w in range(self.scenario.workers)])
        c, u = cu[:, 0], cu[:, 1]
        return c / u, 1.0 / u

    def reachable_step(self, step, global_batch, b_min=1):
        """The shortest compute time any integer split reaches at `step` under the curves."""
        k, v = self.at(step)
        return predicted_time(best_split(v, global_batch, b_min, k), v, k)

    def noisy_reachable_step(self, step, global_batch, b_min=1):
        """The mean compute time of the split that minimises the expected slowest finish at `step`, under the
        deviations of the `measured` steps in the workers' states there (at least MIN_NOISE_STEPS of them)."""
        return self._noisy_ideal(step, global_batch, b_min)[0]

    def noisy_ideal_efficiency(self, step, global_batch, b_min=1):
        """(summed balanced time, summed slowest time) of the measured-noise ideal's split at `step` over the
        measured deviations there: their ratio is the efficiency (lbbsp.metrics) that split shows."""
        return self._noisy_ideal(step, global_batch, b_min)[1]

    def _noisy_ideal(self, step, global_batch, b_min):
        """(mean slowest finish, (summed balanced, summed slowest time)) of the split that minimises the expected
        slowest finish under the measured deviations of the workers' states at `step`; once per states."""
        states = tuple(_key(*self.scenario.state(w, step)) for w in range(self.scenario.workers))
        key = (states, global_batch, b_min)
        if key not in self._noisy:
            noise = self._noise.get(states)
            if noise is None or len(noise) < MIN_NOISE_STEPS:
                found = 0 if noise is None else len(noise)
                raise ValueError(f"{found} measured steps for the states {states} (need {MIN_NOISE_STEPS})")
            k, v = self.at(step)

            def expected(b):
                return float(np.mean(np.max((k + b) / v * noise, axis=1)))

            split = _local_search(best_split(v, global_batch, b_min, k), expected, b_min)
            compute = (k + split) / v * noise
            slowest = np.max(compute, axis=1)
            balanced = balanced_time(np.broadcast_to(split, compute.shape), compute)
            self._noisy[key] = (float(np.mean(slowest)), (float(balanced.sum()), float(slowest.sum())))
        return self._noisy[key]

    def equal_step(self, step, global_batch):
        k, v = self.at(step)
        return predicted_time(best_split(np.ones_like(v), global_batch), v, k)

    def best_static_split(self, steps, global_batch):
        """The fixed split that minimises the summed compute time over `steps` (hindsight), by local search."""
        ks, vs = zip(*(self.at(s) for s in steps))
        k, v = np.array(ks), np.array(vs)

        def total(b):
            return float(np.max((k + b) / v, axis=1).sum())

        best = _local_search(best_split(np.mean(v, axis=0), global_batch, offsets=np.mean(k, axis=0)), total)
        return best, total(best) / len(steps)


def _local_search(start, cost, b_min=1):
    """Move samples between pairs of workers while that lowers `cost`: moves of 16, then 8, 4, 2 and 1
    samples, no worker below b_min. Deterministic; the sum of the split is kept."""
    best, score = start.copy(), cost(start)
    for move in (16, 8, 4, 2, 1):
        improved = True
        while improved:
            improved = False
            for i in range(best.size):
                for j in range(best.size):
                    if i != j and best[i] - move >= b_min:
                        trial = best.copy()
                        trial[i] -= move
                        trial[j] += move
                        value = cost(trial)
                        if value < score - 1e-12:
                            best, score, improved = trial, value, True
    return best


class OraclePolicy(Policy):
    """Knows every worker's true step-time curve for the coming step (benchmarks only); no hysteresis.

    `truth(step)` returns (offsets k, speeds v[, floors f]) at global step `step` (counted from the start of
    training); use with warmup_steps=0.
    """

    name = "oracle"

    def __init__(self, truth):
        if not callable(truth):
            raise ValueError(f"truth={truth!r} is not allowed: give a callable step -> (offsets, speeds[, floors])")
        self.truth = truth

    def start(self, global_batch, bounds):
        super().start(global_batch, bounds)
        self._next = 0
        self.batches = self.resize(global_batch)
        return self.batches.copy()

    def after_step(self, stats, next_global_batch):
        self._next = stats.target
        self.batches = self.resize(int(self.batches.sum()))
        return self.resize(next_global_batch)

    def resize(self, global_batch):
        k, v, *f = self.truth(self._next)
        return split(int(global_batch), self.bounds, sanitize(v, 1.0), sanitize(k, 0.0, positive=False),
                     np.asarray(f[0] if f else np.zeros_like(v), dtype=np.float64))
