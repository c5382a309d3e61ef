"""Run under elastic horovodrun: workers 2 -> 3 -> 2 -> 3 -> 2, the last leave by SIGKILL mid-epoch.

Rank 0 drives the membership by rewriting the hosts file that the discovery
script prints: it adds 127.0.0.1:1 (a join), removes it (a graceful leave)
and adds it again; the worker on 127.0.0.1 then kills itself with SIGKILL in
the middle of an epoch. Every process appends the indices of the steps that
were committed (written at each commit, dropped on a restore) to its own
file, and at the end every surviving rank writes its weights, so the test
can check exactly-once per epoch and identical models. Mode "scale": one
join only (2 -> 3), with the global batch scaled by the number of workers and
the learning rate ramped over 4 steps; each record has the step's learning rate.
Usage: horovodrun ... --host-discovery-script DIR/discover.sh python tests/mp/elastic.py DIR [MODE(churn|scale)]
"""
import json
import os
import signal
import sys
import time

import numpy as np

from _common import init_worker

hvd, tf = init_worker()
import lbbsp.keras as lb  # noqa: E402

out_dir = sys.argv[1]
mode = sys.argv[2] if len(sys.argv) > 2 else "churn"
N_SAMPLES, GLOBAL_BATCH, EPOCHS = 192, 16, 5 if mode == "churn" else 3
host = os.environ.get("HOROVOD_HOSTNAME", "?")
where = {"epoch": -1, "step": -1, "count": 0}
pending, phase_file, hosts_file = [], os.path.join(out_dir, "phase"), os.path.join(out_dir, "hosts")
records = open(os.path.join(out_dir, f"committed_{os.getpid()}.jsonl"), "a")


def fetch(indices):
    where["indices"] = indices.tolist()
    time.sleep(0.15)  # slow steps, so membership changes land mid-epoch
    x = (indices.astype(np.float32) / N_SAMPLES)[:, None]
    return x, np.sin(3 * x)


class RecordingState(lb.elastic.ElasticState):
    """Writes the indices of committed steps at every commit; forgets the uncommitted ones on a restore."""

    def save(self):
        super().save()
        for line in pending:
            records.write(line + "\n")
        records.flush()
        pending.clear()

    def restore(self):
        pending.clear()
        super().restore()


def phase():
    return int(open(phase_file).read()) if os.path.exists(phase_file) else 0


def set_hosts(text, new_phase):
    with open(hosts_file + ".tmp", "w") as fh:
        fh.write(text)
    os.replace(hosts_file + ".tmp", hosts_file)
    with open(phase_file, "w") as fh:
        fh.write(str(new_phase))


class Drive(tf.keras.callbacks.Callback):
    def on_train_begin(self, logs=None):
        where["count"] = 0

    def on_epoch_begin(self, epoch, logs=None):
        where["epoch"] = int(epoch)

    def on_train_batch_begin(self, step, logs=None):
        size, now = hvd.size(), phase()
        if now == 3 and size == 3 and host == "127.0.0.1" and where["count"] >= 3 and step > 0:
            os.kill(os.getpid(), signal.SIGKILL)

    def on_train_batch_end(self, step, logs=None):
        where["count"] += 1
        lr = float(tf.keras.backend.get_value(self.model.optimizer.learning_rate))
        pending.append(json.dumps({"epoch": where["epoch"], "rank": hvd.rank(), "size": hvd.size(),
                                   "indices": where["indices"], "lr": lr, "global": int(balancer.split.sum())}))
        if hvd.rank() != 0 or where["count"] < 4 or (mode == "scale" and phase() >= 1):
            return
        size, now = hvd.size(), phase()
        if now == 0 and size == 2:
            set_hosts("localhost:2\n127.0.0.1:1\n", 1)
        elif now == 1 and size == 3:
            set_hosts("localhost:2\n", 2)
        elif now == 2 and size == 2:
            set_hosts("localhost:2\n127.0.0.1:1\n", 3)


tf.keras.utils.set_random_seed(0)
model = tf.keras.Sequential([tf.keras.layers.Dense(8, activation="tanh", input_shape=(1,)), tf.keras.layers.Dense(1)])
model.compile(optimizer=lb.DistributedOptimizer(tf.keras.optimizers.SGD(0.05, momentum=0.5)), loss="mse")
feed = lb.BalancedFeed.from_function(fetch, N_SAMPLES, global_batch=GLOBAL_BATCH, seed=5)
balancer = lb.LoadBalancer(feed, policy="lbbsp", predictor="last", warmup_steps=1,
                           csv_path=os.path.join(out_dir, f"steps_{os.getpid()}.csv"))
state = RecordingState(model, balancer, batches_per_commit=2, scale_batch=mode == "scale", ramp_steps=4)


@hvd.elastic.run
def train(state):
    lb.elastic.fit(state, epochs=EPOCHS, callbacks=[Drive()], verbose=0)


train(state)
weights = np.concatenate([w.ravel() for w in model.get_weights()])
with open(os.path.join(out_dir, f"final_{hvd.rank()}.json"), "w") as fh:
    json.dump({"rank": hvd.rank(), "size": hvd.size(), "host": host, "weights": weights.tolist(),
               "epoch": state.epoch}, fh)
