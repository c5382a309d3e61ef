"""Run under horovodrun: parts of lbbsp fail mid-training, and training goes on.

Every rank streams its step log to CSV_PATH (the test gives /dev/full, where every write fails with a full
disk), saves lbbsp's state each epoch through a predictor that cannot be pickled, and decides with a policy
that returns a split of the wrong total at every 10th decision. The job must train every epoch with every rank
on the same split; each rank writes what happened to DIR/failures_{rank}.json.
Usage: horovodrun -np N python tests/mp/plugin_failures.py DIR CSV_PATH
"""
import json
import logging
import os
import sys
import threading

import numpy as np

from _common import balancing_policy, init_worker, sine_job

hvd, tf = init_worker()
import lbbsp.keras as lb  # noqa: E402
from horovod.tensorflow import allgather_object  # noqa: E402
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


class Miscounting(balancing_policy()):
    """LB-BSP always balancing its planned speeds (on these alike workers the default keeps equal batches), but every
    10th decision's split holds one sample too many (decisions, not steps: with a decision period, the steps decided
    on need not include any given step)."""

    decisions = 0

    def after_step(self, stats, next_global_batch):
        out = super().after_step(stats, next_global_batch)
        self.decisions += 1
        return out + np.eye(len(out), dtype=np.int64)[0] if self.decisions % 10 == 0 else out


model, fetch = sine_job()
feed = lb.BalancedFeed.from_function(fetch, 2048, global_batch=16, seed=1)
balancer = lb.LoadBalancer(feed, policy=Miscounting(), predictor=Unpicklable(), csv_path=csv_path,
                           state_path=os.path.join(out_dir, "state_{rank}.pkl"))
history = model.fit(feed.dataset(), steps_per_epoch=feed.steps_per_epoch, epochs=3, verbose=0,
                    callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0), balancer])
allgather_object(rank, name="saved")  # every rank's last save is over before any lists the folder
with open(os.path.join(out_dir, f"failures_{rank}.json"), "w") as fh:
    json.dump({"epochs": len(history.history["loss"]), "rows": len(balancer.history), "warnings": warnings,
               "resyncs": len(balancer.resynced), "batches": sorted({r["batch_size"] for r in balancer.history}),
               "state_files": sorted(os.listdir(out_dir))}, fh)
