"""Record a real speed trace: a Keras training worker while its resources change, one CSV row per step.

    python -m benchmarks.record --scenario hog --workload mlp --batch 64 --steps 5000 \
        --out predictor/data/traces/hog_mlp_b64.csv.gz
    python -m benchmarks.record --scenario walk --workload conv --batch-range 16,160 --steps 3000 \
        --out predictor/data/traces/walk_conv_vb.csv.gz

The worker is pinned to one core. Scenarios are listed in SCENARIOS (all
switches at random times, seeded, durations drawn uniformly from
--min-hold..--max-hold seconds); all but steady, hog and memory need a
writable cgroup CPU controller (root).

With --batch-range the batch of every step is drawn at random (log-uniform,
seeded), as under a balancer that moves the split every step. Because the
draw is independent of the contention, a least-squares line of step time on
batch over the whole trace estimates the fixed cost k (in samples) without
the bias an online fit under a balancer has; the speed column is then the
batch-free speed (b + k) / t, and k is written in the trace's header.
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
    "walk": "the quota takes a random walk over continuous levels between 0.15 and 1.0 cores",
    "ramp": "the quota moves linearly from one level in 0.15..1.0 cores to the next over each hold",
    "duty": "a co-located busy process switches on and off, held to a random 20-80% duty cycle of the core",
}
QUOTAS = (1.0, 0.75, 0.5, 0.3)
#: Continuous quota range of the walk and ramp scenarios, in cores.
QUOTA_RANGE = (0.15, 1.0)
#: Range of the duty scenario's hog duty cycle (its own cgroup quota, in cores).
DUTY_RANGE = (0.2, 0.8)


class Contention:
    """Drives the injected state of a scenario from a background thread; `state` is read per step."""

    def __init__(self, scenario, core, seed, min_hold, max_hold):
        from .contention import CpuHog, CpuQuota, MemoryHog

        self.rng = np.random.default_rng(seed)
        self.scenario, self.min_hold, self.max_hold = scenario, min_hold, max_hold
        self.hog = CpuHog([core])
        self.mem = MemoryHog([core], megabytes=2048)
        self.quota = CpuQuota(1.0, pids=[os.getpid()]) if scenario in ("quota", "mixed", "walk", "ramp") else None
        self.duty = None
        if scenario == "duty":
            self.hog.start()  # spawned once, then switched and held to its duty cycle by its own quota
            self.hog.stop()
            self.duty = CpuQuota(DUTY_RANGE[1], pids=[self.hog._proc.pid])
        self.state = {"quota": 1.0, "hog": 0, "mem": 0}
        self._ramp = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _hold(self):
        return float(self.rng.uniform(self.min_hold, self.max_hold))

    def _next_quota(self, now, hold):
        """The quota level after a hold ends: a discrete jump, a random-walk step, or the start of a ramp."""
        current = self.state["quota"]
        if self.scenario == "walk":  # a log-normal step, reflected at the ends of the range (clipping would stick)
            low, high = np.log(QUOTA_RANGE)
            x = np.log(current) + self.rng.normal(0.0, 0.5)
            while not low <= x <= high:
                x = 2 * high - x if x > high else 2 * low - x
            return float(np.exp(x))
        if self.scenario == "ramp":
            self._ramp = (now, now + hold, current, float(self.rng.uniform(*QUOTA_RANGE)))
            return current
        return float(self.rng.choice([q for q in QUOTAS if q != current]))

    def _set_quota(self, value):
        self.quota.set(value)
        self.state["quota"] = round(value, 4)

    def _run(self):
        due = {"quota": self._hold(), "hog": self._hold(), "mem": self._hold()}
        start = time.monotonic()
        while not self._stop.wait(0.05):
            now = time.monotonic() - start
            if self._ramp is not None:
                t0, t1, q0, q1 = self._ramp
                self._set_quota(q0 + (q1 - q0) * min(1.0, (now - t0) / (t1 - t0)))
            for what, when in due.items():
                if now < when:
                    continue
                hold = self._hold()
                due[what] = now + hold
                if what == "quota" and self.quota is not None:
                    self._set_quota(self._next_quota(now, hold))
                elif what == "hog" and (self.scenario in ("hog", "mixed", "duty") or
                                        (self.scenario == "memory" and self.rng.random() < 0.2)):
                    self._toggle(self.hog, "hog")
                    if self.duty is not None and self.state["hog"]:
                        duty = float(self.rng.uniform(*DUTY_RANGE))
                        self.duty.set(duty)
                        self.state["hog"] = round(duty, 3)  # the share of the core the hog takes
                elif what == "mem" and self.scenario == "memory":
                    self._toggle(self.mem, "mem")

    def _toggle(self, proc, key):
        on = not self.state[key]
        (proc.start if on else proc.stop)()
        self.state[key] = int(on)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.hog.close()
        self.mem.close()
        for group in (self.quota, self.duty):
            if group is not None:
                group.close()


def fixed_cost(batches, times):
    """k = c / u (samples) of the line t = c + u b through a trace's (batch, step time) pairs, refitted once
    without the points more than 3 median absolute deviations off it; 0 when the batch never varied."""
    b, t = np.asarray(batches, dtype=np.float64), np.asarray(times, dtype=np.float64)
    keep = np.isfinite(t) & (t > 0)
    if np.ptp(b[keep]) == 0:
        return 0.0
    for _ in range(2):
        u, c = np.polyfit(b[keep], t[keep], 1)
        resid = t - (c + u * b)
        mad = np.median(np.abs(resid[keep] - np.median(resid[keep]))) + 1e-12
        keep &= np.abs(resid) <= 3 * 1.4826 * mad
    return float(max(c, 0.0) / u) if u > 0 else 0.0


def record(scenario, workload, batch, steps, seed, core, min_hold, max_hold, batch_range=None):
    """Run the worker and return (rows, comments); with `batch_range` (min, max) the batch varies per step."""
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
    if batch_range is None:
        data = tf.data.Dataset.from_tensor_slices((x, y)).repeat().shuffle(1024, seed=seed).batch(batch)
        sizes = None
    else:
        draw = np.random.default_rng(seed + 1)
        low, high = np.log(batch_range[0]), np.log(batch_range[1] + 1)
        sizes = []  # the batch of every step served, in order (the recorder reads it back per step)

        def batches():
            while True:
                size = int(np.exp(draw.uniform(low, high)))
                sizes.append(size)
                idx = draw.integers(0, len(x), size)
                yield x[idx], y[idx]

        sig = (tf.TensorSpec((None,) + x.shape[1:], tf.as_dtype(x.dtype)), tf.TensorSpec((None,), tf.int64))
        # No read-ahead: the generator runs once per step, so the newest size drawn is the step's batch.
        options = tf.data.Options()
        options.autotune.enabled = False
        options.experimental_optimization.inject_prefetch = False
        data = tf.data.Dataset.from_generator(batches, output_signature=sig).with_options(options)
    telemetry = Telemetry()
    rows = []

    class Recorder(tf.keras.callbacks.Callback):
        def on_train_batch_end(self, step, logs=None):
            now = time.monotonic()
            step_time = now - self.last
            self.last = now
            size = batch if sizes is None else sizes[-1]
            row = {"step": step, "time": round(time.time(), 3), "batch": size, "step_time": step_time,
                   "speed": size / step_time}
            row.update(zip(FEATURES, (float(v) for v in telemetry.sample())))
            row.update(contention.state)
            rows.append(row)

        def on_train_begin(self, logs=None):
            self.last = time.monotonic()

    model.fit(data, steps_per_epoch=50, epochs=1, verbose=0)  # warm-up, not recorded
    with Contention(scenario, core, seed, min_hold, max_hold) as contention:
        model.fit(data, steps_per_epoch=steps, epochs=1, verbose=0, callbacks=[Recorder()])
    how = f"--batch {batch}" if batch_range is None else f"--batch-range {batch_range[0]},{batch_range[1]}"
    comments = [
        f"recorded by: python -m benchmarks.record --scenario {scenario} --workload {workload} {how} "
        f"--steps {steps} --seed {seed} --core {core} --min-hold {min_hold} --max-hold {max_hold}",
        f"machine: {os.cpu_count()} cores, tensorflow {tf.__version__}, one intra-op and one inter-op thread",
        f"scenario {scenario}: {SCENARIOS[scenario]}",
    ]
    if sizes is not None:
        k = fixed_cost([r["batch"] for r in rows], [r["step_time"] for r in rows])
        for r in rows:
            r["speed"] = (r["batch"] + k) / r["step_time"]
        comments.append(f"batch drawn per step; speed is the batch-free speed (b + k) / t with fixed cost "
                        f"k = {k:.2f} samples (least squares of step time on batch over the trace)")
    return rows, comments


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scenario", choices=list(SCENARIOS), required=True)
    parser.add_argument("--workload", choices=("mlp", "conv", "cnn"), default="mlp")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--batch-range", help="MIN,MAX: draw every step's batch in this range (log-uniform)")
    parser.add_argument("--steps", type=int, default=5000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--core", type=int, default=max(os.sched_getaffinity(0)))
    parser.add_argument("--min-hold", type=float, default=1.0)
    parser.add_argument("--max-hold", type=float, default=6.0)
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    if args.batch < 1 or args.steps < 1:
        parser.error(f"--batch={args.batch} and --steps={args.steps} must be >= 1")
    batch_range = None
    if args.batch_range is not None:
        try:
            batch_range = tuple(int(v) for v in args.batch_range.split(","))
        except ValueError:
            batch_range = ()
        if len(batch_range) != 2 or not 1 <= batch_range[0] < batch_range[1]:
            parser.error(f"--batch-range={args.batch_range!r} is not allowed: give MIN,MAX with 1 <= MIN < MAX")
    if not 0 < args.min_hold <= args.max_hold:
        parser.error(f"--min-hold={args.min_hold} and --max-hold={args.max_hold}: need 0 < min <= max")
    if args.scenario not in ("steady", "hog", "memory"):
        from .contention import cgroups_writable
        if not cgroups_writable():
            parser.error(f"--scenario {args.scenario} needs a writable cgroup CPU controller (run as root)")
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    rows, comments = record(args.scenario, args.workload, args.batch, args.steps, args.seed, args.core,
                            args.min_hold, args.max_hold, batch_range)
    from predictor.traces import write_trace
    write_trace(args.out, rows, comments)
    speeds = np.array([r["speed"] for r in rows])
    log.info("wrote %s: %d steps, speed median %.0f samples/s (p5 %.0f, p95 %.0f)", args.out, len(rows),
             np.median(speeds), np.percentile(speeds, 5), np.percentile(speeds, 95))
    return 0


if __name__ == "__main__":
    sys.exit(main())
