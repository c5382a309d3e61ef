"""Run under horovodrun: lbbsp's own files fail mid-training, and training goes on.

Every rank streams its step log to CSV_PATH (the test gives /dev/full, where every write fails with a full
disk) and saves lbbsp's state each epoch through a predictor that cannot be pickled. The job must train every
epoch; each rank writes what happened to DIR/io_{rank}.json.
Usage: horovodrun -np N python tests/mp/io_failure.py DIR CSV_PATH
"""
import json
import logging
import os
import sys
import threading

import numpy as np

from _common import init_worker

hvd, tf = init_worker()
import lbbsp.keras as lb  # noqa: E402
from predictor.base import SpeedPredictor  # noqa: E402

out_dir, csv_path = sys.argv[1], sys.argv[2]
rank = hvd.rank()
warnings = []


class Collect(logging.Handler):
    def emit(self, record):
        if record.levelno >= logging.WARNING:
            warnings.append(record.getMessage())


logging.getLogger("lbbsp").addHandler(Collect())


class Unpicklable(SpeedPredictor):
    """Forecasts the last speed and holds a lock, which pickle refuses."""

    name = "unpicklable"

    def __init__(self):
        self.lock = threading.Lock()
        super().__init__()

    def _forecast(self):
        return self.history.last_valid()


def fetch(indices):
    x = indices.astype(np.float32)[:, None]
    return x, np.sin(x)


model = tf.keras.Sequential([tf.keras.layers.Dense(4, activation="tanh", input_shape=(1,)), tf.keras.layers.Dense(1)])
model.compile(optimizer=lb.DistributedOptimizer(tf.keras.optimizers.SGD(0.01)), loss="mse")
feed = lb.BalancedFeed.from_function(fetch, 2048, global_batch=16, seed=1)
balancer = lb.LoadBalancer(feed, predictor=Unpicklable(), csv_path=csv_path,
                           state_path=os.path.join(out_dir, "state_{rank}.pkl"))
history = model.fit(feed.dataset(), steps_per_epoch=feed.steps_per_epoch, epochs=3, verbose=0,
                    callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0), balancer])
with open(os.path.join(out_dir, f"io_{rank}.json"), "w") as fh:
    json.dump({"epochs": len(history.history["loss"]), "rows": len(balancer.history), "warnings": warnings,
               "state_files": sorted(os.listdir(out_dir))}, fh)
