"""tf.data adapter for lbbsp.feed.BatchFeed: one dataset whose batch size may change at every step.

The batch dimension is declared unknown (None), so Keras traces its train
function once for all batch sizes. The generator runs inside the train step
(no prefetch, no autotuned buffering), so it reads the plan the callback
made for that very step.
"""
import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf

from ..feed import BatchFeed
from ..feed import _map

__all__ = ["BalancedFeed"]


def _spec(leaf):
    leaf = np.asarray(leaf)
    return tf.TensorSpec(shape=(None,) + leaf.shape[1:], dtype=tf.as_dtype(leaf.dtype))


class BalancedFeed(BatchFeed):
    """lbbsp.feed.BatchFeed bound to this Horovod rank, with `dataset()` for `model.fit`.

    Call `hvd.init()` first.
    """

    def __init__(self, x, y=None, *, global_batch, **kwargs):
        kwargs.setdefault("rank", hvd.rank())
        kwargs.setdefault("size", hvd.size())
        super().__init__(x, y, global_batch=global_batch, **kwargs)

    def dataset(self):
        """An endless dataset of this worker's batches; use with `steps_per_epoch=feed.steps_per_epoch`."""
        signature = _map(_spec, self.example())

        def batches():
            while True:
                yield self.next_batch()

        ds = tf.data.Dataset.from_generator(batches, output_signature=signature)
        options = tf.data.Options()
        options.autotune.enabled = False
        options.experimental_optimization.inject_prefetch = False
        options.experimental_optimization.map_parallelization = False
        options.threading.private_threadpool_size = 1
        return ds.with_options(options)
