"""lbbsp for Horovod Keras (TensorFlow 2.15, Keras 2).

    import lbbsp.keras as lb
    opt = lb.DistributedOptimizer(opt)                 # instead of hvd.DistributedOptimizer
    feed = lb.BalancedFeed(x, y, global_batch=256)     # instead of a per-rank shard
    model.fit(feed.dataset(), steps_per_epoch=feed.steps_per_epoch,
              callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0), lb.LoadBalancer(feed)])
"""
from .callbacks import LoadBalancer
from .data import BalancedFeed
from .global_metrics import global_metric_results
from .optimizer import DistributedOptimizer, is_balanced_optimizer

__all__ = ["BalancedFeed", "DistributedOptimizer", "LoadBalancer", "global_metric_results", "is_balanced_optimizer"]
