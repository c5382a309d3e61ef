"""One rank's side of LB-BSP without a framework: plans, forecasts, decisions off the step, resyncs, state.

The Keras callback (lbbsp.keras.callbacks) adapts Keras events to this class,
as Horovod's Keras callbacks adapt to its framework-free `*Impl` classes. The
train thread and the decision thread share nothing mutable: a decision is
published as an immutable `lbbsp.controller.Plan` into the feed's plan queue
(lbbsp.feed), the one owner of every step's split, and the train thread
reads the plan of the step it runs from there. The controller, its policy and
the step log belong to the decision thread; the train thread touches them
only after waiting for every queued decision (`drain`). A decision runs while
the next step's allreduce does (`Background`).
"""
import collections
import concurrent.futures
import logging
import math
import os
import pickle
import threading
import time

import numpy as np
from predictor.telemetry import QuotaReader

from .consistency import digests_agree
from .controller import BalanceController
from .exchange import unpack
from .forecasting import Forecaster
from .history import StepLog
from .metrics import step_balance
from .steptime import batch_free_speed

__all__ = ["Balancer", "Background"]

log = logging.getLogger(__name__)


class Background:
    """One thread that runs a rank's decisions in order, each once it is released.

    The train step after the one that queued a decision releases it when this worker's gradients exist
    (`Balancer.local`): the train thread then waits in the allreduce and its core is idle. Run as soon as
    it was queued, a decision would hold the GIL and share the core while the next step is dispatched and
    computed, and its CPU would land on the critical path (docs/results.md, "Where a decision runs"). A
    decision that the train thread waits for is released at once, as is every one on a worker under a CPU
    quota (`Balancer.after_step`); none waits longer than WAIT seconds.
    """

    #: Seconds a queued decision waits at most: where steps are longer, where it runs no longer matters.
    WAIT = 1.0

    def __init__(self):
        self._cond = threading.Condition()
        self._jobs = collections.deque()  # (ticket, queued at, future, fn, args), in order
        self._thread, self._closed = None, False
        self._queued = self._released = 0

    def submit(self, fn, *args, hold=True):
        """Queue `fn(*args)`: it runs after every decision queued before it, once released (at once without
        `hold`); returns its concurrent.futures.Future. A held decision wakes nothing: its release does."""
        future = concurrent.futures.Future()
        with self._cond:
            if self._thread is None:
                self._thread, self._closed = threading.Thread(target=self._work, name="lbbsp", daemon=True), False
                self._thread.start()
            self._jobs.append((self._queued, time.monotonic(), future, fn, args))
            self._queued += 1
            if not hold or self.WAIT <= 0:
                self._released = self._queued
                self._cond.notify()
        return future

    def _work(self):
        while True:
            with self._cond:
                while True:
                    if self._jobs:
                        ticket, queued, future, fn, args = self._jobs[0]
                        wait = queued + self.WAIT - time.monotonic()
                        if self._released > ticket or wait <= 0:
                            break
                        timeout = min(wait, self.WAIT / 2)
                    elif self._closed:
                        return
                    else:  # idle: look again within half a WAIT for a held decision (none is held without a WAIT)
                        timeout = self.WAIT / 2 if self.WAIT > 0 else None
                    self._cond.wait(timeout)
                self._jobs.popleft()
            try:
                future.set_result(fn(*args))
            except BaseException as exc:  # noqa: BLE001 - handed to whoever waits for the decision
                future.set_exception(exc)

    def release(self):
        """Let every decision queued so far start."""
        with self._cond:
            if self._released < self._queued:
                self._released = self._queued
                self._cond.notify()

    def close(self):
        """Run every queued decision, then stop the thread."""
        with self._cond:
            thread, self._thread = self._thread, None
            self._released, self._closed = self._queued, True
            self._cond.notify()
        if thread is not None:
            thread.join()


class Balancer:
    """LB-BSP for one rank of a job, fed by a framework adapter (see the module docstring).

    `telemetry` is a predictor.telemetry reader or None; `broadcast(obj)` returns rank 0's `obj` on every rank
    (a collective); `warm_shapes` the batch sizes every worker set up before training. `quota` reads this
    worker's CPU quota (predictor.telemetry.QuotaReader), whatever the predictor reads.
    """

    def __init__(self, feed, controller, forecaster=None, telemetry=None, csv_path=None, keep_steps=1000,
                 warm_shapes=()):
        if not isinstance(controller, BalanceController):
            raise ValueError(f"controller={controller!r} is not allowed: give a lbbsp.controller.BalanceController")
        if forecaster is not None and not isinstance(forecaster, Forecaster):
            raise ValueError(f"forecaster={forecaster!r} is not allowed: give a lbbsp.forecasting.Forecaster")
        self.feed, self.controller, self.forecaster, self.telemetry = feed, controller, forecaster, telemetry
        self.csv_path, self.keep_steps, self.warm_shapes = csv_path, keep_steps, tuple(warm_shapes)
        self.steps = StepLog(keep=keep_steps)
        self.quota = QuotaReader()
        self._thread = Background()
        self._decisions = collections.deque()
        self.resynced = []

    def begin(self, rank, size, epoch=0, first_run=True, gpu=False):
        """Start a run (a fit, or a fit of an elastic job after a change) on this feed's schedule; `gpu`: some
        worker trains on a GPU (the same on every rank)."""
        if self.feed.prefetch > self.controller.plan_ahead:
            raise ValueError(f"prefetch={self.feed.prefetch} is not allowed with plan_ahead="
                             f"{self.controller.plan_ahead}: a step's data can be read only once its split is "
                             "decided; use BalancedFeed(..., prefetch=k) with k <= plan_ahead")
        self.abandon()
        self.rank, self.size = rank, size
        feed = self.feed
        feed.use_device(gpu)
        self._start = (feed.epoch_schedule, feed.bounds, epoch, 0, self.warm_shapes, gpu)
        # Published at the first step, whose key a resumed fit only then tells (Keras skips finished steps).
        self._pending = self.controller.start(*self._start)
        log.info("lbbsp: %d workers, global batch %d, batches on multiples of %d", size, feed.global_batch, feed.grid)
        if self.forecaster is not None and first_run:
            self.forecaster.reset()
        extra = self.telemetry.features if self.telemetry is not None else ()
        self.steps.close()
        self.steps = StepLog(self.csv_path.format(rank=rank) if self.csv_path else None, self.keep_steps, extra,
                             append=not first_run)
        self.resynced, self._unchecked_until = [], -1
        self._counts, self._shapes = self._forecast_counts(), self._shape_counts()
        self._ran = 0  # steps this run has started: the train thread's own count
        self._quota = False  # this worker ran its latest step under a CPU quota (below one core)

    def continue_from(self, state):
        """Take over a saved decision state (a resume); the first step plans from its split."""
        self.controller.load_state(state)
        self._pending = []

    def before_step(self, epoch, step):
        """The Plan of (epoch, step), once its decision is done (it usually ran while the previous step trained)."""
        key = (epoch, step)
        if self._pending is not None:  # the first step of a run: the plans known before any decision
            first = [p for p in self._pending if p.key >= key]
            for plan in first if first and first[0].key == key else self.controller.initial_plans(*key):
                self.feed.publish(plan)
            self._pending = None
        plan = self.feed.plan_of(*key)
        while plan is None and self._decisions:
            self._thread.release()  # the train thread waits for it: nothing to keep clear of
            self._decisions.popleft().result()
            plan = self.feed.plan_of(*key)
        if plan is None:
            raise RuntimeError(f"lbbsp: no split was decided for step {step} of epoch {epoch}")
        self.feed.start_step(epoch, step)
        self._plan, self._local, self._ran = plan, None, self._ran + 1
        return plan

    def local(self, compute):
        """In the train step, once this worker's gradients exist: read telemetry, forecast, fill the row.

        The forecast is made from the step just measured, so the decision that reads it is as fresh as the
        gathered timings. The fixed cost it uses is the one the running step's plan carries.
        """
        started, cpu = time.perf_counter(), time.thread_time()
        features, reading = None, (0.0, 0.0)
        if self.telemetry is not None and (self.csv_path or self.forecaster is None or
                                           self.forecaster.wants_features):
            try:
                features = self.telemetry.sample()
                spent = time.thread_time() - cpu  # CPU only: a pending quota stall lands at its first read
                reading = (spent, spent)
            except Exception as exc:  # noqa: BLE001 - telemetry that fails degrades to no features
                log.warning("lbbsp: telemetry failed (%r); forecasting without machine readings from now on", exc)
                self.telemetry = None
        offset = float(self._plan.offsets[self.rank])
        forecast, batch = math.nan, int(self._plan.sizes[self.rank])
        share = self.quota.share()
        # The decision that reads this step's forecast is past the controller's warm-up from this step on.
        if self.forecaster is not None and self._ran > self.controller.warmup_steps:
            forecast = self.forecaster.update(batch, compute, offset, features, share, reading)
        elif self.forecaster is not None:
            self.forecaster.shapes.add(batch)  # set up during the warm-up steps
        self._local = (compute, offset, forecast, features, time.perf_counter() - started, time.thread_time() - cpu)
        self._quota = share < 1.0
        self._thread.release()  # the decisions queued so far run while this step's allreduce does
        return {"forecast": forecast, "split": self._plan.digest, "decision": self._plan.cost}

    def after_step(self, epoch, step, gathered, record, broadcast):
        """The step is done (its rows gathered): check that every rank ran the same split, queue the decision;
        return this worker's (batch-free speed, forecast, compute seconds) of the step.

        `record` is this rank's per-step record so far (lbbsp.history.FIELDS, with the adapter's own time on the
        critical path in overhead and overhead_cpu); the decision thread completes and logs it.
        """
        if self._local is None:
            raise RuntimeError("lbbsp: the train step did not go through lbbsp.keras.DistributedOptimizer's "
                               "gradients (a custom train_step must call optimizer.minimize or compute_gradients)")
        compute, offset, forecast, features, cost, cpu = self._local
        record.update(speed=batch_free_speed(int(self._plan.sizes[self.rank]), compute, offset), offset=offset,
                      forecast=forecast, compute=compute, decision=self._plan.cost, overhead=record["overhead"] + cost,
                      overhead_cpu=record["overhead_cpu"] + cpu)
        if features is not None:
            record.update(zip(self.steps.columns[len(self.steps.columns) - len(features):], map(float, features)))
        sizes = self._plan.sizes
        index = self.feed.epoch_schedule.index(epoch, step)
        if index > self._unchecked_until and not digests_agree(unpack(gathered).split):
            sizes = self._resync(index, broadcast)
        while self._decisions and self._decisions[0].done():  # finished ones: keep the queue a step or two long
            self._decisions.popleft().result()
        # Under a CPU quota no core idles in the allreduce: the decision's CPU delays the worker wherever it runs,
        # and run at once it shows in the next step's compute time, which the split accounts for.
        hold = self.controller.plan_ahead > 0 and not self._quota
        self._decisions.append(self._thread.submit(self._decide, epoch, step, np.array(gathered), sizes,
                                                   dict(record), hold=hold))
        if self.controller.plan_ahead == 0:
            self._decisions.popleft().result()
        return record["speed"], forecast, compute

    def _decide(self, epoch, step, gathered, sizes, record):
        """Decision thread: the next plan from this step's gathered rows, published; this step's record."""
        started = time.perf_counter()
        plan, stats = self.controller.decide(epoch, step, gathered, sizes)
        self.feed.publish(plan)  # the input pipeline may start on that step now
        balanced, slowest = step_balance(stats.batches, stats.compute)
        record.update(next_batch_size=int(plan.sizes[self.rank]),
                      efficiency=balanced / slowest if slowest > 0 else math.nan,
                      background=time.perf_counter() - started)
        self.steps.add(record, balanced, slowest)

    def _resync(self, index, broadcast):
        """The ranks ran different splits in this step (every rank sees it in the same gathered rows): all take
        rank 0's decision state, its plans of the coming steps and its split of this step (which the decision
        from this step's rows reads). A step the input pipeline has already read keeps this rank's own plan."""
        self.drain()
        mine = [self.feed.plan_of(*self.feed.epoch_schedule.after(*self._plan.key, ahead))
                for ahead in range(1, self.controller.plan_ahead + 2)]
        shared = broadcast({"controller": self.controller.state(), "plans": [p for p in mine if p is not None],
                            "sizes": self._plan.sizes} if self.rank == 0 else None)
        self.controller.load_state(shared["controller"])
        kept = sum(not self.feed.replace(plan) for plan in shared["plans"])
        self.resynced.append(index)
        self._unchecked_until = index + self.feed.prefetch
        log.warning("lbbsp: the ranks ran different splits at step %d of the run (resync %d); all continue from "
                    "rank 0's decision state%s. Different numpy builds or CPU instruction sets round differently: "
                    "see the warning at the start of training", index, len(self.resynced),
                    f" ({kept} step(s) already read keep this rank's plan)" if kept else "")
        return np.asarray(shared["sizes"], dtype=np.int64)

    def drain(self):
        """Wait for every queued decision."""
        self._thread.release()
        while self._decisions:
            self._decisions.popleft().result()

    def abandon(self):
        """Let decisions queued by an interrupted fit finish; their results are of no use any more."""
        self._thread.release()
        while self._decisions:
            try:
                self._decisions.popleft().result()
            except Exception as exc:  # noqa: BLE001 - the fit they belonged to has failed already
                log.debug("lbbsp: a decision of an interrupted fit failed: %r", exc)

    def _forecast_counts(self):
        return (self.forecaster.model_steps, self.forecaster.last_value_steps) if self.forecaster else (0, 0)

    def _shape_counts(self):
        """(batch shapes this worker has run, seconds of set-up measured on it), where the policy models them."""
        model = getattr(self.controller.policy, "model", None)
        if model is None or model.num_workers != self.size:
            return 0, 0.0
        return len(model.shapes[self.rank]), float(model.setup[1][self.rank])

    def epoch_logs(self):
        """This epoch's figures (lbbsp_* keys) for the epoch logs; call at the epoch's end."""
        self.drain()
        self.steps.flush()
        logs = self.steps.epoch_summary()
        logs["lbbsp_resyncs"] = len(self.resynced)
        model, last = (now - before for now, before in zip(self._forecast_counts(), self._counts))
        shapes, setup = (now - before for now, before in zip(self._shape_counts(), self._shapes))
        self._counts, self._shapes = self._forecast_counts(), self._shape_counts()
        if model + last:
            logs["lbbsp_model_share"] = model / (model + last)
        if self._shapes[0]:
            logs.update(lbbsp_shapes=shapes, lbbsp_setup_s=setup)
        return logs

    def end(self):
        """End of training: stop the reader, finish the decisions, close the log."""
        self.feed.close()
        self.drain()
        self._thread.close()
        self.steps.close()

    # Checkpoints: rank 0's decision state is what every rank continues from.

    def save(self, path, epoch, step):
        """Write this rank's state (the decision state and the predictor) to `path`, atomically. A save that fails
        (a full disk, a predictor that cannot be pickled) leaves the last saved state in place and training goes
        on, with a warning; returns whether it was saved."""
        self.drain()
        data = {"version": 2, "epoch": epoch, "step": step, "controller": self.controller.state(),
                "predictor": self.forecaster.predictor if self.forecaster is not None else None}
        try:
            with open(f"{path}.tmp", "wb") as fh:
                pickle.dump(data, fh, protocol=pickle.HIGHEST_PROTOCOL)
            os.replace(f"{path}.tmp", path)
            return True
        except Exception as exc:  # noqa: BLE001 - a plugin failure must not stop training
            log.warning("lbbsp: saving the state to %s at epoch %d, step %d failed (%r); training goes on, and a "
                        "resume continues from the last state saved", path, epoch, step, exc)
            try:
                os.remove(f"{path}.tmp")
            except OSError:
                pass
            return False

    def restore(self, path, broadcast):
        """Continue from rank 0's file at `path` if it has one; True when the decision state was restored."""
        saved = None
        if os.path.exists(path):
            try:
                with open(path, "rb") as fh:
                    saved = pickle.load(fh)
            except Exception as exc:  # noqa: BLE001 - an unreadable file (or one of another version) starts afresh
                log.warning("lbbsp: state %s unreadable (%r); starting from equal batches", path, exc)
            if saved is not None and (not isinstance(saved, dict) or saved.get("version") != 2):
                log.warning("lbbsp: state %s was saved by another version of lbbsp; starting from equal batches",
                            path)
                saved = None
        shared = broadcast(saved["controller"] if saved and self.rank == 0 else None)
        if shared is None:
            return False
        try:
            self.continue_from(shared)
        except Exception as exc:  # noqa: BLE001 - the same state, so the same error, on every rank: all start afresh
            log.warning("lbbsp: state does not fit this job (%s); starting from equal batches", exc)
            self._pending = self.controller.start(*self._start)
            return False
        predictor = saved.get("predictor") if saved else None
        if self.forecaster is not None and type(predictor) is type(self.forecaster.predictor):
            self.forecaster.predictor = predictor
        log.info("lbbsp: resumed from %s (saved at epoch %s, step %s)", path, saved["epoch"] if saved else "?",
                 saved["step"] if saved else "?")
        return True
