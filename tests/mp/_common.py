"""Shared start-up of the multi-process test workers (the benchmarks' start-up) and test predictors."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def init_worker():
    from benchmarks.runtime import init_worker as start

    return start(pin=False)


def make_test_predictors():
    """Predictors for the tests: one that jumps at random, one that fails in every way it can."""
    import numpy as np

    from predictor.base import SpeedPredictor

    class RandomPredictor(SpeedPredictor):
        """Forecasts a random speed each step so the batch sizes keep changing."""

        name = "random"

        def __init__(self, seed):
            self.rng = np.random.default_rng(seed)
            super().__init__()

        def _forecast(self):
            return float(self.rng.uniform(1.0, 100.0))

    class FailingPredictor(RandomPredictor):
        """Raises, returns NaN, inf, 0 or a negative value on a fixed rota of steps."""

        name = "failing"

        def _forecast(self):
            step = len(self.history)
            if step % 5 == 1:
                raise RuntimeError("predictor exploded")
            return [float("nan"), float("inf"), 0.0, -3.0, super()._forecast()][step % 5]

    return RandomPredictor, FailingPredictor


def balancing_policy():
    """lbbsp's policy always taking the split that balances its planned speeds: the simulator's `abl-mean`
    (benchmarks.ablation). The default starts at equal batches and leaves them once a balanced split has been faster
    in hindsight, which on the tests' alike workers the timings' noise decides."""
    from benchmarks.ablation import ABLATIONS

    return ABLATIONS["abl-mean"][1]


def trusting_policy(**kwargs):
    """lbbsp's policy, planning with every valid forecast (the default uses a worker's forecasts only where they
    have lately beaten its measured level), always balancing the forecasts themselves (`balancing_policy`) and
    taking new batch shapes to cost nothing (where a first visit measures a set-up longer than a step, the default
    values moves at the measured speed levels): the tests' predictors alone then set the split."""
    import numpy as np

    class Trusting(balancing_policy()):
        def curves(self, forecast, *measured):
            speeds, offsets, floors = super().curves(forecast, *measured)
            good = np.isfinite(forecast) & (np.asarray(forecast) > 0)
            return np.where(good, forecast, speeds), offsets, floors

        def setup_cost(self, target):
            return 0.0

    return Trusting(**kwargs)


def sine_job():
    """A tiny regression (x = sample index, y = sin x) that any rank reads by index: its compiled model, with
    lbbsp's optimizer, and its sample function."""
    import numpy as np
    import tensorflow as tf

    import lbbsp.keras as lb

    def fetch(indices):
        x = indices.astype(np.float32)[:, None]
        return x, np.sin(x)

    model = tf.keras.Sequential([tf.keras.layers.Dense(4, activation="tanh", input_shape=(1,)),
                                 tf.keras.layers.Dense(1)])
    model.compile(optimizer=lb.DistributedOptimizer(tf.keras.optimizers.SGD(0.01)), loss="mse")
    return model, fetch
