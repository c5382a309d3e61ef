"""A Keras optimizer wrapper whose update is BSP's on the global batch, whatever the local batch sizes.

Worker i scales its mean-loss gradient g_i by b_i / B before a Horovod
sum-allreduce, so every worker applies sum_i (b_i / B) g_i: the gradient a
single machine would compute on all B samples. The same graph timestamps the
end of local compute and the end of the allreduce (so the callback can split
a step into compute and wait), and allgathers each worker's small stats row
in the same Horovod cycle as the gradients, which saves a collective per step.
"""
import tensorflow as tf
import horovod.tensorflow as hvd

__all__ = ["DistributedOptimizer", "BalanceState", "is_balanced_optimizer", "ROW_FIELDS", "OUTBOX_FIELDS"]

#: What each worker puts into the in-graph allgather (set by the callback after the previous step).
OUTBOX_FIELDS = ("forecast", "wait")
#: Columns of the gathered matrix: the outbox plus the compute time measured in this step's graph.
ROW_FIELDS = OUTBOX_FIELDS + ("compute",)


class BalanceState:
    """Per-rank variables shared by the optimizer graph and the callback.

    A plain object, not a Trackable, so none of these variables end up in the
    user's checkpoints or saved models.
    """

    def __init__(self, size):
        with tf.init_scope():
            self.scale = tf.Variable(1.0 / size, trainable=False, dtype=tf.float32, name="lbbsp_scale")
            self.begin = tf.Variable(0.0, trainable=False, dtype=tf.float64, name="lbbsp_begin")
            self.outbox = tf.Variable(tf.zeros(len(OUTBOX_FIELDS), tf.float64), trainable=False, name="lbbsp_outbox")
            self.inbox = tf.Variable(tf.zeros((size, len(ROW_FIELDS)), tf.float64), trainable=False, name="lbbsp_inbox")
            self.times = tf.Variable(tf.zeros(2, tf.float64), trainable=False, name="lbbsp_times")
        self.size = size


def _scale(grad, factor):
    if grad is None:
        return None
    if isinstance(grad, tf.IndexedSlices):
        return tf.IndexedSlices(grad.values * tf.cast(factor, grad.values.dtype), grad.indices, grad.dense_shape)
    return grad * tf.cast(factor, grad.dtype)


def _tensor_of(grad):
    return grad.values if isinstance(grad, tf.IndexedSlices) else grad


def _reduce(optimizer, grads):
    """Scale, sum-allreduce and time the gradients; gather the stats rows. Runs inside the train graph."""
    state = optimizer._lbbsp_state
    scaled = [_scale(g, state.scale) for g in grads]
    present = [g for g in scaled if g is not None]
    with tf.control_dependencies([_tensor_of(g) for g in present]):
        ready = tf.timestamp()
    compute = ready - state.begin
    row = tf.concat([state.outbox, tf.reshape(compute, [1])], axis=0)
    gathered = hvd.allgather(tf.reshape(row, [1, len(ROW_FIELDS)]), name="lbbsp_stats")
    reduced = hvd.grouped_allreduce(
        present,
        op=hvd.Sum,
        compression=optimizer._lbbsp_compression,
        name="lbbsp_grads",
    ) if present else []
    with tf.control_dependencies([_tensor_of(g) for g in reduced] + [gathered]):
        done = tf.timestamp()
    with tf.control_dependencies([state.times.assign(tf.stack([ready, done])), state.inbox.assign(gathered)]):
        reduced = [
            tf.IndexedSlices(tf.identity(g.values), g.indices, g.dense_shape)
            if isinstance(g, tf.IndexedSlices) else tf.identity(g)
            for g in reduced
        ]
    it = iter(reduced)
    return [None if g is None else next(it) for g in scaled]


def _sparse_to_dense(grads, sparse_as_dense):
    if not sparse_as_dense:
        return list(grads)
    return [tf.convert_to_tensor(g) if isinstance(g, tf.IndexedSlices) else g for g in grads]


def DistributedOptimizer(optimizer, compression=hvd.Compression.none, sparse_as_dense=False):
    """Wrap a Keras optimizer for load-balanced BSP (use instead of `hvd.DistributedOptimizer`).

    Works with the Keras 2.15 optimizers (`tf.keras.optimizers.*`) and the
    legacy ones (`tf.keras.optimizers.legacy.*`). The returned optimizer has
    the class name of the one passed in, so saved models load without lbbsp.
    Call `hvd.init()` first.
    """
    new_base = tf.keras.optimizers.Optimizer
    legacy_base = tf.keras.optimizers.legacy.Optimizer
    if not isinstance(optimizer, (new_base, legacy_base)):
        raise ValueError(
            f"optimizer={optimizer!r} is not allowed: give a tf.keras optimizer instance "
            "(tf.keras.optimizers.* or tf.keras.optimizers.legacy.*)"
        )
    if is_balanced_optimizer(optimizer):
        raise ValueError(f"optimizer={optimizer!r} is already wrapped by lbbsp.keras.DistributedOptimizer")
    base = optimizer.__class__

    if isinstance(optimizer, legacy_base):
        def _compute_gradients(self, loss, var_list, grad_loss=None, tape=None):
            pairs = base._compute_gradients(self, loss, var_list, grad_loss=grad_loss, tape=tape)
            grads, variables = zip(*pairs)
            return list(zip(_reduce(self, _sparse_to_dense(grads, self._lbbsp_sparse_as_dense)), variables))

        methods = {"_compute_gradients": _compute_gradients}
    else:
        def compute_gradients(self, loss, var_list, tape=None):
            pairs = base.compute_gradients(self, loss, var_list, tape)
            grads, variables = zip(*pairs)
            return list(zip(_reduce(self, _sparse_to_dense(grads, self._lbbsp_sparse_as_dense)), variables))

        methods = {"compute_gradients": compute_gradients}

    cls = type(base.__name__, (base,), methods)
    wrapped = cls.from_config(optimizer.get_config())
    # Plain attributes set through object.__setattr__ stay invisible to Keras' tracking.
    object.__setattr__(wrapped, "_lbbsp_state", BalanceState(hvd.size()))
    object.__setattr__(wrapped, "_lbbsp_compression", compression)
    object.__setattr__(wrapped, "_lbbsp_sparse_as_dense", bool(sparse_as_dense))
    return wrapped


def is_balanced_optimizer(optimizer):
    """True for an optimizer returned by `DistributedOptimizer`."""
    return isinstance(getattr(optimizer, "_lbbsp_state", None), BalanceState)
