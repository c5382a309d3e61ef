"""The simulator's GPU profile: clusters of ResNet-50 workers whose steps are those measured on an NVIDIA H200
(or, with --card h100, an H100).

    python -m benchmarks.gpusim                       # 8, 64, 256 and 1024 GPUs; every kind; 32, 128, 256 per GPU
    python -m benchmarks.gpusim --workers 8 --kinds classes --batches 32
    python -m benchmarks.gpusim --card h100 --workers 8,64

Worker i's step at batch b, while a co-located job on its GPU runs at duty d
(0: alone), takes

    t = max(f_d e_floor, (c + s_d b) / class_i e_line)  (+ the set-up of b, the first time i runs b)

from the card's trace, predictor/data/traces/gpu_resnet50_vb (H200) or
gpu_resnet50_vb_h100 (ResNet-50, bf16, the batch drawn per step from 32..256
while a co-located job came and went), and the card's constants (CARDS):

- the line: c is the intercept fitted alone on the steps at b >= 96, s_d the
  median slope (t - c) / b of those steps in state d (H200: 0.19 ms per sample
  alone, up to 0.45 at d = 1; H100: 0.21 to 0.50: contention scales the line);
- the floor: f_0 the median step at b = 32 alone (H200: 14.7 ms, where the
  line gives 11.3: kernel launches bound the step; H100: 23.2 ms), f_d =
  f_0 (1 + r d), r the rise of the step at batch 8 under a full-time co-tenant
  in benchmarks/data/gpu_curves*.csv (0.45 on the H200, 0.16 on the H100);
- noise: the trace's own log deviations from that curve in the same state,
  resampled in blocks of 8 consecutive ones, from its floor-bound steps
  (b <= 48) for e_floor and the others for e_line (H200: +-0.5% on the line
  alone, +-10% on the floor, +-20-25% under part-time co-tenants; the H100's
  line alone has stray steps up to 2x, docs/gpu.md);
- readings: each worker's telemetry (what the GPU NARX reads) is the trace's
  NVML readings of the step it replays; without co-tenants, of the trace's
  steps alone, so no reading lists a co-tenant that is not there;
- set-up: a batch size a worker has not run costs it the first step's excess
  of the measured curves, drawn for each worker and shape from the card's range
  (3.0-5.5 s on the H200, 3.5-6.2 s on the H100: cuDNN autotuning); the equal
  split's shape is set up before the run, for every policy;
- kinds: "homogeneous" (one GPU type, alone), "classes" (mixed generations:
  50% / 30% / 20% of the GPUs at 1.0 / 0.6 / 0.4 of the line, the floor
  unchanged) and "cotenants" (one type; each GPU replays the trace's co-tenant
  schedule from its own random step).

Every policy runs the same draws through benchmarks.simulate.simulate (the
controller and forecaster code of the Keras callback, the batch grid of 8).
Printed per cell: each policy's total time for the run (set-ups included),
the set-ups it caused and their seconds, as a fraction of equal batches' and
of the mean oracle's time; the mean oracle knows every worker's state and
curve at the coming step (not the draw, not the set-up costs). Simulated
decisions take no time, so every policy decides at every step; with
`--decision-ms` every rank reports that CPU time per decision, and the
controller's decision budget holds each split for several steps, as on a
real cluster (for every policy: run it with lbbsp and equal).
"""
import argparse
import sys
from typing import NamedTuple

import numpy as np

from lbbsp.allocation import step_times
from predictor.gpu_traces import trace_name
from predictor.traces import TRACE_DIR, read_trace

from .ablation import ABLATIONS
from .cli import integers
from .oracle import best_split
from .simulate import POLICY_VARIANTS, simulate

__all__ = ["GPUCard", "GPUProfile", "GPUCluster", "run_cell", "main", "KINDS", "CARDS"]

KINDS = ("homogeneous", "classes", "cotenants")
CLASSES, CLASS_SHARES = (1.0, 0.6, 0.4), (0.5, 0.3, 0.2)


class GPUCard(NamedTuple):
    """Two constants of a measured card read off its curves (benchmarks/data/gpu_curves*.csv): the rise of the
    floor under a full-time co-tenant (the floor at duty d is f_0 (1 + floor_rise d)) and the range of a new batch
    shape's first-step excess in seconds. Its ResNet-50 trace is predictor.gpu_traces' for the same card."""

    floor_rise: float
    setup_range: tuple


CARDS = {"h200": GPUCard(0.45, (3.0, 5.5)), "h100": GPUCard(0.16, (3.5, 6.2))}
NOISE_BLOCK = 8
POLICIES = ("equal", "pid", "lbbsp-last", "lbbsp-narx", "mean-oracle")


class GPUProfile:
    """The curves, noise pools and co-tenant schedule of a card's measured ResNet-50 trace (see the module
    docstring)."""

    def __init__(self, card="h200"):
        if card not in CARDS:
            raise ValueError(f"card={card!r} is not allowed: use one of {sorted(CARDS)}")
        self.card = CARDS[card]
        trace = read_trace(f"{TRACE_DIR}/{trace_name('gpu_resnet50_vb', card)}.csv.gz")
        b, t, duty = trace["batch"], trace["step_time"], trace["hog"]
        line = b >= 96
        alone = duty == 0
        slope, self.intercept = np.polyfit(b[line & alone], t[line & alone], 1)
        self.duties = np.unique(duty)
        self.slopes = np.array([np.median((t[line & (duty == d)] - self.intercept) / b[line & (duty == d)])
                                for d in self.duties])
        self.floor = float(np.median(t[alone & (b == 32)]))
        resid = np.log(t / self.mean_time(b, duty, 1.0))
        self.pools = {(d, on_floor): resid[(duty == d) & ((b <= 48) == on_floor)]
                      for d in self.duties for on_floor in (True, False)}
        self.schedule = duty
        self.features = trace["features"]

    def _slope(self, duty):
        return self.slopes[np.searchsorted(self.duties, duty)]

    def floor_at(self, duty):
        return self.floor * (1.0 + self.card.floor_rise * np.asarray(duty))

    def mean_time(self, batch, duty, speed_class):
        """The curve max(f_d, (c + s_d b) / class) in seconds."""
        line = (self.intercept + self._slope(duty) * np.asarray(batch, dtype=np.float64)) / speed_class
        return np.maximum(self.floor_at(duty), line)


class GPUCluster:
    """N simulated GPU workers of one kind, with the interface of benchmarks.simulate.Cluster."""

    multiple, comm, gpu = 8, 0.0, True

    def __init__(self, num_workers, steps, kind, global_batch, seed=0, profile=None):
        if kind not in KINDS:
            raise ValueError(f"kind={kind!r} is not allowed: use one of {KINDS}")
        self.profile = profile or GPUProfile()
        p = self.profile
        rng = np.random.default_rng(seed)
        self.num_workers, self.steps, self.kind = num_workers, steps, kind
        n, length = num_workers, steps + 1
        self.speed_class = rng.choice(CLASSES, size=n, p=CLASS_SHARES) if kind == "classes" else np.ones(n)
        start = rng.integers(p.schedule.size, size=n)
        index = (start[None, :] + np.arange(length)[:, None]) % p.schedule.size
        self.duty = p.schedule[index] if kind == "cotenants" else np.zeros((length, n))
        # The readings of the trace's steps in the same state: without co-tenants, those of its steps alone.
        alone = np.flatnonzero(p.schedule == 0)
        self.features = p.features[index if kind == "cotenants" else alone[index % alone.size]]
        self.noise = {on_floor: self._draw(rng, on_floor) for on_floor in (True, False)}
        self.seed = seed
        self.reset_shapes(global_batch)
        self._best = {}

    def _draw(self, rng, on_floor):
        """(steps + 1, N) log deviations, each worker's resampled in blocks from the pool of its state."""
        out = np.empty_like(self.duty)
        for w in range(self.num_workers):
            for s0 in range(0, out.shape[0], NOISE_BLOCK):
                pool = self.profile.pools[(self.duty[s0, w], on_floor)]
                if pool.size == 0:
                    pool = self.profile.pools[(0.0, on_floor)]
                begin = rng.integers(max(pool.size - NOISE_BLOCK, 0) + 1)
                block = pool[begin:begin + NOISE_BLOCK]
                out[s0:s0 + NOISE_BLOCK, w] = np.resize(block, out[s0:s0 + NOISE_BLOCK, w].shape)
        return out

    def clean_times(self, step, batches):
        """Step times at `batches` with this step's noise, without set-ups."""
        p, d = self.profile, self.duty[step]
        floor = p.floor_at(d) * np.exp(self.noise[True][step])
        line = (p.intercept + p._slope(d) * np.asarray(batches, dtype=np.float64)) / self.speed_class
        return np.maximum(floor, line * np.exp(self.noise[False][step]))

    def compute_times(self, step, batches):
        """This step's compute time of every worker at `batches`, a new shape's set-up included."""
        times = self.clean_times(step, batches)
        for w, b in enumerate(np.asarray(batches).tolist()):
            if b not in self.known[w]:
                self.known[w].add(b)
                cost = self._setup_rng.uniform(*self.profile.card.setup_range)
                times[w] += cost
                self.setups += 1
                self.setup_seconds += cost
        return times

    def reset_shapes(self, global_batch, warm=False):
        """Forget the shapes set up by a previous policy's run: the equal split's stays, and with `warm` every
        multiple of the grid up to twice the equal share is set up before the run (`warm_shapes`)."""
        share = global_batch // self.num_workers
        self.warm_shapes = list(range(self.multiple, 2 * share + 1, self.multiple)) if warm else []
        self.known = [{global_batch // self.num_workers, *self.warm_shapes} for _ in range(self.num_workers)]
        self._setup_rng = np.random.default_rng([self.seed, 1])
        self.setups, self.setup_seconds = 0, 0.0

    def mean_truth(self, step):
        """(offsets k, speeds v, floors f) of every worker's mean curve at `step`: what the mean oracle knows."""
        p, d = self.profile, self.duty[min(step, self.steps)]
        slope = p._slope(d) / self.speed_class
        return np.full(self.num_workers, p.intercept / self.speed_class) / slope, 1.0 / slope, p.floor_at(d)

    def best_steps(self, global_batch):
        """Per step, the shortest compute time any split reaches knowing the draw (the line's draw applied as a
        speed), without set-ups: the clairvoyant reference of eta."""
        if global_batch not in self._best:
            best = []
            for step in range(self.steps):
                k, v, _ = self.mean_truth(step)
                f = self.clean_times(step, np.zeros(self.num_workers))  # the drawn floors
                v = v / np.exp(self.noise[False][step])
                best.append(float(step_times(best_split(v, global_batch, 1, k, f), v, k, f).max()))
            self._best[global_batch] = np.array(best)
        return self._best[global_batch]


def run_cell(n, kind, per_gpu, steps, steps_per_epoch, seed=0, policies=POLICIES, profile=None, warm=False,
             decision_seconds=0.0):
    """{policy: (total seconds, set-ups, set-up seconds)} of one cell, every policy on the same draws; `warm`:
    every grid shape set up before the run, for every policy (lbbsp is told through warm_shapes);
    `decision_seconds`: the CPU time every rank reports for a decision (lbbsp.controller's decision period)."""
    global_batch = per_gpu * n
    cluster = GPUCluster(n, steps, kind, global_batch, seed=seed, profile=profile)
    out = {}
    for name in policies:
        cluster.reset_shapes(global_batch, warm)
        run = simulate(cluster, *POLICY_VARIANTS[name], global_batch, steps_per_epoch=steps_per_epoch,
                       decision_seconds=decision_seconds)
        out[name] = (float(run["step_time"].sum()), cluster.setups, cluster.setup_seconds)
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=integers, default="8,64,256,1024")
    parser.add_argument("--kinds", default=",".join(KINDS))
    parser.add_argument("--batches", type=integers, default="32,128,256", help="per-GPU batch of the equal split")
    parser.add_argument("--policies", default=",".join(POLICIES))
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--steps-per-epoch", type=int, default=500)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--card", default="h200", choices=sorted(CARDS), help="the measured card (default h200)")
    parser.add_argument("--warm", action="store_true", help="every grid shape up to twice the equal share set up "
                                                            "before the run (warm_shapes)")
    parser.add_argument("--decision-ms", type=float, default=0.0,
                        help="CPU milliseconds every rank reports for a decision (default 0: a decision at every "
                             "step; more lets the decision budget hold splits, as on a real cluster)")
    args = parser.parse_args(argv)
    sizes, batches = args.workers, args.batches
    kinds, names = args.kinds.split(","), args.policies.split(",")
    bad = [k for k in kinds if k not in KINDS] + [p for p in names if p not in POLICIES and p not in ABLATIONS]
    if bad or min(sizes) < 1 or min(batches) < 8 or any(b % 8 for b in batches) or args.steps < 20 or \
            not 1 <= args.steps_per_epoch or not 0 <= args.decision_ms < np.inf:
        parser.error(f"unknown kinds or policies {bad}; sizes {sizes} (>= 1), batches {batches} (multiples of 8), "
                     f"steps {args.steps} (>= 20), steps per epoch {args.steps_per_epoch} (>= 1), decision ms "
                     f"{args.decision_ms} (>= 0)")
    profile = GPUProfile(args.card)
    print(f"{'GPUs':>5} {'kind':<12} {'b/GPU':>5} {'policy':<12} {'time s':>8} {'of equal':>9} {'of oracle':>10} "
          f"{'set-ups':>8} {'set-up s':>9}")
    for n in sizes:
        for kind in kinds:
            for per_gpu in batches:
                cell = run_cell(n, kind, per_gpu, args.steps, args.steps_per_epoch, args.seed, names, profile,
                                args.warm, args.decision_ms / 1e3)
                equal, oracle = cell.get("equal", (np.nan,))[0], cell.get("mean-oracle", (np.nan,))[0]
                for name, (total, setups, seconds) in cell.items():
                    print(f"{n:>5} {kind:<12} {per_gpu:>5} {name:<12} {total:>8.2f} {total / equal:>9.3f} "
                          f"{total / oracle:>10.3f} {setups:>8d} {seconds:>9.1f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
