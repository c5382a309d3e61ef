"""Simulated step changes of one worker's CPU quota, with and without CFS throttling, under the policies' own code.

    python -m benchmarks.stepchange
    python -m benchmarks.stepchange --policies lbbsp-ema,abl-nochange,abl-nohyst   # one mechanism off each

Why: the live step-change-2 scenario cuts worker 1's CPU quota 4x for 16
of every 32 steps and restores it. lbbsp recovers from the cut at once but
takes 4 to 7 steps after the restore, and single live runs are too noisy to
say why. Here the same BalanceController, policies and forecasters run on
simulated workers whose compute follows t = (k + b) * per_sample with 5%
log-normal jitter, in two modes:

- "smooth": a quota of q cores stretches every step by q0 / q, as a shared
  or throttled GPU slows down (no per-step scatter beyond the jitter);
- "cfs": the Linux bandwidth controller as `docker --cpus` sets it up: a
  worker may run q x 100 ms of CPU in every 100 ms period and then stalls
  until the next period starts. After its compute a worker idles until the
  slowest is done and then runs `comm` seconds of CPU for the allreduce
  (Gloo polls), so its phase in the period carries from step to step. A
  throttled worker given a small batch often runs at full speed, one given a
  larger batch stalls for the rest of the period: its time is not a straight
  line in the batch, and it scatters.

Per mode and policy the run prints the mean step time (the slowest worker's
compute plus `comm`), eta (the balanced step over the step taken, as
benchmarks.analysis), and eta at the steps from a cut and from a restore
on (+0 .. +7; with plan_ahead = 1 the first split that knows of a change
runs at +2), medians over the changes and seeds. The *phase oracle* is the
best pair of fixed splits, one for each quota state, found by a sweep over
the batch grid, switched when the state changed at the step just measured:
it knows the state as soon as a causal policy could, not the draw.

The defaults match step-change-2 as measured (conv workload, 0.9 cores,
global batch 256, grid 8): about 0.33 ms of CPU per sample and a fixed cost
of 30 samples.
"""
import argparse
import sys

import numpy as np

from lbbsp.allocation import Bounds
from lbbsp.metrics import balanced_time
from lbbsp.policies import LBBSPPolicy, Policy, make_policy

from .ablation import ABLATIONS
from .simulate import drive

__all__ = ["QuotaWorker", "quotas", "run", "phase_oracle", "main", "MODES", "POLICIES"]

MODES = ("smooth", "cfs")
#: CFS's default bandwidth period (seconds).
PERIOD = 0.1
#: policy label: (policy factory, predictor); the ablations (benchmarks.ablation) forecast as lbbsp-ema does
POLICIES = {
    "pid": (lambda: make_policy("pid"), None),
    "lbbsp-ema": (LBBSPPolicy, "ema"),
    "lbbsp-last": (LBBSPPolicy, "last"),
    **{name: (factory, "ema") for name, (_, factory, _) in ABLATIONS.items()},
}
#: The policies run by default.
DEFAULT = ("pid", "lbbsp-ema", "lbbsp-last")


class QuotaWorker:
    """One worker's CPU under a CFS quota: where it is in the current period and how much of the period's
    quota it has used."""

    def __init__(self, phase=0.0):
        self.phase, self.used = float(phase) % PERIOD, 0.0

    def advance(self, seconds, quota, busy):
        """Wall seconds to run `seconds` of CPU (busy) or to let `seconds` of wall time pass (idle)."""
        wall = 0.0
        while seconds > 1e-12:
            left = PERIOD - self.phase
            if busy:
                allowed = quota * PERIOD - self.used
                if allowed <= 1e-12:  # throttled until the next period
                    wall += left
                    self.phase = self.used = 0.0
                    continue
                slice_ = min(seconds, allowed, left)
                self.used += slice_
            else:
                slice_ = min(seconds, left)
            seconds -= slice_
            wall += slice_
            self.phase += slice_
            if self.phase >= PERIOD - 1e-12:
                self.phase = self.used = 0.0
        return wall


def quotas(step, cores=0.9, cut=0.25, period=32, start=8, length=16):
    """Both workers' quotas at `step`: worker 1's cut to `cut` of `cores` for `length` of every `period` steps."""
    slowed = start <= step % period < start + length
    return np.array([cores, cores * cut if slowed else cores])


class _PhaseSplit(Policy):
    """Worker 1 gets `slowed` samples while its quota was cut at the step just measured, `normal` otherwise (the
    phase oracle's splits: it learns of a change when a causal policy could, two steps later)."""

    name = "phase"

    def __init__(self, slowed, normal, quota_of):
        self.slowed, self.normal, self.quota_of = int(slowed), int(normal), quota_of

    def after_step(self, stats, next_global_batch):
        q = self.quota_of(stats.step)
        b1 = self.slowed if q[1] < q[0] else self.normal
        self.batches = np.array([next_global_batch - b1, b1])
        return self.batches.copy()


def run(policy, predictor=None, mode="cfs", steps=320, seed=0, per_sample=0.33e-3, offset=30.0, comm=0.008,
        jitter=0.05, global_batch=256, multiple=8, skip=40):
    """One run of `policy` (a Policy or name) on two workers; returns {"step": mean s, "eta": mean,
    "cut": [eta at +0..+7 per cut], "restore": [... per restore]} over the steps after `skip`."""
    if mode not in MODES:
        raise ValueError(f"mode={mode!r} is not allowed: use one of {MODES}")
    rng = np.random.default_rng(seed)
    workers = [QuotaWorker(rng.random() * PERIOD) for _ in range(2)]
    full = quotas(0)[0]

    def measure(t, batches):
        q = quotas(t)
        work = (offset + batches) * per_sample * np.exp(rng.normal(0.0, jitter, 2))
        if mode == "smooth":
            return work * full / q
        compute = np.array([w.advance(x, qi, True) for w, x, qi in zip(workers, work, q)])
        for w, c, qi in zip(workers, compute, q):
            w.advance(compute.max() - c, qi, False)
            w.advance(comm, qi, True)
        return compute

    etas, times, slowed = [], [], []
    for t, (batches, compute, _) in enumerate(drive(policy, predictor, np.full(16, global_batch),
                                                    Bounds.of(2, global_batch, multiple=multiple), steps, measure)):
        etas.append(balanced_time(batches, compute) / compute.max())
        times.append(compute.max() + comm)
        slowed.append(quotas(t)[1] < quotas(t)[0])
    etas, slowed = np.array(etas), np.array(slowed)
    changes = [i for i in np.flatnonzero(slowed[1:] != slowed[:-1]) + 1 if skip <= i <= steps - 8]
    return {"step": float(np.mean(times[skip:])), "eta": float(np.mean(etas[skip:])),
            "cut": [etas[i:i + 8].tolist() for i in changes if slowed[i]],
            "restore": [etas[i:i + 8].tolist() for i in changes if not slowed[i]]}


def phase_oracle(mode, seeds, global_batch=256, multiple=8, **kwargs):
    """(worker 1's batch while cut, while not, mean step s over `seeds`): the best fixed split per quota state
    on the grid, each state's swept with the other's at its best so far."""
    def mean_step(slowed, normal):
        return float(np.mean([run(_PhaseSplit(slowed, normal, quotas), mode=mode, seed=s, global_batch=global_batch,
                                  multiple=multiple, **kwargs)["step"] for s in seeds]))
    grid = range(multiple, global_batch, multiple)
    normal = global_batch // 2
    slowed = min(grid, key=lambda b: mean_step(b, normal))
    normal = min(grid, key=lambda b: mean_step(slowed, b))
    return slowed, normal, mean_step(slowed, normal)


def _recovery(runs, kind):
    return " ".join(f"{v:.2f}" for v in np.median([c for r in runs for c in r[kind]], axis=0))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--modes", default=",".join(MODES), help=f"comma-separated, from {MODES}")
    parser.add_argument("--policies", default=",".join(DEFAULT), help=f"comma-separated, from {list(POLICIES)}")
    parser.add_argument("--seeds", default="0,1,2", help="comma-separated seeds")
    parser.add_argument("--steps", type=int, default=320)
    args = parser.parse_args(argv)
    modes = [m.strip() for m in args.modes.split(",")]
    names = [p.strip() for p in args.policies.split(",")]
    try:
        seeds = [int(s) for s in args.seeds.split(",")]
    except ValueError:
        parser.error(f"--seeds={args.seeds!r} is not allowed: give comma-separated integers")
    bad = [m for m in modes if m not in MODES] + [p for p in names if p not in POLICIES]
    if bad or args.steps < 80:
        parser.error(f"bad arguments: unknown modes or policies {bad} (modes {MODES}, policies {list(POLICIES)}), "
                     f"steps {args.steps} (>= 80)")
    print(f"{'mode':<7} {'policy':<22} {'step ms':>8} {'eta':>6}   eta from a cut (+0..+7)   | from a restore (+0..+7)")
    for mode in modes:
        slowed, normal, step = phase_oracle(mode, seeds, steps=args.steps)
        for name in names:
            make, predictor = POLICIES[name]
            runs = [run(make(), predictor, mode=mode, seed=s, steps=args.steps) for s in seeds]
            print(f"{mode:<7} {name:<22} {1e3 * np.median([r['step'] for r in runs]):>8.1f} "
                  f"{np.median([r['eta'] for r in runs]):>6.3f}   "
                  f"{_recovery(runs, 'cut')} | {_recovery(runs, 'restore')}",
                  flush=True)
        print(f"{mode:<7} {'phase oracle':<22} {1e3 * step:>8.1f}          worker 1 gets {slowed} samples while cut, "
              f"{normal} otherwise", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
