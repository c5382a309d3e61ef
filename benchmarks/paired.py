"""Paired per-round ratios between two variants of one or more `benchmarks.compare` launches.

    python -m benchmarks.paired results/static-4 --variants lbbsp-narx,horovod
    python -m benchmarks.paired run1/dynamic-2 run2/dynamic-2 --variants lbbsp-narx,lbbsp-narx@base

A launch interleaves its variants round by round, so the ratio of two variants' epoch times within a
round cancels what the machine did in that round. Pooled over launches, the median of those ratios says
which variant is faster; their scatter says how far to trust it: the median of n rounds is good to about
sqrt(pi / 2) s / sqrt(n) (s: the standard deviation of the log ratios), so resolving a difference d takes
about (sqrt(pi / 2) s / d)^2 rounds. Run the same code as both variants (`--base-tree` on a second
worktree of the same commit) to see the harness's own spread on the machine at hand.
"""
import argparse
import glob
import json
import math
import os
import sys

import numpy as np

__all__ = ["ratios", "describe"]


def _times(folder, variant):
    """{round folder: steady epoch time} of one variant in one scenario folder of a launch. Read from each run's
    summary.json, not the launch's results.json, so that a launch cut short still counts its finished rounds."""
    out = {}
    for path in glob.glob(os.path.join(folder, glob.escape(variant), "r*", "summary.json")):
        with open(path) as fh:
            value = json.load(fh).get("epoch_time")
        if isinstance(value, (int, float)) and math.isfinite(value) and value > 0:
            out[os.path.basename(os.path.dirname(path))] = float(value)
    return out


def ratios(folders, variant, base):
    """Epoch time of `variant` over `base` in every round that ran both, launch by launch (numpy array)."""
    out = []
    for folder in folders:
        mine, theirs = _times(folder, variant), _times(folder, base)
        out += [mine[r] / theirs[r] for r in sorted(set(mine) & set(theirs))]
    return np.array(out, dtype=np.float64)


def describe(x, resolve=0.02):
    """Median, mean, quartiles, rounds faster, the median's standard error (relative) and the rounds it would
    take to resolve a relative difference `resolve`, of paired ratios `x`."""
    x = np.asarray(x, dtype=np.float64)
    if x.size < 2:
        raise ValueError(f"{x.size} paired round(s) is not enough: give launches with at least 2 rounds of both")
    spread = float(np.std(np.log(x), ddof=1)) * math.sqrt(math.pi / 2)
    return {"rounds": int(x.size), "median": float(np.median(x)), "mean": float(np.mean(x)),
            "quartiles": [float(q) for q in np.percentile(x, [25, 75])], "faster": int(np.sum(x < 1)),
            "error": spread / math.sqrt(x.size), "rounds_to_resolve": int(math.ceil((spread / resolve) ** 2))}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("folders", nargs="+", help="scenario folders of compare launches (<out>/<scenario>)")
    parser.add_argument("--variants", required=True, help="VARIANT,BASE: the ratio is VARIANT / BASE")
    parser.add_argument("--resolve", type=float, default=0.02, help="relative difference to size the rounds for")
    parser.add_argument("--json", help="also write the figures here")
    args = parser.parse_args(argv)
    pair = args.variants.split(",")
    if len(pair) != 2 or not all(pair):
        parser.error(f"--variants={args.variants!r} is not allowed: give two variants, VARIANT,BASE")
    if not 0 < args.resolve < 1:
        parser.error(f"--resolve={args.resolve!r} is not allowed: give a relative difference in (0, 1)")
    for folder in args.folders:
        if not os.path.isdir(folder):
            parser.error(f"folder {folder!r} does not exist: give <out>/<scenario> of a benchmarks.compare launch")
    try:
        figures = describe(ratios(args.folders, *pair), args.resolve)
    except ValueError as exc:
        parser.error(f"{args.variants}: {exc}")
    q1, q3 = figures["quartiles"]
    print(f"{pair[0]} / {pair[1]} over {figures['rounds']} rounds: median {figures['median']:.3f} "
          f"(mean {figures['mean']:.3f}, quartiles {q1:.3f}-{q3:.3f}, faster in {figures['faster']}); "
          f"the median is good to +-{100 * figures['error']:.1f}% (one standard error); resolving "
          f"{100 * args.resolve:g}% takes about {figures['rounds_to_resolve']} rounds")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(dict(figures, variant=pair[0], base=pair[1], folders=args.folders), fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
