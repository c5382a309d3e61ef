"""A Keras optimizer wrapper whose update is BSP's on the global batch, whatever the local batch sizes.

Worker i scales its mean loss by b_i / B, so its gradient is (b_i / B) g_i,
and a Horovod sum-allreduce gives every worker sum_i (b_i / B) g_i: the
gradient a single machine would compute on all B samples. Scaling the loss
costs one scalar multiply; scaling the gradients would cost a pass (a kernel
on a GPU) per gradient tensor. The same graph notes when the
local gradients exist and when the allreduce is done (so the callback can
split a step into busy and wait time), and exchanges each worker's small
stats row inside a gradient's sum-allreduce, which saves a collective per
step.
"""
import os
import time

import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf

from .. import exchange

__all__ = ["DistributedOptimizer", "BalanceState", "is_balanced_optimizer", "balance_state"]


class BalanceState:
    """Per-rank state shared by the optimizer graph and the callback.

    The graph hands values to Python through two numpy_functions (far cheaper
    than eager variable reads and writes), so the callback itself runs no
    TensorFlow op per step. Only the loss weight is a variable, written
    when it changes. `on_local` (set by the callback) is called when this
    worker's gradients exist, with its compute seconds, and returns the rest
    of its exchanged row (its forecast). A plain object, not a Trackable, so
    none of this ends up in the user's checkpoints or saved models. Its
    times are on the monotonic clock: a wall clock set back or forth (NTP)
    would corrupt the step it lands in.
    """

    def __init__(self, rank, size):
        with tf.init_scope():
            self.scale = tf.Variable(1.0 / size, trainable=False, dtype=tf.float32, name="lbbsp_scale")
        self._scale_value = 1.0 / size
        self.on_local = None
        self.steps = 0
        self.rebind(rank, size)

    def rebind(self, rank, size):
        """This worker's rank and the number of workers (again after an elastic membership change).

        The train graph reads neither: the stats matrix is shaped by the rows
        the numpy callbacks return, so a graph traced for one size runs on another.
        """
        self.rank, self.size = int(rank), int(size)
        self._rows = exchange.empty(self.size, np.float32, 0.0)
        self.gathered = exchange.empty(self.size)
        self.begin = None
        self.ready = self.joined = self.done = float("nan")
        self.local_cost = 0.0

    def set_scale(self, value):
        """Weight of this worker's mean loss in the next step (b_i / B); a variable write only on change."""
        value = float(value)
        if value != self._scale_value:
            self.scale.assign(value)
            self._scale_value = value

    def restart_clock(self, now=None):
        """Start the busy period of the next step now (after work that is not per-step, e.g. validation)."""
        self.begin = time.perf_counter() if now is None else now

    def on_ready(self, _gradients_computed):
        """Graph callback when the local gradients exist (its input, `_computed`, arrives only then): this
        worker's row in an (N, fields) matrix of zeros.

        The compute time is the busy time before this worker can join the allreduce: from the end of
        the previous one to now, plus what `on_local` took in the previous step (it runs after this
        clock stops, but delays the worker's entry into the collective just the same; on a worker
        under a small CPU quota a forecast's fraction of a millisecond of CPU takes several of wall
        time). A balancer that left it out would give that worker too much.
        """
        self.ready = time.perf_counter()
        begin = self.begin if self.begin is not None else self.ready
        compute = self.ready - begin + self.local_cost
        local = self.on_local(compute) if self.on_local is not None else {}
        self.joined = time.perf_counter()
        self.local_cost = self.joined - self.ready
        return exchange.pack_local(self._rows, self.rank, compute=compute, **local)

    def on_done(self, gathered):
        """Graph callback when the gradient and stats allreduces are done: keep every rank's row."""
        self.done = time.perf_counter()
        self.gathered = np.asarray(gathered, dtype=np.float64)
        self.begin = self.done
        self.steps += 1
        return np.float64(self.done)


def _weighted(loss, tape, weight):
    """`loss` times `weight` (b_i / B), recorded where its gradient is taken: inside a callable loss, or on `tape`
    (re-entered, as Keras' LossScaleOptimizer does). A tensor loss without a tape is left to the base
    optimizer, which refuses it."""
    def times(value):
        return value * tf.cast(weight, value.dtype)

    if callable(loss):
        return lambda: times(loss())
    if tape is None:
        return loss
    with tape:
        return times(loss)


def _tensor_of(grad):
    return grad.values if isinstance(grad, tf.IndexedSlices) else grad


def _elements(tensor):
    """A tensor's number of elements (infinite where its shape is not known when traced)."""
    return tensor.shape.num_elements() or float("inf")


def _computed(tensors):
    """A scalar that exists only once every tensor in `tensors` has been computed, where they were computed.

    On a GPU an op counts as done once its kernels are queued, not run, so a host callback that merely
    follows the gradients would read the clock while the GPU is still computing them. This scalar is one
    element of the smallest gradient, taken by an op queued behind every gradient (the device runs its
    queue in order); the host callback that reads it waits for its copy, and so for the gradients.
    """
    if not tensors:
        return tf.zeros([])
    with tf.control_dependencies(tensors):
        smallest = min(tensors, key=_elements)
        return tf.reduce_sum(tf.cast(tf.reshape(smallest, [-1])[:1], tf.float32))


def _summed(collective, tensors):
    """`collective(tensors)`, a Horovod sum, or `tensors` themselves where one worker trains: its sum is its own,
    and Horovod's collective would still wait for a cycle of its background thread every step. Decided when the
    step is traced, as by Horovod's own optimizer; in an elastic job, whose size may change under a traced graph,
    when it runs."""
    if int(os.environ.get("HOROVOD_ELASTIC", 0)):
        with tf.device("/cpu:0"):  # where Horovod's size op runs (Horovod places its own test there too)
            several = hvd.size_op() > 1
        return tf.cond(several, lambda: collective(tensors), lambda: tensors)
    return collective(tensors) if hvd.size() > 1 else tensors


def _reduce(optimizer, grads):
    """Sum-allreduce the gradients (of losses weighted by `_weighted`), exchange the stats rows, time both. Runs in
    the train graph.

    The rows of lbbsp.exchange travel in a sum-allreduce too: rank i writes
    its row into row i of an (N, fields) float32 matrix of zeros, so the sum
    holds every rank's row. With `grouped` (the default) the dense gradients and the rows go in one
    grouped allreduce: one negotiation, one fused collective (one per dtype where `compression` or
    the model makes gradients of another dtype). Otherwise each gradient is reduced as soon as it
    exists, which lets communication overlap the rest of the backward pass, and the rows ride with
    the smallest float32 gradient (which then waits for them: the cheapest one to hold back). The
    rows are never compressed.
    """
    state = optimizer._lbbsp_state
    compression = optimizer._lbbsp_compression
    local = _computed([_tensor_of(g) for g in grads if g is not None])
    row = tf.numpy_function(state.on_ready, [local], tf.float32, stateful=True, name="lbbsp_ready")
    rows = tf.reshape(row, [-1, len(exchange.FIELDS)])  # not state.size: a traced graph must survive a resize
    reduced = list(grads)
    dense = [i for i, g in enumerate(grads) if g is not None and not isinstance(g, tf.IndexedSlices)]
    # Only the gradients are compressed: 16 bits hold neither a split's digest nor a fast worker's speed. A
    # grouped allreduce holds one dtype: the rows (float32) ride with float32 gradients.
    packed = {i: compression.compress(grads[i]) for i in dense}
    if optimizer._lbbsp_grouped:
        by_dtype, apart = {rows.dtype: []}, []
        for i in dense:
            by_dtype.setdefault(packed[i][0].dtype, []).append(i)
    else:  # the rows ride with the smallest float32 gradient, the one whose wait for them costs least
        riders = [i for i in dense if packed[i][0].dtype == rows.dtype]
        smallest = min(riders, key=lambda i: _elements(grads[i]), default=None)
        by_dtype = {rows.dtype: [] if smallest is None else [smallest]}
        apart = [i for i in dense if i != smallest]
    for dtype, members in by_dtype.items():
        tensors = ([rows] if dtype == rows.dtype else []) + [packed[i][0] for i in members]
        out = _summed(lambda ts: hvd.grouped_allreduce(ts, op=hvd.Sum, name=f"lbbsp_grads_{dtype.name}"), tensors)
        if dtype == rows.dtype:
            rows, out = out[0], out[1:]
        for i, g in zip(members, out):
            reduced[i] = compression.decompress(g, packed[i][1])
    for i in apart:  # each as soon as it exists, compressed once (above)
        reduced[i] = compression.decompress(_summed(lambda t: hvd.allreduce(t, op=hvd.Sum), packed[i][0]),
                                            packed[i][1])
    for i, g in enumerate(grads):
        if isinstance(g, tf.IndexedSlices):
            reduced[i] = _summed(lambda t: hvd.allreduce(t, op=hvd.Sum, compression=compression), g)
    with tf.control_dependencies([_tensor_of(g) for g in reduced if g is not None] + [rows]):
        done = tf.numpy_function(state.on_done, [rows], tf.float64, stateful=True, name="lbbsp_done")
    with tf.control_dependencies([done]):
        return [
            None if g is None
            else tf.IndexedSlices(tf.identity(g.values), g.indices, g.dense_shape) if isinstance(g, tf.IndexedSlices)
            else tf.identity(g)
            for g in reduced
        ]


def _sparse_to_dense(grads, sparse_as_dense):
    if not sparse_as_dense:
        return list(grads)
    return [tf.convert_to_tensor(g) if isinstance(g, tf.IndexedSlices) else g for g in grads]


def _reduce_pairs(optimizer, pairs):
    """(gradient, variable) pairs with the gradients reduced by `_reduce`."""
    grads, variables = zip(*pairs)
    return list(zip(_reduce(optimizer, _sparse_to_dense(grads, optimizer._lbbsp_sparse_as_dense)), variables))


def DistributedOptimizer(optimizer, compression=hvd.Compression.none, sparse_as_dense=False, grouped=True):
    """Wrap a Keras optimizer for load-balanced BSP (use instead of `hvd.DistributedOptimizer`).

    `grouped=True` (the default) reduces all dense gradients and the stats rows
    in one grouped allreduce: one collective a step, which waits for the last
    gradient. `grouped=False` reduces each gradient as soon as it exists,
    overlapping communication with the backward pass (as Horovod's own
    optimizer does), the rows riding with the smallest gradient: the one to try
    where gradients are large; on CPU workers one collective a step was
    faster (docs/results.md, "What nothing costs"). With one worker no
    collective runs.

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
            loss = _weighted(loss, tape, self._lbbsp_state.scale)
            return _reduce_pairs(self, base._compute_gradients(self, loss, var_list, grad_loss=grad_loss, tape=tape))

        methods = {"_compute_gradients": _compute_gradients}
    else:
        def compute_gradients(self, loss, var_list, tape=None):
            loss = _weighted(loss, tape, self._lbbsp_state.scale)
            return _reduce_pairs(self, base.compute_gradients(self, loss, var_list, tape))

        methods = {"compute_gradients": compute_gradients}

    # Same name, module and qualname as the base class: Keras records these when saving, so a saved
    # model refers to the plain optimizer and loads without lbbsp.
    methods.update(__module__=base.__module__, __qualname__=base.__qualname__)
    cls = type(base.__name__, (base,), methods)
    wrapped = cls.from_config(optimizer.get_config())
    # Plain attributes set through object.__setattr__ stay invisible to Keras' tracking.
    object.__setattr__(wrapped, "_lbbsp_state", BalanceState(hvd.rank(), hvd.size()))
    object.__setattr__(wrapped, "_lbbsp_compression", compression)
    object.__setattr__(wrapped, "_lbbsp_sparse_as_dense", bool(sparse_as_dense))
    object.__setattr__(wrapped, "_lbbsp_grouped", bool(grouped))
    return wrapped


def balance_state(optimizer):
    """The BalanceState through which the callback and an optimizer returned by `DistributedOptimizer` share
    each step's batch sizes and exchanged row, also where that optimizer sits inside a LossScaleOptimizer
    (Keras puts one around the compiled optimizer under the "mixed_float16" policy); None for any other."""
    for candidate in (optimizer, getattr(optimizer, "inner_optimizer", None)):
        state = getattr(candidate, "_lbbsp_state", None)
        if isinstance(state, BalanceState):
            return state
    return None


def is_balanced_optimizer(optimizer):
    """True for an optimizer returned by `DistributedOptimizer`, also inside a LossScaleOptimizer."""
    return balance_state(optimizer) is not None
