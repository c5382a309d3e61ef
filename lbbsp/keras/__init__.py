"""lbbsp for Horovod Keras (Keras 2: tf.keras on TensorFlow 2.15, tf-keras with TF_USE_LEGACY_KERAS=1 on 2.16+).

    import lbbsp.keras as lb
    opt = lb.DistributedOptimizer(opt)                 # instead of hvd.DistributedOptimizer
    feed = lb.BalancedFeed(x, y, global_batch=256)     # instead of a per-rank shard
    model.fit(feed.dataset(), steps_per_epoch=feed.steps_per_epoch,
              callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0), lb.LoadBalancer(feed)])

Elastic jobs (workers that join and leave): lbbsp.keras.elastic.
"""
import tensorflow as _tf

from .compat import check_keras

check_keras(_tf)

from . import elastic  # noqa: E402 - only once Keras is known to be Keras 2
from .callbacks import LoadBalancer, worker_identity
from .data import BalancedFeed
from .global_metrics import global_metric_results
from .optimizer import DistributedOptimizer, is_balanced_optimizer

__all__ = ["BalancedFeed", "DistributedOptimizer", "LoadBalancer", "elastic", "global_metric_results",
           "is_balanced_optimizer", "worker_identity"]
