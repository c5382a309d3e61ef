"""The LoadBalancer Keras callback: adapts Keras events to lbbsp's controller, forecaster and step log."""
import collections
import logging
import math
import os
import pickle
import socket
import time

import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf

from ..consistency import build_mismatch, digest, digests_agree, numpy_build
from ..controller import BalanceController
from ..exchange import Row
from ..forecasting import FORECAST_BUDGET, Background, Forecaster, check_budget
from ..history import FIELDS, StepLog
from ..policies import LBBSPPolicy
from ..steptime import batch_free_speed
from .data import BalancedFeed
from .global_metrics import global_metric_results
from .optimizer import is_balanced_optimizer

__all__ = ["LoadBalancer", "worker_identity"]

log = logging.getLogger(__name__)

#: Keys written into the batch logs at every step.
STEP_KEYS = ("lbbsp_batch", "lbbsp_speed", "lbbsp_forecast", "lbbsp_compute_ms", "lbbsp_wait_ms")


def worker_identity():
    """This worker's stable identity across elastic resets: its host (as the launcher named it) and local rank."""
    host = os.environ.get("HOROVOD_HOSTNAME") or socket.gethostname()
    return f"{host}:{hvd.local_rank()}"


class LoadBalancer(tf.keras.callbacks.Callback):
    """Sets every worker's batch size each step so that all workers finish together (LB-BSP).

    Args:
      feed: the `lbbsp.keras.BalancedFeed` whose `dataset()` is passed to `fit`.
      policy: a name in `lbbsp.policies.POLICIES` ("lbbsp", "equal", "static",
        "dbs", "pid") or a Policy instance.
      predictor: forecaster of this worker's next batch-free speed, for
        forecasting policies: "narx" (default), "arx", "ema", "last" or a
        `predictor.SpeedPredictor`.
      warmup_steps: first steps (tracing, warm-up) whose timings are ignored.
      plan_ahead: the timings of step t decide the split of step
        t + 1 + plan_ahead. With 1 (the default) the decision runs on a
        background thread while step t + 1 trains, so the slowest worker
        never waits for it; 0 reacts a step sooner, with the decision on the
        critical path.
      sync_metrics: report loss and metrics summed over all ranks' samples
        (replaces Horovod's MetricAverageCallback, which averages unweighted).
      csv_path: where each rank streams its per-step records ("{rank}" is
        replaced by the rank); columns in `lbbsp.history.FIELDS`.
      keep_steps: how many recent per-step records stay in memory
        (`history`); None keeps all (memory then grows with the run).
      state_path: where each rank saves lbbsp's state ("{rank}" is replaced by
        the rank): the split, the step-time model, the policy's and the
        predictor's state. Saved at every epoch end and every `state_every`
        steps; when the file exists at the start of training (a job resumed
        from a Keras checkpoint, `BackupAndRestore` included), training
        continues balanced from it. Rank 0's decision state is broadcast, so
        every rank resumes identically. A pickle: load only your own files.
      state_every: also save every this many steps (match BackupAndRestore's
        `save_freq`); None saves at epoch ends only.
      forecast_budget: the share of this worker's compute time its predictor
        may take per step (the forecast runs before the worker's allreduce).
        Over it, the worker forecasts its last measured speed, re-times the
        predictor every 32 steps and reads telemetry only for the steps that
        re-timing reads (`lbbsp.forecasting.Forecaster`). None runs the
        predictor at every step.

    Per step it writes `lbbsp_batch`, `lbbsp_speed`, `lbbsp_forecast`,
    `lbbsp_compute_ms` and `lbbsp_wait_ms` into the batch logs; per epoch
    `lbbsp_batch` (mean), `lbbsp_efficiency`, `lbbsp_idle_fraction`,
    `lbbsp_overhead_ms` (plugin time on the step's critical path; on a
    worker under a CPU quota it holds whatever quota stall lands in it),
    `lbbsp_overhead_cpu_ms` (the CPU time of that work: what the plugin costs),
    `lbbsp_background_ms` (the decision, off it), `lbbsp_resyncs` (how
    often in this fit the ranks found they had run different splits and took
    rank 0's decision state, lbbsp.consistency) and, with a predictor,
    `lbbsp_model_share` (the share of this epoch's forecasts this worker's
    predictor made; the rest were its last measured speed) and, for
    lbbsp's default `variance_aware="auto"`, `lbbsp_choice` (the split it
    takes now, an index into the policy's `candidates`, by default
    LBBSPPolicy.CANDIDATES: 0 the forecasts, 1 corrected, 2 their quantile,
    3 the forecasts without noise shrinkage) into the epoch logs.
    """

    def __init__(self, feed, policy="lbbsp", predictor="narx", warmup_steps=2, plan_ahead=1, sync_metrics=True,
                 csv_path=None, keep_steps=1000, state_path=None, state_every=None, forecast_budget=FORECAST_BUDGET):
        super().__init__()
        if not isinstance(feed, BalancedFeed):
            raise ValueError(f"feed={feed!r} is not allowed: give the lbbsp.keras.BalancedFeed passed to fit()")
        for name, value in (("csv_path", csv_path), ("state_path", state_path)):
            if value is not None and not isinstance(value, str):
                raise ValueError(f"{name}={value!r} is not allowed: give a path string or None")
        if state_every is not None and (isinstance(state_every, bool) or not isinstance(state_every, int)
                                        or state_every < 1):
            raise ValueError(f"state_every={state_every!r} is not allowed: give an integer >= 1 or None")
        self.state_path, self.state_every = state_path, state_every
        self.feed = feed
        self.controller = BalanceController(policy, warmup_steps, plan_ahead)
        budget = check_budget(forecast_budget)
        self.forecaster = Forecaster(predictor, budget=budget) if self.controller.uses_forecast else None
        self._worker = Background()
        self.sync_metrics = bool(sync_metrics)
        self.csv_path = csv_path
        if keep_steps is not None and (isinstance(keep_steps, bool) or not isinstance(keep_steps, int)
                                       or keep_steps < 0):
            raise ValueError(f"keep_steps={keep_steps!r} is not allowed: give an integer >= 0 or None (keep all)")
        self.keep_steps = keep_steps
        self.steps = StepLog(keep=keep_steps)
        self._telemetry = None
        self.elastic = None  # set by lbbsp.keras.elastic.ElasticState
        self._prepared = False
        self._decisions = collections.deque()
        self._digest = math.nan
        self.resynced = []  # the run's step indices at which the ranks took rank 0's decision state

    @property
    def history(self):
        """The most recent per-step records of this rank (dicts with the keys of lbbsp.history.FIELDS)."""
        return list(self.steps.rows)

    def _check_model(self, model, steps=None):
        optimizer = model.optimizer
        if not is_balanced_optimizer(optimizer):
            raise ValueError(
                f"model.optimizer={optimizer!r} is not allowed: wrap it with lbbsp.keras.DistributedOptimizer "
                "(instead of hvd.DistributedOptimizer) so gradients are weighted by each worker's batch size"
            )
        spe = getattr(model, "_steps_per_execution", None)
        if spe is not None and int(spe.numpy()) != 1:
            raise ValueError(
                f"steps_per_execution={int(spe.numpy())} is not allowed with LoadBalancer: it must be 1, "
                "since batch sizes change between steps"
            )
        if steps is not None and steps != self.feed.steps_per_epoch:
            raise ValueError(
                f"steps_per_epoch={steps} is not allowed: pass steps_per_epoch=feed.steps_per_epoch "
                f"({self.feed.steps_per_epoch}) to fit()"
            )
        return optimizer._lbbsp_state

    def _open_telemetry(self):
        wants = (self.forecaster is not None and self.forecaster.uses_features) or self.csv_path
        if not wants or self._telemetry is not None:
            return
        try:
            from predictor.telemetry import Telemetry
            self._telemetry = Telemetry()
        except Exception as exc:  # noqa: BLE001 - no telemetry means no features, never a failed job
            log.warning("telemetry unavailable (%r); forecasting without machine readings", exc)

    def on_train_begin(self, logs=None):
        if self.elastic is not None:
            if not self._prepared:
                raise RuntimeError("lbbsp: a LoadBalancer given to lbbsp.keras.elastic.ElasticState trains through "
                                   "lbbsp.keras.elastic.fit(state, ...), not model.fit")
            self._prepared = False
            return
        self._state = self._check_model(self.model, self.params.get("steps") if self.params else None)
        self.rank, self.size = hvd.rank(), hvd.size()
        if self._state.size != self.size:
            raise ValueError(
                f"the optimizer was wrapped for {self._state.size} workers but Horovod runs {self.size}"
            )
        self.feed.bind(self.rank, self.size)
        self._check_builds(hvd.allgather_object(numpy_build(), name="lbbsp_numpy"))
        self._begin_run()
        self.resumed = self._restore() if self.state_path else False

    @staticmethod
    def _check_builds(builds):
        """Warn when the ranks' numpy builds (gathered) may round differently (lbbsp.consistency): their splits
        would part ways."""
        problem = build_mismatch(builds)
        if problem:
            log.warning("lbbsp: %s", problem)

    def _grid(self):
        """The feed's batch grid and the finest the policy may refine it to (the same where batch_multiple is given)."""
        return {"multiple": self.feed.grid, "finest_multiple": self.feed.finest_grid}

    def _begin_run(self, epoch=0, first_run=True):
        """Per-run set-up shared by a plain fit and every fit of an elastic job."""
        if self.feed.prefetch > self.controller.plan_ahead:
            raise ValueError(
                f"prefetch={self.feed.prefetch} is not allowed with plan_ahead={self.controller.plan_ahead}: a step's "
                "data can be read only once its split is decided; use BalancedFeed(..., prefetch=k) with "
                "k <= plan_ahead"
            )
        self._plans = self.controller.start(self.size, self.feed.epoch_schedule, self.feed.b_min, self.feed.b_max,
                                            epoch=epoch, **self._grid())
        log.info("lbbsp: %d workers, global batch %d, batches on multiples of %d", self.size, self.feed.global_batch,
                 self.feed.grid)
        self._decisions = collections.deque()
        self._sizes = next(iter(self._plans.values()))
        if self.forecaster is not None and first_run:
            self.forecaster.reset()
        self._open_telemetry()
        extra = self._telemetry.features if self._telemetry is not None else ()
        self.steps.close()
        self.steps = StepLog(self.csv_path.format(rank=self.rank) if self.csv_path else None, self.keep_steps, extra,
                             append=not first_run)
        self._state.on_local = self._on_local
        self._epoch = epoch
        self._train_metrics = {}
        self._counts_before = self._forecast_counts()
        self.resynced, self._unchecked_until = [], -1

    def _abandon(self):
        """Let decisions queued by an interrupted fit finish; their results are of no use any more."""
        while self._decisions:
            try:
                self._decisions.popleft().result()
            except Exception as exc:  # noqa: BLE001 - the fit they belonged to has failed already
                log.debug("decision of an interrupted fit failed: %r", exc)

    def begin_elastic(self, model):
        """Before a fit inside hvd.elastic.run: continue from the committed state in `self.elastic`.

        Called by lbbsp.keras.elastic.fit on every rank (it gathers the
        workers' identities). Every rank starts from the same committed
        snapshot (rank 0's after a sync), so all take the same split. Workers
        are matched by identity: one that stays keeps its estimates, a
        newcomer starts from the mean of the others' and the split is
        recomputed for the new set. Returns the steps left in the current epoch.
        """
        self._abandon()
        elastic = self.elastic
        self._state = self._check_model(model)
        self.rank, self.size = hvd.rank(), hvd.size()
        self._state.rebind(self.rank, self.size)
        gathered = hvd.allgather_object((worker_identity(), numpy_build()), name="lbbsp_workers")
        workers = [identity for identity, _ in gathered]
        self._check_builds([build for _, build in gathered])
        snapshot = elastic.lbbsp or {}
        epoch, position = int(elastic.epoch), int(snapshot.get("position", 0))
        self.feed.bind(self.rank, self.size, resume=(epoch, position) if position else None,
                       global_batch=elastic.global_batch_for(self.size))
        first_run = not elastic.started
        self._begin_run(epoch, first_run)
        elastic.started = True
        self.resumed = False
        saved, before = snapshot.get("controller"), snapshot.get("workers")
        if saved is not None and before is not None:
            try:
                if list(before) == list(workers):
                    self.controller.load_state(saved)
                else:
                    index = self.controller.rejoin(saved, before, workers)
                    log.info("lbbsp: workers changed from %d to %d (%d new); split %s", len(before), len(workers),
                             int((index < 0).sum()), self.controller.batch_sizes.tolist())
            except (ValueError, KeyError) as exc:  # the same on every rank: all start from equal batches together
                log.warning("lbbsp: the committed state does not fit the new workers (%s); equal batches", exc)
                self._begin_run(epoch, first_run=False)
            else:
                self._plans = {}
                self.resumed = True
        self.workers = workers
        self._prepared = True
        return self.feed.epoch_schedule.steps_in(epoch)

    def snapshot(self, epoch, step):
        """What an elastic commit after (epoch, step) keeps: the decision state, the workers, and where the
        next step starts (epoch, position in its sample order; the next epoch once this one is done)."""
        self._drain()
        schedule = self.feed.epoch_schedule
        done = step + 1 >= schedule.steps_in(epoch)
        return {"controller": self.controller.state(), "workers": list(self.workers),
                "epoch": epoch + 1 if done else epoch, "position": 0 if done else schedule.end_position(epoch, step)}

    def _state_file(self):
        return self.state_path.format(rank=self.rank)

    def _save(self, epoch, step):
        predictor = self.forecaster.predictor if self.forecaster is not None else None
        self._drain()
        data = {"version": 1, "epoch": epoch, "step": step, "controller": self.controller.state(),
                "predictor": predictor}
        tmp = f"{self._state_file()}.tmp"
        with open(tmp, "wb") as fh:
            pickle.dump(data, fh, protocol=pickle.HIGHEST_PROTOCOL)
        os.replace(tmp, self._state_file())

    def _restore(self):
        """Continue from the saved state if rank 0 has one; True when the decision state was restored."""
        saved = None
        if os.path.exists(self._state_file()):
            try:
                with open(self._state_file(), "rb") as fh:
                    saved = pickle.load(fh)
            except (OSError, pickle.UnpicklingError, EOFError, AttributeError) as exc:
                log.warning("lbbsp state %s unreadable (%r); starting from equal batches", self._state_file(), exc)
        shared = hvd.broadcast_object(saved["controller"] if saved and self.rank == 0 else None, root_rank=0,
                                      name="lbbsp_state")
        if shared is None:
            return False
        try:
            self.controller.load_state(shared)
        except (ValueError, KeyError) as exc:  # the same on every rank: all start fresh together
            log.warning("lbbsp state does not fit this job (%s); starting from equal batches", exc)
            self._plans = self.controller.start(self.size, self.feed.schedule, self.feed.b_min, self.feed.b_max,
                                                **self._grid())
            return False
        self._plans = {}  # the first step of the resumed run plans from the restored split
        predictor = saved.get("predictor") if saved else None
        if self.forecaster is not None and predictor is not None and \
                type(predictor) is type(self.forecaster.predictor):
            self.forecaster.predictor = predictor
        log.info("lbbsp resumed from %s (saved at epoch %s, step %s)", self._state_file(),
                 saved["epoch"] if saved else "?", saved["step"] if saved else "?")
        return True

    def _on_local(self, compute):
        """Runs in the train step once this worker's gradients exist: read telemetry, forecast, fill the row.

        The forecast is made here, from the step just measured, so the
        decision that reads it is as fresh as the gathered timings (a forecast
        one step older lags a drifting speed by a whole step). It costs the
        predictor's time before this worker's allreduce (about 0.1 ms for the
        NARX, microseconds for EMA and last value).
        """
        started, cpu = time.perf_counter(), time.thread_time()
        features, reading = None, (0.0, 0.0)
        wanted = self.csv_path or self.forecaster is None or self.forecaster.wants_features
        if self._telemetry is not None and wanted:
            try:
                features = self._telemetry.sample()
                spent = time.thread_time() - cpu  # CPU only: a pending quota stall lands at its first read
                reading = (spent, spent)
            except Exception as exc:  # noqa: BLE001 - telemetry that fails degrades to no features
                log.warning("telemetry failed (%r); forecasting without machine readings from now on", exc)
                self._telemetry = None
        forecast = math.nan
        offset = float(self.controller.offsets()[self.rank])
        if self.forecaster is not None and self.controller.steps_seen >= self.controller.warmup_steps:
            share = self._telemetry.cpu_share if self._telemetry is not None else 1.0
            forecast = self.forecaster.update(int(self._sizes[self.rank]), compute, offset, features, share, reading)
        self._local = (compute, offset, forecast, features, time.perf_counter() - started, time.thread_time() - cpu)
        return {"forecast": forecast, "split": self._digest}

    def _forecast_counts(self):
        return (self.forecaster.model_steps, self.forecaster.last_value_steps) if self.forecaster else (0, 0)

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch
        self._train_metrics = {}
        self._counts_before = self._forecast_counts()
        # Work between epochs (validation, checkpoints) is not part of any step's busy time.
        self._state.restart_clock()

    def _collect(self):
        """Wait for the oldest queued decision and file its split under the step it is for."""
        key, sizes = self._decisions.popleft().result()
        self._plans[key] = sizes

    def _drain(self):
        while self._decisions:
            self._collect()

    def on_train_batch_begin(self, step, logs=None):
        started, cpu = time.perf_counter(), time.thread_time()
        self._t_begin = time.time()
        key = (self._epoch, step)
        while key not in self._plans and self._decisions:
            self._collect()  # usually done long ago: it ran while the previous step trained
        if key not in self._plans or self.controller.steps_seen == 0:
            if key not in self._plans:  # first step of a resumed run: continue from the current split
                self._plans.update(self.controller.initial_plans(*key))
            for planned in sorted(k for k in self._plans if k >= key):  # the steps known before any decision
                self.feed.plan(*planned, self._plans[planned])
        self._sizes = self._plans.pop(key)
        self._digest = digest(self._sizes)
        for old in [k for k in self._plans if k < key]:
            del self._plans[old]
        self.feed.start_step(self._epoch, step)
        self._state.set_scale(self._sizes[self.rank] / float(self.feed.epoch_schedule.of(self._epoch)[step]))
        self._steps_before = self._state.steps
        self._local = None
        self._overhead, self._overhead_cpu = time.perf_counter() - started, time.thread_time() - cpu

    def on_train_batch_end(self, step, logs=None):
        t_end = time.time()
        started, cpu = time.perf_counter(), time.thread_time()
        state = self._state
        local = int(self._sizes[self.rank])
        served, times = self.feed.served(self._epoch, step)
        beyond = self.feed.served_beyond(self._epoch, step)
        if served != local or times != 1 or beyond > self.feed.prefetch:
            raise RuntimeError(
                f"lbbsp: step {step} of epoch {self._epoch} should have read {local} samples once, with at most "
                f"{self.feed.prefetch} steps read ahead; the feed served {served} samples {times} time(s), "
                f"{beyond} steps ahead: the dataset was wrapped (.batch, .shuffle, .prefetch, ...) after "
                "feed.dataset(); pass it to fit unchanged and use BalancedFeed(..., prefetch=k) for read-ahead"
            )
        if state.steps != self._steps_before + 1 or self._local is None:
            raise RuntimeError(
                "lbbsp: the train step did not go through lbbsp.keras.DistributedOptimizer's gradients "
                "(a custom train_step must call optimizer.minimize or optimizer.compute_gradients)"
            )
        compute, offset, forecast, features, local_cost, local_cpu = self._local
        wait = state.done - state.joined
        row = dict(
            time=t_end, epoch=self._epoch, step=step, rank=self.rank, workers=self.size,
            global_batch=int(self._sizes.sum()),
            batch_size=local, compute=compute, wait=wait, step_time=t_end - self._t_begin,
            speed=batch_free_speed(local, compute, offset), offset=offset, forecast=forecast,
        )
        if features is not None:
            row.update(zip(self.steps.columns[len(FIELDS):], (float(v) for v in features)))
        row["overhead"] = self._overhead + local_cost + time.perf_counter() - started
        row["overhead_cpu"] = self._overhead_cpu + local_cpu + time.thread_time() - cpu
        index = self.feed.epoch_schedule.index(self._epoch, step)
        if index > self._unchecked_until and not digests_agree(Row(state.gathered).split):
            self._resync(index)
        self._decisions.append(self._worker.submit(self._decide, self._epoch, step, state.gathered.copy(),
                                                   self._sizes, row))
        if self.controller.plan_ahead == 0:
            self._collect()
        if step + 1 >= self.feed.epoch_schedule.steps_in(self._epoch) and self.sync_metrics:
            self._train_metrics = global_metric_results(self.model)
        if self.state_path and self.state_every and (step + 1) % self.state_every == 0:
            self._save(self._epoch, step)
        if logs is not None:
            logs.update(zip(STEP_KEYS, (local, row["speed"], forecast, 1e3 * compute, 1e3 * wait)))

    def _resync(self, index):
        """The ranks ran different splits in this step (every rank sees it in the same gathered rows): all take
        rank 0's decision state, its plans of the coming steps and its split of this step (which the decision
        from this step's rows reads), so that the next decisions agree again.

        A step the input pipeline has already read keeps this rank's own plan, so the steps up to `prefetch`
        ahead are not compared again.
        """
        self._drain()
        shared = hvd.broadcast_object({"controller": self.controller.state(), "plans": dict(self._plans),
                                       "sizes": self._sizes} if self.rank == 0 else None,
                                      root_rank=0, name="lbbsp_resync")
        self.controller.load_state(shared["controller"])
        self._sizes = np.asarray(shared["sizes"], dtype=np.int64)  # what the coming decision reads this step as
        kept = 0
        for key, sizes in shared["plans"].items():
            self._plans[key] = np.asarray(sizes, dtype=np.int64)
            kept += not self.feed.replan(*key, sizes)
        self.resynced.append(index)
        self._unchecked_until = index + self.feed.prefetch
        log.warning("lbbsp: the ranks ran different splits at step %d of the run (resync %d); all continue from "
                    "rank 0's decision state%s. Different numpy builds or CPU instruction sets round differently: "
                    "see the warning at the start of training", index, len(self.resynced),
                    f" ({kept} step(s) already read keep this rank's plan)" if kept else "")

    def _decide(self, epoch, step, gathered, sizes, row):
        """Background thread: the decision from this step's gathered rows, and this step's record."""
        started = time.perf_counter()
        key, decided, stats = self.controller.decide(epoch, step, gathered, sizes)
        self.feed.plan(*key, decided)  # the input pipeline may start on that step now
        balanced, slowest = self.controller.balance(stats)
        row.update(next_batch_size=int(decided[self.rank]), efficiency=balanced / slowest if slowest > 0 else math.nan)
        row["background"] = time.perf_counter() - started
        self.steps.add(row, balanced, slowest)
        return key, decided

    def on_epoch_end(self, epoch, logs=None):
        self._drain()
        self.steps.flush()
        if self.state_path:
            self._save(epoch, self.feed.epoch_schedule.steps_in(epoch) - 1)
        if logs is None:
            return
        # Keras copies the last step's batch logs into the epoch logs: keep only epoch figures.
        for key in STEP_KEYS:
            logs.pop(key, None)
        logs.update(self._train_metrics)
        if self.sync_metrics and any(key.startswith("val_") for key in logs):
            logs.update(global_metric_results(self.model, prefix="val_"))
        logs.update(self.steps.epoch_summary())
        logs["lbbsp_resyncs"] = len(self.resynced)
        model, last = (now - before for now, before in zip(self._forecast_counts(), self._counts_before))
        if model + last:
            logs["lbbsp_model_share"] = model / (model + last)
        policy = self.controller.policy
        if isinstance(policy, LBBSPPolicy) and policy.variance_aware == "auto":
            logs["lbbsp_choice"] = policy.choice.best

    def on_train_end(self, logs=None):
        self.feed.close()
        self._drain()
        self._worker.close()
        self.steps.close()
        self._state.on_local = None
