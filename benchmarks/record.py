"""Record a real speed trace: a Keras training worker while its resources change, one CSV row per step.

    python -m benchmarks.record --scenario hog --workload mlp --batch 64 --steps 5000 \
        --out predictor/data/traces/hog_mlp_b64.csv.gz

The worker is pinned to one core. Scenarios are listed in SCENARIOS (all
switches at random times, seeded, durations drawn uniformly from
--min-hold..--max-hold seconds); quota and mixed need a writable cgroup CPU
controller (root), the others run anywhere.
"""
import argparse
import logging
import os
import sys
import threading
import time

import numpy as np

log = logging.getLogger("benchmarks.record")

SCENARIOS = {
    "steady": "nothing changes (the machine's own noise only)",
    "quota": "the worker's cgroup CPU quota jumps between 1.0, 0.75, 0.5 and 0.3 cores",
    "hog": "a busy process pinned to the worker's core switches on and off",
    "memory": "a process rewriting 2 GiB switches on and off (memory pressure), plus rare hogs",
    "mixed": "quota changes and the hog, independently",
}
QUOTAS = (1.0, 0.75, 0.5, 0.3)


class Contention:
    """Drives the injected state of a scenario from a background thread; `state` is read per step."""

    def __init__(self, scenario, core, seed, min_hold, max_hold):
        from .contention import CpuHog, CpuQuota, MemoryHog

        self.rng = np.random.default_rng(seed)
        self.scenario, self.min_hold, self.max_hold = scenario, min_hold, max_hold
        self.hog = CpuHog([core])
        self.mem = MemoryHog([core], megabytes=2048)
        self.quota = CpuQuota(1.0, pids=[os.getpid()]) if scenario in ("quota", "mixed") else None
        self.state = {"quota": 1.0, "hog": 0, "mem": 0}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _hold(self):
        return float(self.rng.uniform(self.min_hold, self.max_hold))

    def _run(self):
        due = {"quota": self._hold(), "hog": self._hold(), "mem": self._hold()}
        start = time.monotonic()
        while not self._stop.wait(0.05):
            now = time.monotonic() - start
            for what, when in due.items():
                if now < when:
                    continue
                due[what] = now + self._hold()
                if what == "quota" and self.quota is not None:
                    value = float(self.rng.choice([q for q in QUOTAS if q != self.state["quota"]]))
                    self.quota.set(value)
                    self.state["quota"] = value
                elif what == "hog" and (self.scenario in ("hog", "mixed") or
                                        (self.scenario == "memory" and self.rng.random() < 0.2)):
                    self._toggle(self.hog, "hog")
                elif what == "mem" and self.scenario == "memory":
                    self._toggle(self.mem, "mem")

    def _toggle(self, proc, key):
        if self.state[key]:
            proc.stop()
        else:
            proc.start()
        self.state[key] = 1 - self.state[key]

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.hog.close()
        self.mem.close()
        if self.quota is not None:
            self.quota.close()


def record(scenario, workload, batch, steps, seed, core, min_hold, max_hold):
    """Run the worker and return (rows, comments)."""
    import tensorflow as tf

    from predictor.telemetry import FEATURES, Telemetry

    from .contention import pin_to_cores
    from .workloads import build_model, load_data

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    pin_to_cores([core])
    x, y, _, _ = load_data(workload, seed=seed)
    model = build_model(workload, hidden=256, seed=seed)
    model.compile(optimizer=tf.keras.optimizers.SGD(0.01),
                  loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    data = tf.data.Dataset.from_tensor_slices((x, y)).repeat().shuffle(1024, seed=seed).batch(batch)
    telemetry = Telemetry()
    rows = []

    class Recorder(tf.keras.callbacks.Callback):
        def on_train_batch_end(self, step, logs=None):
            now = time.monotonic()
            step_time = now - self.last
            self.last = now
            row = {"step": step, "time": round(time.time(), 3), "batch": batch, "step_time": step_time,
                   "speed": batch / step_time}
            row.update(zip(FEATURES, (float(v) for v in telemetry.sample())))
            row.update(contention.state)
            rows.append(row)

        def on_train_begin(self, logs=None):
            self.last = time.monotonic()

    model.fit(data, steps_per_epoch=50, epochs=1, verbose=0)  # warm-up, not recorded
    with Contention(scenario, core, seed, min_hold, max_hold) as contention:
        model.fit(data, steps_per_epoch=steps, epochs=1, verbose=0, callbacks=[Recorder()])
    comments = [
        f"recorded by: python -m benchmarks.record --scenario {scenario} --workload {workload} --batch {batch} "
        f"--steps {steps} --seed {seed} --core {core} --min-hold {min_hold} --max-hold {max_hold}",
        f"machine: {os.cpu_count()} cores, tensorflow {tf.__version__}, one intra-op and one inter-op thread",
        f"scenario {scenario}: {SCENARIOS[scenario]}",
    ]
    return rows, comments


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scenario", choices=list(SCENARIOS), required=True)
    parser.add_argument("--workload", choices=("mlp", "conv", "cnn"), default="mlp")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--steps", type=int, default=5000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--core", type=int, default=max(os.sched_getaffinity(0)))
    parser.add_argument("--min-hold", type=float, default=1.0)
    parser.add_argument("--max-hold", type=float, default=6.0)
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    if args.batch < 1 or args.steps < 1:
        parser.error(f"--batch={args.batch} and --steps={args.steps} must be >= 1")
    if not 0 < args.min_hold <= args.max_hold:
        parser.error(f"--min-hold={args.min_hold} and --max-hold={args.max_hold}: need 0 < min <= max")
    if args.scenario in ("quota", "mixed"):
        from .contention import cgroups_writable
        if not cgroups_writable():
            parser.error(f"--scenario {args.scenario} needs a writable cgroup CPU controller (run as root)")
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    rows, comments = record(args.scenario, args.workload, args.batch, args.steps, args.seed, args.core,
                            args.min_hold, args.max_hold)
    from predictor.traces import write_trace
    write_trace(args.out, rows, comments)
    speeds = np.array([r["speed"] for r in rows])
    log.info("wrote %s: %d steps, speed median %.0f samples/s (p5 %.0f, p95 %.0f)", args.out, len(rows),
             np.median(speeds), np.percentile(speeds, 5), np.percentile(speeds, 95))
    return 0


if __name__ == "__main__":
    sys.exit(main())
