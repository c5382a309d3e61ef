"""Run every variant on one scenario, repeated and interleaved, and print medians against plain Horovod.

    python -m benchmarks.compare --scenario static-4 --repeats 3
    python -m benchmarks.compare --scenario step-change-2 --variants horovod,pid,lbbsp-ema,lbbsp-narx,oracle

Each round runs every variant once (the order rotates from round to round so
that no variant always follows the same one); the oracle runs last in a round,
with the step-time curves measured so far in this comparison. Every table
shows plain Horovod first, medians over the rounds with their min-max spread,
and speedups relative to plain Horovod; a difference smaller than the spread
is called a tie. Below the main table: where each step's time goes per
rank, and for scenarios whose contention changes, the step efficiency at
each step after a change (benchmarks.analysis.recovery). Writes under
--out/<scenario>/: one folder per variant and
round (per-rank step CSVs, summary.json, log), curves.json, table.md,
results.json and PNG plots. `--table-only` runs nothing and prints the tables
of the comparison already there anew (e.g. an earlier run's, with the
reachable ideals of the current code).
"""
import argparse
import csv
import glob
import json
import os
import shutil
import subprocess
import sys
import time

import numpy as np

from .oracle import CurveBook, fit_curves, one_size, save_curves
from .progress import Progress
from .scenario import Scenario, list_scenarios
from .variants import LIVE_DEFAULT, VARIANTS, split_label, worker_options

BASE = "horovod"


def run_variant(scenario, label, seed, args, run_dir, progress, curves_path=None):
    """One horovodrun of the variant; returns its summary.json."""
    shutil.rmtree(run_dir, ignore_errors=True)
    os.makedirs(run_dir)
    launcher = shutil.which("horovodrun", path=os.path.dirname(sys.executable)) or "horovodrun"
    hosts = args.hosts or f"localhost:{scenario.workers}"
    tree = os.path.abspath(args.base_tree) if split_label(label)[1] else os.getcwd()
    cmd = [launcher, "-np", str(scenario.workers), "-H", hosts, "--gloo",
           sys.executable, "-m", "benchmarks.worker", "--scenario", scenario.source,
           *worker_options(label), "--out-dir", os.path.abspath(run_dir), "--seed", str(seed)]
    if curves_path:
        cmd += ["--curves", os.path.abspath(curves_path)]
    if args.epochs:
        cmd += ["--epochs", str(args.epochs)]
    if args.emulate:
        cmd.append("--emulate")
    if args.external:
        cmd.append("--external")
    env = dict(os.environ, OMP_NUM_THREADS="1", TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [tree, env.get("PYTHONPATH")]))
    log_path = os.path.join(run_dir, "log.txt")
    progress_file = os.path.join(run_dir, "progress")
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=tree)
        while proc.poll() is None:
            done = len(open(progress_file).read().split()) if os.path.exists(progress_file) else 0
            progress.update(label, done)
            time.sleep(0.5)
    if proc.returncode != 0:
        tail = open(log_path).read()[-3000:]
        raise RuntimeError(f"variant {label} failed (exit {proc.returncode}); log {log_path}:\n{tail}")
    with open(os.path.join(run_dir, "summary.json")) as fh:
        return json.load(fh)


def measured_steps(out_dir):
    """Every lbbsp-run step so far (first epoch and the oracle's runs excluded), each a list by rank of
    ((state speed, hog), batch, compute)."""
    steps = {}
    for path in sorted(glob.glob(os.path.join(out_dir, "*", "r*", "steps_rank*.csv"))):
        if os.sep + "oracle" + os.sep in path:
            continue
        run = os.path.dirname(path)
        with open(path) as fh:
            for row in csv.DictReader(fh):
                if int(row["epoch"]) >= 1:
                    ranks = steps.setdefault((run, int(row["epoch"]), int(row["step"])), {})
                    ranks[int(row["rank"])] = ((float(row["state_speed"]), row["state_hog"] == "True"),
                                               float(row["batch_size"]), float(row["compute"]))
    return [[ranks[r] for r in sorted(ranks)] for ranks in steps.values()]


def curve_records(steps):
    """(worker, speed, hog, batch, compute) of every rank's record in `steps` (from measured_steps)."""
    return [(w, speed, hog, batch, compute) for step in steps
            for w, ((speed, hog), batch, compute) in enumerate(step)]


def _median(runs, key):
    values = [r[key] for r in runs if r.get(key) is not None]
    return (float(np.median(values)), float(min(values)), float(max(values))) if values else (None, None, None)


def _fmt(value, spec, scale=1.0):
    return "-" if value is None else format(value * scale, spec)


def ideal_rows(scenario, curves, results, steps_per_epoch, epochs, measured=()):
    """Reachable ideal (on the mean curves, and under the noise of the `measured` steps where there are
    enough) and hindsight-best static split from the measured curves, as epoch times; with the split, the
    allreduce added, and the efficiency the measured-noise ideal shows (None without enough measured steps)."""
    book = CurveBook(scenario, curves, measured)
    allreduce = [np.median([np.min(r["breakdown"]["allreduce"]) for r in runs if r.get("breakdown")])
                 for label, runs in results.items() if label != BASE and any(r.get("breakdown") for r in runs)]
    comm = 1e-3 * float(np.min(allreduce)) if allreduce else 0.0
    steps = range(steps_per_epoch, steps_per_epoch * epochs)  # the measured epochs
    reach = float(np.mean([book.reachable_step(s, scenario.global_batch) for s in steps]))
    rows = {"reachable ideal": steps_per_epoch * (reach + comm)}
    ideal_eta = None
    try:
        noisy = float(np.mean([book.noisy_reachable_step(s, scenario.global_batch) for s in steps]))
        rows["reachable ideal, measured noise"] = steps_per_epoch * (noisy + comm)
        balanced, slowest = np.sum([book.noisy_ideal_efficiency(s, scenario.global_batch) for s in steps], axis=0)
        ideal_eta = float(balanced / slowest)
    except ValueError as exc:
        print(f"no reachable ideal under the measured noise: {exc}", file=sys.stderr)
    split, static = book.best_static_split(list(steps), scenario.global_batch)
    equal = float(np.mean([book.equal_step(s, scenario.global_batch) for s in steps]))
    rows.update({"best static split": steps_per_epoch * (static + comm),
                 "equal (model)": steps_per_epoch * (equal + comm)})
    return rows, split, comm, ideal_eta


def table(results, scenario, ideals=None):
    """Markdown: medians over rounds [min-max], plain Horovod first and the base of every ratio."""
    base = results.get(BASE)
    base_time = _median(base, "epoch_time")[0] if base else None
    lines = [
        "| variant | epoch time s, median [min-max] | speedup vs Horovod | vs Horovod | eta | idle % "
        "| compute share | mean batch per worker | final acc | callback ms | peak RSS MiB (max rank) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    base_range = _median(base, "epoch_time")[1:] if base else None
    for label, runs in results.items():
        med, lo, hi = _median(runs, "epoch_time")
        speedup = f"{base_time / med:.2f}x" if base_time else "-"
        verdict = "-"
        if base_range and label != BASE:
            verdict = "faster" if hi < base_range[0] else "slower" if lo > base_range[1] else "tie"
        batches = [r["mean_batch"] for r in runs if r.get("mean_batch")]
        batch_text = " / ".join(f"{b:.0f}" for b in np.median(batches, axis=0)) if batches else "-"
        lines.append(
            f"| {label} | {med:.2f} [{lo:.2f}-{hi:.2f}] | {speedup} | {verdict} | "
            f"{_fmt(_median(runs, 'efficiency')[0], '.3f')} | {_fmt(_median(runs, 'idle_fraction')[0], '.1f', 100)} | "
            f"{_fmt(_median(runs, 'compute_share')[0], '.2f')} | {batch_text} | "
            f"{_fmt(_median(runs, 'final_accuracy')[0], '.3f')} | {_fmt(_median(runs, 'overhead_ms')[0], '.2f')} | "
            f"{_fmt(_median([dict(p=max(r['peak_rss_mb'])) for r in runs if r.get('peak_rss_mb')], 'p')[0], '.0f')} |"
        )
    for name, value in (ideals or {}).items():
        lines.append(f"| *{name}* | {value:.2f} | {base_time / value:.2f}x | | | | | | | | |" if base_time else
                     f"| *{name}* | {value:.2f} | - | | | | | | | | |")
    rounds = max(len(runs) for runs in results.values())
    notes = [f"Scenario `{scenario.name}`: {scenario.description.strip()}",
             f"Heterogeneity: {next(iter(results.values()))[0]['heterogeneity']}. {rounds} interleaved rounds; "
             "epoch time excludes the first (warm-up) epoch."]
    return "\n".join(notes + [""] + lines)


def breakdown_table(results):
    """Markdown: per variant and rank, median ms per step of compute / allreduce / waiting / plugin (wall) /
    plugin CPU / throttled, and the share of forecasts the predictor made (the rest were the last measured
    speed; "-" without one)."""
    lines = ["| variant | rank | compute | allreduce | waiting | plugin | plugin CPU | throttled | model % |",
             "|---|---|---|---|---|---|---|---|---|"]
    for label, runs in results.items():
        parts = [r["breakdown"] for r in runs if r.get("breakdown")]
        if not parts:
            continue
        shares = [r["model_share"] for r in runs if r.get("model_share")]
        for rank in range(len(parts[0]["compute"])):
            cells = [f"{np.median([p.get(name, [np.nan] * (rank + 1))[rank] for p in parts]):.1f}"
                     for name in ("compute", "allreduce", "waiting", "plugin", "plugin_cpu", "throttled")]
            cells.append(f"{100 * np.median([s[rank] for s in shares]):.0f}" if shares else "-")
            lines.append(f"| {label} | {rank} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def recovery_table(results, threshold=0.9):
    """Markdown: per variant and kind of change (benchmarks.analysis), the median step efficiency at each step
    after a change of contention (over every such change of every round), and the first step from which it
    stays >= threshold; "" without changes. Results saved before changes had kinds count as "any"."""
    changes = {}
    for label, runs in results.items():
        for r in runs:
            seqs = r.get("recovery") or []
            kinds = r.get("recovery_kinds") or []
            kinds = kinds if len(kinds) == len(seqs) else ["any"] * len(seqs)
            for kind, seq in zip(kinds, seqs):
                changes.setdefault((label, kind), []).append(seq)
    if not changes:
        return ""
    steps = len(next(iter(changes.values()))[0])
    lines = ["| variant | change | changes | " + " | ".join(f"+{k}" for k in range(steps)) +
             f" | >= {threshold} from |", "|" + "---|" * (steps + 4)]
    order = {kind: i for i, kind in enumerate(("slower", "faster", "mixed", "any"))}
    labels = {label: i for i, label in enumerate(results)}
    for (label, kind), rows in sorted(changes.items(), key=lambda item: (labels[item[0][0]], order[item[0][1]])):
        median = np.median(np.array(rows), axis=0)
        back = next((k for k in range(steps) if np.all(median[k:] >= threshold)), None)
        lines.append(f"| {label} | {kind} | {len(rows)} | " + " | ".join(f"{v:.2f}" for v in median) +
                     f" | {'-' if back is None else f'+{back}'} |")
    return "\n".join(lines)


def run_all(scenario, labels, args, out_dir):
    """Every variant in `labels`, args.repeats interleaved rounds, into a fresh `out_dir`: {label: summaries}."""
    shutil.rmtree(out_dir, ignore_errors=True)
    os.makedirs(out_dir)
    epochs = args.epochs or scenario.epochs
    ordered = [BASE] * (BASE in labels) + [v for v in labels if v not in (BASE, "oracle")]
    progress = Progress(total=args.repeats * len(labels), parts=epochs)
    results = {label: [] for label in ordered + ["oracle"] * ("oracle" in labels)}
    curves_path = os.path.join(out_dir, "curves.json")
    for r in range(args.repeats):
        shift = r % len(ordered) if ordered else 0
        round_labels = ordered[shift:] + ordered[:shift] + ["oracle"] * ("oracle" in labels)
        for label in round_labels:
            curves = None
            if label == "oracle":
                save_curves(curves_path, fit_curves(curve_records(measured_steps(out_dir))))
                curves = curves_path
            summary = run_variant(scenario, label, r, args, os.path.join(out_dir, label, f"r{r}"), progress, curves)
            results[label].append(summary)
            progress.finished(f"{label} round {r + 1}", f"{summary['epoch_time']:.2f} s/epoch")
    return results


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scenario", default="static-4", help=f"one of {list_scenarios()} or a YAML path")
    parser.add_argument("--variants", default=",".join(LIVE_DEFAULT),
                        help="comma-separated, from: " + ", ".join(VARIANTS))
    parser.add_argument("--repeats", type=int, default=3, help="interleaved rounds (>= 1; 3 or more for medians)")
    parser.add_argument("--epochs", type=int, help="override the scenario's epochs (>= 2)")
    parser.add_argument("--emulate", action="store_true", help="emulated speeds even where cgroups work")
    parser.add_argument("--hosts", help="horovodrun -H list (default: localhost:<workers>)")
    parser.add_argument("--external", action="store_true",
                        help="speeds come from container or cluster limits: workers inject nothing")
    parser.add_argument("--base-tree", help="another checkout (e.g. the previous release, `git worktree add`) that "
                                            "runs the variants labelled <variant>@base, interleaved with this one's")
    parser.add_argument("--out", default="results")
    parser.add_argument("--no-plots", action="store_true")
    parser.add_argument("--table-only", action="store_true",
                        help="run nothing: print the tables of the comparison already in --out anew")
    args = parser.parse_args(argv)
    try:
        scenario = Scenario.load(args.scenario)
    except ValueError as exc:
        parser.error(str(exc))
    labels = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = [v for v in labels if split_label(v)[0] not in VARIANTS]
    if unknown or not labels:
        parser.error(f"--variants={args.variants!r} is not allowed: unknown {unknown}; use {list(VARIANTS)}, each "
                     "optionally with @base")
    if any(split_label(v)[1] for v in labels) and not (args.base_tree and os.path.isdir(args.base_tree)):
        parser.error(f"--base-tree={args.base_tree!r} is not allowed: variants labelled @base need the folder of "
                     "another checkout")
    if args.epochs is not None and args.epochs < 2:
        parser.error(f"--epochs={args.epochs} is not allowed: it must be >= 2 (the first is warm-up)")
    if args.repeats < 1:
        parser.error(f"--repeats={args.repeats} is not allowed: it must be >= 1")
    if "oracle" in labels and args.external:
        parser.error("--variants with oracle is not allowed with --external: the oracle needs the scenario's states")
    out_dir = os.path.join(args.out, scenario.name)
    if args.table_only:
        try:
            with open(os.path.join(out_dir, "results.json")) as fh:
                results = json.load(fh)["results"]
        except (OSError, ValueError, KeyError) as exc:
            parser.error(f"--table-only needs {os.path.join(out_dir, 'results.json')} of an earlier comparison: {exc}")
        labels = list(results)
    else:
        results = run_all(scenario, labels, args, out_dir)
    ideals = ideal_eta = None
    flat = {}
    if not args.external and len(labels) > 1:
        try:
            measured = measured_steps(out_dir)
            records = curve_records(measured)
            curves, flat = fit_curves(records), one_size(records)
            first = results[labels[0]][0]
            ideals, split, comm, ideal_eta = ideal_rows(scenario, curves, results, first["steps_per_epoch"],
                                                        len(first["epoch_times"]), measured)
            save_curves(os.path.join(out_dir, "curves.json"), curves)
        except ValueError as exc:
            print(f"no reachable ideal: {exc}", file=sys.stderr)
    text = table(results, scenario, ideals) + "\n\nPer-step breakdown (ms, median over rounds):\n\n" + \
        breakdown_table(results)
    recovered = recovery_table(results)
    if recovered:
        text += ("\n\nStep efficiency after each change of contention (median over changes; +0 is the step of the "
                 "change, and with plan_ahead=1 the first split that knows of it runs at +2; slower: a quota cut "
                 "or a hog started, faster: a quota restored or a hog gone, mixed: both at once):\n\n" + recovered)
    if ideals:
        text += (f"\n\nReachable ideal: the best split under each worker's step-time curve measured in this run "
                 f"(curves.json), plus the smallest measured allreduce ({1e3 * comm:.1f} ms); under the measured "
                 f"noise: the split for the expected slowest finish under each step's measured deviations from "
                 f"the curves; best static split {split.tolist()}.")
        if flat:
            text += (" Measured at one batch size only, so drawn through the origin (no fixed cost) and optimistic "
                     "below it: " + ", ".join(f"worker {w} at {b} samples (speed {state.split('|')[0]}"
                                             f"{', hog' if state.endswith('|1') else ''})"
                                             for (w, state), b in sorted(flat.items())) +
                     "; add the `equal` variant to measure them at another.")
    if ideal_eta is not None:
        text += (f" Eta of the measured-noise ideal's split under the measured deviations: {ideal_eta:.3f} "
                 f"(the draw unbalances even the fastest split's steps).")
    print(text)
    with open(os.path.join(out_dir, "table.md"), "w") as fh:
        fh.write(text + "\n")
    with open(os.path.join(out_dir, "results.json"), "w") as fh:
        json.dump({"results": results, "ideals": ideals, "ideal_efficiency": ideal_eta}, fh, indent=1)
    if not args.no_plots:
        from .plots import plot_all
        for path in plot_all(out_dir, results):
            print(f"plot: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
