"""One worker's forecast of its next batch-free speed (b + k) / t, guarded so that it never fails a step.

A forecast runs on the step's critical path: where the predictor costs more than `budget` of the worker's compute
time, the worker forecasts its last measured speed instead (docs/method.md, section 2).
"""
import collections
import logging
import math
import time

from predictor import make_predictor
from predictor.base import is_valid_speed

from .checks import check_budget, integer, number
from .steptime import batch_free_speed

__all__ = ["Forecaster", "FORECAST_BUDGET"]

log = logging.getLogger(__name__)

#: Default share of a worker's compute time its predictor may take per step.
FORECAST_BUDGET = 0.01
#: Recent measurements (predictor cost, compute time) whose median the budget compares.
_TIMINGS = 5


class Forecaster:
    """Runs a `predictor.SpeedPredictor` on one worker's batch-free speeds; never raises, never returns junk.

    An exception, or a forecast that is not a positive number or lies `absurd` times outside the speeds measured,
    gives the last good forecast (one warning per kind). The predictor's cost (with its readings) is the larger of
    its median wall time and its median CPU time over the worker's share of a core; over `budget` of the median
    compute time, the forecast is the last speed and the predictor is re-timed every `probe_every` steps (`budget=None`:
    always run it). Only the gathered forecasts enter the decision, so a rank's clock cannot make ranks disagree.
    """

    def __init__(self, predictor="narx", absurd=10.0, budget=FORECAST_BUDGET, probe_every=32,
                 clock=time.perf_counter, cpu_clock=time.thread_time):
        self.absurd = number("absurd", absurd, 1.0, low_open=True)
        self.budget = check_budget(budget)
        self.probe_every = integer("probe_every", probe_every, 1)
        self._clock, self._cpu_clock = clock, cpu_clock
        self._named = predictor if isinstance(predictor, str) else None
        self.predictor = make_predictor(predictor)
        self._warned = set()
        self.reset()

    @property
    def name(self):
        return self.predictor.name

    def use_device(self, gpu):
        """A predictor given by name takes its model for the worker's device; an instance is kept as it is."""
        if self._named is not None:
            wanted = make_predictor(self._named, device="gpu" if gpu else "cpu")
            if type(wanted) is not type(self.predictor) or getattr(wanted, "device", None) != \
                    getattr(self.predictor, "device", None):
                self.predictor = wanted
                self.reset()

    @property
    def uses_features(self):
        return bool(getattr(self.predictor, "uses_features", False))

    def reset(self):
        """Forget the history (start of training)."""
        self.last_good = math.nan
        self.last_speed = math.nan
        self.low, self.high = math.inf, 0.0
        self.failures = 0
        self.model_steps = self.last_value_steps = 0
        self._costs = collections.deque(maxlen=_TIMINGS)
        self._computes = collections.deque(maxlen=_TIMINGS)
        self._since_model = 0
        self._over = False
        self._cpu_share = 1.0
        self.switches = 0
        self.shapes = set()
        try:
            self.predictor.reset()
        except Exception as exc:  # noqa: BLE001 - a plugin failure must not stop training
            self._warn("reset", f"predictor {self.name!r} failed to reset ({exc!r})")

    def _warn(self, kind, message):
        self.failures += 1
        if kind not in self._warned:
            self._warned.add(kind)
            log.warning("%s; falling back to the last good forecast (warned once)", message)

    @property
    def cost(self):
        """The predictor's expected wall time per forecast in seconds (NaN before any timing)."""
        if not self._costs:
            return math.nan
        return max(_median([w for w, _ in self._costs]), _median([c for _, c in self._costs]) / self._cpu_share)

    @property
    def wants_features(self):
        """Whether the coming step's readings are needed: not while the predictor is over budget, outside the window
        of its next re-timing."""
        lead = getattr(getattr(self.predictor, "spec", None), "delays", 0)
        return not self._over or self._since_model + 1 + lead >= self.probe_every

    def _affordable(self):
        """Run the predictor at this step? Always until it has been timed a few times, then within budget."""
        if self.budget is None or len(self._costs) < _TIMINGS or self._since_model + 1 >= self.probe_every:
            return True
        compute = _median(self._computes)
        if math.isnan(compute):
            return True
        over = not self.cost <= self.budget * compute
        if over != self._over:
            self._over = over
            self.switches += 1
            log.log(logging.INFO if self.switches == 1 else logging.DEBUG,
                    "lbbsp: the %s forecast takes %.2f ms, %.1f%% of this worker's %.1f ms of compute (budget %.1f%%); "
                    "%s", self.name, 1e3 * self.cost, 100 * self.cost / compute, 1e3 * compute, 100 * self.budget,
                    f"forecasting the last measured speed, re-timing it every {self.probe_every} steps" if over
                    else "forecasting with it again")
        return not over

    def _observe(self, speed, features):
        try:
            self.predictor.observe(speed, features)
        except Exception as exc:  # noqa: BLE001 - a plugin failure must not stop training
            self._warn("raise", f"predictor {self.name!r} raised {exc!r}")

    def update(self, batch, compute, offset=0.0, features=None, cpu_share=1.0, features_cost=(0.0, 0.0)):
        """Feed one step (batch samples in `compute` seconds, fixed cost `offset` samples); return the forecast.
        `cpu_share`: the share of a core this worker may use (its CPU quota, at most 1); `features_cost`: (wall, CPU)
        seconds that reading `features` took, counted in the cost of a predictor that uses them."""
        self._cpu_share = float(cpu_share) if 0.0 < cpu_share <= 1.0 else 1.0
        if int(batch) not in self.shapes:
            # A first step at a batch size includes the shape's set-up: no measurement of speed.
            self.shapes.add(int(batch))
            self._observe(math.nan, features)
            return self.last_good if is_valid_speed(self.last_good) else self.last_speed
        speed = batch_free_speed(batch, compute, offset)
        if is_valid_speed(speed):
            self.last_speed = speed
            self.low, self.high = min(self.low, speed), max(self.high, speed)
        if is_valid_speed(compute):
            self._computes.append(float(compute))
        if not self._affordable():
            self._since_model += 1
            self.last_value_steps += 1
            self._observe(speed, features)
            return self.last_speed if is_valid_speed(self.last_speed) else self.last_good
        self._since_model = 0
        self.model_steps += 1
        started, cpu = self._clock(), self._cpu_clock()
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
        finally:
            extra = features_cost if self.uses_features and features is not None else (0.0, 0.0)
            self._costs.append((self._clock() - started + extra[0], self._cpu_clock() - cpu + extra[1]))
        if value is None:
            return self.last_good if is_valid_speed(self.last_good) else self.last_speed
        self.last_good = float(value)
        return self.last_good


def _median(values):
    return float(sorted(values)[len(values) // 2]) if values else math.nan
