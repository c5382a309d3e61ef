"""Per-step cost of lbbsp on homogeneous workers, against plain Horovod, in one job (ratios, not timings).

    horovodrun -np 2 -H localhost:2 --gloo python -m benchmarks.overhead [--rounds 3] [--quota 0.25]
        [--unpinned] [--decision-ms 5]

The same model without any collective (`local`: a plain optimizer, each rank
training alone on its shard, so the rest of a step is the allreduce), plain
Horovod (hvd.DistributedOptimizer, its shard through tf.data's batch and
prefetch, equal batches), lbbsp's DistributedOptimizer alone on the same
pipeline (`optimizer`: the weighted gradients and the graph callbacks that
time the step and carry the stats, no callback, no feed) and lbbsp with
policies equal, lbbsp+EMA, lbbsp+NARX (decisions planned one step ahead, off
the critical path), lbbsp+NARX with plan_ahead=0 (decision on the critical
path), lbbsp+NARX without its forecast cost budget (the predictor runs at
every step), lbbsp+NARX without its decision budget (a decision at every
step) and lbbsp+NARX whose decisions start as soon as they are queued
(`atonce`: beside the next step's dispatch and compute, as before they were
held until its gradients exist) train the same model on identical workers,
interleaved over several rounds in the same processes, so machine noise hits
all alike, each timed over the same steps. With --quota every rank runs under
that cgroup CPU quota (cores), where each millisecond of plugin CPU costs
about 1/quota milliseconds of wall time; with --unpinned the ranks' threads
share every core, as they do in a job that pins nothing; --decision-ms adds
that much CPU to each of lbbsp's decisions (what a large job's decision
costs, where the decision budget holds splits for several steps). Reported per
variant: the median steady-state step time (warm-up steps dropped), the range
of the per-round medians, the extra milliseconds per step over plain Horovod
and their share of its step time, the mean step time against plain Horovod's
(what an epoch takes), the process's CPU time per step (every thread:
TensorFlow's, Horovod's, the plugin's), the plugin's median time on the
critical path, and the median time of its background work (the decision; the
forecast is on the critical path).
"""
import argparse
import contextlib
import resource
import sys
import time
from unittest import mock

import numpy as np

VARIANTS = ("local", "horovod", "optimizer", "equal", "lbbsp-ema", "lbbsp-narx", "lbbsp-narx-inline",
            "lbbsp-narx-always", "lbbsp-narx-every", "lbbsp-narx-atonce")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=80, help="steps per variant and round")
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--batch", type=int, default=256, help="per-worker batch")
    parser.add_argument("--quota", type=float, help="cgroup CPU quota of every rank, in cores (needs root)")
    parser.add_argument("--decision-ms", type=float, default=0.0,
                        help="CPU milliseconds of busy work added to each decision of lbbsp's policy (what a "
                             "decision of a large job costs: the decision budget's case)")
    parser.add_argument("--unpinned", action="store_true",
                        help="let every rank's threads run on any core (by default rank r is pinned to core r)")
    parser.add_argument("--variants", default=",".join(VARIANTS),
                        help=f"comma-separated, from {', '.join(VARIANTS)} (horovod always runs: the baseline)")
    args = parser.parse_args(argv)
    variants = ["horovod"] + [v for v in args.variants.split(",") if v and v != "horovod"]
    unknown = sorted(set(variants) - set(VARIANTS))
    if unknown:
        parser.error(f"--variants={args.variants!r}: {unknown} are not variants; choose from {', '.join(VARIANTS)}")
    if args.rounds < 1 or args.steps < 30 or (args.quota is not None and args.quota <= 0) or not \
            0 <= args.decision_ms < 1e4:
        parser.error(f"--rounds={args.rounds} (>= 1), --steps={args.steps} (>= 30), --quota={args.quota} (> 0), "
                     f"--decision-ms={args.decision_ms} (in [0, 10000))")

    import os

    import lbbsp.keras as lb
    from lbbsp.balancer import Background
    from lbbsp.policies import LBBSPPolicy

    from .contention import CpuQuota
    from .runtime import init_worker
    from .workloads import build_model, load_data

    hvd, tf = init_worker(pin=not args.unpinned)
    rank, size = hvd.rank(), hvd.size()
    quota = CpuQuota(args.quota, pids=[os.getpid()]) if args.quota else None
    global_batch = args.batch * size
    # One global batch per step: lbbsp's feed ends its epoch where the data ends, tf.data's pipeline repeats.
    x, y, _, _ = load_data("mlp", num_samples=global_batch * args.steps)
    loss = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    warmup = 10

    class StepClock(tf.keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            self.times, self.last = [], None

        def on_train_batch_end(self, batch, logs=None):
            now = time.perf_counter()
            if self.last is not None:
                self.times.append(now - self.last)
            self.last = now
            if batch == warmup:
                self.cpu = _cpu_seconds()

        def on_train_end(self, logs=None):
            self.cpu_per_step = (_cpu_seconds() - self.cpu) / max(len(self.times) - warmup, 1)

    def run(variant):
        model = build_model("mlp", hidden=args.hidden, seed=0)
        clock = StepClock()
        callbacks = [hvd.callbacks.BroadcastGlobalVariablesCallback(0)]
        if variant in ("local", "horovod", "optimizer"):
            optimizer = tf.keras.optimizers.SGD(0.01)
            wrap = {"local": lambda o: o, "horovod": hvd.DistributedOptimizer, "optimizer": lb.DistributedOptimizer}
            model.compile(optimizer=wrap[variant](optimizer), loss=loss)
            # What a plain Horovod job reads: its shard, batched and prefetched by tf.data.
            data = tf.data.Dataset.from_tensor_slices((x[rank::size], y[rank::size])).repeat()
            model.fit(data.batch(args.batch, drop_remainder=True).prefetch(1), steps_per_epoch=args.steps,
                      epochs=1, verbose=0, callbacks=callbacks + [clock])
            return clock.times[warmup:], (float("nan"), float("nan")), clock.cpu_per_step
        policy, _, rest = variant.partition("-")
        predictor, _, mode = rest.partition("-")
        model.compile(optimizer=lb.DistributedOptimizer(tf.keras.optimizers.SGD(0.01)), loss=loss)
        feed = lb.BalancedFeed(x, y, global_batch=global_batch, prefetch=0 if mode == "inline" else 1)
        balancer = lb.LoadBalancer(feed, policy="equal" if policy == "equal" else "lbbsp",
                                   predictor=predictor or "ema", plan_ahead=0 if mode == "inline" else 1,
                                   **({"forecast_budget": None} if mode == "always" else
                                      {"decision_budget": None} if mode == "every" else {}))
        # atonce: a queued decision waits for nothing (Background.WAIT, for this variant's fit only)
        with mock.patch.object(Background, "WAIT", 0.0) if mode == "atonce" else contextlib.nullcontext(), \
                mock.patch.object(LBBSPPolicy, "after_step", _costly(LBBSPPolicy.after_step, args.decision_ms)) \
                if args.decision_ms else contextlib.nullcontext():
            model.fit(feed.dataset(), steps_per_epoch=feed.steps_per_epoch, epochs=1, verbose=0,
                      callbacks=callbacks + [balancer, clock])
        rows = balancer.history[warmup:]
        return clock.times[warmup:], (float(np.median([r["overhead"] for r in rows])),
                                      float(np.median([r["background"] for r in rows]))), clock.cpu_per_step

    times = {v: [] for v in variants}
    rounds = {v: [] for v in variants}
    costs = {v: [] for v in variants}
    cpu = {v: [] for v in variants}
    try:
        for _ in range(args.rounds):
            for variant in variants:
                t, c, seconds = run(variant)
                if len(t) != args.steps - warmup - 1:  # every variant is timed over the same steps
                    raise RuntimeError(f"{variant} timed {len(t)} steady steps, not {args.steps - warmup - 1}")
                cpu[variant].append(seconds)
                times[variant].extend(t)
                rounds[variant].append(1e3 * float(np.median(t)))
                costs[variant].append(c)
    finally:
        if quota is not None:
            quota.close()
    if rank == 0:
        base, base_mean = float(np.median(times["horovod"])), float(np.mean(times["horovod"]))
        where = f"each rank under a {args.quota}-core quota" if args.quota else \
            "every rank free to use any core" if args.unpinned else "each rank on its own core"
        where += f", {args.decision_ms:g} ms of CPU added to each decision" if args.decision_ms else ""
        print(f"{size} workers ({where}), per-worker batch {args.batch}, mlp hidden {args.hidden}, {args.rounds} "
              f"rounds x {len(times['horovod']) // args.rounds} steady steps per variant, interleaved")
        print(f"{'variant':<19}{'step ms':>9}{'rounds [min-max]':>18}{'extra ms':>10}{'extra %':>9}{'mean %':>8}"
              f"{'CPU ms':>8}{'critical-path ms':>18}{'background ms':>15}")
        for variant in variants:
            step = float(np.median(times[variant]))
            spread = f"[{min(rounds[variant]):.2f}-{max(rounds[variant]):.2f}]"
            head = f"{variant:<19}{1e3 * step:>9.2f}{spread:>18}{1e3 * (step - base):>+10.2f}" \
                   f"{100 * (step / base - 1):>+8.1f}% {100 * (np.mean(times[variant]) / base_mean - 1):>+6.1f}% " \
                   f"{1e3 * float(np.median(cpu[variant])):>7.2f}"
            if variant in ("local", "horovod", "optimizer"):
                print(f"{head}{'-':>18}{'-':>15}")
                continue
            path, background = np.nanmedian(np.array(costs[variant]), axis=0)
            print(f"{head}{1e3 * path:>18.3f}{1e3 * background:>15.3f}")
        if "lbbsp-narx" in rounds and "lbbsp-narx-atonce" in rounds:
            paired = np.array(rounds["lbbsp-narx"]) / np.array(rounds["lbbsp-narx-atonce"])
            print(f"Paired per round, the median step of lbbsp-narx / lbbsp-narx-atonce: {np.median(paired):.3f} "
                  f"(lower in {int((paired < 1).sum())} of {len(paired)} rounds)")
    return 0


def _costly(after_step, ms):
    """`after_step` that also keeps its thread's CPU busy for `ms` milliseconds (the controller counts that CPU)."""
    def costly(self, *args):
        end = time.thread_time() + ms / 1e3
        while time.thread_time() < end:
            pass
        return after_step(self, *args)
    return costly


def _cpu_seconds():
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


if __name__ == "__main__":
    sys.exit(main())
