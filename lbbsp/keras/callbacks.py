"""The LoadBalancer Keras callback: a thin adapter of Keras events to lbbsp.balancer.Balancer."""
import logging
import os
import socket
import time

import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf

from ..balancer import Balancer
from ..checks import check_budget, integer
from ..consistency import build_mismatch, numpy_build
from ..controller import DECISION_BUDGET, BalanceController
from ..forecasting import FORECAST_BUDGET, Forecaster
from .data import BalancedFeed
from .global_metrics import global_metric_results
from .optimizer import balance_state

__all__ = ["LoadBalancer", "worker_identity"]

log = logging.getLogger(__name__)

#: Keys written into the batch logs at every step.
STEP_KEYS = ("lbbsp_batch", "lbbsp_speed", "lbbsp_forecast", "lbbsp_compute_ms", "lbbsp_wait_ms")


def worker_identity():
    """This worker's stable identity across elastic resets: its host (as the launcher named it) and local rank."""
    host = os.environ.get("HOROVOD_HOSTNAME") or socket.gethostname()
    return f"{host}:{hvd.local_rank()}"


def _on_gpu():
    """True when TensorFlow places this worker's ops on a GPU."""
    return bool(tf.config.list_logical_devices("GPU"))


def _broadcast(name):
    return lambda obj: hvd.broadcast_object(obj, root_rank=0, name=name)


def _open_telemetry(gpu):
    """This worker's readings: CPU and memory, and with `gpu` its GPU's through NVML (neutral without it)."""
    try:
        from predictor.nvml import NVMLReader, device_for
        from predictor.telemetry import Telemetry
        return Telemetry(gpu=NVMLReader(device_for(hvd.local_rank())).start() if gpu else None)
    except Exception as exc:  # noqa: BLE001 - no telemetry means no features, never a failed job
        log.warning("lbbsp: telemetry unavailable (%r); forecasting without machine readings", exc)
        return None


class LoadBalancer(tf.keras.callbacks.Callback):
    """Sets every worker's batch size each step so that all workers finish together (LB-BSP).

    Args:
      feed: the `lbbsp.keras.BalancedFeed` whose `dataset()` is passed to `fit`.
      policy: "lbbsp" (default), "equal", "static", "dbs", "pid" or a `lbbsp.policies.Policy`.
      predictor: forecaster of this worker's next batch-free speed: "narx" (default), "arx", "ema", "last"
        or a `predictor.SpeedPredictor`.
      warmup_steps: first steps (tracing, warm-up) whose timings are ignored.
      plan_ahead: the timings of step t decide the split of step t + 1 + plan_ahead; with 1 (the default)
        the decision runs on a background thread while step t + 1 trains.
      sync_metrics: report loss and metrics summed over all ranks' samples (replaces Horovod's
        MetricAverageCallback, which averages unweighted).
      csv_path: where each rank streams its per-step records ("{rank}" is replaced by the rank).
      keep_steps: how many recent per-step records stay in memory (`history`); None keeps all.
      state_path: where each rank saves lbbsp's state ("{rank}" is replaced by the rank), at every epoch end
        and every `state_every` steps; when it exists at the start of training (a job resumed from a Keras
        checkpoint, `BackupAndRestore` included) training continues balanced from rank 0's. A pickle: load
        only your own files.
      state_every: also save every this many steps (match BackupAndRestore's `save_freq`).
      forecast_budget: the share of this worker's compute time its predictor may take per step; over it,
        the worker forecasts its last measured speed (`lbbsp.forecasting.Forecaster`). None: always.
      decision_budget: the share of the workers' compute time a decision's CPU may take per step; over it,
        splits are decided every 2, 4, ... steps (`lbbsp.controller`). None: every step.
      warm_shapes: batch sizes to set up on every worker before training (one forward and backward pass
        each, no update), so that moving to them later costs no cuDNN autotuning; its time is logged.

    Per step it writes lbbsp_batch, lbbsp_speed, lbbsp_forecast, lbbsp_compute_ms and lbbsp_wait_ms into
    the batch logs; per epoch lbbsp_batch (mean), lbbsp_efficiency, lbbsp_idle_fraction, lbbsp_overhead_ms,
    lbbsp_overhead_cpu_ms, lbbsp_background_ms, lbbsp_resyncs, lbbsp_shapes and lbbsp_setup_s (batch shapes
    set up this epoch and the seconds their first steps took beyond the model) and, with a predictor,
    lbbsp_model_share into the epoch logs (docs/reference.md).
    """

    def __init__(self, feed, policy="lbbsp", predictor="narx", warmup_steps=2, plan_ahead=1, sync_metrics=True,
                 csv_path=None, keep_steps=1000, state_path=None, state_every=None, forecast_budget=FORECAST_BUDGET,
                 decision_budget=DECISION_BUDGET, warm_shapes=()):
        super().__init__()
        if not isinstance(feed, BalancedFeed):
            raise ValueError(f"feed={feed!r} is not allowed: give the lbbsp.keras.BalancedFeed passed to fit()")
        for name, value in (("csv_path", csv_path), ("state_path", state_path)):
            if value is not None and not isinstance(value, str):
                raise ValueError(f"{name}={value!r} is not allowed: give a path string or None")
            try:
                if value is not None:
                    value.format(rank=0)
            except (KeyError, IndexError, ValueError) as exc:
                raise ValueError(f"{name}={value!r} is not allowed: the only field it may hold is {{rank}} "
                                 f"({exc!r}); write a literal brace as {{{{ or }}}}") from exc
        for name, value in (("state_every", state_every), ("keep_steps", keep_steps)):
            integer(name, value, 1, optional=True)
        if state_every is not None and state_path is None:
            raise ValueError(f"state_every={state_every!r} is not allowed without state_path: give both (the state "
                             "is saved to state_path every state_every steps)")
        shapes = list(warm_shapes) if isinstance(warm_shapes, (list, tuple)) else None
        if shapes is None or any(isinstance(b, bool) or not isinstance(b, (int, np.integer)) or b < 1 for b in shapes):
            raise ValueError(f"warm_shapes={warm_shapes!r} is not allowed: give a list of batch sizes (integers >= 1)")
        controller = BalanceController(policy, warmup_steps, plan_ahead, decision_budget)
        budget = check_budget(forecast_budget)
        forecaster = Forecaster(predictor, budget=budget) if controller.uses_forecast else None
        self.feed, self.state_path, self.state_every, self.sync_metrics = feed, state_path, state_every, sync_metrics
        self.core = Balancer(feed, controller, forecaster, csv_path=csv_path, keep_steps=keep_steps,
                             warm_shapes=sorted(set(int(b) for b in shapes)))
        self.elastic = None  # set by lbbsp.keras.elastic.ElasticState
        self._prepared = False

    controller = property(lambda self: self.core.controller)
    forecaster = property(lambda self: self.core.forecaster)
    resynced = property(lambda self: self.core.resynced)

    @property
    def split(self):
        """Every worker's batch in the step that runs now (read-only)."""
        return self._plan.sizes

    @property
    def history(self):
        """The most recent per-step records of this rank (dicts with the keys of lbbsp.history.FIELDS)."""
        return list(self.core.steps.rows)

    def _check_model(self, model):
        optimizer = model.optimizer
        state = balance_state(optimizer)
        if state is None:
            raise ValueError(f"model.optimizer={optimizer!r} is not allowed: wrap it with "
                             "lbbsp.keras.DistributedOptimizer (instead of hvd.DistributedOptimizer) so gradients "
                             "are weighted by each worker's batch size")
        spe = getattr(model, "_steps_per_execution", None)
        if spe is not None and int(spe.numpy()) != 1:
            raise ValueError(f"steps_per_execution={int(spe.numpy())} is not allowed with LoadBalancer: it must "
                             "be 1, since batch sizes change between steps")
        if getattr(model, "jit_compile", False) is True:
            raise ValueError("jit_compile=True is not allowed with LoadBalancer: each step hands its timings to Python "
                             "(tf.numpy_function), which XLA cannot compile. Compile with jit_compile=False; XLA's "
                             "auto-clustering (TF_XLA_FLAGS=--tf_xla_auto_jit=2) still compiles the rest of the step")
        return state

    def _begin(self, epoch=0, first_run=True):
        """Per-fit set-up shared by a plain fit and every fit of an elastic job."""
        folder = os.path.dirname(os.path.abspath(self._state_file())) if self.state_path else None
        if folder is not None and not os.path.isdir(folder):
            raise ValueError(f"state_path={self.state_path!r} is not allowed: the folder {folder!r} does not exist; "
                             "give a file in an existing folder")
        if self.forecaster is not None:
            self.forecaster.use_device(self.gpu)
        wants = (self.forecaster is not None and self.forecaster.uses_features) or self.core.csv_path
        if wants and self.core.telemetry is None:
            self.core.telemetry = _open_telemetry(self.gpu)
        self.core.begin(self.rank, self.size, epoch, first_run, self.gpu)
        self._state.on_local = self.core.local
        self._epoch, self._train_metrics = epoch, {}

    def _gather(self, name, mine=None):
        """Every rank's `mine`, gathered with each rank's numpy build and device: warns when the builds may round
        differently (lbbsp.consistency) and sets `gpu` when some worker trains on a GPU."""
        gathered = hvd.allgather_object((mine, numpy_build(), _on_gpu()), name=name)
        problem = build_mismatch([build for _, build, _ in gathered])
        if problem:
            log.warning("lbbsp: %s", problem)
        self.gpu = any(gpu for _, _, gpu in gathered)
        return [item for item, _, _ in gathered]

    def on_train_begin(self, logs=None):
        if self.elastic is not None:
            if not self._prepared:
                raise RuntimeError("lbbsp: a LoadBalancer given to lbbsp.keras.elastic.ElasticState trains through "
                                   "lbbsp.keras.elastic.fit(state, ...), not model.fit")
            self._prepared = False
            return
        self._state = self._check_model(self.model)
        steps = (self.params or {}).get("steps")
        if steps != self.feed.steps_per_epoch:  # None: the feed's endless dataset would never end an epoch
            raise ValueError(f"steps_per_epoch={steps} is not allowed: pass steps_per_epoch=feed.steps_per_epoch "
                             f"({self.feed.steps_per_epoch}) to fit()")
        self.rank, self.size = hvd.rank(), hvd.size()
        if self._state.size != self.size:
            raise ValueError(f"the optimizer was wrapped for {self._state.size} workers but Horovod runs {self.size}")
        self.feed.bind(self.rank, self.size)
        self._gather("lbbsp_numpy")
        self._warm_up()
        self._begin()
        self.resumed = bool(self.state_path) and self.core.restore(self._state_file(), _broadcast("lbbsp_state"))

    def _warm_up(self):
        """Set up `warm_shapes` before training: one forward and backward pass each, weights left as they were."""
        shapes = self.core.warm_shapes
        if not shapes:
            return
        bounds = self.feed.bounds
        useless = [b for b in shapes if not bounds.lower.min() <= b <= bounds.upper.max()]
        if useless:  # a pass at a batch no worker may run costs time, or a GPU's memory
            raise ValueError(f"warm_shapes={list(shapes)!r} is not allowed: {useless} lie outside the batch sizes a "
                             f"worker may run, [{int(bounds.lower.min())}, {int(bounds.upper.max())}] (b_min, b_max)")
        from .warmup import warm_up
        seconds = warm_up(self.model, self.feed, shapes)
        log.info("lbbsp: set up %d batch shapes %s in %.2f s (%s s each)", len(shapes), list(shapes),
                 sum(seconds), ", ".join(f"{s:.2f}" for s in seconds))

    def begin_elastic(self, model):
        """Before a fit inside hvd.elastic.run: continue from the committed state in `self.elastic`.

        Called by lbbsp.keras.elastic.fit on every rank. Every rank starts from the same committed snapshot
        (rank 0's after a sync). Workers are matched by identity: one that stays keeps its estimates, a
        newcomer starts from the mean of the others'. Returns the steps left in the current epoch.
        """
        self.core.abandon()
        elastic = self.elastic
        self._state = self._check_model(model)
        self.rank, self.size = hvd.rank(), hvd.size()
        self._state.rebind(self.rank, self.size)
        workers = self._gather("lbbsp_workers", worker_identity())
        snapshot = elastic.lbbsp or {}
        epoch, position = int(elastic.epoch), int(snapshot.get("position", 0))
        self.feed.bind(self.rank, self.size, resume=(epoch, position) if position else None,
                       global_batch=elastic.global_batch_for(self.size))
        self._begin(epoch, first_run=not elastic.started)
        elastic.started = True
        saved, before = snapshot.get("controller"), snapshot.get("workers")
        if saved is not None and before is not None:
            try:
                if list(before) == list(workers):
                    self.core.continue_from(saved)
                else:
                    index = self.controller.rejoin(saved, before, workers)
                    self.core.continue_from(self.controller.state())
                    log.info("lbbsp: workers changed from %d to %d (%d new); split %s", len(before), len(workers),
                             int((index < 0).sum()), self.controller.batch_sizes.tolist())
            except Exception as exc:  # noqa: BLE001 - the same on every rank: all start from equal batches together
                log.warning("lbbsp: the committed state does not fit the new workers (%s); equal batches", exc)
                self._begin(epoch, first_run=False)
        self.workers = workers
        self._prepared = True
        return self.feed.epoch_schedule.steps_in(epoch)

    def snapshot(self, epoch, step):
        """What an elastic commit after (epoch, step) keeps: the decision state, the workers, and where the next
        step starts (epoch, position in its sample order; the next epoch once this one is done)."""
        self.core.drain()
        schedule = self.feed.epoch_schedule
        done = step + 1 >= schedule.steps_in(epoch)
        return {"controller": self.controller.state(), "workers": list(self.workers),
                "epoch": epoch + 1 if done else epoch, "position": 0 if done else schedule.end_position(epoch, step)}

    def _state_file(self):
        return self.state_path.format(rank=self.rank)

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch, self._train_metrics = epoch, {}
        self._state.restart_clock()  # work between epochs (validation, checkpoints) is no step's busy time

    def on_train_batch_begin(self, step, logs=None):
        started, cpu = time.perf_counter(), time.thread_time()
        self._t_begin = started
        self._plan = self.core.before_step(self._epoch, step)
        self._state.set_scale(self._plan.sizes[self.rank] / float(self.feed.epoch_schedule.of(self._epoch)[step]))
        self._hooks = (time.perf_counter() - started, time.thread_time() - cpu)

    def on_train_batch_end(self, step, logs=None):
        t_end = time.time()
        started, cpu = time.perf_counter(), time.thread_time()
        state, local = self._state, int(self._plan.sizes[self.rank])
        served, times, beyond = self.feed.served(self._epoch, step)
        if times == 0 and beyond <= 0:
            raise RuntimeError(f"lbbsp: step {step} of epoch {self._epoch} read nothing from the feed: pass "
                               "feed.dataset() of the BalancedFeed given to LoadBalancer to fit (the data fit read "
                               "does not follow lbbsp's split)")
        if served != local or times != 1 or beyond > self.feed.prefetch:
            raise RuntimeError(
                f"lbbsp: step {step} of epoch {self._epoch} should have read {local} samples once, with at most "
                f"{self.feed.prefetch} steps read ahead; the feed served {served} samples {times} time(s), "
                f"{beyond} steps ahead: the dataset was wrapped (.batch, .shuffle, .prefetch, ...) after "
                "feed.dataset(); pass it to fit unchanged and use BalancedFeed(..., prefetch=k) for read-ahead")
        wait = state.done - state.joined
        record = dict(time=t_end, epoch=self._epoch, step=step, rank=self.rank, workers=self.size,
                      global_batch=int(np.sum(self._plan.sizes)), batch_size=local, wait=wait,
                      step_time=started - self._t_begin, overhead=self._hooks[0] + time.perf_counter() - started,
                      overhead_cpu=self._hooks[1] + time.thread_time() - cpu)
        speed, forecast, compute = self.core.after_step(self._epoch, step, state.gathered, record,
                                                        _broadcast("lbbsp_resync"))
        if step + 1 >= self.feed.epoch_schedule.steps_in(self._epoch) and self.sync_metrics:
            self._train_metrics = global_metric_results(self.model)
        if self.state_path and self.state_every and (step + 1) % self.state_every == 0:
            self.core.save(self._state_file(), self._epoch, step)
        if logs is not None:
            logs.update(zip(STEP_KEYS, (local, speed, forecast, 1e3 * compute, 1e3 * wait)))

    def on_epoch_end(self, epoch, logs=None):
        figures = self.core.epoch_logs()
        if self.state_path:
            self.core.save(self._state_file(), epoch, self.feed.epoch_schedule.steps_in(epoch) - 1)
        if logs is None:
            return
        for key in STEP_KEYS:  # Keras copies the last step's batch logs into the epoch logs: epoch figures only
            logs.pop(key, None)
        logs.update(self._train_metrics)
        if self.sync_metrics and any(key.startswith("val_") for key in logs):
            logs.update(global_metric_results(self.model, prefix="val_"))
        logs.update(figures)

    def on_train_end(self, logs=None):
        self.core.end()
        self._state.on_local = None

