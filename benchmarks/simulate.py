"""Trace-driven simulation of N workers (to 1024 and beyond) under the very same policy, model and forecaster code.

    python -m benchmarks.simulate --workers 4,64,1024 --policies equal,pid,lbbsp-ema,lbbsp-narx,oracle

Worker i replays a recorded trace (predictor/data/traces, a random file and
offset) scaled to a base speed drawn from 1, 1/2, 1/4 (heterogeneous
hardware). The recorded CPU steps are short (2-15 ms), so one simulated step
spans `--aggregate` recorded steps (their time-weighted speed), like the longer
steps of a real job. A step takes t_i = (k + b_i) / v_i(t) (a fixed cost of k
samples) plus a fixed communication time; epochs have `--steps-per-epoch`
steps (DBS acts per epoch). Each worker's forecast comes from its own
lbbsp.forecasting.Forecaster and every decision from
lbbsp.controller.BalanceController: the code that runs inside the Keras
callback. The oracle knows every worker's true speed of the coming step.
Reported per (N, policy): eta = T* / max t_i, the speedup over equal batches,
and the decision cost per step.
"""
import argparse
import os
import sys
import time

import numpy as np

from lbbsp import exchange
from lbbsp.controller import BalanceController
from lbbsp.forecasting import Forecaster
from predictor.traces import list_traces, read_trace

from .oracle import OraclePolicy
from .variants import VARIANTS

__all__ = ["Cluster", "simulate", "main", "POLICY_VARIANTS"]

POLICY_VARIANTS = {label: v for label, v in VARIANTS.items() if label != "horovod"}


class Cluster:
    """N simulated workers: per-step true speeds and telemetry from recorded traces."""

    def __init__(self, num_workers, steps, seed=0, offset=16.0, comm=0.005, traces=None, aggregate=10):
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
        self.offset, self.comm = float(offset), comm
        self.num_workers, self.steps = num_workers, steps

    def compute_times(self, step, batches):
        return (self.offset + batches) / self.speed[step]

    def truth(self, step):
        """(offsets, speeds) of every worker at `step`: what the oracle knows."""
        return np.full(self.num_workers, self.offset), self.speed[min(step, self.steps)]


def simulate(cluster, policy, predictor, global_batch, steps_per_epoch=20, plan_ahead=1):
    """Run `policy` on the cluster; returns per-step arrays (eta, step time, decision seconds).

    As in the callback, the timings of step t decide the split of step t + 1 + plan_ahead.
    """
    n = cluster.num_workers
    if policy == "oracle":
        policy = OraclePolicy(cluster.truth)
    controller = BalanceController(policy, warmup_steps=0, plan_ahead=plan_ahead)
    plans = controller.start(n, np.full(steps_per_epoch, global_batch))
    forecasters = [Forecaster(predictor) for _ in range(n)] if controller.uses_forecast else None
    gathered = exchange.empty(n)
    forecasts = np.full(n, np.nan)
    eta, step_time, decide = [], [], []
    for t in range(cluster.steps):
        epoch, step = divmod(t, steps_per_epoch)
        batches = plans.pop((epoch, step))
        compute = cluster.compute_times(t, batches)
        step_time.append(compute.max() + cluster.comm)
        k, v = cluster.truth(t)
        eta.append(((global_batch + k.sum()) / v.sum()) / compute.max())
        gathered[:, 1] = compute.max() - compute + cluster.comm
        gathered[:, 2] = compute
        if forecasters is not None:
            # As in the callback: the forecast exchanged now was made from the previous step's measurement.
            gathered[:, 0] = forecasts
            offsets = controller.offsets()
            forecasts = [f.update(batches[w], compute[w], offsets[w], cluster.features[t, w])
                         for w, f in enumerate(forecasters)]
        start = time.perf_counter()
        key, decided, _ = controller.decide(epoch, step, gathered, batches)
        decide.append(time.perf_counter() - start)
        plans[key] = decided
    return {"eta": np.array(eta), "step_time": np.array(step_time), "decide": np.array(decide)}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", default="4,64,1024", help="comma-separated cluster sizes")
    parser.add_argument("--policies", default="equal,pid,dbs,lbbsp-ema,lbbsp-narx,oracle")
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--per-worker-batch", type=int, default=64)
    parser.add_argument("--offset", type=float, default=16.0, help="fixed cost per step, in samples")
    parser.add_argument("--aggregate", type=int, default=10, help="recorded steps per simulated step")
    parser.add_argument("--steps-per-epoch", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.workers.split(",")]
    names = [p.strip() for p in args.policies.split(",")]
    unknown = [p for p in names if p not in POLICY_VARIANTS]
    if unknown or any(s < 1 for s in sizes) or args.steps < 10 or args.aggregate < 1 or args.steps_per_epoch < 1 \
            or args.offset < 0:
        parser.error(f"bad arguments: unknown policies {unknown}, sizes {sizes} (>= 1), steps {args.steps} (>= 10), "
                     f"aggregate {args.aggregate} (>= 1), steps per epoch {args.steps_per_epoch} (>= 1), "
                     f"offset {args.offset} (>= 0)")
    print(f"{'workers':>8} {'policy':<11} {'eta':>6} {'speedup':>8} {'decision ms (median/p99)':>26}")
    for n in sizes:
        cluster = Cluster(n, args.steps, seed=args.seed, offset=args.offset, aggregate=args.aggregate)
        base = None
        for name in names:
            policy, predictor = POLICY_VARIANTS[name]
            r = simulate(cluster, policy, predictor, args.per_worker_batch * n, steps_per_epoch=args.steps_per_epoch)
            skip = 10
            mean_step = r["step_time"][skip:].mean()
            base = mean_step if name == "equal" or base is None else base
            print(f"{n:>8} {name:<11} {r['eta'][skip:].mean():>6.3f} {base / mean_step:>7.2f}x "
                  f"{1e3 * np.median(r['decide']):>14.3f} / {1e3 * np.percentile(r['decide'], 99):.3f}",
                  flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
