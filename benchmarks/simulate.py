"""Simulation of N workers (to 1024 and beyond) under the very same policy, model and forecaster code.

    python -m benchmarks.simulate --workers 4,64,256,1024 --profiles recorded,low-noise

Worker i replays a recorded trace (predictor/data/traces, a random file and
offset) scaled to a base speed drawn from 1, 1/2, 1/4 (heterogeneous
hardware); one simulated step spans `--aggregate` recorded steps (their
time-weighted speed), like the longer steps of a real job. A step takes
t_i = (k + b_i) / v_i(t) (a fixed cost of k samples) plus a fixed
communication time.

Every profile keeps the recorded contention: a worker's mean speed at a
step is the centred 21-step average of its replayed trace (load that comes
and goes, quota changes, hogs). Noise profiles (what is drawn around it):

- "recorded": the recorded per-step noise, resampled: the worker's own
  source trace's log deviations from that average, taken in blocks of 8
  steps from random places (spread, tails and short-term autocorrelation as
  recorded, drawn independently of the mean path).
- "low-noise": as on dedicated GPU nodes: 3% log-normal jitter per step and
  an occasional straggler step (0.3% of steps run at half speed).
- "replayed": the recorded speeds replayed as they are, with the centred
  9-step average as the mean. The noise is then not independent of the
  mean (the average holds the draw and the steps around it), so the mean
  oracles of this profile are partly clairvoyant; kept to compare with
  earlier releases.

Each worker's forecast comes from its own lbbsp.forecasting.Forecaster and
every decision from lbbsp.controller.BalanceController: the code that runs
inside the Keras callback. Four references: the clairvoyant oracle knows
every worker's speed in the coming step (the draw included); the mean oracle
knows each worker's mean speed at the coming step and the distribution of
its noise (the profile's spread for "low-noise"; for the others, the spread
of the deviations in the worker's source trace as a whole, not of this
run's draws) but not the draw, and splits for the expected slowest finish
(`tail_speeds`); the lagged mean oracle knows the same, but
of the step just measured, as a causal policy could at best (the mean at
the coming step is a centred average that reaches into the future). No
policy can beat the first; the second is reachable by a perfect
forecaster of the mean where the noise is drawn apart from the mean
("recorded", "low-noise"; a causal policy may even pass it there by using
the noise's autocorrelation, which it ignores); the third by perfect
knowledge of the present. The tail oracle knows what the mean oracle
knows and uses the whole distribution, not only its spread: each worker is
planned at its own quantile at 1 - 1/N of its time noise, so that every
worker is about equally likely to be the last. Where the workers' tails
differ in shape ("recorded": kurtosis 2-17, and a resampled source's tail
ends at its largest recorded deviation) it shows how far the mean oracle,
which plans as if every tail were normal, is from the best use of that
knowledge. Reported per (N, profile, policy) (with
`--seeds`, the median and range over clusters drawn with each seed), over the
steps after `--skip` (a variance-aware split learns which workers it
forecasts worst): eta = (best possible step) / (step taken), as a
fraction of the mean oracle's and of the tail oracle's too, the speedup
over equal batches, and the decision cost per step. `--decision-ms` has every rank report that CPU
time per decision, so that the controller's budget sets a decision period as it does live (by default
a decision at every step). With a wide spread of speeds and many
workers, the slowest worker takes longer at b_min than the balanced step;
such a step is "floor-bound" (any split that gives that worker b_min is as
good as the oracle's), and the share of such steps is printed with the
noise statistics.
"""
import argparse
import os
import sys
import time

import numpy as np

from lbbsp import exchange
from lbbsp.allocation import Bounds
from lbbsp.controller import BalanceController
from lbbsp.forecasting import Forecaster
from predictor.traces import list_traces, read_trace

from .ablation import ABLATIONS
from .cli import integers
from .oracle import OraclePolicy, best_split, predicted_time
from .variants import LIVE_ONLY, VARIANTS

__all__ = ["Cluster", "drive", "simulate", "noise_stats", "main", "POLICY_VARIANTS", "PROFILES"]

PROFILES = ("recorded", "low-noise", "replayed")
POLICY_VARIANTS = dict({label: v for label, v in VARIANTS.items() if label not in LIVE_ONLY},
                       **{"mean-oracle": ("mean-oracle", None), "lagged-mean-oracle": ("lagged-mean-oracle", None),
                          "tail-oracle": ("tail-oracle", None)},
                       **{name: (name, predictor) for name, (_, _, predictor) in ABLATIONS.items()})


def tail_speeds(speeds, spread, z=None):
    """Speeds that plan for a high quantile of each worker's time instead of its mean: with log-normal noise
    of standard deviation spread_i, the quantile exp(z spread_i) of its time, z = sqrt(2 ln N) by default (the
    large-N limit of where the largest of N standard normal draws falls, above lbbsp.policies.largest_normal(N) at
    every N; kept so that the oracle's figures compare across releases); noisier workers get slack."""
    v = np.asarray(speeds, dtype=np.float64)
    s = np.where(np.isfinite(spread), spread, 0.0).clip(0.0, 2.0)
    return v * np.exp(-(np.sqrt(2.0 * np.log(max(v.size, 2))) if z is None else z) * s)


def _rolling_mean(x, window):
    """Centred moving average along axis 0 (edges use the part of the window that exists)."""
    kernel = np.ones(window)
    pad = window // 2
    num = np.apply_along_axis(lambda c: np.convolve(np.pad(c, pad, mode="edge"), kernel, "valid"), 0, x)
    return num / window


#: Steps of the centred moving average that is a worker's mean speed: its recorded contention ("recorded",
#: "low-noise"), or the mean of the replayed speeds ("replayed").
CONTENTION_MEAN, REPLAYED_MEAN = 21, 9
#: "recorded": the noise is resampled in blocks of this many steps (the deviations' autocorrelation is
#: 0.75, 0.48, 0.26 at lags 1-3 and gone by lag 4).
NOISE_BLOCK = 8
#: "low-noise": log-normal jitter of this standard deviation and a straggler step (at STRAGGLER_SPEED) with
#: probability STRAGGLER_RATE.
LOW_NOISE_JITTER, STRAGGLER_RATE, STRAGGLER_SPEED = 0.03, 0.003, 0.5
#: Draws of the low-noise profile's noise from which the tail oracle takes its quantile.
TAIL_DRAWS = 200_000
#: The standard deviation of log(speed / mean) that this jitter and these stragglers make.
LOW_NOISE_SPREAD = float(np.sqrt(LOW_NOISE_JITTER ** 2 + STRAGGLER_RATE * (1 - STRAGGLER_RATE)
                                 * np.log(STRAGGLER_SPEED) ** 2))


def _relative_speed(speed, idx, aggregate):
    """Time-weighted speed of each run of `aggregate` recorded steps at `idx`, relative to the trace's median."""
    per_sample = (1.0 / speed[idx]).reshape(-1, aggregate).mean(axis=1)
    return (1.0 / per_sample) / np.median(speed)


def _deviations(speed, aggregate, window):
    """log(speed / centred `window`-step mean) over a whole trace, aggregated as the simulator steps it."""
    rel = _relative_speed(speed, np.arange(speed.size // aggregate * aggregate), aggregate)
    return np.log(rel / _rolling_mean(rel, window))


def _blocks(rng, deviations, length, block):
    """`length` deviations resampled in blocks of `block` consecutive ones from random places."""
    starts = rng.integers(max(deviations.size - block, 0) + 1, size=-(-length // block))
    idx = (starts[:, None] + np.arange(block)).ravel()[:length]
    return deviations[np.minimum(idx, deviations.size - 1)]


class Cluster:
    """N simulated workers: per-step true speeds and telemetry from recorded traces."""

    def __init__(self, num_workers, steps, seed=0, offset=16.0, comm=0.005, traces=None, aggregate=10,
                 profile="recorded"):
        if profile not in PROFILES:
            raise ValueError(f"profile={profile!r} is not allowed: use one of {PROFILES}")
        rng = np.random.default_rng(seed)
        paths = traces or [p for p in list_traces() if not os.path.basename(p).startswith(("steady", "live", "gpu_"))]
        loaded = [read_trace(p) for p in paths]
        base = rng.choice([1.0, 0.5, 0.25], size=num_workers, p=[0.5, 0.3, 0.2])
        picks = rng.integers(len(loaded), size=num_workers)
        self.speed = np.empty((steps + 1, num_workers))
        self.features = np.empty((steps + 1, num_workers, loaded[0]["features"].shape[1]))
        for w in range(num_workers):
            trace = loaded[picks[w]]
            n = trace["speed"].size
            idx = (rng.integers(n) + np.arange((steps + 1) * aggregate)) % n
            self.speed[:, w] = 1000.0 * base[w] * _relative_speed(trace["speed"], idx, aggregate)
            self.features[:, w] = trace["features"][idx[aggregate - 1::aggregate]]
        window = REPLAYED_MEAN if profile == "replayed" else CONTENTION_MEAN
        self.mean = _rolling_mean(self.speed, window)
        if profile == "low-noise":
            jitter = np.exp(rng.normal(0.0, LOW_NOISE_JITTER, self.speed.shape))
            straggle = np.where(rng.random(self.speed.shape) < STRAGGLER_RATE, STRAGGLER_SPEED, 1.0)
            self.speed = self.mean * jitter * straggle
            self.spread = np.full(num_workers, LOW_NOISE_SPREAD)
        else:
            # The spread of each source trace's deviations as a whole: the noise's distribution, not this run's draws.
            sources = [_deviations(t["speed"], aggregate, window) for t in loaded]
            self.spread = np.array([sources[i].std() for i in picks])
            if profile == "recorded":
                self.speed = self.mean * np.exp(np.stack([_blocks(rng, sources[i], steps + 1, NOISE_BLOCK)
                                                          for i in picks], axis=1))
        self.noise = np.log(self.speed / self.mean)
        self.tail = self._tails(num_workers, [sources[i] for i in picks] if profile != "low-noise" else None, seed)
        self.offset, self.comm, self.profile = float(offset), comm, profile
        self.multiple, self.gpu, self.warm_shapes = 1, False, ()
        self.num_workers, self.steps = num_workers, steps
        self._best = {}

    @staticmethod
    def _tails(num_workers, sources, seed):
        """Each worker's quantile at 1 - 1/N of its log time noise (-log(speed / mean)), from its noise's
        distribution: the source trace's deviations it is resampled from, or for "low-noise" a large draw of
        that profile's jitter and stragglers (a generator of its own, so the cluster's draws stay as they are)."""
        level = 1.0 - 1.0 / max(num_workers, 2)
        if sources is None:
            rng = np.random.default_rng([seed, TAIL_DRAWS])
            noise = rng.normal(0.0, LOW_NOISE_JITTER, TAIL_DRAWS) + np.where(
                rng.random(TAIL_DRAWS) < STRAGGLER_RATE, np.log(STRAGGLER_SPEED), 0.0)
            return np.full(num_workers, np.quantile(-noise, level))
        return np.array([np.quantile(-d, level) for d in sources])

    def compute_times(self, step, batches):
        return (self.offset + batches) / self.speed[step]

    def truth(self, step):
        """(offsets, speeds) of every worker at `step`: what the clairvoyant oracle knows."""
        return np.full(self.num_workers, self.offset), self.speed[min(step, self.steps)]

    def mean_truth(self, step):
        """(offsets, speeds to plan with) from the mean speeds and the noise spread: the mean oracle's view."""
        return np.full(self.num_workers, self.offset), tail_speeds(self.mean[min(step, self.steps)], self.spread)

    def tail_truth(self, step):
        """(offsets, speeds to plan with) from the mean speeds and each worker's own noise quantile: the tail
        oracle's view (the mean oracle's knowledge, with the noise's whole distribution used, not its spread)."""
        return np.full(self.num_workers, self.offset), self.mean[min(step, self.steps)] * np.exp(-self.tail)

    def best_steps(self, global_batch):
        """Per step, the shortest compute time any split reaches (knowing the draw); computed once per batch,
        since every policy run and the noise statistics compare against the same figures."""
        if global_batch not in self._best:
            times = []
            for step in range(self.steps):
                k, v = self.truth(step)
                times.append(predicted_time(best_split(v, global_batch, offsets=k), v, k))
            self._best[global_batch] = np.array(times)
        return self._best[global_batch]


def noise_stats(cluster, global_batch):
    """Per-step noise of a cluster's speeds (median spread, p99 of |log deviation|, lag-1 autocorrelation)
    and the share of floor-bound steps (the slowest worker at b_min = 1 takes as long as the best split)."""
    z = cluster.noise
    centred = z - z.mean(axis=0)
    lag1 = (centred[1:] * centred[:-1]).sum(axis=0) / np.maximum((centred ** 2).sum(axis=0), 1e-12)
    floor = (cluster.offset + 1.0) / cluster.speed.min(axis=1)
    best = cluster.best_steps(global_batch)
    return {"spread": float(np.median(z.std(axis=0))), "p99": float(np.percentile(np.abs(z), 99)),
            "lag1": float(np.median(lag1)), "floor": float(np.mean(floor[:-1] >= best * (1 - 1e-9)))}


def _policy(name, cluster, lag):
    if name == "oracle":
        return OraclePolicy(cluster.truth)
    if name == "mean-oracle":
        return OraclePolicy(cluster.mean_truth)
    if name == "tail-oracle":
        return OraclePolicy(cluster.tail_truth)
    if name == "lagged-mean-oracle":
        return OraclePolicy(lambda step: cluster.mean_truth(max(step - lag, 0)))
    if name in ABLATIONS:
        return ABLATIONS[name][1]()
    return name


def drive(policy, predictor, schedule, bounds, steps, measure, features=None, plan_ahead=1, gpu=False, warm_shapes=(),
          decision_seconds=0.0):
    """The callback's decision loop, offline: per step, yields (batches run, compute seconds, decision seconds).

    `measure(t, batches)` gives every worker's compute time at global step t; `features[t, w]` the telemetry
    worker w's forecaster reads. As in the callback, the timings of step t decide the split of step
    t + 1 + plan_ahead, and each worker forecasts from its own step just measured, with the fixed cost its
    plan carries. `gpu`: the workers train on GPUs; `warm_shapes`: batch sizes set up before training
    (lbbsp.policies.Policy.prepare); `decision_seconds`: the CPU time every rank reports for a decision (0: none,
    a decision at every step; more puts the controller's decision period to work, which a measured time on the
    simulator's own clock would make unrepeatable).
    """
    n = bounds.num_workers
    controller = BalanceController(policy, warmup_steps=0, plan_ahead=plan_ahead)
    plans = {plan.key: plan for plan in controller.start(schedule, bounds, warm_shapes=warm_shapes, gpu=gpu)}
    # budget=None: the simulator's clock is not a simulated worker's, and its runs must repeat exactly.
    forecasters = [Forecaster(predictor, budget=None) for _ in range(n)] if controller.uses_forecast else None
    gathered = exchange.empty(n)
    gathered[:, exchange.FIELDS.index("decision")] = decision_seconds
    column = {name: exchange.FIELDS.index(name) for name in ("forecast", "compute", "split")}
    for t in range(steps):
        epoch, step = divmod(t, len(schedule))
        plan = plans.pop((epoch, step))
        compute = measure(t, plan.sizes)
        gathered[:, column["compute"]], gathered[:, column["split"]] = compute, plan.digest
        if forecasters is not None:
            gathered[:, column["forecast"]] = [
                f.update(plan.sizes[w], compute[w], plan.offsets[w], None if features is None else features[t, w])
                for w, f in enumerate(forecasters)]
        start = time.perf_counter()
        decided, _ = controller.decide(epoch, step, gathered, plan.sizes)
        seconds = time.perf_counter() - start
        plans[decided.key] = decided
        yield plan.sizes, compute, seconds


def simulate(cluster, policy, predictor, global_batch, steps_per_epoch=20, plan_ahead=1, decision_seconds=0.0):
    """Run `policy` on the cluster; returns per-step arrays (eta, step time, decision seconds)."""
    best = cluster.best_steps(global_batch)
    bounds = Bounds.of(cluster.num_workers, global_batch, multiple=cluster.multiple)
    runs = drive(_policy(policy, cluster, 1 + plan_ahead), predictor, np.full(steps_per_epoch, global_batch), bounds,
                 cluster.steps, cluster.compute_times, cluster.features, plan_ahead, cluster.gpu, cluster.warm_shapes,
                 decision_seconds)
    eta, step_time, decide = zip(*((best[t] / compute.max(), compute.max() + cluster.comm, seconds)
                                   for t, (_, compute, seconds) in enumerate(runs)))
    return {"eta": np.array(eta), "step_time": np.array(step_time), "decide": np.array(decide)}


def _collect(figures, runs, skip):
    """Add one seed's figures per policy: eta, as a fraction of the mean and tail oracles' and the speedup over
    equal batches (where those ran), and the decision times."""
    base = runs["equal"]["step_time"][skip:].mean() if "equal" in runs else None
    references = {key: runs[name]["eta"][skip:].mean() for key, name in (("of_mean", "mean-oracle"),
                                                                           ("of_tail", "tail-oracle")) if name in runs}
    for name, r in runs.items():
        eta = r["eta"][skip:].mean()
        figures[name]["eta"].append(eta)
        for key, reference in references.items():
            figures[name][key].append(eta / reference)
        if base:
            figures[name]["speedup"].append(base / r["step_time"][skip:].mean())
        figures[name]["decide"].append(r["decide"])


def _cell(values, width, digits=3):
    """One figure, or the median [min-max] of several; '-' when there is none."""
    if not values:
        return f"{'-':>{width}}"
    if len(values) == 1:
        return f"{values[0]:>{width}.{digits}f}"
    return f"{np.median(values):>{width}.{digits}f} [{min(values):.{digits}f}-{max(values):.{digits}f}]"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=integers, default="4,64,256,1024", help="comma-separated cluster sizes")
    parser.add_argument("--profiles", default="recorded,low-noise", help=f"comma-separated, from {PROFILES}")
    parser.add_argument("--policies", default="equal,pid,lbbsp-ema,lbbsp-last,lbbsp-narx,oracle,mean-oracle,"
                                              "lagged-mean-oracle,tail-oracle")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--skip", type=int, help="steps left out of the averages while policies learn "
                                                  "(default: 50, or a third of a shorter run)")
    parser.add_argument("--per-worker-batch", type=int, default=64)
    parser.add_argument("--offset", type=float, default=16.0, help="fixed cost per step, in samples")
    parser.add_argument("--aggregate", type=int, default=10, help="recorded steps per simulated step")
    parser.add_argument("--steps-per-epoch", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--decision-ms", type=float, default=0.0,
                        help="CPU time every rank reports per decision (0: a decision at every step; more puts the "
                             "decision period of the controller's budget to work)")
    parser.add_argument("--seeds", type=integers, help="comma-separated seeds, one cluster each, every policy on "
                                                       "every one: cells are then the median with [min-max] over the "
                                                       "seeds (overrides --seed)")
    parser.add_argument("--plot", help="write a plot of eta against the number of workers to this PNG path")
    args = parser.parse_args(argv)
    if args.skip is None:
        args.skip = min(50, args.steps // 3)
    sizes = args.workers
    names = [p.strip() for p in args.policies.split(",")]
    profiles = [p.strip() for p in args.profiles.split(",")]
    seeds = args.seeds or [args.seed]
    unknown = [p for p in names if p not in POLICY_VARIANTS] + [p for p in profiles if p not in PROFILES]
    if unknown or any(s < 1 for s in sizes) or args.steps < 20 or not 0 <= args.skip < args.steps - 10 \
            or args.aggregate < 1 or args.steps_per_epoch < 1 or args.offset < 0 or len(set(seeds)) < len(seeds) \
            or not 0 <= args.decision_ms < np.inf:
        parser.error(f"bad arguments: unknown policies or profiles {unknown}, sizes {sizes} (>= 1), steps "
                     f"{args.steps} (>= 20), skip {args.skip} (0 .. steps - 11), aggregate {args.aggregate} (>= 1), "
                     f"steps per epoch {args.steps_per_epoch} (>= 1), offset {args.offset} (>= 0), "
                     f"seeds {seeds} (each once), decision ms {args.decision_ms} (>= 0)")
    print(f"{'workers':>8} {'profile':<10} {'policy':<18} {'eta':>6} {'of mean-oracle':>15} {'of tail-oracle':>15} "
          f"{'speedup':>8} {'decision ms (median/p99)':>26}"
          + (f"   over seeds {seeds}: median [min-max]" if len(seeds) > 1 else ""))
    etas = {}
    for n in sizes:
        for profile in profiles:
            figures = {name: {"eta": [], "of_mean": [], "of_tail": [], "speedup": [], "decide": []} for name in names}
            for seed in seeds:
                cluster = Cluster(n, args.steps, seed=seed, offset=args.offset, aggregate=args.aggregate,
                                  profile=profile)
                stats = noise_stats(cluster, args.per_worker_batch * n)
                print(f"{n:>8} {profile:<10} noise: spread {stats['spread']:.3f}, p99 |log dev| {stats['p99']:.3f}, "
                      f"lag-1 autocorrelation {stats['lag1']:.2f}; floor-bound steps {100 * stats['floor']:.0f}%"
                      + (f" (seed {seed})" if len(seeds) > 1 else ""), flush=True)
                runs = {name: simulate(cluster, *POLICY_VARIANTS[name], args.per_worker_batch * n,
                                       steps_per_epoch=args.steps_per_epoch, decision_seconds=args.decision_ms / 1e3)
                        for name in names}
                _collect(figures, runs, args.skip)
            for name, f in figures.items():
                etas[(n, profile, name)] = float(np.median(f["eta"]))
                decide = 1e3 * np.concatenate(f["decide"])
                print(f"{n:>8} {profile:<10} {name:<18} {_cell(f['eta'], 6)} {_cell(f['of_mean'], 15)} "
                      f"{_cell(f['of_tail'], 15)} {_cell(f['speedup'], 7, 2)}{'x' if f['speedup'] else ' '} "
                      f"{np.median(decide):>14.3f} / {np.percentile(decide, 99):.3f}", flush=True)
    if args.plot:
        from .plots import plot_scaling

        print(f"plot: {plot_scaling(args.plot, etas, f'({args.per_worker_batch} per worker)')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
