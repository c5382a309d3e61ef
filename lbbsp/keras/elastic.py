"""lbbsp inside Horovod Elastic: workers join and leave, the split follows them, no sample is lost.

    state = lbbsp.keras.elastic.ElasticState(model, balancer, batches_per_commit=10)

    @hvd.elastic.run
    def train(state):
        lbbsp.keras.elastic.fit(state, epochs=5, callbacks=[...])

    train(state)

Run with `horovodrun -np 2 --min-np 1 --max-np 4 --host-discovery-script ./hosts.sh python train.py`.

`ElasticState` is Horovod's KerasState (model and optimizer weights, kept in
memory at every commit and broadcast from rank 0 to newcomers) plus what
lbbsp needs to continue: the balancer's decision state, the identities of the
workers it was fitted on, and the position reached in the current epoch's
sample order. `fit` trains from the last commit: the rest of an interrupted
epoch (only its samples not yet committed, spread over the new workers), then
whole epochs. Steps after the last commit are trained again after a failure
(their updates were lost with the failed worker), never skipped.

Global batch: fixed by default, so the update is the one before the change.
With `scale_batch=True` it follows the number of workers (the per-worker
batch of the start is kept) and the learning rate moves to the linearly
scaled value over `ramp_steps` steps (Lin et al. 2019, dynamic mini-batch
SGD: eta_t = eta (1 + (k - 1) min(1, (t - t0) / T)) for a batch k times
larger), not in one jump.
"""
import logging
import math

import horovod.tensorflow.keras as hvd
import tensorflow as tf
from horovod.common.exceptions import HorovodInternalError

from ..checks import integer
from .callbacks import LoadBalancer

__all__ = ["ElasticState", "fit"]

log = logging.getLogger(__name__)


def _build_optimizer(model):
    """Create the optimizer's slot variables without a train step (a step is a collective, which a worker
    joining a running job must not make before the state is synced; horovod#2652)."""
    optimizer = model.optimizer
    if isinstance(optimizer, tf.keras.optimizers.legacy.Optimizer):
        optimizer._create_all_weights(model.trainable_variables)
    else:
        optimizer.build(model.trainable_variables)


class ElasticState(hvd.elastic.KerasState):
    """Horovod's elastic KerasState with lbbsp's balancer state; see the module docstring.

    Args:
      model: a built, compiled Keras model whose optimizer is lbbsp.keras.DistributedOptimizer.
      balancer: the job's lbbsp.keras.LoadBalancer.
      batches_per_commit: commit (copy the weights to host memory, check for
        membership changes) every this many steps and at every epoch end;
        fewer commits cost less, more lose fewer steps to a failure.
      scale_batch: global batch proportional to the number of workers
        (default False: fixed).
      ramp_steps: steps over which the learning rate moves to its scaled
        value after the global batch changed (with scale_batch; 0 jumps).
      kwargs: more attributes to commit and sync, as in KerasState.
    """

    def __init__(self, model, balancer, batches_per_commit=1, scale_batch=False, ramp_steps=100, **kwargs):
        if not isinstance(balancer, LoadBalancer):
            raise ValueError(f"balancer={balancer!r} is not allowed: give the job's lbbsp.keras.LoadBalancer")
        integer("batches_per_commit", batches_per_commit, 1)
        integer("ramp_steps", ramp_steps, 0)
        if getattr(model, "optimizer", None) is None or not model.built:
            raise ValueError("model is not allowed: build and compile it (with lbbsp.keras.DistributedOptimizer) "
                             "before making the ElasticState")
        self.scale_batch, self.ramp_steps = bool(scale_batch), ramp_steps
        if self.scale_batch and not isinstance(_learning_rate(model.optimizer), float):
            raise ValueError("scale_batch=True is not allowed with a learning-rate schedule: the ramp sets the "
                             "learning rate itself; give the optimizer a constant learning rate")
        _build_optimizer(model)
        feed = balancer.feed
        self.balancer, self.batches_per_commit, self.started = balancer, batches_per_commit, False
        balancer.elastic = self
        per_worker = feed.global_batch / hvd.size()
        super().__init__(model, epoch=0, lbbsp=None, global_batch=feed.global_batch, per_worker=per_worker,
                         ramp=None, **kwargs)

    def global_batch_for(self, size):
        """The global batch with `size` workers."""
        if not self.scale_batch:
            return int(self.global_batch)
        return max(int(round(self.per_worker * size)), size * self.balancer.feed.b_min)


def _learning_rate(optimizer):
    """The constant learning rate as a float, or the optimizer's LearningRateSchedule."""
    value = getattr(optimizer, "_learning_rate", None)  # the schedule itself where there is one (Keras 2.15)
    if value is None:
        value = optimizer.learning_rate if hasattr(optimizer, "learning_rate") else optimizer.lr
    if isinstance(value, tf.keras.optimizers.schedules.LearningRateSchedule):
        return value
    return float(tf.keras.backend.get_value(value))


def _set_learning_rate(optimizer, value):
    variable = optimizer.learning_rate if hasattr(optimizer, "learning_rate") else optimizer.lr
    tf.keras.backend.set_value(variable, value)


def _ramp_value(ramp):
    """The learning rate `ramp` (from, to, steps done, length) sets now."""
    fraction = min(1.0, ramp["done"] / ramp["steps"]) if ramp["steps"] else 1.0
    return ramp["from"] + (ramp["to"] - ramp["from"]) * fraction


class _Ramp(tf.keras.callbacks.Callback):
    """Moves the learning rate linearly to its scaled value, as committed in state.ramp.

    The rate is set at every fit's start too: a worker that just joined has
    its optimizer's initial rate, not the one the ramp reached.
    """

    def __init__(self, state):
        super().__init__()
        self.state = state

    def on_train_begin(self, logs=None):
        if self.state.ramp is not None:
            _set_learning_rate(self.model.optimizer, _ramp_value(self.state.ramp))

    def on_train_batch_begin(self, step, logs=None):
        ramp = self.state.ramp
        if ramp is None or ramp["done"] > ramp["steps"]:
            return
        _set_learning_rate(self.model.optimizer, _ramp_value(ramp))
        self.state.ramp = dict(ramp, done=ramp["done"] + 1)


class _Commit(tf.keras.callbacks.Callback):
    """Commits the state every `batches_per_commit` steps and at epoch ends, with the balancer's snapshot."""

    def __init__(self, state):
        super().__init__()
        self.state = state

    def on_train_begin(self, logs=None):
        self._since = 0

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch

    def on_train_batch_end(self, step, logs=None):
        self._since += 1
        if self._since >= self.state.batches_per_commit:
            self._since = 0
            self._commit(self._epoch, step)

    def on_epoch_end(self, epoch, logs=None):
        self._commit(epoch, self.state.balancer.feed.epoch_schedule.steps_in(epoch) - 1)

    def _commit(self, epoch, step):
        # A commit after an epoch's last step already belongs to the next epoch: a reset raised by this
        # commit must not train the finished epoch again.
        self.state.lbbsp = self.state.balancer.snapshot(epoch, step)
        self.state.epoch = self.state.lbbsp["epoch"]
        self.state.commit()


def _ramp_for(state, global_batch):
    """Start a learning-rate ramp when the global batch changed (scale_batch); the same on every rank."""
    old = int(state.global_batch)
    state.global_batch = global_batch
    if not state.scale_batch or global_batch == old:
        return
    current = _ramp_value(state.ramp) if state.ramp is not None else _learning_rate(state.model.optimizer)
    state.ramp = {"from": current, "to": current * global_batch / old, "done": 0, "steps": state.ramp_steps}
    log.info("lbbsp: global batch %d -> %d; learning rate %.4g -> %.4g over %d steps", old, global_batch,
             current, state.ramp["to"], state.ramp_steps)


def fit(state, epochs, callbacks=None, **fit_kwargs):
    """Train `state.model` up to `epochs` epochs from the last commit; call inside `hvd.elastic.run`.

    Keras arguments other than the data, steps and epochs (verbose,
    validation_data, ...) pass through. Returns the Keras History of the
    last fit call.
    """
    if not isinstance(state, ElasticState):
        raise ValueError(f"state={state!r} is not allowed: give an lbbsp.keras.elastic.ElasticState")
    for name in ("x", "y", "batch_size", "steps_per_epoch", "initial_epoch", "epochs"):
        if name in fit_kwargs:
            raise ValueError(f"{name} is not allowed here: lbbsp.keras.elastic.fit sets it from the feed and the state")
    balancer, model = state.balancer, state.model
    history = None
    while state.epoch < epochs:
        steps = balancer.begin_elastic(model)
        _ramp_for(state, balancer.feed.global_batch)
        if steps == 0:  # nothing left of this epoch that the new workers can split (see EpochSchedule)
            state.epoch += 1
            continue
        whole = steps == balancer.feed.steps_per_epoch and not (state.lbbsp or {}).get("position")
        last = epochs if whole else state.epoch + 1
        try:
            history = model.fit(balancer.feed.dataset(), steps_per_epoch=steps, initial_epoch=state.epoch,
                                epochs=last, callbacks=[balancer, _Ramp(state), *(callbacks or []), _Commit(state)],
                                **fit_kwargs)
        except tf.errors.OpError as exc:
            if "horovod" in str(exc).lower():  # a collective failed: a worker is gone
                raise HorovodInternalError(exc) from exc
            raise
    return history
