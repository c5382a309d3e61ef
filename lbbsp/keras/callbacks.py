"""The LoadBalancer Keras callback: thin glue between Keras/Horovod and lbbsp.controller."""
import time

import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf

from ..controller import ROW_FIELDS, BalanceController
from ..feed import BalancedFeed
from .global_metrics import global_metric_results
from .optimizer import is_balanced_optimizer

__all__ = ["LoadBalancer"]

EXCHANGES = ("fused", "eager")
#: Keys written into the batch logs at every step.
STEP_KEYS = ("lbbsp_batch", "lbbsp_speed", "lbbsp_forecast", "lbbsp_compute_ms", "lbbsp_wait_ms")


class LoadBalancer(tf.keras.callbacks.Callback):
    """Sets every worker's batch size each step so that all workers finish together (LB-BSP).

    Args:
      feed: the `lbbsp.keras.BalancedFeed` whose `dataset()` is passed to `fit`.
      policy: a name in `lbbsp.policies.POLICIES` ("lbbsp", "equal", "static",
        "dbs", "pid", "oracle") or a Policy instance.
      predictor: forecaster of the next step's speed for forecasting policies:
        "narx" (default), "arx", "ema", "last" or a `predictor.SpeedPredictor`.
      exchange: "fused" (default) gathers the workers' forecasts inside the
        train step, with the gradients, at no extra collective; decisions use
        forecasts one step older. "eager" runs one more allgather after each
        step (about 0.7 ms with Gloo) for decisions on the freshest forecasts.
      warmup_steps: first steps (tracing, warm-up) whose timings are ignored.
      sync_metrics: report loss and metrics summed over all ranks' samples
        (replaces Horovod's MetricAverageCallback, which averages unweighted).
      csv_path: where each rank writes its per-step history at the end of
        training; "{rank}" in the path is replaced by the rank.
      true_speed_fn: benchmarks only, for policy "oracle": `fn(epoch, step)`
        returns this worker's true (injected) speed at that step; the values
        of all workers travel in the exchange, so every rank sees the same.

    Per step it writes `lbbsp_batch`, `lbbsp_speed`, `lbbsp_forecast`,
    `lbbsp_compute_ms` and `lbbsp_wait_ms` into the batch logs; per epoch
    `lbbsp_batch` (mean), `lbbsp_efficiency`, `lbbsp_straggler`,
    `lbbsp_idle_fraction` and `lbbsp_overhead_ms` into the epoch logs.
    """

    def __init__(self, feed, policy="lbbsp", predictor="narx", exchange="fused", warmup_steps=1,
                 sync_metrics=True, csv_path=None, true_speed_fn=None):
        super().__init__()
        if not isinstance(feed, BalancedFeed):
            raise ValueError(f"feed={feed!r} is not allowed: give the lbbsp.keras.BalancedFeed passed to fit()")
        if exchange not in EXCHANGES:
            raise ValueError(f"exchange={exchange!r} is not allowed: use one of {EXCHANGES}")
        if csv_path is not None and not isinstance(csv_path, str):
            raise ValueError(f"csv_path={csv_path!r} is not allowed: give a path string or None")
        if true_speed_fn is not None and not callable(true_speed_fn):
            raise ValueError(f"true_speed_fn={true_speed_fn!r} is not allowed: give a callable or None")
        self.feed = feed
        self.controller = BalanceController(policy, predictor, warmup_steps)
        self.exchange = exchange
        self.sync_metrics = bool(sync_metrics)
        self.csv_path = csv_path
        self.true_speed_fn = true_speed_fn
        self._telemetry = None

    @property
    def history(self):
        """Per-step rows of this rank (see lbbsp.controller.HISTORY_FIELDS)."""
        return self.controller.history

    def write_csv(self, path):
        self.controller.write_csv(path)

    def _check_model(self):
        optimizer = self.model.optimizer
        if not is_balanced_optimizer(optimizer):
            raise ValueError(
                f"model.optimizer={optimizer!r} is not allowed: wrap it with lbbsp.keras.DistributedOptimizer "
                "(instead of hvd.DistributedOptimizer) so gradients are weighted by each worker's batch size"
            )
        spe = getattr(self.model, "_steps_per_execution", None)
        if spe is not None and int(spe.numpy()) != 1:
            raise ValueError(
                f"steps_per_execution={int(spe.numpy())} is not allowed with LoadBalancer: it must be 1, "
                "since batch sizes change between steps"
            )
        steps = self.params.get("steps") if self.params else None
        if steps is not None and steps != self.feed.steps_per_epoch:
            raise ValueError(
                f"steps_per_epoch={steps} is not allowed: pass steps_per_epoch=feed.steps_per_epoch "
                f"({self.feed.steps_per_epoch}) to fit()"
            )
        return optimizer._lbbsp_state

    def on_train_begin(self, logs=None):
        self._state = self._check_model()
        self.rank, self.size = hvd.rank(), hvd.size()
        if self._state.size != self.size:
            raise ValueError(
                f"the optimizer was wrapped for {self._state.size} workers but Horovod runs {self.size}"
            )
        self.feed.bind(self.rank, self.size)
        self._batches = self.controller.start(self.rank, self.size, self.feed.schedule,
                                              self.feed.b_min, self.feed.b_max)
        wants_features = self.controller.predictor is not None and self.controller.predictor.uses_features
        if (wants_features or self.csv_path) and self._telemetry is None:
            from predictor.telemetry import Telemetry
            self._telemetry = Telemetry()
        self._state.outbox[:] = np.nan
        self._epoch = 0
        self._train_metrics = {}

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch
        self._train_metrics = {}
        # Work between epochs (validation, checkpoints) is not part of any step's busy time.
        self._state.restart_clock()

    def on_train_batch_begin(self, batch, logs=None):
        started = time.perf_counter()
        self._t_begin = time.time()
        self.feed.plan(self._epoch, batch, self._batches)
        self._state.set_scale(self._batches[self.rank] / float(self.feed.schedule[batch]))
        self._steps_before = self._state.steps
        self._overhead = time.perf_counter() - started

    def on_train_batch_end(self, batch, logs=None):
        t_end = time.time()
        started = time.perf_counter()
        state = self._state
        local = int(self._batches[self.rank])
        if self.feed.served != (self._epoch, batch, local) or self.feed.serves != 1:
            raise RuntimeError(
                f"lbbsp: step {batch} of epoch {self._epoch} should have read {local} samples once but the feed "
                f"served {self.feed.served} {self.feed.serves} time(s); the dataset was prefetched or wrapped "
                "(pass feed.dataset() to fit unchanged)"
            )
        if state.steps != self._steps_before + 1:
            raise RuntimeError(
                "lbbsp: the train step did not go through lbbsp.keras.DistributedOptimizer's gradients "
                "(a custom train_step must call optimizer.minimize or optimizer.compute_gradients)"
            )
        compute = float(state.gathered[self.rank, ROW_FIELDS.index("compute")])
        wait = state.done - state.ready
        speed = local / compute if compute > 0 else float("nan")
        features = self._telemetry.sample() if self._telemetry is not None else None
        forecast = self.controller.forecast(speed, features, local)
        true = float(self.true_speed_fn(self._epoch, batch + 1)) if self.true_speed_fn else float("nan")
        if self.exchange == "eager":
            row = tf.constant([[forecast, wait, true, compute]], dtype=tf.float64)
            gathered = hvd.allgather(row, name="lbbsp_eager_stats").numpy()
        else:
            gathered = state.gathered
        current = self._batches
        self._batches, stats = self.controller.decide(self._epoch, batch, gathered)
        state.outbox[:] = (forecast, wait, true)
        if batch + 1 >= self.feed.steps_per_epoch and self.sync_metrics:
            self._train_metrics = global_metric_results(self.model)
        overhead = self._overhead + time.perf_counter() - started
        self.controller.record(
            time=t_end, epoch=self._epoch, step=batch, rank=self.rank, global_batch=int(current.sum()),
            batch=local, compute=compute, wait=wait, step_time=t_end - self._t_begin, speed=speed,
            forecast=forecast, next_batch=int(self._batches[self.rank]), efficiency=stats.efficiency,
            overhead=overhead, features=features,
        )
        if logs is not None:
            logs.update(zip(STEP_KEYS, (local, speed, forecast, 1e3 * compute, 1e3 * wait)))

    def on_epoch_end(self, epoch, logs=None):
        if logs is None:
            return
        # Keras copies the last step's batch logs into the epoch logs: keep only epoch figures.
        for key in STEP_KEYS:
            logs.pop(key, None)
        logs.update(self._train_metrics)
        if self.sync_metrics and any(key.startswith("val_") for key in logs):
            logs.update(global_metric_results(self.model, prefix="val_"))
        logs.update(self.controller.epoch_summary())

    def on_train_end(self, logs=None):
        if self.csv_path:
            self.write_csv(self.csv_path.format(rank=self.rank))
