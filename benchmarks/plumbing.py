"""lbbsp's own work per training step, without TensorFlow: CPU time and thread switches of one rank.

    python -m benchmarks.plumbing [--policies equal,lbbsp] [--workers 2] [--steps 2000] [--rounds 3]

Drives one rank's lbbsp.balancer.Balancer, feed and controller as the Keras
callback does at every step (the plan, the batch, the forecast, the gathered
rows of N identical workers, the queued decision), with 20 ms steps that take
no time. What it prints is the plugin's cost alone, which wall-clock runs on a
shared machine cannot resolve: the process's CPU microseconds per step (the
train thread and the decision thread together) and its voluntary context
switches per step (medians over the rounds). Compare two checkouts by running
it in each.
"""
import argparse
import resource
import sys
import time

import numpy as np

from lbbsp.balancer import Balancer
from lbbsp.controller import BalanceController
from lbbsp.exchange import FIELDS, empty
from lbbsp.feed import BatchFeed
from lbbsp.forecasting import Forecaster

__all__ = ["per_step", "main"]


def per_step(policy, num_workers=2, steps=2000, per_worker_batch=128, seed=0):
    """(CPU seconds, voluntary context switches) per step of one rank running `policy`, forecasting with an EMA (the
    NARX needs TensorFlow)."""
    rng = np.random.default_rng(seed)
    global_batch = per_worker_batch * num_workers
    x = rng.normal(size=(global_batch * 20, 64)).astype(np.float32)
    feed = BatchFeed(x, np.zeros(len(x), np.int64), global_batch=global_batch, rank=0, size=num_workers, prefetch=1)
    controller = BalanceController(policy)
    balancer = Balancer(feed, controller, Forecaster("ema") if controller.uses_forecast else None)
    balancer.begin(0, num_workers)
    start, usage = time.process_time(), resource.getrusage(resource.RUSAGE_SELF).ru_nvcsw
    for index in range(steps):
        epoch, step = divmod(index, feed.steps_per_epoch)
        plan = balancer.before_step(epoch, step)
        feed.next_batch()
        row = balancer.local(0.02 * np.exp(0.01 * rng.standard_normal()))
        gathered = empty(num_workers, fill=0.0)  # every worker ran the plan; their compute times scatter by 1%
        gathered[:, FIELDS.index("compute")] = 0.02 * np.exp(0.01 * rng.standard_normal(num_workers))
        for name in ("forecast", "split", "decision"):
            gathered[:, FIELDS.index(name)] = row[name]
        record = dict(time=0.0, epoch=epoch, step=step, rank=0, workers=num_workers, global_batch=global_batch,
                      batch_size=int(plan.sizes[0]), wait=0.0, step_time=0.02, overhead=0.0, overhead_cpu=0.0)
        balancer.after_step(epoch, step, gathered, record, lambda obj: obj)
    balancer.end()
    switches = resource.getrusage(resource.RUSAGE_SELF).ru_nvcsw - usage
    return (time.process_time() - start) / steps, switches / steps


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--policies", default="equal,lbbsp")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    if args.workers < 1 or args.steps < 10 or args.rounds < 1:
        parser.error(f"--workers={args.workers} (>= 1), --steps={args.steps} (>= 10), --rounds={args.rounds} (>= 1)")
    policies = [p for p in args.policies.split(",") if p]
    figures = {p: [] for p in policies}
    for _ in range(args.rounds):
        for policy in policies:  # interleaved: machine noise hits every policy alike
            figures[policy].append(per_step(policy, args.workers, args.steps))
    print(f"{args.workers} workers, {args.steps} steps per round, {args.rounds} rounds (medians)")
    print(f"{'policy':<10}{'CPU us/step':>12}{'switches/step':>15}")
    for policy, runs in figures.items():
        cpu, switches = np.median(np.array(runs), axis=0)
        print(f"{policy:<10}{1e6 * cpu:>12.1f}{switches:>15.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
