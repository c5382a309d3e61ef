"""One benchmark run, started on every rank by horovodrun (benchmarks/compare.py does that for you).

    horovodrun -np 4 -H localhost:4 --gloo python -m benchmarks.worker --scenario static-4 --policy lbbsp \
        --predictor narx --out-dir results/static-4/lbbsp-narx

Each rank pins itself to its core, runs under its scenario's CPU quota (or an
emulated delay where cgroups are not writable), applies the scenario's timed
events, and trains. `--policy horovod` is plain Horovod (hvd.DistributedOptimizer,
a static shard per rank, equal batches) for the overhead comparison. Rank 0
writes summary.json; every rank writes steps_rank{r}.csv.
"""
import argparse
import json
import os
import sys
import threading
import time

import numpy as np

from lbbsp.policies import POLICIES

POLICY_CHOICES = tuple(POLICIES) + ("horovod",)


def parse(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scenario", required=True, help="name in benchmarks/scenarios or a YAML path")
    parser.add_argument("--policy", choices=POLICY_CHOICES, required=True)
    parser.add_argument("--predictor", default="narx", choices=("narx", "arx", "ema", "last"))
    parser.add_argument("--exchange", default="fused", choices=("fused", "eager"))
    parser.add_argument("--epochs", type=int, help="override the scenario's epochs")
    parser.add_argument("--emulate", action="store_true", help="emulate speeds with delays even if cgroups work")
    parser.add_argument("--external", action="store_true",
                        help="speeds are imposed from outside (container CPU limits, real cluster): inject nothing")
    parser.add_argument("--out-dir", required=True)
    return parser.parse_args(argv)


class Slowdown:
    """Applies one rank's scenario: a CPU quota and hog events (real), or a delay per sample (emulated).

    With `external`, the speeds come from outside (container CPU limits, a real
    cluster) and nothing is injected; the scenario still tells the oracle.
    """

    def __init__(self, scenario, rank, emulate, external=False):
        from lbbsp.contention import CpuHog, CpuQuota, cgroups_writable

        self.scenario, self.rank, self.external = scenario, rank, external
        self.emulated = not external and (emulate or not cgroups_writable())
        self.hog = CpuHog(scenario.cores(rank))
        real = not (external or self.emulated)
        self.quota = CpuQuota(scenario.true_speed(rank, 0.0), pids=[os.getpid()]) if real else None
        self.per_sample = 0.0
        self.start_time = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._events, daemon=True)

    @property
    def label(self):
        if self.external:
            return "external (container or cluster CPU limits)"
        return "emulated (delay per sample)" if self.emulated else "real (cgroup CPU quota, co-located hog)"

    def elapsed(self):
        return 0.0 if self.start_time is None else time.time() - self.start_time

    def start(self, start_time, per_sample):
        """Begin the scenario clock (the same start_time on every rank)."""
        self.start_time, self.per_sample = start_time, per_sample
        self._thread.start()

    def _events(self):
        applied = (None, None)
        while not self._stop.wait(0.05):
            speed, hog = self.scenario.state(self.rank, self.elapsed())
            if (speed, hog) == applied:
                continue
            if self.quota is not None:
                self.quota.set(speed * self.scenario.scale)
                (self.hog.start if hog else self.hog.stop)()
            applied = (speed, hog)

    def delay(self, batch):
        """Emulated mode: sleep as long as the missing speed would have cost for `batch` samples."""
        if self.emulated and self.per_sample > 0:
            relative = self.scenario.true_speed(self.rank, self.elapsed()) / self.scenario.scale
            time.sleep(batch * self.per_sample * (1.0 / relative - 1.0))

    def true_speed(self, epoch, step):
        return self.scenario.true_speed(self.rank, self.elapsed())

    def close(self):
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        self.hog.stop()
        if self.quota is not None:
            self.quota.close()


def main(argv=None):
    args = parse(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    import horovod.tensorflow as hvd_core
    import horovod.tensorflow.keras as hvd

    import lbbsp.keras as lb
    from lbbsp.contention import pin_to_cores
    from lbbsp.workloads import build_model, load_data

    from .analysis import summarize
    from .scenario import Scenario

    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    scenario = Scenario.load(args.scenario)
    if size != scenario.workers:
        raise SystemExit(f"scenario {scenario.name} needs {scenario.workers} ranks, horovodrun gave {size}")
    epochs = args.epochs or scenario.epochs
    if not args.external:
        pin_to_cores(scenario.cores(rank))
    os.makedirs(args.out_dir, exist_ok=True)

    x, y, x_test, y_test = load_data(scenario.workload, seed=0)
    model = build_model(scenario.workload, hidden=scenario.hidden, seed=0)
    base_opt = tf.keras.optimizers.SGD(0.05 if scenario.workload == "cnn" else 0.01, momentum=0.9)
    loss = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    slowdown = Slowdown(scenario, rank, args.emulate, args.external)
    per_sample = 0.0
    if slowdown.emulated:
        # Calibrate the full-speed cost of a sample on this core, for the emulated delay.
        probe = build_model(scenario.workload, hidden=scenario.hidden, seed=1)
        probe.compile(optimizer=tf.keras.optimizers.SGD(0.01), loss=loss)
        b = scenario.global_batch // size
        probe.train_on_batch(x[:b], y[:b])
        start = time.perf_counter()
        for _ in range(3):
            probe.train_on_batch(x[:b], y[:b])
        per_sample = (time.perf_counter() - start) / (3 * b)

    timer_log = []

    class EpochClock(tf.keras.callbacks.Callback):
        """Training time per epoch (test evaluation on rank 0 excluded) and test accuracy."""

        def on_epoch_begin(self, epoch, logs=None):
            self.t = time.perf_counter()

        def on_epoch_end(self, epoch, logs=None):
            elapsed = time.perf_counter() - self.t
            acc = None
            if rank == 0:
                acc = float(np.mean(np.argmax(self.model.predict(x_test, verbose=0, batch_size=512), 1) == y_test))
            timer_log.append({"epoch": epoch, "time": elapsed, "accuracy": acc, "loss": float(logs.get("loss", 0))})
            if rank == 0:
                with open(os.path.join(args.out_dir, "progress"), "a") as fh:
                    fh.write(f"{epoch + 1}/{epochs}\n")

    callbacks = [hvd.callbacks.BroadcastGlobalVariablesCallback(0)]
    if args.policy == "horovod":
        model.compile(optimizer=hvd.DistributedOptimizer(base_opt), loss=loss)
        shard_x, shard_y = x[rank::size], y[rank::size]
        local = scenario.global_batch // size

        def batches():
            rng = np.random.default_rng(rank)
            while True:
                order = rng.permutation(len(shard_x))
                for i in range(0, len(order) - local + 1, local):
                    idx = order[i:i + local]
                    slowdown.delay(local)
                    yield shard_x[idx], shard_y[idx]

        sig = (tf.TensorSpec((None,) + x.shape[1:], tf.as_dtype(x.dtype)), tf.TensorSpec((None,), tf.int64))
        data = tf.data.Dataset.from_generator(batches, output_signature=sig)
        steps = len(x) // scenario.global_batch
        callbacks.append(hvd.callbacks.MetricAverageCallback())
        balancer = None
    else:
        model.compile(optimizer=lb.DistributedOptimizer(base_opt), loss=loss)
        source_x, source_y = x, y

        def fetch(idx):
            slowdown.delay(len(idx))
            return source_x[idx], source_y[idx]

        feed = lb.BalancedFeed.from_function(fetch, len(x), global_batch=scenario.global_batch, seed=0)
        data, steps = feed.dataset(), feed.steps_per_epoch
        exchange = "eager" if args.policy == "oracle" else args.exchange
        balancer = lb.LoadBalancer(feed, policy=args.policy, predictor=args.predictor, exchange=exchange,
                                   true_speed_fn=slowdown.true_speed if args.policy == "oracle" else None)
        callbacks.append(balancer)
    callbacks.append(EpochClock())

    start_time = float(hvd_core.broadcast(tf.constant(time.time(), tf.float64), 0, name="start_time"))
    slowdown.start(start_time, per_sample)
    try:
        model.fit(data, steps_per_epoch=steps, epochs=epochs, verbose=0, callbacks=callbacks)
    finally:
        slowdown.close()

    history = balancer.history if balancer else []
    if balancer:
        balancer.write_csv(os.path.join(args.out_dir, f"steps_rank{rank}.csv"))
    everyone = hvd_core.allgather_object(history)
    if rank == 0:
        summary = summarize(everyone, timer_log, scenario.global_batch, len(x), scenario.target_accuracy)
        summary.update(scenario=scenario.name, policy=args.policy, predictor=args.predictor if balancer else None,
                       exchange=args.exchange if balancer else None, heterogeneity=slowdown.label, workers=size,
                       global_batch=scenario.global_batch, epochs=epochs, ideal_speedup=scenario.ideal_speedup())
        with open(os.path.join(args.out_dir, "summary.json"), "w") as fh:
            json.dump(summary, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
