"""Turn the per-rank step records of live benchmark runs into speed traces in the predictor's format.

    python -m benchmarks.export_traces results/step-change-2/lbbsp-narx/r0 --out predictor/data/traces

Unlike traces from benchmarks.record (one batch size, one process alone),
these come from real lbbsp jobs: the batch changes from step to step, the
speed column is the batch-free speed (b + k) / t with the job's fitted fixed
cost k, the telemetry was read inside the job, and the injected state
(quota in cores, hog) comes from the scenario. They serve as held-out test
traces for predictor.evaluate (prefix "live") or as training traces that
show the model what a multi-process job's steps look like (prefix
"livetrain"; predictor.train uses them as they are, without aggregation).
"""
import argparse
import csv
import glob
import os
import sys

from predictor.telemetry import FEATURES
from predictor.traces import write_trace


def export(run_dir, out_dir, prefix="live"):
    """Write one trace per rank of `run_dir`; returns the paths written."""
    scenario = os.path.basename(os.path.dirname(os.path.dirname(os.path.abspath(run_dir))))
    written = []
    for path in sorted(glob.glob(os.path.join(run_dir, "steps_rank*.csv"))):
        with open(path) as fh:
            rows = list(csv.DictReader(fh))
        if not rows or FEATURES[0] not in rows[0]:
            continue  # a run without telemetry (no learned predictor): nothing to learn from
        rank = rows[0]["rank"]
        out_rows = []
        for i, r in enumerate(rows):
            row = {"step": i, "time": float(r["time"]), "batch": int(r["batch_size"]),
                   "step_time": float(r["compute"]), "speed": float(r["speed"]),
                   "quota": float(r.get("cores", "nan") or "nan"), "hog": int(r.get("state_hog") == "True"), "mem": 0}
            row.update({f: float(r[f]) for f in FEATURES})
            out_rows.append(row)
        name = f"{prefix}_{scenario}_{os.path.basename(os.path.abspath(run_dir))}_rank{rank}.csv.gz"
        target = os.path.join(out_dir, name)
        write_trace(target, out_rows, [
            "exported by: python -m benchmarks.export_traces from a live lbbsp run of scenario "
            f"{scenario}, rank {rank}",
            "speed is the batch-free speed (b + k) / t; the batch changes from step to step; quota in cores",
        ])
        written.append(target)
    return written


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", help="run directories holding steps_rank*.csv")
    parser.add_argument("--out", required=True)
    parser.add_argument("--prefix", default="live",
                        help="file name prefix: live (held out for evaluation) or livetrain (used for training)")
    args = parser.parse_args(argv)
    if args.prefix not in ("live", "livetrain"):
        parser.error(f"--prefix={args.prefix!r} is not allowed: use live or livetrain")
    os.makedirs(args.out, exist_ok=True)
    for run in args.runs:
        for path in export(run, args.out, args.prefix):
            print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
