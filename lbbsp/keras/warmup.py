"""Set up batch shapes before training: one forward and backward pass at each, with no update.

cuDNN autotunes every convolution the first time it runs at a new batch size
(seconds per shape for a ResNet-50). Running a pass at each shape the balancer
may use, before training, moves that cost out of the training steps and lets
the balancer move between those shapes for free (lbbsp.steptime). The
gradients are computed and dropped: no collective, no optimizer step; the
model's non-trainable variables (batch-norm statistics) are restored after.
XLA's auto-clustering compiles the train function's clusters per shape and
per function, so this does not set those up.
"""
import time

import tensorflow as tf

__all__ = ["warm_up"]


def warm_up(model, feed, shapes):
    """Seconds each batch size in `shapes` took for its first pass (the first one includes tracing)."""
    spec = feed.dataset().element_spec

    @tf.function(input_signature=[spec])
    def one_pass(data):
        x, y, weight = tf.keras.utils.unpack_x_y_sample_weight(data)
        with tf.GradientTape() as tape:
            loss = model.compute_loss(x, y, model(x, training=True), weight)
        return tape.gradient(loss, model.trainable_variables)

    kept = [v.numpy() for v in model.non_trainable_variables]
    seconds = []
    try:
        for batch in shapes:
            data = feed.warm_batch(int(batch))
            started = time.perf_counter()
            tf.nest.map_structure(lambda t: t.numpy() if t is not None else None, one_pass(data))
            seconds.append(time.perf_counter() - started)
    finally:
        for variable, value in zip(model.non_trainable_variables, kept):
            variable.assign(value)
    return seconds
