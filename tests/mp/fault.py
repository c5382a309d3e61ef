"""Run under horovodrun: one rank raises inside a training step; the whole job must end, not hang.

The error is raised by the data function on the last rank at step 5 of epoch 1,
i.e. inside the train step while the other ranks wait in the allreduce.
Usage: horovodrun -np N python tests/mp/fault.py
"""
import numpy as np

from _common import init_worker

hvd, tf = init_worker()
import lbbsp.keras as lb  # noqa: E402

rank, size = hvd.rank(), hvd.size()
calls = []


def fetch(indices):
    calls.append(len(indices))
    if rank == size - 1 and len(calls) == 12:
        raise RuntimeError(f"injected failure on rank {rank}")
    x = indices.astype(np.float32)[:, None]
    return x, np.sin(x)


model = tf.keras.Sequential([tf.keras.layers.Dense(4, activation="tanh", input_shape=(1,)), tf.keras.layers.Dense(1)])
model.compile(optimizer=lb.DistributedOptimizer(tf.keras.optimizers.SGD(0.01)), loss="mse")
feed = lb.BalancedFeed.from_function(fetch, 64, global_batch=8, seed=1)
model.fit(feed.dataset(), steps_per_epoch=feed.steps_per_epoch, epochs=3, verbose=0,
          callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0), lb.LoadBalancer(feed, predictor="ema")])
