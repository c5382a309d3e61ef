"""The interface every speed predictor implements, and the feature window they share.

A predictor sees, after each training step, the speed the worker measured in
that step (samples/s) and the telemetry readings taken with it, and forecasts
the speed of the next step. Learned predictors are scale-free: they work on
speeds divided by the worker's own recent level, so one model serves a CPU
worker at 50 samples/s and a GPU worker at 5,000.
"""
import abc
import collections
import math

import numpy as np

__all__ = ["SpeedPredictor", "History", "is_valid_speed"]


def is_valid_speed(value):
    """True for a finite, positive number: the only kind of forecast the allocator may use."""
    try:
        value = float(value)
    except (TypeError, ValueError):
        return False
    return math.isfinite(value) and value > 0.0


class SpeedPredictor(abc.ABC):
    """Forecasts a worker's next-step speed from its own history."""

    #: Short name used in logs, tables and the `predictor=` argument.
    name = "base"
    #: Steps of history needed before `forecast` is meaningful.
    min_history = 1

    def __init__(self):
        self.history = History(self.window)
        self.reset()

    #: Steps kept in the history window.
    window = 64

    def reset(self):
        """Forget all history (called at the start of training)."""
        self.history.clear()

    def observe(self, speed, features=None):
        """Record the speed measured in the step that just ended and the telemetry read with it."""
        self.history.append(speed, features)

    def forecast(self):
        """Speed (samples/s) expected at the next step; NaN when there is too little history."""
        if len(self.history) < self.min_history:
            return float("nan")
        return float(self._forecast())

    @abc.abstractmethod
    def _forecast(self):
        """Forecast from a history of at least `min_history` steps."""


class History:
    """The last `maxlen` speeds and feature vectors, with invalid speeds kept out of the level."""

    def __init__(self, maxlen):
        self.speeds = collections.deque(maxlen=maxlen)
        self.features = collections.deque(maxlen=maxlen)

    def __len__(self):
        return len(self.speeds)

    def clear(self):
        self.speeds.clear()
        self.features.clear()

    def append(self, speed, features=None):
        speed = float(speed) if is_valid_speed(speed) else float("nan")
        self.speeds.append(speed)
        self.features.append(None if features is None else np.asarray(features, dtype=np.float64))

    def last_valid(self):
        """The newest finite positive speed, or NaN."""
        for value in reversed(self.speeds):
            if not math.isnan(value):
                return value
        return float("nan")
