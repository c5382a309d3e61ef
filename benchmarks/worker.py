"""One benchmark run, started on every rank by horovodrun (benchmarks/compare.py does that for you).

    horovodrun -np 4 -H localhost:4 --gloo python -m benchmarks.worker --scenario static-4 --policy lbbsp \
        --predictor narx --out-dir results/static-4/lbbsp-narx/r0

Each rank pins itself to its core, runs under its scenario's CPU quota (or an
emulated delay where cgroups are not writable), applies the scenario's events
at the steps they name, and trains. `--policy horovod` is plain Horovod
(hvd.DistributedOptimizer, a static shard per rank, equal batches), the
reference of every table; `--policy oracle` needs `--curves` (measured
step-time curves, see benchmarks/oracle.py). Rank 0 writes summary.json;
every rank writes steps_rank{r}.csv (lbbsp's per-step records plus the time
its cgroup was throttled in each step).
"""
import argparse
import csv
import json
import os
import sys
import time

import numpy as np

from lbbsp.policies import POLICIES, LBBSPPolicy

POLICY_CHOICES = tuple(POLICIES) + ("horovod", "oracle")
#: The LoadBalancer's warm-up steps of every policy but the oracle (whose splits use no timing).
WARMUP_STEPS = 2


def parse(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scenario", required=True, help="name in benchmarks/scenarios or a YAML path")
    parser.add_argument("--policy", choices=POLICY_CHOICES, required=True)
    parser.add_argument("--predictor", default="narx", choices=("narx", "arx", "ema", "last"))
    parser.add_argument("--epochs", type=int, help="override the scenario's epochs")
    parser.add_argument("--seed", type=int, default=0, help="model initialisation and data order")
    parser.add_argument("--curves", help="measured step-time curves (JSON) for --policy oracle")
    parser.add_argument("--plan-ahead", type=int, default=1, help="lbbsp's plan_ahead (0 or more)")
    parser.add_argument("--prefetch", type=int, default=1,
                        help="steps the images workload's input pipeline prepares ahead (<= --plan-ahead)")
    parser.add_argument("--batch-multiple", type=int,
                        help="lbbsp's batch grid: every worker's batch a multiple of this (BalancedFeed "
                             "batch_multiple; default: lbbsp.allocation.default_multiple)")
    parser.add_argument("--forecast-budget", default=None,
                        help="LoadBalancer forecast_budget: a share of compute time, or 'none' to run the predictor "
                             "at every step (default: lbbsp.forecasting.FORECAST_BUDGET)")
    parser.add_argument("--min-gain", type=float, default=None, help="lbbsp policy's min_gain (hysteresis)")
    parser.add_argument("--emulate", action="store_true", help="emulate speeds with delays even if cgroups work")
    parser.add_argument("--external", action="store_true",
                        help="speeds are imposed from outside (container CPU limits, real cluster): inject nothing")
    parser.add_argument("--out-dir", required=True)
    args = parser.parse_args(argv)
    if args.forecast_budget is not None:  # given: a LoadBalancer keyword argument (None runs the predictor always)
        try:
            value = None if args.forecast_budget == "none" else float(args.forecast_budget)
        except ValueError:
            parser.error(f"--forecast-budget={args.forecast_budget!r} is not allowed: give a number >= 0 or 'none'")
        args.forecast_budget = {"forecast_budget": value}
    if args.min_gain is not None and args.policy != "lbbsp":
        parser.error(f"--min-gain is an option of --policy lbbsp, not of --policy {args.policy}")
    try:  # the policy's own check, before horovodrun starts every rank
        make_policy(args)
    except ValueError as exc:
        parser.error(f"--min-gain: {exc}")
    if args.policy == "oracle" and not args.curves:
        parser.error("--policy oracle needs --curves (benchmarks.compare measures them from the other variants)")
    return args


def make_policy(args):
    """The policy of parsed options, as the LoadBalancer takes it: a name, or an LBBSPPolicy with the lbbsp
    options. Not the oracle, which needs curves."""
    if args.policy != "lbbsp" or args.min_gain is None:
        return args.policy
    return LBBSPPolicy(min_gain=args.min_gain)


class ScenarioDriver:
    """Applies one rank's scenario state at the start of every step; records its throttled time per step.

    Real: a cgroup CPU quota and a co-located hog. Emulated (no writable
    cgroups): a sleep per sample for the speed the worker lacks. External:
    nothing (container or cluster limits).
    """

    def __init__(self, scenario, rank, emulate, external=False):
        from .contention import CpuHog, CpuQuota, cgroups_writable

        self.scenario, self.rank, self.external = scenario, rank, external
        self.emulated = not external and (emulate or not cgroups_writable())
        self.hog = CpuHog(scenario.cores(rank))
        real = not (external or self.emulated)
        self.quota = CpuQuota(scenario.cores_given(rank, 0), pids=[os.getpid()]) if real else None
        self.per_sample = 0.0
        self.applied = None
        self.throttled = []

    @property
    def label(self):
        if self.external:
            return "external (container or cluster CPU limits)"
        return "emulated (delay per sample)" if self.emulated else "real (cgroup CPU quota, co-located hog)"

    def begin_step(self, step):
        """Switch to the state of global step `step` and note the throttle counter."""
        state = self.scenario.state(self.rank, step)
        if state != self.applied and self.quota is not None:
            self.quota.set(state[0] * self.scenario.scale)
            (self.hog.start if state[1] else self.hog.stop)()
        self.applied, self.step = state, step
        self._throttle_start = self.quota.throttled_seconds() if self.quota is not None else 0.0

    def end_step(self):
        end = self.quota.throttled_seconds() if self.quota is not None else 0.0
        self.throttled.append((self.step, end - self._throttle_start))

    def delay(self, batch):
        """Emulated mode: sleep as long as the missing speed would have cost for `batch` samples."""
        if self.emulated and self.per_sample > 0 and self.applied is not None:
            relative = self.scenario.cores_given(self.rank, self.step) / self.scenario.scale
            time.sleep(batch * self.per_sample * (1.0 / relative - 1.0))

    def close(self):
        self.hog.close()
        if self.quota is not None:
            self.quota.close()


def _calibrate(scenario, x, y, loss, tf):
    """Full-speed seconds per sample on this core, for the emulated delay."""
    from .workloads import build_model

    probe = build_model(scenario.workload, hidden=scenario.hidden, seed=1)
    probe.compile(optimizer=tf.keras.optimizers.SGD(0.01), loss=loss)
    b = scenario.global_batch // scenario.workers
    probe.train_on_batch(x[:b], y[:b])
    start = time.perf_counter()
    for _ in range(3):
        probe.train_on_batch(x[:b], y[:b])
    return (time.perf_counter() - start) / (3 * b)


def main(argv=None):
    args = parse(argv)
    from .runtime import init_worker
    from .scenario import Scenario

    scenario = Scenario.load(args.scenario)
    hvd, tf = init_worker(pin=False)
    import horovod.tensorflow as hvd_core

    import lbbsp.keras as lb

    from .analysis import summarize
    from .contention import pin_to_cores
    from .workloads import build_model, load_data

    rank, size = hvd.rank(), hvd.size()
    if size != scenario.workers:
        raise SystemExit(f"scenario {scenario.name} needs {scenario.workers} ranks, horovodrun gave {size}")
    epochs = args.epochs or scenario.epochs
    if not args.external:
        pin_to_cores(scenario.cores(rank))
    os.makedirs(args.out_dir, exist_ok=True)

    x, y, x_test, y_test = load_data(scenario.workload, seed=0, num_samples=scenario.num_samples)
    model = build_model(scenario.workload, hidden=scenario.hidden, seed=args.seed)
    base_opt = tf.keras.optimizers.SGD({"cnn": 0.03, "conv": 0.05}.get(scenario.workload, 0.01), momentum=0.9)
    loss = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    driver = ScenarioDriver(scenario, rank, args.emulate, args.external)
    images = scenario.workload == "images"
    if images:
        from .workloads import image_files, image_loader

        if driver.emulated:
            raise SystemExit("the images workload needs real cgroup CPU quotas (root) or --external")
        load = image_loader(image_files(x, os.path.join(args.out_dir, "..", "..", "images")), y, seed=args.seed)
        x_test = x_test[:, 2:26, 2:26]
    if driver.emulated:
        driver.per_sample = _calibrate(scenario, x, y, loss, tf)
    timer_log = []

    class Clock(tf.keras.callbacks.Callback):
        """Drives the scenario per step; training time per epoch."""

        def on_epoch_begin(self, epoch, logs=None):
            self.epoch, self.t = epoch, time.perf_counter()

        def on_train_batch_begin(self, step, logs=None):
            driver.begin_step(self.epoch * self.params["steps"] + step)

        def on_train_batch_end(self, step, logs=None):
            driver.end_step()

        def on_epoch_end(self, epoch, logs=None):
            loss = logs.get("loss")
            timer_log.append({"epoch": epoch, "time": time.perf_counter() - self.t,
                              "loss": None if loss is None else float(loss)})
            if rank == 0:
                with open(os.path.join(args.out_dir, "progress"), "a") as fh:
                    fh.write(f"{epoch + 1}/{epochs}\n")

    callbacks = [hvd.callbacks.BroadcastGlobalVariablesCallback(0), Clock()]
    balancer = None
    if args.policy == "horovod":
        model.compile(optimizer=hvd.DistributedOptimizer(base_opt), loss=loss)
        shard_x, shard_y = x[rank::size], y[rank::size]
        local = scenario.global_batch // size

        def batches():
            rng = np.random.default_rng(args.seed * 1000 + rank)
            while True:
                order = rng.permutation(len(shard_x))
                for i in range(0, len(order) - local + 1, local):
                    idx = order[i:i + local]
                    driver.delay(local)
                    yield shard_x[idx], shard_y[idx]

        if images:  # the pipeline a user writes: per-sample load in parallel, batch, prefetch
            data = tf.data.Dataset.from_tensor_slices(np.arange(rank, len(x), size)).shuffle(len(x) // size,
                                                                                              seed=args.seed)
            data = data.repeat().map(load, num_parallel_calls=tf.data.AUTOTUNE).batch(local, drop_remainder=True)
            data = data.prefetch(1)
        else:
            sig = (tf.TensorSpec((None,) + x.shape[1:], tf.as_dtype(x.dtype)), tf.TensorSpec((None,), tf.int64))
            data = tf.data.Dataset.from_generator(batches, output_signature=sig)
            if driver.emulated:  # an emulated delay stands for compute: no read-ahead (tf.data's own) may hide it
                options = tf.data.Options()
                options.experimental_optimization.inject_prefetch = False
                data = data.with_options(options)
        steps = len(x) // scenario.global_batch
        callbacks.insert(1, hvd.callbacks.MetricAverageCallback())
    else:
        model.compile(optimizer=lb.DistributedOptimizer(base_opt), loss=loss)

        def fetch(idx):
            driver.delay(len(idx))
            return x[idx], y[idx]

        if images:
            feed = lb.BalancedFeed.from_sample_fn(load, len(x), global_batch=scenario.global_batch, seed=args.seed,
                                                  prefetch=args.prefetch, batch_multiple=args.batch_multiple)
        else:
            feed = lb.BalancedFeed.from_function(fetch, len(x), global_batch=scenario.global_batch, seed=args.seed,
                                                 batch_multiple=args.batch_multiple)
        data, steps = feed.dataset(), feed.steps_per_epoch
        policy, warmup = make_policy(args), WARMUP_STEPS
        if args.policy == "oracle":  # the oracle needs no warm-up: it uses no timing
            from .oracle import CurveBook, OraclePolicy, load_curves

            policy, warmup = OraclePolicy(CurveBook(scenario, load_curves(args.curves)).at), 0
        balancer = lb.LoadBalancer(feed, policy=policy, predictor=args.predictor, warmup_steps=warmup,
                                   plan_ahead=args.plan_ahead, keep_steps=None, **(args.forecast_budget or {}))
        callbacks.append(balancer)

    start = time.perf_counter()
    try:
        model.fit(data, steps_per_epoch=steps, epochs=epochs, verbose=0, callbacks=callbacks)
    finally:
        driver.close()
    wall = time.perf_counter() - start
    accuracy = float(np.mean(np.argmax(model.predict(x_test, verbose=0, batch_size=512), 1) == y_test))

    history = balancer.history if balancer else []
    throttled = dict(driver.throttled)
    for row in history:
        row["throttled"] = throttled.get(row["epoch"] * steps + row["step"], 0.0)
        row["cores"] = scenario.cores_given(rank, row["epoch"] * steps + row["step"])
        row["state_speed"], row["state_hog"] = scenario.state(rank, row["epoch"] * steps + row["step"])
    if history:
        with open(os.path.join(args.out_dir, f"steps_rank{rank}.csv"), "w", newline="") as fh:
            writer = csv.DictWriter(fh, fieldnames=list(history[0]), extrasaction="ignore")
            writer.writeheader()
            writer.writerows(history)
    import resource

    everyone = hvd_core.allgather_object(history)
    peak_rss = hvd_core.allgather_object(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0)
    forecaster = balancer.forecaster if balancer else None
    counts = hvd_core.allgather_object((forecaster.model_steps, forecaster.last_value_steps) if forecaster else None)
    if rank == 0:
        summary = summarize(everyone, timer_log, len(x), steps)
        summary["final_accuracy"] = accuracy
        summary["peak_rss_mb"] = [round(float(v), 1) for v in peak_rss]
        if forecaster is not None:  # per rank: the share of forecasts its predictor made (the rest: last speed)
            summary["model_share"] = [round(m / max(m + k, 1), 3) for m, k in counts]
        if balancer is not None:
            summary["grid"] = balancer.feed.grid  # the batch grid the splits kept (benchmarks.replay reads it)
        summary.update(scenario=scenario.name, policy=args.policy, predictor=args.predictor if balancer else None,
                       heterogeneity=driver.label, workers=size, global_batch=scenario.global_batch, epochs=epochs,
                       seed=args.seed, wall=wall, steps_per_epoch=steps)
        with open(os.path.join(args.out_dir, "summary.json"), "w") as fh:
            json.dump(summary, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
