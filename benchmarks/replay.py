"""Replay a live run's gathered rows through the controller, offline, and show what each decision saw.

    python -m benchmarks.replay results/step-change-2/lbbsp-narx/r0
    python -m benchmarks.replay results/static-4/pid/r1 --steps 40-60

Every rank decides from the gathered rows alone (lbbsp.exchange: each rank's
forecast and compute time, exchanged as float32) and the batch sizes
it ran, and a run's per-rank step CSVs hold both. Fed the same rows, a
BalanceController built as benchmarks.worker builds it for the variant
(benchmarks.variants; by default the one the folder's path names) makes the
same decisions. The replay checks that it does, against the batch sizes the
ranks then ran, and prints for each step what the decision saw: the split
run and the split decided, each worker's batch-free speed, fixed cost and
change threshold, the workers whose speed the step-time model saw jump, the
workers whose forecasts or (on GPUs) running mean speeds it planned with
(where they have lately beaten their last measured speeds), learned floors,
and the forgone saving that a move to new batch shapes must pay for, with
the workers' lasting speeds (their mean over the last full window of
steps, before the first one over the steps so far) that such a move is
valued at where a set-up costs more than a step. A recovery
slower than it should be can then be traced to its cause without running
the cluster again.
"""
import argparse
import csv
import glob
import json
import os
import sys

import numpy as np

from lbbsp import exchange
from lbbsp.allocation import Bounds, default_multiple
from lbbsp.controller import BalanceController
from lbbsp.sharding import EpochSchedule

from .variants import VARIANTS, worker_options
from .worker import WARMUP_STEPS, make_policy, parse

__all__ = ["load_run", "replay", "main"]


def load_run(run_dir):
    """The per-step records of every rank of a run: {column: array of shape (steps, ranks)} for the columns a
    decision reads (epoch, step, global_batch, batch_size, forecast, compute, decision)."""
    paths = sorted(glob.glob(os.path.join(run_dir, "steps_rank*.csv")),
                   key=lambda p: int(os.path.basename(p)[len("steps_rank"):-len(".csv")]))
    if not paths:
        raise ValueError(f"run_dir={run_dir!r} holds no steps_rank*.csv: give the folder of one run "
                         "(benchmarks.compare writes <out>/<scenario>/<variant>/r<round>)")
    ranks = []
    for path in paths:
        with open(path, newline="") as fh:
            ranks.append(list(csv.DictReader(fh)))
    steps = min(len(rows) for rows in ranks)
    columns = ("epoch", "step", "global_batch", "batch_size", "forecast", "compute", "decision")
    # Only the decision time may be missing: earlier runs reported none (they decided at every step).
    return {name: np.array([[float(rows[i][name] if name != "decision" else rows[i].get(name, 0.0)) for rows in ranks]
                            for i in range(steps)]) for name in columns}


def _grid(run_dir):
    """The batch grid the run's splits kept, where its summary.json records it (runs from 2026-12-01 on)."""
    try:
        with open(os.path.join(run_dir, "summary.json")) as fh:
            return json.load(fh).get("grid")
    except (OSError, ValueError):
        return None


def replay(run_dir, variant="lbbsp-narx", gpu=False, grid=None):
    """Feed a run's gathered rows to a controller built for `variant` (its policy, plan_ahead and batch grid as
    benchmarks.worker sets them; `gpu`: the run trained on GPUs; `grid`: the batch grid of a run whose summary does
    not record it); returns (per-step records, decisions that match the split the ranks ran, decisions checked)."""
    if variant not in VARIANTS or VARIANTS[variant][0] in ("horovod", "oracle"):
        allowed = [v for v, spec in VARIANTS.items() if spec[0] not in ("horovod", "oracle")]
        raise ValueError(f"variant={variant!r} is not allowed: give one whose splits come from timings, {allowed}")
    args = parse(["--scenario", "replay", "--out-dir", run_dir] + worker_options(variant))
    run = load_run(run_dir)
    epoch, step = run["epoch"][:, 0].astype(int), run["step"][:, 0].astype(int)
    global_batch = run["global_batch"][:, 0].astype(int)
    n = run["batch_size"].shape[1]
    first = epoch == epoch[0]
    schedule = EpochSchedule.from_steps(global_batch[first])
    if grid is None:
        grid = _grid(run_dir) or args.batch_multiple or default_multiple(int(global_batch[0]), n, gpu)
    controller = BalanceController(make_policy(args), warmup_steps=WARMUP_STEPS, plan_ahead=args.plan_ahead)
    controller.start(schedule, Bounds.of(n, int(global_batch[0]), multiple=grid), gpu=gpu)
    policy = controller.policy
    gathered = exchange.empty(n)
    records, matched, checked = [], 0, 0
    ahead = 1 + args.plan_ahead
    for i in range(len(epoch)):
        # The rows travel as float32 (lbbsp.keras.optimizer); the CSVs hold the float64 values before that.
        for column in ("forecast", "compute", "decision"):
            gathered[:, exchange.FIELDS.index(column)] = run[column][i].astype(np.float32)
        ran = run["batch_size"][i].astype(np.int64)
        plan, stats = controller.decide(int(epoch[i]), int(step[i]), gathered, ran)
        decided = np.asarray(plan.sizes)
        record = {"epoch": int(epoch[i]), "step": int(step[i]), "ran": ran.tolist(), "decided": decided.tolist(),
                  "period": controller.next_decision - stats.step if stats.elapsed else 0}
        if i + ahead < len(epoch):
            checked += 1
            record["match"] = bool(np.array_equal(run["batch_size"][i + ahead].astype(np.int64), decided))
            matched += record["match"]
        model = getattr(policy, "model", None)
        if model is not None:
            record.update(speed=model.speeds.tolist(), offset=model.offsets.tolist(), floor=model.floors.tolist(),
                          threshold=model.threshold.tolist(), jumped=np.flatnonzero(model.changed).tolist(),
                          forecast_used=np.flatnonzero(policy.planned_with == 1).tolist(),
                          mean_used=np.flatnonzero(policy.planned_with == 2).tolist(),
                          regret=policy._regret, setup=model.setup_cost(),
                          lasting=np.exp(policy._lasting_logs()).tolist())
        records.append(record)
    return records, matched, checked


def _line(r):
    text = f"{r['epoch']:>3} {r['step']:>3}  ran {r['ran']} -> {r['decided']}"
    text += "  MISMATCH" if r.get("match") is False else ""
    text += "  (split held)" if r["period"] == 0 else f"  (holds {r['period']} steps)" if r["period"] > 1 else ""
    if "speed" in r:
        text += (f"  speed {np.round(r['speed']).tolist()} k {np.round(r['offset'], 1).tolist()} "
                 f"threshold {np.round(r['threshold'], 2).tolist()}")
        text += f" jumped {r['jumped']}" if r["jumped"] else ""
        text += f" floor {np.round(1e3 * np.array(r['floor']), 1).tolist()} ms" if any(r["floor"]) else ""
        text += f" forecasts of {r['forecast_used']}" if r["forecast_used"] else ""
        text += f" running means of {r['mean_used']}" if r["mean_used"] else ""
        text += (f" regret {r['regret']:.2f} s (set-up {r['setup']:.2f} s) lasting speeds "
                 f"{np.round(r['lasting']).tolist()}" if r["regret"] else "")
    return text


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dir", help="one run's folder (with steps_rank*.csv)")
    parser.add_argument("--variant", help="the variant that ran (default: the name of the folder above run_dir, "
                                          "as benchmarks.compare lays it out, else lbbsp-narx)")
    parser.add_argument("--steps", help="print only global steps FROM-TO (counted from the first step)")
    parser.add_argument("--json", help="also write every step's record to this JSON file")
    parser.add_argument("--gpu", action="store_true", help="the run trained on GPUs (the set-up cost's prior)")
    parser.add_argument("--grid", type=int, help="the batch grid of a run whose summary.json does not record it "
                                                 "(before 2026-12-01 the default was 8, 4 or 2 on CPU workers too)")
    args = parser.parse_args(argv)
    if args.grid is not None and args.grid < 1:
        parser.error(f"--grid={args.grid} is not allowed: give the run's batch grid, an integer >= 1")
    variant = args.variant or os.path.basename(os.path.dirname(os.path.normpath(args.run_dir)))
    if args.variant is None and variant not in VARIANTS:
        variant = "lbbsp-narx"
    low, high = 0, sys.maxsize
    if args.steps:
        try:
            low, high = (int(v) for v in args.steps.split("-"))
        except ValueError:
            parser.error(f"--steps={args.steps!r} is not allowed: give FROM-TO, e.g. 40-60")
    try:
        records, matched, checked = replay(args.run_dir, variant, args.gpu, args.grid)
    except ValueError as exc:
        parser.error(str(exc))
    for index, record in enumerate(records):
        if low <= index <= high:
            print(f"{index:>4} {_line(record)}")
    print(f"{variant}: {matched} of {checked} decisions match the split the ranks ran")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(records, fh)
    return 0 if matched == checked else 1


if __name__ == "__main__":
    sys.exit(main())
