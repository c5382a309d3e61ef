"""Shared start-up of the multi-process test workers: one thread per worker, quiet TensorFlow, Horovod up."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def init_worker():
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    import horovod.tensorflow.keras as hvd

    hvd.init()
    return hvd, tf


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
