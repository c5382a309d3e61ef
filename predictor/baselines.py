"""Simple predictors: the baselines NARX must beat, and the fallbacks it uses."""
import math

from .base import SpeedPredictor

__all__ = ["LastValuePredictor", "EMAPredictor"]


class LastValuePredictor(SpeedPredictor):
    """Next speed = last measured speed."""

    name = "last"

    def _forecast(self):
        return self.history.last_valid()


class EMAPredictor(SpeedPredictor):
    """Exponential moving average of the measured speeds (invalid readings skipped)."""

    name = "ema"

    def __init__(self, alpha=0.3):
        if not (isinstance(alpha, (int, float)) and 0.0 < alpha <= 1.0):
            raise ValueError(f"alpha={alpha!r} is not allowed: it must be a number in (0, 1]")
        self.alpha = float(alpha)
        super().__init__()

    def reset(self):
        super().reset()
        self._ema = float("nan")

    def observe(self, speed, features=None):
        super().observe(speed, features)
        value = self.history.speeds[-1]
        if math.isnan(value):
            return
        self._ema = value if math.isnan(self._ema) else self._ema + self.alpha * (value - self._ema)

    def _forecast(self):
        return self._ema
