"""Identical workers' recorded noise, replayed through the decision: what moves cost where nothing is to balance.

    python -m benchmarks.alike OUT/homogeneous-2-mlp [OUT2/homogeneous-2-mlp ...] --policies equal,lbbsp-narx

Reads the per-step compute times of the `equal` runs of `benchmarks.compare` launches on identical workers:
every worker ran the same batch, so a step's time over the line's time at that batch is the step's noise.
Worker i's time at batch b in replayed step s is then line(b) x noise[s, i], with the line t = fixed +
per_sample x b fitted by least squares to the steps of the lbbsp runs in the same folders (whose batches
moved) or given with `--line`. Each run's steady epochs (from the second on) are replayed through the
controller (`benchmarks.simulate.drive`: the live code, the decision period set by `--decision-ms`, by
default the median decision time the lbbsp runs reported). Deterministic: over 25 runs the mean is good to
about 0.2% of the compute (the runs' scatter), where a live launch of paired rounds resolves 2-6%
(docs/results.md). Printed per policy: the mean slowest compute over equal batches' on the same noise
(mean, median and worst over the runs) and the share of steps off the equal split.
"""
import argparse
import glob
import json
import os
import sys

import numpy as np

from lbbsp.allocation import Bounds, default_multiple

from .replay import load_run
from .simulate import POLICY_VARIANTS, _policy, drive

__all__ = ["read_run", "fit_line", "replay", "main"]

ORACLES = ("oracle", "mean-oracle", "lagged-mean-oracle", "tail-oracle")


def read_run(folder):
    """(batches, compute seconds, steps per epoch) of one run folder: (steps, workers) arrays from its step CSVs."""
    return _arrays(load_run(folder))


def _arrays(run):
    """read_run's triple from benchmarks.replay.load_run's columns."""
    return run["batch_size"], run["compute"], int(np.count_nonzero(run["epoch"][:, 0] == 0))


def fit_line(runs):
    """(fixed seconds, seconds per sample): least squares over every step of `runs` (after their first epoch)."""
    b = np.concatenate([batches[per_epoch:].ravel() for batches, _, per_epoch in runs])
    t = np.concatenate([compute[per_epoch:].ravel() for _, compute, per_epoch in runs])
    ok = np.isfinite(t) & (t > 0)
    if ok.sum() < 3 or np.ptp(b[ok]) == 0:
        raise ValueError("the lbbsp runs' batches never moved: no line to fit; give --line FIXED_MS,PER_SAMPLE_MS")
    per_sample, fixed = np.polyfit(b[ok], t[ok], 1)
    if not (fixed > 0 and per_sample > 0):
        raise ValueError(f"the fitted line t = {1e3 * fixed:.3g} ms + {1e3 * per_sample:.3g} ms per sample is not "
                         "allowed (both must be > 0); give --line FIXED_MS,PER_SAMPLE_MS")
    return float(fixed), float(per_sample)


def replay(run, line, policy, decision_seconds):
    """(mean slowest compute, share of steps off the equal split) of `policy` on one equal run's steady noise."""
    batches, compute, per_epoch = run
    fixed, per_sample = line
    noise = compute[per_epoch:] / (fixed + per_sample * batches[per_epoch:])
    total, n = int(batches[0].sum()), batches.shape[1]
    bounds = Bounds.of(n, total, multiple=default_multiple(total, n))
    name, predictor = POLICY_VARIANTS[policy]
    steps = drive(_policy(name, None, 2), predictor, np.full(per_epoch, total), bounds, len(noise),
                  lambda s, b: (fixed + per_sample * b) * noise[s], decision_seconds=decision_seconds)
    slowest, off = zip(*((t.max(), bool(np.any(b != b[0]))) for b, t, _ in steps))
    return float(np.mean(slowest)), float(np.mean(off))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folders", nargs="+", help="benchmarks.compare output folders of one scenario (OUT/SCENARIO)")
    parser.add_argument("--policies", default="equal,lbbsp-last,lbbsp-narx", help=f"comma-separated, from "
                        f"{sorted(p for p in POLICY_VARIANTS if p not in ORACLES)}")
    parser.add_argument("--line", help="FIXED_MS,PER_SAMPLE_MS of the step-time line (default: fitted to the lbbsp "
                                       "runs in the folders)")
    parser.add_argument("--decision-ms", type=float, help="CPU time reported per decision (default: the median the "
                                                          "lbbsp runs in the folders reported)")
    parser.add_argument("--json", help="write the figures to this file as well")
    args = parser.parse_args(argv)
    policies = [p.strip() for p in args.policies.split(",")]
    unknown = [p for p in policies if p not in POLICY_VARIANTS or p in ORACLES]
    if unknown or (args.decision_ms is not None and not 0 <= args.decision_ms < np.inf):
        parser.error(f"policies {unknown} or --decision-ms {args.decision_ms} are not allowed: give policies from "
                     f"{sorted(p for p in POLICY_VARIANTS if p not in ORACLES)} and milliseconds >= 0")
    equal = [read_run(path) for path in _runs(args.folders, "equal")]
    lbbsp = [load_run(path) for path in _runs(args.folders, "lbbsp*")]  # steps give the line, rows the decision time
    if not equal:
        parser.error(f"folders {args.folders} are not allowed: none holds runs of the `equal` variant")
    try:
        if args.line:
            line = tuple(float(v) / 1e3 for v in args.line.split(","))
        else:
            line = fit_line([_arrays(run) for run in lbbsp])
        if len(line) != 2 or not all(np.isfinite(line)) or min(line) <= 0:
            raise ValueError(f"--line {args.line!r} is not allowed: give FIXED_MS,PER_SAMPLE_MS, both > 0")
    except ValueError as exc:
        parser.error(str(exc))
    decision_ms = args.decision_ms
    if decision_ms is None:
        decisions = [d for run in lbbsp for d in run["decision"][:, 0] if d > 0]
        decision_ms = 1e3 * float(np.median(decisions)) if decisions else 0.0
    print(f"{len(equal)} equal runs; line t = {1e3 * line[0]:.2f} ms + {1e3 * line[1]:.4f} ms per sample; "
          f"{decision_ms:.2f} ms per decision")
    # Equal batches never move, so the decision time changes nothing of theirs: replayed once, as the base.
    equal_results = [replay(run, line, "equal", 0.0) for run in equal]
    base = [slowest for slowest, _ in equal_results]
    figures = {}
    print(f"{'policy':<24} {'slowest / equal: mean':>22} {'median':>8} {'worst':>8} {'off equal':>10}")
    for policy in policies:
        results = equal_results if policy == "equal" else [replay(run, line, policy, decision_ms / 1e3)
                                                           for run in equal]
        ratio = np.array([slowest for slowest, _ in results]) / base
        figures[policy] = {"ratios": ratio.tolist(), "off_equal": [off for _, off in results]}
        print(f"{policy:<24} {ratio.mean():>22.4f} {np.median(ratio):>8.4f} {ratio.max():>8.4f} "
              f"{np.mean([off for _, off in results]):>10.2f}")
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"line": line, "decision_ms": decision_ms, "policies": figures}, out, indent=1)
    return 0


def _runs(folders, pattern):
    """The run folders of the variants matching `pattern` in benchmarks.compare output `folders`, but those of
    another checkout ("@base")."""
    return [path for folder in folders for path in sorted(glob.glob(os.path.join(folder, pattern, "r*")))
            if "@" not in path]


if __name__ == "__main__":
    sys.exit(main())
