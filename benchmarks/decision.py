"""Cost of one balancing decision, in isolation: the step-time fit, the planning errors and the split.

    python -m benchmarks.decision --workers 4,64,1024

Every rank runs BalanceController.decide once per step on the gathered rows
(on a background thread with plan_ahead >= 1). Here it runs alone on
synthetic rows (heterogeneous speeds with 10% log-normal noise per step and
a fixed cost of 16 samples), so the figure is the decision's own cost, not
that of forecasters or training sharing the core. Prints the median and
p99 per policy and cluster size over the decisions of every seed (each a
run of its own), after `--skip` warm-up decisions per run.
"""
import argparse
import functools
import sys
import time

import numpy as np

from lbbsp import exchange
from lbbsp.controller import BalanceController
from lbbsp.policies import LBBSPPolicy, make_policy

from .variants import LBBSP_CONFIGS

__all__ = ["decision_times", "main"]

POLICIES = dict({"pid": lambda: make_policy("pid"), "lbbsp": LBBSPPolicy},
                **{name: functools.partial(LBBSPPolicy, **config) for name, config in LBBSP_CONFIGS.items()})


def decision_times(policy, num_workers, steps=600, skip=100, seed=0, per_worker_batch=64):
    """Seconds per decide() call of `policy` (a Policy) over `steps` synthetic steps, the first `skip` left out."""
    rng = np.random.default_rng(seed)
    controller = BalanceController(policy, warmup_steps=0, plan_ahead=1)
    steps_per_epoch = 20
    plans = controller.start(num_workers, np.full(steps_per_epoch, per_worker_batch * num_workers))
    base = 1000.0 * rng.choice([1.0, 0.5, 0.25], size=num_workers)
    gathered = exchange.empty(num_workers)
    times = []
    for t in range(steps):
        epoch, step = divmod(t, steps_per_epoch)
        batches = plans.pop((epoch, step))
        speeds = base * np.exp(rng.normal(0.0, 0.1, num_workers))
        compute = (16.0 + batches) / speeds
        gathered[:, 0], gathered[:, 1], gathered[:, 2] = speeds, compute.max() - compute, compute
        start = time.perf_counter()
        key, decided, _ = controller.decide(epoch, step, gathered, batches)
        times.append(time.perf_counter() - start)
        plans[key] = decided
    return np.array(times[skip:])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", default="4,64,1024", help="comma-separated cluster sizes")
    parser.add_argument("--policies", default=",".join(POLICIES), help=f"comma-separated, from {list(POLICIES)}")
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--skip", type=int, default=100)
    parser.add_argument("--seeds", default="0,1,2,3", help="comma-separated seeds of the synthetic speeds")
    args = parser.parse_args(argv)
    try:
        sizes = [int(s) for s in args.workers.split(",")]
        seeds = [int(s) for s in args.seeds.split(",")]
    except ValueError:
        parser.error(f"--workers={args.workers!r} and --seeds={args.seeds!r} must be comma-separated integers")
    names = [p.strip() for p in args.policies.split(",")]
    unknown = [p for p in names if p not in POLICIES]
    if unknown or any(s < 1 for s in sizes) or not 0 <= args.skip < args.steps - 10:
        parser.error(f"bad arguments: unknown policies {unknown} (allowed {list(POLICIES)}), sizes {sizes} (>= 1), "
                     f"skip {args.skip} (0 .. steps - 11)")
    print(f"{'workers':>8} {'policy':<15} {'median ms':>10} {'p99 ms':>8}")
    for n in sizes:
        for name in names:
            runs = [decision_times(POLICIES[name](), n, args.steps, args.skip, seed) for seed in seeds]
            t = 1e3 * np.concatenate(runs)
            print(f"{n:>8} {name:<15} {np.median(t):>10.3f} {np.percentile(t, 99):>8.3f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
