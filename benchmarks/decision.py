"""Cost of one balancing decision, in isolation: the step-time model's update and the split.

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
import sys

import numpy as np

from lbbsp.allocation import Bounds
from lbbsp.policies import LBBSPPolicy, make_policy

from .cli import integers
from .simulate import drive

__all__ = ["decision_times", "main"]

POLICIES = {"pid": lambda: make_policy("pid"), "lbbsp": LBBSPPolicy}


def decision_times(policy, num_workers, steps=600, skip=100, seed=0, per_worker_batch=64):
    """Seconds per decide() call of `policy` (a Policy) over `steps` synthetic steps, the first `skip` left out."""
    rng = np.random.default_rng(seed)
    base = 1000.0 * rng.choice([1.0, 0.5, 0.25], size=num_workers)

    def measure(t, batches):
        return (16.0 + batches) / (base * np.exp(rng.normal(0.0, 0.1, num_workers)))

    global_batch = per_worker_batch * num_workers
    runs = drive(policy, "last", np.full(20, global_batch), Bounds.of(num_workers, global_batch), steps, measure)
    return np.array([seconds for _, _, seconds in runs][skip:])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=integers, default="4,64,1024", help="comma-separated cluster sizes")
    parser.add_argument("--policies", default=",".join(POLICIES), help=f"comma-separated, from {list(POLICIES)}")
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--skip", type=int, default=100)
    parser.add_argument("--seeds", type=integers, default="0,1,2,3",
                        help="comma-separated seeds of the synthetic speeds")
    args = parser.parse_args(argv)
    sizes, seeds = args.workers, args.seeds
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
