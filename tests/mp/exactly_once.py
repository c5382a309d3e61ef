"""Run under horovodrun: every sample read exactly once per epoch while batch sizes change every step.

Also checks that every rank took the same decision at every step, that the
train function was traced once for all batch sizes, and (with 'failing') that
a predictor which raises or returns NaN/inf/<=0 on one rank neither kills
nor hangs the job.
Usage: horovodrun -np N python tests/mp/exactly_once.py OUT_JSON PREDICTOR(random|failing) [PIPELINE(function|sample)]
[MULTIPLE] [DECISIONS(every|held)]

MULTIPLE is the feed's batch_multiple (the batch grid; default 1), or 'auto': the default grid for a
global batch of 48 on 3 CPU workers (any batch size). lbbsp's policy plans with every valid forecast here, so the
random ones move the split at every step.

With 'sample' the data comes through the per-sample tf.data pipeline with one step
prefetched; every loaded index is recorded with tf.py_function. DECISIONS 'every' (the default) decides at
every step; 'held' gives decisions a budget no decision fits, so the split decided from the first step's rows
holds for the whole run (lbbsp.controller.MAX_PERIOD steps).
"""
import json
import sys

import numpy as np

from _common import init_worker, make_test_predictors, trusting_policy

hvd, tf = init_worker()
import lbbsp.keras as lb  # noqa: E402
from horovod.tensorflow import allgather_object  # noqa: E402

out_path, kind = sys.argv[1], sys.argv[2]
pipeline = sys.argv[3] if len(sys.argv) > 3 else "function"
multiple = sys.argv[4] if len(sys.argv) > 4 else "1"
multiple, global_batch = (None, 48) if multiple == "auto" else (int(multiple), 24)
decision_budget = 1e-12 if len(sys.argv) > 5 and sys.argv[5] == "held" else None
RandomPredictor, FailingPredictor = make_test_predictors()


rank = hvd.rank()
N_SAMPLES, EPOCHS = 101, 3
read = []


def fetch(indices):
    read.append(indices.copy())
    x = indices.astype(np.float32)[:, None]
    return x, np.sin(x)


class Decisions(tf.keras.callbacks.Callback):
    def __init__(self, balancer):
        super().__init__()
        self.balancer, self.log = balancer, []

    def on_train_batch_end(self, batch, logs=None):
        self.log.append(self.balancer.split.tolist())  # the split this step used
        self.expected.append(feed.indices(self.epoch, batch, self.balancer.split).tolist())

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_begin(self, logs=None):
        self.expected = []


def note(index):
    loaded.add(int(index))
    return index


loaded = set()


def load(index):
    tf.py_function(note, [index], tf.int64)
    x = tf.cast(index, tf.float32)[None]
    return x, tf.sin(x)


tf.keras.utils.set_random_seed(0)
model = tf.keras.Sequential([tf.keras.layers.Dense(4, activation="tanh", input_shape=(1,)), tf.keras.layers.Dense(1)])
model.compile(optimizer=lb.DistributedOptimizer(tf.keras.optimizers.Adam(0.01)), loss="mse")
if pipeline == "sample":
    feed = lb.BalancedFeed.from_sample_fn(load, N_SAMPLES, global_batch=global_batch, seed=5, prefetch=1,
                                          batch_multiple=multiple)
else:
    feed = lb.BalancedFeed.from_function(fetch, N_SAMPLES, global_batch=global_batch, seed=5,
                                         batch_multiple=multiple)
last = rank == hvd.size() - 1
predictor = (FailingPredictor if kind == "failing" and last else RandomPredictor)(seed=rank)
# Random forecasts, always made (no forecast budget: on a loaded machine the predictor would otherwise give way to
# the last measured speed) and always trusted (a change threshold nothing exceeds), move the split at every step.
policy = trusting_policy(min_gain=0.0, model={"change": 100.0})
balancer = lb.LoadBalancer(feed, policy=policy, predictor=predictor, warmup_steps=0, decision_budget=decision_budget,
                           forecast_budget=None)
decisions = Decisions(balancer)
dataset = feed.dataset()
read.clear()  # dataset() read one sample to learn the element signature
model.fit(dataset, steps_per_epoch=feed.steps_per_epoch, epochs=EPOCHS, verbose=0,
          callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0), balancer, decisions])

per_epoch = []
steps = feed.steps_per_epoch
if pipeline == "sample":
    # What each trained step was planned to read, every index of which the pipeline loaded.
    chunks = [np.array(c, dtype=np.int64) for c in decisions.expected]
    assert all(set(c.tolist()) <= loaded for c in chunks), "a planned sample was not loaded"
else:
    chunks = read
for epoch in range(EPOCHS):
    per_epoch.append(np.concatenate(chunks[epoch * steps:(epoch + 1) * steps]).tolist())
mine = {
    "epochs": per_epoch,
    "decisions": decisions.log,
    "batch_sizes": sorted({len(r) for r in chunks}),
    "tracing_count": model.train_function.experimental_get_tracing_count(),
    "predictor_failures": balancer.forecaster.failures,
    "offsets": balancer.controller.policy.model.offsets.tolist(),  # the step-time model, the same on every rank
    "identified": balancer.controller.policy.model.identified.tolist(),
    "speeds": balancer.controller.policy.model.speeds.tolist(),
    "resynced": balancer.resynced,  # steps at which the ranks' split digests differed (none: they agree)
    "final_loss": float(model.evaluate(np.arange(5, dtype=np.float32)[:, None], np.zeros((5, 1)), verbose=0)),
}
everyone = allgather_object(mine)
if rank == 0:
    with open(out_path, "w") as fh:
        json.dump({"num_samples": N_SAMPLES, "steps_per_epoch": steps, "global_batch": global_batch,
                   "grid": feed.grid, "ranks": everyone}, fh)
