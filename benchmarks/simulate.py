"""Trace-driven simulation of N workers (to 1024 and beyond) under the very same policy and allocator code.

    python -m benchmarks.simulate --workers 4,64,1024 --policies equal,pid,lbbsp-ema,lbbsp-narx,oracle

Worker i replays a recorded trace (predictor/traces, a random file and offset)
scaled to a base speed drawn from 1, 1/2, 1/4 (heterogeneous hardware). The
recorded CPU steps are short (2-15 ms), so one simulated step spans
`--aggregate` recorded steps (their time-weighted speed), like the longer
steps of a real job. A step takes t_i = overhead + b_i / v_i(t) plus a fixed
communication time; epochs have `--steps-per-epoch` steps (DBS acts per epoch).
Each worker's forecast comes from its own GuardedPredictor, and the decision
from lbbsp.controller.BalanceController with the named policy: the code that
runs inside the Keras callback. Reported per (N, policy): eta = T*/max t_i,
the speedup over equal batches, and the decision cost per step.
"""
import argparse
import os
import sys
import time

import numpy as np

from lbbsp.controller import ROW_FIELDS, BalanceController, GuardedPredictor
from predictor.traces import list_traces, read_trace

__all__ = ["Cluster", "simulate", "main", "POLICY_VARIANTS"]

POLICY_VARIANTS = {
    "equal": ("equal", None), "static": ("static", None), "dbs": ("dbs", None), "pid": ("pid", None),
    "lbbsp-ema": ("lbbsp", "ema"), "lbbsp-narx": ("lbbsp", "narx"), "oracle": ("oracle", None),
}


class Cluster:
    """N simulated workers: per-step true speeds and telemetry from recorded traces."""

    def __init__(self, num_workers, steps, seed=0, overhead=0.002, comm=0.005, traces=None, aggregate=10):
        rng = np.random.default_rng(seed)
        paths = traces or [p for p in list_traces() if not os.path.basename(p).startswith("steady")]
        loaded = [read_trace(p) for p in paths]
        base = rng.choice([1.0, 0.5, 0.25], size=num_workers, p=[0.5, 0.3, 0.2])
        self.speed = np.empty((steps + 1, num_workers))
        self.features = np.empty((steps + 1, num_workers, loaded[0]["features"].shape[1]))
        for w in range(num_workers):
            trace = loaded[rng.integers(len(loaded))]
            n = trace["speed"].size
            idx = (rng.integers(n) + np.arange((steps + 1) * aggregate)) % n
            per_sample = (1.0 / trace["speed"][idx]).reshape(steps + 1, aggregate).mean(axis=1)
            rel = (1.0 / per_sample) / np.median(trace["speed"])
            self.speed[:, w] = 1000.0 * base[w] * rel  # samples/s of a full-speed worker: 1000
            self.features[:, w] = trace["features"][idx[aggregate - 1::aggregate]]
        self.overhead, self.comm = overhead, comm
        self.num_workers, self.steps = num_workers, steps

    def compute_times(self, step, batches):
        return self.overhead + batches / self.speed[step]


def simulate(cluster, policy, predictor, global_batch, exchange_delay=0, steps_per_epoch=20):
    """Run `policy` on the cluster; returns per-step dict arrays (eta, step time, decision seconds)."""
    n = cluster.num_workers
    controller = BalanceController(policy, predictor or "ema", warmup_steps=0)
    schedule = np.full(steps_per_epoch, global_batch)
    batches = controller.start(0, n, schedule)
    forecasters = [GuardedPredictor(predictor) for _ in range(n)] if controller.policy.uses_forecast else None
    forecasts = np.full(n, np.nan)
    eta, step_time, decide = [], [], []
    col = {name: i for i, name in enumerate(ROW_FIELDS)}
    for t in range(cluster.steps):
        compute = cluster.compute_times(t, batches)
        step_time.append(compute.max() + cluster.comm)
        ideal = cluster.overhead + global_batch / cluster.speed[t].sum()
        eta.append(ideal / compute.max())
        speeds = batches / compute
        gathered = np.full((n, len(ROW_FIELDS)), np.nan)
        gathered[:, col["compute"]] = compute
        gathered[:, col["wait"]] = compute.max() - compute + cluster.comm
        gathered[:, col["true_speed"]] = cluster.speed[t + 1]
        if forecasters is not None:
            fresh = np.array([f.update(speeds[w], cluster.features[t, w], batches[w])
                              for w, f in enumerate(forecasters)])
            # Fused exchange: decisions use the forecasts sent one step earlier.
            gathered[:, col["forecast"]] = forecasts if exchange_delay else fresh
            forecasts = fresh
        start = time.perf_counter()
        batches, _ = controller.decide(t // steps_per_epoch, t % steps_per_epoch, gathered)
        decide.append(time.perf_counter() - start)
    return {"eta": np.array(eta), "step_time": np.array(step_time), "decide": np.array(decide)}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", default="4,64,1024", help="comma-separated cluster sizes")
    parser.add_argument("--policies", default="equal,pid,dbs,lbbsp-ema,lbbsp-narx,oracle")
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--per-worker-batch", type=int, default=64)
    parser.add_argument("--fused", action="store_true", help="forecasts one step old, as with exchange='fused'")
    parser.add_argument("--aggregate", type=int, default=10, help="recorded steps per simulated step")
    parser.add_argument("--steps-per-epoch", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.workers.split(",")]
    names = [p.strip() for p in args.policies.split(",")]
    unknown = [p for p in names if p not in POLICY_VARIANTS]
    if unknown or any(s < 1 for s in sizes) or args.steps < 10 or args.aggregate < 1 or args.steps_per_epoch < 1:
        parser.error(f"bad arguments: unknown policies {unknown}, sizes {sizes} (>= 1), steps {args.steps} (>= 10), "
                     f"aggregate {args.aggregate} (>= 1), steps per epoch {args.steps_per_epoch} (>= 1)")
    print(f"{'workers':>8} {'policy':<11} {'eta':>6} {'speedup':>8} {'decision ms (median/p99)':>26}")
    for n in sizes:
        cluster = Cluster(n, args.steps, seed=args.seed, aggregate=args.aggregate)
        base = None
        for name in names:
            policy, predictor = POLICY_VARIANTS[name]
            r = simulate(cluster, policy, predictor, args.per_worker_batch * n, exchange_delay=int(args.fused),
                         steps_per_epoch=args.steps_per_epoch)
            skip = 10
            mean_step = r["step_time"][skip:].mean()
            base = mean_step if name == "equal" or base is None else base
            print(f"{n:>8} {name:<11} {r['eta'][skip:].mean():>6.3f} {base / mean_step:>7.2f}x "
                  f"{1e3 * np.median(r['decide']):>14.3f} / {1e3 * np.percentile(r['decide'], 99):.3f}",
                  flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
