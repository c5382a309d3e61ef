"""Run under horovodrun twice: train, crash on every rank, then resume from the checkpoints.

Mode "steps": phase "crash" trains with Keras' BackupAndRestore (every 3
steps) and lbbsp's state file (every 3 steps) and raises after step 7 of
epoch 1; phase "resume" starts a fresh process: Keras restores the model and
resumes at step 6 of epoch 1, lbbsp restores its split, model and predictor.
Mode "epochs": ModelCheckpoint saves the weights at every epoch end, lbbsp its
state; the crash comes after step 3 of epoch 1, and the resume loads the
weights and calls fit(initial_epoch=1). Each phase writes the (epoch, step,
indices) it read and the batch sizes it used, per rank.
Usage: horovodrun -np N python tests/mp/resume.py DIR PHASE(crash|resume) [MODE(steps|epochs)]
"""
import json
import os
import sys

import numpy as np

from _common import init_worker, trusting_policy

hvd, tf = init_worker()
import lbbsp.keras as lb  # noqa: E402
from predictor.base import SpeedPredictor  # noqa: E402

out_dir, phase = sys.argv[1], sys.argv[2]
mode = sys.argv[3] if len(sys.argv) > 3 else "steps"
crash_step = 7 if mode == "steps" else 3
rank, size = hvd.rank(), hvd.size()
N_SAMPLES, EPOCHS = 96, 3  # 12 steps of 8: BackupAndRestore's count and lbbsp's stay aligned
read, sizes, where = [], [], {"epoch": -1, "step": -1}


class RankSpeed(SpeedPredictor):
    """Worker r forecasts 10 * (r + 1) samples/s: the balanced split is 1 : 2 : 3."""

    name = "rank-speed"

    def _forecast(self):
        return 10.0 * (rank + 1)


def fetch(indices):
    read.append((where["epoch"], where["step"], indices.tolist()))
    x = indices.astype(np.float32)[:, None]
    return x, np.sin(x)


class Record(tf.keras.callbacks.Callback):
    def on_epoch_begin(self, epoch, logs=None):
        where["epoch"] = int(epoch)

    def on_train_batch_begin(self, step, logs=None):
        where["step"] = int(step)
        sizes.append((where["epoch"], int(step), balancer.split.tolist()))  # the split this step uses

    def on_train_batch_end(self, step, logs=None):
        if phase == "crash" and where["epoch"] == 1 and step == crash_step:
            raise RuntimeError(f"simulated failure after step {crash_step} of epoch 1")


tf.keras.utils.set_random_seed(0)
model = tf.keras.Sequential([tf.keras.layers.Dense(4, activation="tanh", input_shape=(1,)), tf.keras.layers.Dense(1)])
model.compile(optimizer=lb.DistributedOptimizer(tf.keras.optimizers.SGD(0.01)), loss="mse")
feed = lb.BalancedFeed.from_function(fetch, N_SAMPLES, global_batch=8, seed=3)
# k pinned at 0 (min_spread=1), the forecasts always made (no forecast budget) and always trusted (a change
# threshold nothing exceeds), a decision at every step (no decision budget: with one, the split decided while the
# first, traced steps made rank 2's forecast look absurd could hold for the whole run): the split follows the
# forecasts exactly, 1 : 2 (: 3), whatever the tiny model's timings.
policy = trusting_policy(min_gain=0.0, model={"min_spread": 1.0, "change": 100.0})
balancer = lb.LoadBalancer(feed, policy=policy, predictor=RankSpeed(), warmup_steps=0, forecast_budget=None,
                           decision_budget=None,
                           state_path=os.path.join(out_dir, "lbbsp_state_{rank}.pkl"),
                           state_every=3 if mode == "steps" else None)
weights = os.path.join(out_dir, f"weights_{rank}.h5")
initial_epoch = 0
if mode == "steps":
    checkpoint = tf.keras.callbacks.BackupAndRestore(os.path.join(out_dir, f"backup_{rank}"), save_freq=3,
                                                     delete_checkpoint=False)
else:
    checkpoint = tf.keras.callbacks.ModelCheckpoint(weights, save_weights_only=True)
    if phase == "resume":
        model.load_weights(weights)
        initial_epoch = 1
dataset = feed.dataset()
read.clear()  # dataset() read one sample to learn the element signature
try:
    model.fit(dataset, steps_per_epoch=feed.steps_per_epoch, epochs=EPOCHS, verbose=0, initial_epoch=initial_epoch,
              callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0), checkpoint, balancer, Record()])
    outcome = "finished"
except RuntimeError as exc:
    outcome = str(exc)
with open(os.path.join(out_dir, f"{phase}_{rank}.json"), "w") as fh:
    json.dump({"outcome": outcome, "read": read, "sizes": sizes, "resumed": bool(balancer.resumed),
               "weights": [w.tolist() for w in model.get_weights()]}, fh)
