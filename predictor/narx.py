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
shipped one on every step (exponentially weighted |log error|, weight
ERROR_RATE for the newest step); when its error exceeds 1.25 x the shipped
readout's, it is reset to the shipped weights, and the forecast comes from
whichever of the two has been better, so adaptation cannot diverge.

The worker's last measured speed is scored the same way, and is the forecast
whenever it has lately been better than the model's (the count is kept in
`persisted`). A model trained on noisy shared machines smooths; where a
worker's speed moves little from step to step, or in runs of long steps,
its own last speed is the better forecast, and a worker should not pay for
a model that does not fit it. Too little history or an invalid window falls
back to an EMA forecast.
"""
import json
import logging
import os

import numpy as np

from .base import SpeedPredictor
from .baselines import EMAPredictor
from .features import LOG_CLIP, WindowSpec

__all__ = ["NARXPredictor", "ARXPredictor", "load", "load_default", "model_path", "MODEL_DIR", "gru_forward"]

log = logging.getLogger(__name__)

MODEL_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "models")
FORMAT_VERSION = 1
#: Weight of the newest step in the exponentially weighted forecast errors that pick the forecast.
ERROR_RATE = 0.05


def gru_weights(kernel, recurrent_kernel, bias):
    """A Keras GRU's weights (reset_after=True) rearranged for `gru_forward_prepared`.

    The recurrent bias becomes the last row of the recurrent kernel (the
    hidden state carries a constant 1), and the update and reset gate columns
    are negated, so that exp(.) of a gate's input is directly exp(-a) of its
    sigmoid: two numpy calls fewer per time step.
    """
    units = np.shape(recurrent_kernel)[0]
    sign = np.ones(3 * units)
    sign[:2 * units] = -1.0
    kernel = np.asarray(kernel, dtype=np.float64) * sign
    bias = np.asarray(bias, dtype=np.float64).reshape(2, -1)
    recurrent = np.vstack([np.asarray(recurrent_kernel, dtype=np.float64), bias[1]]) * sign
    return kernel, bias[0] * sign, recurrent


def gru_forward_prepared(window, kernel, input_bias, recurrent):
    """Final hidden state of a GRU over `window` (steps, inputs), with weights from `gru_weights`.

    Runs at every training step: the arithmetic is done in place in a few
    preallocated buffers, since on small arrays numpy's per-call cost dominates.
    """
    units = recurrent.shape[0] - 1
    x_proj = window @ kernel
    x_proj += input_bias
    x_gates, x_cand = x_proj[:, :2 * units], x_proj[:, 2 * units:]
    state = np.zeros(units + 1)
    state[units] = 1.0  # multiplies the recurrent bias row
    h = state[:units]
    rec = np.empty(3 * units)
    rec_gates, rec_cand = rec[:2 * units], rec[2 * units:]
    gates = np.empty(2 * units)
    z, r = gates[:units], gates[units:]
    cand = np.empty(units)
    for t in range(x_proj.shape[0]):
        np.dot(state, recurrent, out=rec)
        np.add(x_gates[t], rec_gates, out=gates)  # minus the gates' inputs
        np.exp(gates, out=gates)
        gates += 1.0
        np.reciprocal(gates, out=gates)  # sigmoid
        np.multiply(r, rec_cand, out=cand)
        cand += x_cand[t]
        np.tanh(cand, out=cand)
        h -= cand
        h *= z
        h += cand  # z * h + (1 - z) * cand
    return h.copy()


def gru_forward(window, kernel, recurrent_kernel, bias):
    """Final hidden state of a Keras GRU (reset_after=True, sigmoid/tanh) over `window` (steps, inputs)."""
    return gru_forward_prepared(window, *gru_weights(kernel, recurrent_kernel, bias))


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
        self._errors = np.zeros(3)  # EW |log error| of the shipped readout, the adapted one, the last value
        self.fallbacks = 0
        self.rls_resets = 0
        self.persisted = 0

    def __setstate__(self, state):
        """Unpickle (lbbsp checkpoints hold the predictor), also one saved before the last value was scored."""
        errors = np.asarray(state.get("_errors", np.zeros(3)), dtype=np.float64)
        if errors.size == 2:
            errors = np.append(errors, errors[0])  # the last value starts level with the model, which wins ties
        state.update(_errors=errors, persisted=state.get("persisted", 0))
        self.__dict__.update(state)

    def observe(self, speed, features=None):
        super().observe(speed, features)
        self._fallback.observe(speed, features)
        value = self.history.speeds[-1]
        if self._pending is not None and np.isfinite(value):
            phi, level, last = self._pending
            target = float(np.clip(np.log(value / level), -LOG_CLIP, LOG_CLIP))
            shipped = float(phi @ self._readout_w + self._readout_b)
            adapted = self._rls.predict(phi) if self._rls is not None else shipped
            persisted = float(np.clip(np.log(last / level), -LOG_CLIP, LOG_CLIP))
            errors = np.abs([shipped - target, adapted - target, persisted - target])
            self._errors += ERROR_RATE * (errors - self._errors)
            if self._rls is not None:
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
        last = self.history.speeds[-1]
        self._pending = (phi, level, last) if np.isfinite(last) else None
        best = 0
        if self._rls is not None and self._errors[1] < self._errors[0]:
            best = 1
        if self._pending is not None and self._errors[2] < self._errors[best]:
            self.persisted += 1
            return float(last)  # this worker's last speed has lately been the better forecast
        out = self._rls.predict(phi) if best == 1 else float(phi @ self._readout_w + self._readout_b)
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
        self._prepared = gru_weights(self.kernel, self.recurrent_kernel, self.bias)
        super().__init__(spec, online)

    def __getstate__(self):
        return {key: value for key, value in self.__dict__.items() if key != "_prepared"}

    def __setstate__(self, state):
        super().__setstate__(state)
        self._prepared = gru_weights(self.kernel, self.recurrent_kernel, self.bias)

    def _readout_input(self, window):
        return gru_forward_prepared(window, *self._prepared)

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


def model_path(kind, device="cpu", directory=None):
    """Where the model of `kind` for `device` is (in `directory`, default the shipped models): {kind}_default.npz
    for CPU workers, {kind}_gpu.npz for GPU workers."""
    return os.path.join(directory or MODEL_DIR, f"{kind}_{'gpu' if device == 'gpu' else 'default'}.npz")


def load_default(kind, online=False, device="cpu"):
    """The model shipped in predictor/models/ for `kind` ("narx" or "arx") and `device` ("cpu" or "gpu")."""
    if kind not in _KINDS:
        raise ValueError(f"kind={kind!r} is not allowed: use one of {list(_KINDS)}")
    predictor = load(model_path(kind, device), online=online)
    predictor.device = device
    return predictor
