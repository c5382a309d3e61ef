"""NARX and ARX speed predictors, run in numpy from exported weights (no TensorFlow at inference).

NARX: a GRU over the tapped-delay window of (log speed ratio, telemetry)
followed by a linear readout, predicting log(v_{t+1} / L_t). Trained in Keras
(predictor/train.py); inference here repeats Keras' GRU equations
(reset_after=True) in numpy, about 0.1 ms per forecast, where Keras'
`predict` costs tens of milliseconds per call.

ARX: the same window, a linear model fitted by ridge least squares: the
baseline that shows what the non-linear recurrent model adds.

Both can adapt their linear readout online by recursive least squares on the
worker's own history (`online=True`): a few microseconds per step, in line,
so it never blocks a training step. The adapted readout is scored against the
shipped one on every step (exponentially weighted |log error|); when its error
exceeds 1.25 x the shipped readout's, it is reset to the shipped weights, and
the forecast comes from whichever of the two has been better, so adaptation
cannot diverge. Too little history or an invalid window falls back to an EMA
forecast.
"""
import json
import logging
import os

import numpy as np

from .base import SpeedPredictor
from .baselines import EMAPredictor
from .features import LOG_CLIP, WindowSpec

__all__ = ["NARXPredictor", "ARXPredictor", "load", "load_default", "MODEL_DIR", "gru_forward"]

log = logging.getLogger(__name__)

MODEL_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "models")
FORMAT_VERSION = 1


def gru_forward(window, kernel, recurrent_kernel, bias):
    """Final hidden state of a Keras GRU (reset_after=True, sigmoid/tanh) over `window` (steps, inputs).

    Runs at every training step: the arithmetic is done in place in a few
    preallocated buffers, since on small arrays numpy's per-call cost dominates.
    """
    units = recurrent_kernel.shape[0]
    x_proj = window @ kernel
    x_proj += bias[0]
    rec = np.empty(3 * units)
    zr = np.empty(2 * units)
    cand = np.empty(units)
    h = np.zeros(units)
    first = True
    for x_t in x_proj:
        if first:
            rec[:] = bias[1]  # h is zero
            first = False
        else:
            np.dot(h, recurrent_kernel, out=rec)
            rec += bias[1]
        np.add(x_t[:2 * units], rec[:2 * units], out=zr)
        np.negative(zr, out=zr)
        np.exp(zr, out=zr)
        zr += 1.0
        np.reciprocal(zr, out=zr)  # sigmoid
        np.multiply(zr[units:], rec[2 * units:], out=cand)
        cand += x_t[2 * units:]
        np.tanh(cand, out=cand)
        h -= cand
        h *= zr[:units]
        h += cand  # z * h + (1 - z) * cand
    return h


class _RLS:
    """Recursive least squares on a linear readout y = w . [phi, 1], with forgetting factor `lam`."""

    def __init__(self, w, b, lam=0.995, delta=0.05):
        self.w = np.append(np.asarray(w, dtype=np.float64).reshape(-1), float(b))
        self.P = np.eye(self.w.size) * delta
        self.lam = lam

    def predict(self, phi):
        return float(self.w[:-1] @ phi + self.w[-1])

    def update(self, phi, target):
        x = np.append(phi, 1.0)
        px = self.P @ x
        gain = px / (self.lam + x @ px)
        self.w += gain * (target - self.w @ x)
        self.P = (self.P - np.outer(gain, px)) / self.lam


class _LearnedPredictor(SpeedPredictor):
    """Window-based predictor with an EMA fallback and optional online readout adaptation."""

    uses_features = True

    def __init__(self, spec, online=False):
        if not isinstance(spec, WindowSpec):
            raise ValueError(f"spec={spec!r} is not allowed: give a predictor.features.WindowSpec")
        self.spec = spec
        self.window = max(spec.history_needed, 16)
        self.min_history = 1
        self.online = bool(online)
        self._fallback = EMAPredictor()
        super().__init__()

    def reset(self):
        super().reset()
        self._fallback.reset()
        self._rls = self._new_rls() if self.online else None
        self._pending = None
        self._errors = np.zeros(2)  # EW |log error| of the shipped and the adapted readout
        self.fallbacks = 0
        self.rls_resets = 0

    def observe(self, speed, features=None):
        super().observe(speed, features)
        self._fallback.observe(speed, features)
        if self._rls is not None and self._pending is not None:
            phi, level = self._pending
            value = self.history.speeds[-1]
            if np.isfinite(value):
                target = float(np.clip(np.log(value / level), -LOG_CLIP, LOG_CLIP))
                shipped = float(phi @ self._readout_w + self._readout_b)
                errors = np.abs([shipped - target, self._rls.predict(phi) - target])
                self._errors += 0.1 * (errors - self._errors)
                if self._errors[1] > 1.25 * self._errors[0] + 1e-3:
                    self._rls = self._new_rls()  # adaptation has drifted: start again from the shipped readout
                    self._errors[1] = self._errors[0]
                    self.rls_resets += 1
                else:
                    self._rls.update(phi, target)
        self._pending = None

    def _forecast(self):
        built = self.spec.window(self.history.speeds, self.history.features)
        if built is None:
            self.fallbacks += 1
            return self._fallback.forecast()
        level, window = built
        phi = self._readout_input(window)
        out = float(phi @ self._readout_w + self._readout_b)
        if self._rls is not None:
            self._pending = (phi, level)
            if self._errors[1] < self._errors[0]:
                out = self._rls.predict(phi)
        return level * float(np.exp(np.clip(out, -LOG_CLIP, LOG_CLIP)))

    def _new_rls(self):
        return _RLS(self._readout_w, self._readout_b)


class NARXPredictor(_LearnedPredictor):
    """NARX: GRU over tapped delays of speed and telemetry, linear readout (see module docstring)."""

    name = "narx"

    def __init__(self, spec, kernel, recurrent_kernel, bias, dense_w, dense_b, online=False):
        self.kernel = np.asarray(kernel, dtype=np.float64)
        self.recurrent_kernel = np.asarray(recurrent_kernel, dtype=np.float64)
        self.bias = np.asarray(bias, dtype=np.float64).reshape(2, -1)
        self._readout_w = np.asarray(dense_w, dtype=np.float64).reshape(-1)
        self._readout_b = float(np.asarray(dense_b).reshape(-1)[0])
        units = self.recurrent_kernel.shape[0]
        if self.kernel.shape != (spec.width, 3 * units) or self.recurrent_kernel.shape != (units, 3 * units) \
                or self.bias.shape != (2, 3 * units) or self._readout_w.shape != (units,):
            raise ValueError(
                f"NARX weights do not fit the window spec {spec.to_dict()}: kernel {self.kernel.shape}, "
                f"recurrent {self.recurrent_kernel.shape}, bias {self.bias.shape}, readout {self._readout_w.shape}"
            )
        super().__init__(spec, online)

    def _readout_input(self, window):
        return gru_forward(window, self.kernel, self.recurrent_kernel, self.bias)

    def arrays(self):
        return {"kernel": self.kernel, "recurrent_kernel": self.recurrent_kernel, "bias": self.bias,
                "dense_w": self._readout_w, "dense_b": np.array([self._readout_b])}


class ARXPredictor(_LearnedPredictor):
    """ARX: linear model on the same window as NARX (the linear baseline)."""

    name = "arx"

    def __init__(self, spec, w, b, online=False):
        self._readout_w = np.asarray(w, dtype=np.float64).reshape(-1)
        self._readout_b = float(np.asarray(b).reshape(-1)[0])
        if self._readout_w.shape != (spec.delays * spec.width,):
            raise ValueError(
                f"ARX weights of shape {self._readout_w.shape} do not fit the window spec {spec.to_dict()}"
            )
        super().__init__(spec, online)

    def _readout_input(self, window):
        return window.reshape(-1)

    def arrays(self):
        return {"w": self._readout_w, "b": np.array([self._readout_b])}


_KINDS = {"narx": NARXPredictor, "arx": ARXPredictor}


def save(predictor, path, meta=None):
    """Write a NARX or ARX predictor's weights and window spec to an .npz file."""
    header = {"kind": predictor.name, "version": FORMAT_VERSION, "spec": predictor.spec.to_dict(),
              "meta": meta or {}}
    np.savez(path, header=np.array(json.dumps(header)), **predictor.arrays())


def load(path, online=False):
    """Read a predictor written by `save`. Raises OSError or ValueError for a missing or corrupt file."""
    try:
        with np.load(path, allow_pickle=False) as data:
            header = json.loads(str(data["header"]))
            arrays = {k: data[k] for k in data.files if k != "header"}
    except (OSError, EOFError) as exc:
        raise OSError(f"cannot read predictor model {path!r}: {exc}") from exc
    except (KeyError, ValueError, json.JSONDecodeError) as exc:
        raise ValueError(f"predictor model {path!r} is corrupt: {exc}") from exc
    if header.get("version") != FORMAT_VERSION or header.get("kind") not in _KINDS:
        raise ValueError(f"predictor model {path!r} has kind={header.get('kind')!r} "
                         f"version={header.get('version')!r}; expected one of {list(_KINDS)} version {FORMAT_VERSION}")
    spec = WindowSpec.from_dict(header["spec"])
    try:
        predictor = _KINDS[header["kind"]](spec, online=online, **arrays)
    except TypeError as exc:
        raise ValueError(f"predictor model {path!r} is corrupt: {exc}") from exc
    predictor.meta = header.get("meta", {})
    return predictor


def load_default(kind, online=False):
    """The model shipped in predictor/models/ for `kind` ("narx" or "arx")."""
    if kind not in _KINDS:
        raise ValueError(f"kind={kind!r} is not allowed: use one of {list(_KINDS)}")
    return load(os.path.join(MODEL_DIR, f"{kind}_default.npz"), online=online)
