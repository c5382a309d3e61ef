"""The scale-free input window shared by the learned predictors (NARX and ARX), for training and inference.

At step t the window holds, for each of the last `delays` steps k:
log(v_{t-k} / L_t) and the telemetry FEATURES read with step t-k, where the
level L_t is the median of the last `level_span` speeds. The target is
log(v_{t+1} / L_t), so a forecast is L_t * exp(prediction): multiplying all
speeds by a constant multiplies the forecast by the same constant.
"""
import math

import numpy as np

from .telemetry import CPU_FEATURES, FEATURES, NEUTRAL

__all__ = ["WindowSpec", "DEFAULT_SPEC"]

LOG_CLIP = 3.0
FEATURE_CLIP = 4.0


class WindowSpec:
    """Shape of the input window: `delays` tapped delays of speed and telemetry, level over `level_span` steps."""

    def __init__(self, delays=8, level_span=8, features=CPU_FEATURES):
        if not isinstance(delays, int) or delays < 1:
            raise ValueError(f"delays={delays!r} is not allowed: it must be an integer >= 1")
        if not isinstance(level_span, int) or level_span < 1:
            raise ValueError(f"level_span={level_span!r} is not allowed: it must be an integer >= 1")
        unknown = [f for f in features if f not in FEATURES]
        if unknown:
            raise ValueError(f"features={list(features)!r} is not allowed: unknown {unknown}; known {list(FEATURES)}")
        self.delays, self.level_span = delays, level_span
        self.features = tuple(features)
        self._columns = np.array([FEATURES.index(f) for f in self.features], dtype=np.int64)

    @property
    def history_needed(self):
        return max(self.delays, self.level_span)

    @property
    def width(self):
        """Values per delay: the speed ratio plus the features."""
        return 1 + len(self.features)

    def to_dict(self):
        return {"delays": self.delays, "level_span": self.level_span, "features": list(self.features)}

    @classmethod
    def from_dict(cls, d):
        return cls(int(d["delays"]), int(d["level_span"]), tuple(d["features"]))

    def _clean_features(self, feats):
        feats = np.asarray(feats, dtype=np.float64)
        if not np.isfinite(feats).all():
            feats = np.where(np.isfinite(feats), feats, np.broadcast_to(NEUTRAL, feats.shape))
        return np.clip(feats[..., self._columns], -FEATURE_CLIP, FEATURE_CLIP)

    def window(self, speeds, features):
        """(level, window of shape (delays, width)) from the newest history, or None when it is unusable.

        Called at every training step, so it avoids numpy for the tiny median.
        """
        if len(speeds) < self.history_needed:
            return None
        recent = list(speeds)[-self.history_needed:]
        if not all(v > 0 and v != math.inf for v in recent):  # NaN > 0 is False
            return None
        tail = sorted(recent[-self.level_span:])
        mid = len(tail) // 2
        level = tail[mid] if len(tail) % 2 else 0.5 * (tail[mid - 1] + tail[mid])
        out = np.empty((self.delays, self.width))
        np.log(np.array(recent[-self.delays:]) / level, out=out[:, 0])
        np.clip(out[:, 0], -LOG_CLIP, LOG_CLIP, out=out[:, 0])
        rows = [NEUTRAL if f is None else f for f in list(features)[-self.delays:]]
        out[:, 1:] = self._clean_features(rows)
        return level, out

    def dataset(self, speeds, features):
        """All (window, target) pairs of one trace: X of shape (n, delays, width), y of shape (n,).

        Windows with an invalid speed (in the window or as the target) are skipped.
        """
        speeds = np.asarray(speeds, dtype=np.float64)
        features = np.asarray(features, dtype=np.float64)
        h = self.history_needed
        n = speeds.size - h
        if n <= 0:
            return np.zeros((0, self.delays, self.width)), np.zeros(0), np.zeros(0, dtype=np.int64)
        # Index matrix of the history each window sees: rows t = h-1 .. size-2.
        ends = np.arange(h - 1, speeds.size - 1)
        hist = speeds[ends[:, None] - np.arange(h)[::-1]]
        target = speeds[ends + 1]
        ok = np.all(np.isfinite(hist) & (hist > 0), axis=1) & np.isfinite(target) & (target > 0)
        level = np.median(hist[:, -self.level_span:], axis=1)
        ratios = np.clip(np.log(hist[:, -self.delays:] / level[:, None]), -LOG_CLIP, LOG_CLIP)
        feats = self._clean_features(features[ends[:, None] - np.arange(self.delays)[::-1]])
        X = np.concatenate([ratios[..., None], feats], axis=2)
        y = np.clip(np.log(target / level), -LOG_CLIP, LOG_CLIP)
        return X[ok], y[ok], ends[ok]


DEFAULT_SPEC = WindowSpec()
