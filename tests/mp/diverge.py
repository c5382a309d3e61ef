"""Run under horovodrun: ranks that compute different splits are found out and brought back together.

MODE 'inject': the last rank moves one sample between two workers in its own
decisions at two fixed steps, as a last-bit difference in its arithmetic would.
MODE 'cpu': rank 1 imports numpy with its AVX-512 kernels switched off
(NPY_DISABLE_CPU_FEATURES), so where the machine has AVX-512 its exp and log
round differently from the other ranks' (a cluster of mixed CPU generations).
Writes, per rank, the split each step ran, the steps at which the ranks
resynchronised and whether the start-up check saw different numpy builds.
Usage: horovodrun -np N python tests/mp/diverge.py OUT_JSON MODE
"""
import os
import sys

_AVX512 = "AVX512F AVX512CD AVX512_KNL AVX512_KNM AVX512_SKX AVX512_CLX AVX512_CNL AVX512_ICL AVX512_SPR"
if sys.argv[2] == "cpu" and os.environ.get("HOROVOD_RANK") == "1":
    os.environ["NPY_DISABLE_CPU_FEATURES"] = _AVX512  # before numpy is imported

import json  # noqa: E402
import logging  # noqa: E402

import numpy as np  # noqa: E402

from _common import init_worker, make_test_predictors, sine_job  # noqa: E402

hvd, tf = init_worker()
import lbbsp.keras as lb  # noqa: E402
from horovod.tensorflow import allgather_object  # noqa: E402
from lbbsp.policies import LBBSPPolicy  # noqa: E402

out_path, mode = sys.argv[1], sys.argv[2]
rank, size = hvd.rank(), hvd.size()
RandomPredictor, _ = make_test_predictors()
INJECT_AT = (4, 19)  # the last rank's own splits of steps 7 and 22 in 'inject' (not an epoch's first step)


class Drifting(LBBSPPolicy):
    """lbbsp's policy; on the last rank, two of its decisions move a sample from the largest batch to the smallest."""

    decisions = 0

    def after_step(self, stats, global_batch):
        sizes = np.array(super().after_step(stats, global_batch), dtype=np.int64)
        if mode == "inject" and rank == size - 1 and self.decisions in INJECT_AT:
            big, small = int(np.argmax(sizes)), int(np.argmin(sizes))
            sizes[big] -= 1
            sizes[small if small != big else (big + 1) % size] += 1
        self.decisions += 1
        return sizes


class Warnings(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


warnings = Warnings()
logging.getLogger("lbbsp").addHandler(warnings)


class Splits(tf.keras.callbacks.Callback):
    def __init__(self, balancer):
        super().__init__()
        self.balancer, self.log = balancer, []

    def on_train_batch_begin(self, batch, logs=None):
        self.log.append(self.balancer.split.tolist())  # the split this step runs (a resync replaces it at its end)


model, fetch = sine_job()
feed = lb.BalancedFeed.from_function(fetch, 240, global_batch=24, seed=1)
balancer = lb.LoadBalancer(feed, policy=Drifting(), predictor=RandomPredictor(seed=rank), warmup_steps=1,
                           decision_budget=None)  # a decision at every step: the injected ones land where planned
splits = Splits(balancer)
history = model.fit(feed.dataset(), steps_per_epoch=feed.steps_per_epoch, epochs=4, verbose=0,
                    callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0), balancer, splits])
result = {"splits": splits.log, "resynced": balancer.resynced, "resyncs": history.history["lbbsp_resyncs"],
          "build_warning": any("NPY_DISABLE_CPU_FEATURES" in m for m in warnings.messages)}
everyone = allgather_object(result)
if rank == 0:
    with open(out_path, "w") as fh:
        json.dump({"ranks": everyone}, fh)
