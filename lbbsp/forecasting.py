"""One worker's forecast of its next batch-free speed, guarded so that it never fails a training step.

Used as is by the Keras callback (one per rank) and by the simulator (one per
simulated worker). The measurement fed to the predictor is the batch-free
speed (b + k) / t, where k is the worker's fixed per-step cost in samples from
the shared step-time model (lbbsp.steptime): it does not depend on the batch
the balancer chose, so the predictor forecasts the worker, not the policy.
"""
import concurrent.futures
import logging
import math

from predictor import make_predictor
from predictor.base import is_valid_speed

from .steptime import batch_free_speed

__all__ = ["Forecaster", "Background"]

log = logging.getLogger(__name__)


class Forecaster:
    """Runs a `predictor.SpeedPredictor` on one worker's batch-free speeds; never raises, never returns junk.

    An exception, a forecast that is NaN, inf or <= 0, or one that is finite
    but absurd (more than `absurd` times above the fastest or below the
    slowest speed this worker ever measured) is replaced by the last good
    forecast (before any, the last measured speed), with one warning per kind
    of failure.
    """

    def __init__(self, predictor="narx", absurd=10.0):
        if isinstance(absurd, bool) or not isinstance(absurd, (int, float)) or not absurd > 1:
            raise ValueError(f"absurd={absurd!r} is not allowed: it must be a number > 1")
        self.predictor = make_predictor(predictor)
        self.absurd = float(absurd)
        self._warned = set()
        self.reset()

    @property
    def name(self):
        return self.predictor.name

    @property
    def uses_features(self):
        return bool(getattr(self.predictor, "uses_features", False))

    def reset(self):
        """Forget the history (start of training)."""
        self.last_good = math.nan
        self.last_speed = math.nan
        self.low, self.high = math.inf, 0.0
        self.failures = 0
        try:
            self.predictor.reset()
        except Exception as exc:  # noqa: BLE001 - a plugin failure must not stop training
            self._warn("reset", f"predictor {self.name!r} failed to reset ({exc!r})")

    def _warn(self, kind, message):
        self.failures += 1
        if kind not in self._warned:
            self._warned.add(kind)
            log.warning("%s; falling back to the last good forecast (warned once)", message)

    def update(self, batch, compute, offset=0.0, features=None):
        """Feed one step (batch samples in `compute` seconds, fixed cost `offset` samples); return the forecast."""
        speed = batch_free_speed(batch, compute, offset)
        if is_valid_speed(speed):
            self.last_speed = speed
            self.low, self.high = min(self.low, speed), max(self.high, speed)
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
            elif self.high > 0 and not self.low / self.absurd <= float(value) <= self.high * self.absurd:
                self._warn("absurd", f"predictor {self.name!r} returned {value!r}, far outside the measured "
                                     f"{self.low:.4g}..{self.high:.4g}")
                value = None
        if value is None:
            return self.last_good if is_valid_speed(self.last_good) else self.last_speed
        self.last_good = float(value)
        return self.last_good


class Background:
    """One thread that runs a rank's decisions in order, off the training step."""

    def __init__(self):
        self._pool = None

    def submit(self, fn, *args):
        if self._pool is None:
            self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="lbbsp")
        return self._pool.submit(fn, *args)

    def close(self):
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
