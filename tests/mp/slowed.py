"""Run under horovodrun -np 2: rank 1 slowed for real; lbbsp must shrink its batch.

Rank 1 runs under a cgroup CPU quota (0.3 cores) where cgroups are writable,
else next to a busy process pinned to its core. Both policies train in the
same run, one after the other; epoch times exclude the first (warm-up) epoch.
With "gpu", every rank tells lbbsp it trains on a GPU (the decision path's GPU mode: a set-up cost for new
batch shapes, floors, pooled fixed costs, running mean speeds) and sets up every grid shape before training.
Usage: horovodrun -np 2 python tests/mp/slowed.py OUT_JSON [POLICY] [gpu]
"""
import contextlib
import json
import os
import sys
import time

import numpy as np

from _common import init_worker

hvd, tf = init_worker()
import lbbsp.keras as lb  # noqa: E402
from horovod.tensorflow import allgather_object  # noqa: E402
from benchmarks.contention import CpuHog, CpuQuota, cgroups_writable, pin_to_cores  # noqa: E402

out_path = sys.argv[1]
policy = sys.argv[2] if len(sys.argv) > 2 else "lbbsp"
gpu = len(sys.argv) > 3 and sys.argv[3] == "gpu"
if gpu:
    import lbbsp.keras.callbacks  # noqa: E402

    lbbsp.keras.callbacks._on_gpu = lambda: True
rank, size = hvd.rank(), hvd.size()
cores = sorted(os.sched_getaffinity(0))
pin_to_cores([cores[rank % len(cores)]])
use_quota = cgroups_writable()
hvd.allreduce(tf.constant(0.0), name="barrier_setup")

rng = np.random.default_rng(0)
x = rng.normal(size=(8192, 64)).astype(np.float32)
y = rng.integers(0, 10, size=8192)


class EpochTimer(tf.keras.callbacks.Callback):
    def on_train_begin(self, logs=None):
        self.times = []

    def on_epoch_begin(self, epoch, logs=None):
        self._t = time.perf_counter()

    def on_epoch_end(self, epoch, logs=None):
        self.times.append(time.perf_counter() - self._t)


def run(policy_name):
    tf.keras.utils.set_random_seed(0)
    model = tf.keras.Sequential([tf.keras.layers.Dense(512, activation="relu", input_shape=(64,)),
                                 tf.keras.layers.Dense(512, activation="relu"),
                                 tf.keras.layers.Dense(10)])
    model.compile(optimizer=lb.DistributedOptimizer(tf.keras.optimizers.SGD(0.01)),
                  loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    feed = lb.BalancedFeed(x, y, global_batch=1024, seed=1)  # compute-heavy steps: the split decides the time
    balancer = lb.LoadBalancer(feed, policy=policy_name, predictor="ema",
                               csv_path=os.environ.get("LBBSP_TEST_CSV", "").format(policy=policy_name) or None,
                               warm_shapes=list(range(8, 1017, 8)) if gpu else [])
    timer = EpochTimer()
    model.fit(feed.dataset(), steps_per_epoch=feed.steps_per_epoch, epochs=4, verbose=0,
              callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0), balancer, timer])
    tail = [r for r in balancer.history if r["epoch"] >= 2]
    steptime = getattr(balancer.core.controller.policy, "model", None)
    gpu_mode = None if steptime is None else {"gpu": steptime.gpu, "mean_rate": steptime.mean_rate,
                                              "offset_prior": steptime.offset_prior,
                                              "set_up_measured": int(steptime.setup[0].sum()),
                                              "resyncs": len(balancer.core.resynced)}
    return {"gpu_mode": gpu_mode, "epoch_time": float(np.mean(timer.times[1:])),
            "batch": float(np.mean([r["batch_size"] for r in tail])),
            "overhead_ms": 1e3 * float(np.median([r["overhead"] for r in balancer.history])),
            "sizes": sorted({int(r["batch_size"]) for r in balancer.history}), "grid": feed.grid,
            "trace": [(int(r["epoch"]), int(r["step"]), int(r["batch_size"]), round(1e3 * r["compute"], 2))
                      for r in balancer.history]}  # (epoch, step, batch, compute ms): evidence should it fail


if rank == 1:
    slow = CpuQuota(0.3, pids=[os.getpid()]) if use_quota else CpuHog([cores[rank % len(cores)]])
else:
    slow = contextlib.nullcontext()
with slow if rank == 1 and use_quota else contextlib.nullcontext():
    if rank == 1 and not use_quota:
        slow.start()
    try:
        result = {"equal": run("equal"), policy: run(policy)}
    finally:
        if rank == 1 and not use_quota:
            slow.close()

gathered = allgather_object(result)
if rank == 0:
    with open(out_path, "w") as fh:
        json.dump({"slowdown": "cgroup quota 0.3 cores" if use_quota else "co-located CPU hog",
                   "policy": policy, "gpu": gpu, "ranks": gathered}, fh)
