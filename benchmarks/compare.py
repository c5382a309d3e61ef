"""Run every policy on one scenario back to back and print a table of each one's ratio to plain BSP.

    python -m benchmarks.compare --scenario static-4
    python -m benchmarks.compare --scenario dynamic-2 --variants equal,lbbsp-ema,lbbsp-narx --epochs 4

Variants: horovod (plain Horovod, equal batches, no lbbsp), equal (BSP through
lbbsp), static, dbs, pid, lbbsp-ema, lbbsp-narx, oracle. Writes, under
--out/<scenario>/: one folder per variant (per-rank step CSVs, summary.json),
table.md, results.json and PNG plots.
"""
import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import time

from .scenario import Scenario, list_scenarios

VARIANTS = {
    "horovod": ("horovod", None),
    "equal": ("equal", None),
    "static": ("static", None),
    "dbs": ("dbs", None),
    "pid": ("pid", None),
    "lbbsp-ema": ("lbbsp", "ema"),
    "lbbsp-narx": ("lbbsp", "narx"),
    "oracle": ("oracle", None),
}
BASELINE = "equal"


class Progress:
    """A one-line progress bar over all epochs of all variants (plain lines when not on a terminal)."""

    def __init__(self, total, stream=sys.stderr):
        self.total, self.done, self.stream = total, 0, stream
        self.start = time.monotonic()
        self.tty = stream.isatty()
        self._last = None

    def show(self, label, extra=0):
        done = self.done + extra
        elapsed = time.monotonic() - self.start
        eta = elapsed / done * (self.total - done) if done else float("nan")
        width = 30
        fill = int(width * done / self.total)
        line = (f"[{'#' * fill}{'.' * (width - fill)}] {done}/{self.total} epochs  {label:<11} "
                f"elapsed {elapsed:5.0f}s  eta {eta:5.0f}s" if math.isfinite(eta) else
                f"[{'.' * width}] 0/{self.total} epochs  {label:<11} elapsed {elapsed:5.0f}s")
        if line == self._last:
            return
        self._last = line
        self.stream.write(("\r" + line) if self.tty else (line + "\n"))
        self.stream.flush()

    def finish(self):
        if self.tty:
            self.stream.write("\n")


def run_variant(scenario, label, args, out_dir, progress):
    policy, predictor = VARIANTS[label]
    run_dir = os.path.join(out_dir, label)
    shutil.rmtree(run_dir, ignore_errors=True)
    os.makedirs(run_dir)
    launcher = shutil.which("horovodrun", path=os.path.dirname(sys.executable)) or "horovodrun"
    hosts = args.hosts or f"localhost:{scenario.workers}"
    cmd = [launcher, "-np", str(scenario.workers), "-H", hosts, "--gloo",
           sys.executable, "-m", "benchmarks.worker", "--scenario", scenario.source, "--policy", policy,
           "--out-dir", run_dir, "--exchange", args.exchange]
    if predictor:
        cmd += ["--predictor", predictor]
    if args.epochs:
        cmd += ["--epochs", str(args.epochs)]
    if args.emulate:
        cmd.append("--emulate")
    if args.external:
        cmd.append("--external")
    env = dict(os.environ, OMP_NUM_THREADS="1", TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [os.getcwd(), env.get("PYTHONPATH")]))
    log_path = os.path.join(run_dir, "log.txt")
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
        progress_file = os.path.join(run_dir, "progress")
        while proc.poll() is None:
            done = len(open(progress_file).read().split()) if os.path.exists(progress_file) else 0
            progress.show(label, done)
            time.sleep(0.5)
    if proc.returncode != 0:
        tail = open(log_path).read()[-3000:]
        raise RuntimeError(f"variant {label} failed (exit {proc.returncode}); log {log_path}:\n{tail}")
    with open(os.path.join(run_dir, "summary.json")) as fh:
        return json.load(fh)


def _fmt(value, spec, scale=1.0):
    return "-" if value is None else format(value * scale, spec)


def table(results, scenario):
    """Markdown table of the variants, with ratios to the BSP baseline."""
    base = results.get(BASELINE) or next(iter(results.values()))
    lines = [
        "| variant | epoch time (s) | speedup vs BSP | throughput (samples/s) | eta | idle % | straggler "
        "| mean batch per worker | final acc | time to acc (s) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for label, r in results.items():
        speedup = base["epoch_time"] / r["epoch_time"]
        batches = "-" if not r.get("mean_batch") else " / ".join(f"{b:.0f}" for b in r["mean_batch"])
        lines.append(
            f"| {label} | {r['epoch_time']:.2f} | {speedup:.2f}x | {r['throughput']:.0f} | "
            f"{_fmt(r.get('efficiency'), '.3f')} | {_fmt(r.get('idle_fraction'), '.1f', 100)} | "
            f"{_fmt(r.get('straggler'), '.2f')} | {batches} | {_fmt(r.get('final_accuracy'), '.3f')} | "
            f"{_fmt(r.get('time_to_accuracy'), '.1f')} |"
        )
    notes = [f"Scenario `{scenario.name}`: {scenario.description.strip()}",
             f"Heterogeneity: {base['heterogeneity']}. Ideal speedup of perfect balance over BSP "
             f"(T_bsp / T*, from the injected speeds): {scenario.ideal_speedup():.2f}x."]
    footer = []
    plain = results.get("horovod")
    if plain:
        steps = max(1, round(plain["throughput"] * plain["epoch_time"] / scenario.global_batch))
        for label, r in results.items():
            if label != "horovod":
                extra = (r["epoch_time"] - plain["epoch_time"]) / steps
                footer.append(f"{label}: {1e3 * extra:+.2f} ms per step vs plain Horovod "
                              f"({100 * extra * steps / plain['epoch_time']:+.1f}% of its step time); "
                              f"callback median {_fmt(r.get('overhead_ms'), '.2f')} ms")
    return "\n".join(notes + [""] + lines + ([""] + footer if footer else []))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scenario", default="static-4", help=f"one of {list_scenarios()} or a YAML path")
    parser.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated, from: " + ", ".join(VARIANTS))
    parser.add_argument("--epochs", type=int, help="override the scenario's epochs (>= 2)")
    parser.add_argument("--exchange", default="fused", choices=("fused", "eager"))
    parser.add_argument("--emulate", action="store_true", help="emulated speeds even where cgroups work")
    parser.add_argument("--hosts", help="horovodrun -H list (default: localhost:<workers>)")
    parser.add_argument("--external", action="store_true",
                        help="speeds come from container or cluster limits: workers inject nothing")
    parser.add_argument("--out", default="results")
    parser.add_argument("--no-plots", action="store_true")
    args = parser.parse_args(argv)
    try:
        scenario = Scenario.load(args.scenario)
    except ValueError as exc:
        parser.error(str(exc))
    labels = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = [v for v in labels if v not in VARIANTS]
    if unknown or not labels:
        parser.error(f"--variants={args.variants!r} is not allowed: unknown {unknown}; use {list(VARIANTS)}")
    if args.epochs is not None and args.epochs < 2:
        parser.error(f"--epochs={args.epochs} is not allowed: it must be >= 2 (the first is warm-up)")
    out_dir = os.path.join(args.out, scenario.name)
    os.makedirs(out_dir, exist_ok=True)
    epochs = args.epochs or scenario.epochs
    progress = Progress(total=epochs * len(labels))
    results = {}
    for label in labels:
        results[label] = run_variant(scenario, label, args, out_dir, progress)
        progress.done += epochs
        progress.show(label)
    progress.finish()
    text = table(results, scenario)
    print(text)
    with open(os.path.join(out_dir, "table.md"), "w") as fh:
        fh.write(text + "\n")
    with open(os.path.join(out_dir, "results.json"), "w") as fh:
        json.dump(results, fh, indent=1)
    if not args.no_plots:
        from .plots import plot_all
        for path in plot_all(out_dir, results):
            print(f"plot: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
