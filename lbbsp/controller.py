"""Framework-free logic of the load-balancing callback (the Keras callback is a thin adapter over it).

Per step, on every rank: the local measurement goes into a guarded predictor,
the forecast and the measurement are exchanged (by the adapter), and the same
policy runs on the same gathered numbers everywhere, so every rank arrives at
the same batch sizes for the next step.
"""
import csv
import logging

import numpy as np

from predictor import make_predictor
from predictor.base import is_valid_speed
from predictor.telemetry import FEATURES

from .metrics import idle_fraction, summarize_steps
from .policies import StepStats, make_policy

__all__ = ["GuardedPredictor", "BalanceController", "HISTORY_FIELDS", "OUTBOX_FIELDS", "ROW_FIELDS"]

#: What each worker sends about itself after a step (set by the adapter before the next step's exchange).
OUTBOX_FIELDS = ("forecast", "wait", "true_speed")
#: Columns of the gathered (N, 4) matrix: the outbox plus the busy time measured in the step itself.
ROW_FIELDS = OUTBOX_FIELDS + ("compute",)
_COL = {name: i for i, name in enumerate(ROW_FIELDS)}

log = logging.getLogger(__name__)

HISTORY_FIELDS = (
    "time", "epoch", "step", "rank", "global_batch", "batch", "compute", "wait", "step_time",
    "speed", "forecast", "next_batch", "efficiency", "overhead",
)


class GuardedPredictor:
    """Runs a predictor without ever letting it fail a training step.

    An exception or a forecast that is NaN, inf or <= 0 is replaced by the last
    good forecast (or, before any, the last measured speed), with one warning
    per kind of failure.

    A worker's measured speed depends on its own batch (fixed per-step costs
    weigh more on small batches), so when the balancer moves the batch by more
    than `batch_reset` (relative) the speed history no longer describes the
    new regime: the predictor restarts from the new measurements (a learned
    predictor falls back to its EMA until it has a full window again).
    Without this, smoothing over the old regime delays convergence.
    """

    def __init__(self, predictor, batch_reset=0.1):
        if not isinstance(batch_reset, (int, float)) or batch_reset <= 0:
            raise ValueError(f"batch_reset={batch_reset!r} is not allowed: it must be a number > 0")
        self.predictor = make_predictor(predictor)
        self.batch_reset = float(batch_reset)
        self._warned = set()
        self.reset()

    @property
    def name(self):
        return self.predictor.name

    @property
    def uses_features(self):
        return bool(getattr(self.predictor, "uses_features", False))

    def reset(self):
        self.last_good = float("nan")
        self.last_speed = float("nan")
        self.last_batch = None
        self.failures = 0
        self.restarts = 0
        self._restart()

    def _restart(self):
        try:
            self.predictor.reset()
        except Exception as exc:  # noqa: BLE001 - a plugin failure must not stop training
            self._warn("reset", f"predictor {self.name!r} failed to reset ({exc!r})")

    def _warn(self, kind, message):
        self.failures += 1
        if kind not in self._warned:
            self._warned.add(kind)
            log.warning("%s; falling back to the last good forecast (warned once)", message)

    def update(self, speed, features=None, batch=None):
        """Feed one measurement (taken at `batch` samples) and return the forecast of the next step's speed."""
        if batch is not None:
            if self.last_batch is not None and abs(batch / self.last_batch - 1.0) > self.batch_reset:
                self._restart()
                self.restarts += 1
            self.last_batch = float(batch)
        if is_valid_speed(speed):
            self.last_speed = float(speed)
        try:
            self.predictor.observe(speed, features)
            value = self.predictor.forecast()
        except Exception as exc:  # noqa: BLE001 - a plugin failure must not stop training
            self._warn("raise", f"predictor {self.name!r} raised {exc!r}")
            value = None
        else:
            if not is_valid_speed(value):
                self._warn("invalid", f"predictor {self.name!r} returned {value!r}")
                value = None
        if value is None:
            value = self.last_good if is_valid_speed(self.last_good) else self.last_speed
        else:
            self.last_good = float(value)
        return float(value)


class BalanceController:
    """Decides every step's per-worker batch sizes from gathered measurements; keeps the per-step history."""

    def __init__(self, policy="lbbsp", predictor="narx", warmup_steps=1):
        if isinstance(warmup_steps, bool) or not isinstance(warmup_steps, int) or warmup_steps < 0:
            raise ValueError(f"warmup_steps={warmup_steps!r} is not allowed: it must be an integer >= 0")
        self.policy = make_policy(policy)
        self.predictor = GuardedPredictor(predictor) if self.policy.uses_forecast else None
        self.warmup_steps = warmup_steps

    def start(self, rank, size, schedule, b_min=1, b_max=None):
        """Reset per-run state; return the batches of the first step."""
        self.rank, self.size = int(rank), int(size)
        self.schedule = np.asarray(schedule, dtype=np.int64)
        self.b_min, self.b_max = b_min, b_max
        self.batches = self.policy.start(size, int(self.schedule[0]), b_min, b_max)
        if self.predictor is not None:
            self.predictor.reset()
        self.steps_seen = 0
        self.history = []
        self._epoch_rows = []
        return self.batches.copy()

    def forecast(self, speed, features=None, batch=None):
        """Local step: feed the guarded predictor; NaN while warming up or without a forecasting policy."""
        if self.predictor is None or self.steps_seen < self.warmup_steps:
            return float("nan")
        return self.predictor.update(speed, features, batch)

    def decide(self, epoch, step, gathered):
        """Batches for the step after (epoch, step) from the gathered (N, 4) matrix.

        Columns are ROW_FIELDS; true_speed is NaN except in benchmarks that
        inject known speeds (for the oracle).
        """
        gathered = np.asarray(gathered, dtype=np.float64).reshape(self.size, len(ROW_FIELDS))
        last_of_epoch = step + 1 >= self.schedule.size
        next_global = int(self.schedule[0 if last_of_epoch else step + 1])
        true_speed = gathered[:, _COL["true_speed"]]
        stats = StepStats(step=self.steps_seen, batches=self.batches.copy(), compute=gathered[:, _COL["compute"]],
                          wait=gathered[:, _COL["wait"]], forecast=gathered[:, _COL["forecast"]],
                          true_speed=true_speed if np.isfinite(true_speed).all() else None)
        self.steps_seen += 1
        if self.steps_seen <= self.warmup_steps:
            # The first steps include tracing and warm-up: measured speeds say nothing yet.
            self.batches = self.policy.resize(next_global)
        else:
            self._epoch_rows.append((stats.batches, stats.compute))
            self.batches = self.policy.after_step(stats, next_global)
        if last_of_epoch:
            self.batches = self.policy.after_epoch(next_global)
        self.batches = np.asarray(self.batches, dtype=np.int64)
        return self.batches.copy(), stats

    def record(self, features=None, **row):
        """Append one per-step row (HISTORY_FIELDS, plus the telemetry FEATURES when given) to the history."""
        if features is not None:
            row.update(zip(FEATURES, (float(v) for v in features)))
        self.history.append(row)

    def epoch_summary(self):
        """Epoch-level figures over this epoch's rows since the last call; resets the epoch accumulator."""
        rows = [r for r in self.history if r["epoch"] == self.history[-1]["epoch"]] if self.history else []
        out = {}
        if rows:
            out["lbbsp_batch"] = float(np.mean([r["batch"] for r in rows]))
            out["lbbsp_idle_fraction"] = idle_fraction([r["wait"] for r in rows], [r["step_time"] for r in rows])
            out["lbbsp_overhead_ms"] = 1e3 * float(np.median([r["overhead"] for r in rows]))
        if self._epoch_rows:
            b, t = zip(*self._epoch_rows)
            summary = summarize_steps(np.vstack(b), np.vstack(t))
            out["lbbsp_efficiency"] = summary["efficiency"]
            out["lbbsp_straggler"] = summary["straggler"]
        self._epoch_rows = []
        return out

    def write_csv(self, path):
        """Write the per-step history of this rank to `path`."""
        with open(path, "w", newline="") as fh:
            fields = HISTORY_FIELDS + tuple(f for f in FEATURES if self.history and f in self.history[0])
            writer = csv.DictWriter(fh, fieldnames=fields, extrasaction="ignore")
            writer.writeheader()
            writer.writerows(self.history)
