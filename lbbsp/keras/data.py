"""tf.data adapter for lbbsp.feed.BatchFeed: one dataset whose batch size may change at every step.

The batch dimension is declared unknown (None), so Keras traces its train
function once for all batch sizes. Steps are served in the order the
callback plans them; with `prefetch=k` (k <= the callback's plan_ahead) the
pipeline prepares up to k planned steps while the current one trains, and
with a per-sample load function (`from_sample_fn`) each step's samples are
loaded by a parallel `map` before they are grouped into that step's batch.
"""
import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf

from ..feed import BatchFeed, FunctionSource
from ..feed import _map

__all__ = ["BalancedFeed"]

AUTOTUNE = tf.data.AUTOTUNE


def _spec(leaf):
    leaf = np.asarray(leaf)
    return tf.TensorSpec(shape=(None,) + leaf.shape[1:], dtype=tf.as_dtype(leaf.dtype))


class BalancedFeed(BatchFeed):
    """lbbsp.feed.BatchFeed bound to this Horovod rank, with `dataset()` for `model.fit`.

    Call `hvd.init()` first, or pass `rank` and `size`. `prefetch=1` lets the pipeline prepare the next
    planned step while the current one trains (at most the callback's plan_ahead). The arguments are
    lbbsp.feed.BatchFeed's.
    """

    def __init__(self, x, y=None, *, global_batch, sample_weight=None, seed=0, shuffle=True, drop_remainder=False,
                 b_min=1, b_max=None, batch_multiple=None, prefetch=0, rank=None, size=None, _source=None):
        super().__init__(x, y, global_batch=global_batch, sample_weight=sample_weight, seed=seed, shuffle=shuffle,
                         drop_remainder=drop_remainder, b_min=b_min, b_max=b_max, batch_multiple=batch_multiple,
                         prefetch=prefetch, rank=hvd.rank() if rank is None else rank,
                         size=hvd.size() if size is None else size, _source=_source)

    @classmethod
    def from_sample_fn(cls, load, num_samples, *, global_batch, num_parallel_calls=AUTOTUNE, prefetch=1,
                       **kwargs):
        """A feed whose samples come from `load(index)`, a tf.data function of one int64 index (read_file,
        decode, augment, ...) that returns one sample like `(x, y)`. Each step's samples are loaded by
        `map(load, num_parallel_calls)` and grouped into this worker's planned batch; `prefetch` steps are
        prepared ahead (the callback's plan_ahead must be at least as large).
        """
        if not callable(load):
            raise ValueError(f"load={load!r} is not allowed: give a function of one int64 sample index")
        feed = cls(None, global_batch=global_batch, prefetch=prefetch,
                   _source=FunctionSource(_unsupported_take, num_samples), **kwargs)
        feed.load, feed.num_parallel_calls = load, num_parallel_calls
        return feed

    def dataset(self):
        """An endless dataset of this worker's batches; use with `steps_per_epoch=feed.steps_per_epoch`."""
        options = tf.data.Options()
        options.experimental_optimization.inject_prefetch = False
        if getattr(self, "load", None) is not None:
            return self._sample_pipeline().with_options(options)
        signature = _map(_spec, self.example())

        def batches():
            generation = self.generation  # when iteration starts: after the callback bound the feed
            while True:
                item = self.next_batch(generation)
                if item is None:
                    return
                yield item

        ds = tf.data.Dataset.from_generator(batches, output_signature=signature)
        options.autotune.enabled = False
        options.experimental_optimization.map_parallelization = False
        options.threading.private_threadpool_size = 1
        if self.prefetch:
            ds = ds.prefetch(self.prefetch)
        return ds.with_options(options)

    def warm_batch(self, size):
        """`size` samples (the first ones, repeated where the data is smaller) as one batch (lbbsp.keras.warmup)."""
        indices = np.arange(size, dtype=np.int64) % self.num_samples
        if getattr(self, "load", None) is not None:
            return next(iter(tf.data.Dataset.from_tensor_slices(indices).map(self.load).batch(size)))
        return self.source.take(indices)

    def _sample_pipeline(self):
        def steps():
            generation = self.generation  # when iteration starts: after the callback bound the feed
            while True:
                item = self.next_indices(generation=generation)
                if item is None:
                    return
                yield item[2]

        load, parallel = self.load, self.num_parallel_calls

        def one_step(indices):
            samples = tf.data.Dataset.from_tensor_slices(indices)
            samples = samples.map(load, num_parallel_calls=parallel, deterministic=True)
            return samples.batch(tf.size(indices, out_type=tf.int64))

        ds = tf.data.Dataset.from_generator(steps, output_signature=tf.TensorSpec([None], tf.int64))
        ds = ds.flat_map(one_step)
        return ds.prefetch(self.prefetch) if self.prefetch else ds


def _unsupported_take(indices):
    raise RuntimeError("a feed made by from_sample_fn loads its samples inside its tf.data pipeline")
