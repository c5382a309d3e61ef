"""Sample-weighted global metrics: sum every metric's state over the ranks, then read the result.

Keras metrics keep additive states (totals and counts, confusion matrices),
so summing the states over ranks gives the value a single machine would
report on all samples, whatever each rank's share was. Horovod's
MetricAverageCallback instead averages per-rank results, which over-weights
the samples of workers with small batches.
"""
import horovod.tensorflow as hvd
import tensorflow as tf

__all__ = ["global_metric_results"]


def global_metric_results(model, prefix=""):
    """{prefix + name: value} for model.metrics with states summed over all ranks (local states restored)."""
    metrics = [m for m in model.metrics if m.variables]
    states = [v for m in metrics for v in m.variables]
    if not states:
        return {}
    local = [v.read_value() for v in states]
    summed = hvd.grouped_allreduce([tf.cast(x, tf.float64) for x in local], op=hvd.Sum, name="lbbsp_metrics")
    out = {}
    try:
        for var, value in zip(states, summed):
            var.assign(tf.cast(value, var.dtype))
        for metric in metrics:
            result = metric.result()
            if isinstance(result, dict):
                out.update({prefix + k: float(v) for k, v in result.items()})
            elif tf.size(result) == 1:
                out[prefix + metric.name] = float(tf.reshape(result, []))
    finally:
        for var, value in zip(states, local):
            var.assign(value)
    return out
