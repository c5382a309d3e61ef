"""Elastic benchmark: a slower worker joins a running job, later dies by SIGKILL; lbbsp against plain Horovod.

    python -m benchmarks.elastic --repeats 3            # about 6 minutes on 2 cores

Horovod Elastic on this machine ("localhost" and "127.0.0.1" are two hosts
to it, as in Horovod's own elastic tests). Two workers on localhost start
with CPU quotas of 0.6 core each (the conv workload); after 12 steps the
discovery script adds 127.0.0.1 with one slot, a worker at 0.3 core (half
speed), and the first two wait at that step until the driver has seen it
(else a slow driver poll leaves the new membership a varying number of
steps, or none); after 16 steps there it kills itself with SIGKILL,
mid-epoch. Every
policy runs the same events (interleaved repeats, plain Horovod's equal
split first); each run reports its wall time and, per membership change,
the time from the event (hosts file rewritten, or the kill) to the first
finished step on the new membership and rank 0's median efficiency (T* / T)
before the change and in steps 0-2, 3-7 and 3-end after it. Writes under
--out: per run the step CSVs, events.jsonl, a plot of batch sizes and step
times over time (timeline.png), and table.md.
"""
import argparse
import csv
import glob
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import numpy as np

POLICIES = {"horovod": "equal", "lbbsp": "lbbsp", "pid": "pid"}
QUOTA = {"localhost": 0.6, "127.0.0.1": 0.3}
JOIN_AFTER, DIE_AFTER = 12, 16
JOIN_WAIT = 120.0  # seconds the first workers wait at the join for the driver to add the new host


def worker(run_dir, policy, epochs):
    """One rank of the elastic job (started by horovodrun)."""
    from .contention import CpuQuota
    from .runtime import init_worker
    from .workloads import build_model, load_data

    hvd, tf = init_worker(pin=False)
    import lbbsp.keras as lb

    host = os.environ.get("HOROVOD_HOSTNAME", "localhost")
    quota = CpuQuota(QUOTA.get(host, 0.6), pids=[os.getpid()])
    count = {"steps": 0}

    def note(event):
        with open(os.path.join(run_dir, "events.jsonl"), "a") as fh:
            fh.write(json.dumps({"event": event, "time": time.time()}) + "\n")

    class Events(tf.keras.callbacks.Callback):
        def on_train_batch_begin(self, step, logs=None):
            if host == "127.0.0.1" and count["steps"] >= DIE_AFTER:
                note("kill")
                os.kill(os.getpid(), signal.SIGKILL)

        def on_train_batch_end(self, step, logs=None):
            count["steps"] += 1
            if host == "127.0.0.1" or count["steps"] != JOIN_AFTER:
                return
            hosts = os.path.join(run_dir, "hosts")
            if hvd.rank() == 0:
                with open(hosts + ".tmp", "w") as fh:
                    fh.write("localhost:2\n127.0.0.1:1\n")
                os.replace(hosts + ".tmp", hosts)
                note("join")
            # Hold the first two workers until the driver has seen the new host, so that the steps left for
            # the new membership do not depend on how fast the driver polls on a busy machine. Each
            # check is a broadcast from rank 0, so every rank leaves the loop at the same check.
            for _ in range(int(JOIN_WAIT / 0.1)):
                time.sleep(0.1)
                state.check_host_updates()

    x, y, _, _ = load_data("conv", num_samples=2048)
    model = build_model("conv")
    model.compile(optimizer=lb.DistributedOptimizer(tf.keras.optimizers.SGD(0.02, momentum=0.9)),
                  loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.build((None, 24, 24, 3))
    feed = lb.BalancedFeed(x, y, global_batch=128, seed=1)
    balancer = lb.LoadBalancer(feed, policy=policy, predictor="narx",
                               csv_path=os.path.join(run_dir, f"steps_{host}_{os.getpid()}.csv"))
    state = lb.elastic.ElasticState(model, balancer, batches_per_commit=4)

    @hvd.elastic.run
    def train(state):
        lb.elastic.fit(state, epochs=epochs, callbacks=[Events()], verbose=0)

    try:
        train(state)
    finally:
        quota.close()


def run(label, run_dir, epochs):
    """One elastic horovodrun; returns its wall time in seconds."""
    shutil.rmtree(run_dir, ignore_errors=True)
    os.makedirs(run_dir)
    with open(os.path.join(run_dir, "hosts"), "w") as fh:
        fh.write("localhost:2\n")
    discover = os.path.join(run_dir, "discover.sh")
    with open(discover, "w") as fh:
        fh.write(f"#!/bin/sh\ncat {os.path.join(run_dir, 'hosts')}\n")
    os.chmod(discover, 0o755)
    launcher = shutil.which("horovodrun", path=os.path.dirname(sys.executable)) or "horovodrun"
    cmd = [launcher, "-np", "2", "--min-np", "2", "--max-np", "3", "--elastic-timeout", "120",
           "--host-discovery-script", discover, "--gloo", "--network-interfaces", "lo",
           sys.executable, "-m", "benchmarks.elastic", "--worker", run_dir, "--policy", POLICIES[label],
           "--epochs", str(epochs)]
    env = dict(os.environ, OMP_NUM_THREADS="1", TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [os.getcwd(), env.get("PYTHONPATH")]))
    started = time.time()
    with open(os.path.join(run_dir, "log.txt"), "w") as log:
        proc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, timeout=1200)
    if proc.returncode != 0:
        raise RuntimeError(f"{label} failed (exit {proc.returncode}); see {run_dir}/log.txt")
    return time.time() - started


def _efficiency(rows):
    return [float(r["efficiency"]) for r in rows if r["efficiency"] not in ("", "nan")]


def _median(values):
    return float(np.median(values)) if values else None


def analyse(run_dir):
    """Rank 0's steps, the events, and per change: seconds from the event to the first step on the new
    membership, and rank 0's median efficiency (T* / T) before it and in steps 0-2, 3-7 and 3-end after
    it (steps 0-1 are warm-up, whose timings lbbsp ignores; the split they set acts from step 3)."""
    rows = []
    for path in glob.glob(os.path.join(run_dir, "steps_*.csv")):
        host = os.path.basename(path).split("_")[1]
        with open(path) as fh:
            rows += [dict(r, host=host) for r in csv.DictReader(fh)]
    rows.sort(key=lambda r: float(r["time"]))
    events = [json.loads(line) for line in open(os.path.join(run_dir, "events.jsonl"))]
    first = [r for r in rows if r["rank"] == "0"]
    changes = []
    for event in events:
        before = [r for r in first if float(r["time"]) <= event["time"]]
        if not before:
            continue
        size = before[-1]["workers"]
        before = [r for r in before if r["workers"] == size]
        new = [r for r in first if float(r["time"]) > event["time"] and r["workers"] != size]
        if not new:
            continue
        start = first.index(new[0])
        end = next((i for i in range(start, len(first)) if first[i]["workers"] != new[0]["workers"]), len(first))
        stay = first[start:end]  # the steps of the new membership, up to the next change
        changes.append({
            "event": event["event"], "workers": f"{size} -> {new[0]['workers']}",
            "seconds_to_first_step": float(new[0]["time"]) - event["time"],
            "efficiency_before": _median(_efficiency(before)[3:]),
            "efficiency_0_2": _median(_efficiency(stay[:3])), "efficiency_3_7": _median(_efficiency(stay[3:8])),
            "efficiency_after": _median(_efficiency(stay[3:])),
        })
    return rows, events, changes


def plot(run_dir, rows, events, title):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t0 = float(rows[0]["time"])
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 6), sharex=True)
    for host in sorted({r["host"] for r in rows}):
        for rank in sorted({r["rank"] for r in rows if r["host"] == host}):
            mine = [r for r in rows if r["host"] == host and r["rank"] == rank]
            t = [float(r["time"]) - t0 for r in mine]
            top.plot(t, [int(r["batch_size"]) for r in mine], ".", ms=3, label=f"{host} rank {rank}")
    zero = [r for r in rows if r["rank"] == "0"]
    bottom.plot([float(r["time"]) - t0 for r in zero], [1e3 * float(r["step_time"]) for r in zero], ".", ms=3)
    for ax in (top, bottom):
        for event in events:
            ax.axvline(event["time"] - t0, color="grey", ls="--", lw=0.8)
    top.set_ylabel("batch size")
    top.legend(fontsize=7, ncol=2)
    bottom.set_ylabel("rank 0 step time (ms)")
    bottom.set_xlabel("seconds (dashed: join, kill)")
    top.set_title(title)
    path = os.path.join(run_dir, "timeline.png")
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--policies", default="horovod,lbbsp", help=f"comma-separated, from {list(POLICIES)}")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--out", default="results/elastic")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--policy", help=argparse.SUPPRESS)
    parser.add_argument("--report", action="store_true", help="tabulate the runs already under --out, run nothing")
    args = parser.parse_args(argv)
    if args.worker:
        worker(args.worker, args.policy, args.epochs)
        return 0
    labels = [p.strip() for p in args.policies.split(",") if p.strip()]
    if not labels or any(p not in POLICIES for p in labels):
        parser.error(f"--policies={args.policies!r} is not allowed: use names from {list(POLICIES)}")
    if args.repeats < 1 or args.epochs < 2:
        parser.error(f"--repeats={args.repeats} and --epochs={args.epochs} are not allowed: need >= 1 and >= 2")
    from .contention import cgroups_writable
    if not args.report and not cgroups_writable():
        parser.error("this benchmark sets CPU quotas per worker: it needs root and a writable cgroup CPU controller")
    results = {label: [] for label in labels}
    for r in range(args.repeats):
        for label in labels[r % len(labels):] + labels[:r % len(labels)]:
            run_dir = os.path.join(args.out, label, f"r{r}")
            if args.report:
                wall = json.load(open(os.path.join(run_dir, "wall.json")))["wall"]
            else:
                wall = run(label, run_dir, args.epochs)
                with open(os.path.join(run_dir, "wall.json"), "w") as fh:
                    json.dump({"wall": wall}, fh)
            rows, events, changes = analyse(run_dir)
            plot(run_dir, rows, events, f"{label}, round {r + 1}: 2 workers, a half-speed one joins, then dies")
            results[label].append({"wall": wall, "changes": changes})
            print(f"{label} round {r + 1}: {wall:.1f} s; " +
                  "; ".join(f"{c['event']} {c['workers']}: first step after {c['seconds_to_first_step']:.1f} s, "
                            f"efficiency {c['efficiency_before']:.2f} before, {c['efficiency_3_7']:.2f} in steps 3-7"
                            for c in changes), flush=True)
    base = np.median([x["wall"] for x in results[labels[0]]])
    lines = ["| policy | wall s, median [min-max] | vs " + labels[0] + " | event | s to first step | efficiency "
             "before | steps 0-2 | steps 3-7 | steps 3-end |", "|---|---|---|---|---|---|---|---|---|"]
    for label, runs in results.items():
        walls = [x["wall"] for x in runs]
        wall = np.median(walls)
        head = f"| {label} | {wall:.1f} [{min(walls):.1f}-{max(walls):.1f}] | {base / wall:.2f}x"
        for event in ("join", "kill"):
            found = [c for x in runs for c in x["changes"] if c["event"] == event]
            if not found:
                continue
            cells = [f"{np.median([c[k] for c in found if c[k] is not None]):.2f}" for k in
                     ("seconds_to_first_step", "efficiency_before", "efficiency_0_2", "efficiency_3_7",
                      "efficiency_after")]
            lines.append(f"{head} | {event} {found[0]['workers']} | " + " | ".join(cells) + " |")
            head = "| | |"
    text = "\n".join(lines)
    print(text)
    with open(os.path.join(args.out, "table.md"), "w") as fh:
        fh.write(text + "\n")
    with open(os.path.join(args.out, "results.json"), "w") as fh:
        json.dump(results, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
