"""Run under horovodrun: with forced unequal batches, lbbsp's weights equal single-process SGD on the same global
batches.

Usage: horovodrun -np N python tests/mp/equivalence.py OUT_JSON SHARES (e.g. 3,13) [OPTION]

OPTION "mixed_float16": that precision policy (Keras wraps both models' optimizers in a LossScaleOptimizer);
"fp16": the gradients compressed to 16 bits in the allreduce (hvd.Compression.fp16); "per_tensor": each gradient reduced
on its own (DistributedOptimizer(grouped=False)), the rows riding with the smallest gradient; "legacy_sparse": Keras'
legacy SGD, and an embedding whose gradient is sparse (tf.IndexedSlices, reduced apart from the dense ones).
"""
import json
import sys

import numpy as np

from _common import init_worker

hvd, tf = init_worker()
import horovod.tensorflow  # noqa: E402
import lbbsp.keras as lb  # noqa: E402
from lbbsp.consistency import digest  # noqa: E402
from lbbsp.exchange import unpack  # noqa: E402
from lbbsp.keras.optimizer import balance_state  # noqa: E402
from lbbsp.policies import FixedPolicy  # noqa: E402

out_path, shares = sys.argv[1], [float(s) for s in sys.argv[2].split(",")]
option = sys.argv[3] if len(sys.argv) > 3 else None
if option == "mixed_float16":
    tf.keras.mixed_precision.set_global_policy(option)
compression = hvd.Compression.fp16 if option == "fp16" else hvd.Compression.none
N, B, EPOCHS, LR = 50, 16, 2, 0.05
rng = np.random.default_rng(0)
x = rng.normal(size=(N + 30, 5)).astype(np.float32)
y = (x @ rng.normal(size=(5, 1)) + 0.1 * rng.normal(size=(N + 30, 1))).astype(np.float32)
x, y, x_val, y_val = x[:N], y[:N], x[N:], y[N:]
# Deliberately unequal validation shards: rank r gets a share proportional to r + 1.
cuts = np.cumsum([0] + [(r + 1) for r in range(hvd.size())])
bounds = np.round(cuts / cuts[-1] * len(x_val)).astype(int)
val_shard = (x_val[bounds[hvd.rank()]:bounds[hvd.rank() + 1]], y_val[bounds[hvd.rank()]:bounds[hvd.rank() + 1]])


SGD = tf.keras.optimizers.legacy.SGD if option == "legacy_sparse" else tf.keras.optimizers.SGD


def build():
    tf.keras.utils.set_random_seed(1)
    inputs = tf.keras.Input((5,))
    hidden = inputs
    if option == "legacy_sparse":  # an id per sample from its first feature: the embedding's gradient is sparse
        ids = tf.keras.layers.Lambda(lambda v: tf.cast(tf.abs(v[:, 0]) * 3, tf.int32) % 4)(inputs)
        hidden = tf.keras.layers.Concatenate()([inputs, tf.keras.layers.Embedding(4, 2)(ids)])
    hidden = tf.keras.layers.Dense(8, activation="tanh")(hidden)
    outputs = tf.keras.layers.Activation("linear", dtype="float32")(tf.keras.layers.Dense(1)(hidden))
    return tf.keras.Model(inputs, outputs)


model = build()
model.compile(optimizer=lb.DistributedOptimizer(SGD(LR, momentum=0.9), compression=compression,
                                                grouped=option != "per_tensor"),
              loss="mse", metrics=["mae"])
feed = lb.BalancedFeed(x, y, global_batch=B, seed=7)
balancer = lb.LoadBalancer(feed, policy=FixedPolicy(shares), warmup_steps=0)
hist = model.fit(feed.dataset(), steps_per_epoch=feed.steps_per_epoch, epochs=EPOCHS, verbose=0,
                 validation_data=val_shard, validation_batch_size=4,
                 callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0), balancer])

# Every rank received every rank's row whole: the split's digest of the last step, as each rank ran it.
gathered = unpack(balance_state(model.optimizer).gathered)
digests_ok = bool(np.all(gathered.split == digest(balancer.split)))
digests_ok = all(horovod.tensorflow.allgather_object(digests_ok))

if hvd.rank() == 0:
    # The same global batches on one machine, through plain Keras.
    ref = build()
    ref.compile(optimizer=SGD(LR, momentum=0.9), loss="mse", metrics=["mae"])
    losses = []
    for epoch in range(EPOCHS):
        ref.reset_metrics()
        order = np.concatenate([feed.indices(epoch, t, [int(feed.schedule[t])], rank=0)
                                for t in range(feed.steps_per_epoch)])
        for t in range(feed.steps_per_epoch):
            lo = int(feed.epoch_schedule.offsets(epoch)[t])
            idx = order[lo:lo + int(feed.schedule[t])]
            res = ref.train_on_batch(x[idx], y[idx], reset_metrics=False, return_dict=True)
        losses.append(res)
    diff = max(float(np.max(np.abs(a - b))) for a, b in zip(model.get_weights(), ref.get_weights()))
    ref_val = ref.evaluate(x_val, y_val, batch_size=7, verbose=0, return_dict=True)
    result = {
        "max_weight_diff": diff,
        "batches": sorted({r["batch_size"] for r in balancer.history}),
        "schedule": feed.schedule.tolist(),
        "lbbsp_loss": hist.history["loss"], "ref_loss": [r["loss"] for r in losses],
        "lbbsp_mae": hist.history["mae"], "ref_mae": [r["mae"] for r in losses],
        "lbbsp_val_loss": hist.history["val_loss"][-1], "ref_val_loss": ref_val["loss"],
        "lbbsp_val_mae": hist.history["val_mae"][-1], "ref_val_mae": ref_val["mae"],
        "lbbsp_keys": sorted(hist.history),
        "size": hvd.size(),
        "optimizer": type(model.optimizer).__name__,
        "digests_ok": digests_ok,
    }
    with open(out_path, "w") as fh:
        json.dump(result, fh)
