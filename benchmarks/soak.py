"""Soak test: a long lbbsp run with contention changing, printing each worker's memory and plugin cost over time.

    horovodrun -np 2 -H localhost:2 --gloo python -m benchmarks.soak --steps 10000

A small MLP trains for --steps steps (one long epoch per 1,000 steps) under
the lbbsp policy with the NARX forecaster and a streamed step CSV; the last
rank's CPU quota (or a co-located hog where cgroups are not writable) switches
every --switch steps. Every 1,000 steps each rank reports its resident memory
(RSS) and the median plugin cost of those steps; rank 0 prints the table and
the growth of RSS between step 1,000 and the end.
"""
import argparse
import os
import sys
import tempfile

import numpy as np


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=10000)
    parser.add_argument("--switch", type=int, default=500, help="steps between contention changes")
    parser.add_argument("--out", help="directory for the per-rank step CSVs (default: a temporary one)")
    args = parser.parse_args(argv)
    if args.steps < 2000 or args.switch < 1:
        parser.error(f"--steps={args.steps} (>= 2000) and --switch={args.switch} (>= 1)")

    import psutil

    from .contention import CpuHog, CpuQuota, cgroups_writable
    from .runtime import init_worker

    hvd, tf = init_worker()
    import horovod.tensorflow as hvd_core

    import lbbsp.keras as lb

    rank, size = hvd.rank(), hvd.size()
    out = args.out or tempfile.mkdtemp(prefix="lbbsp-soak-")
    os.makedirs(out, exist_ok=True)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64 * size * 1000, 32)).astype(np.float32)
    y = rng.integers(0, 10, size=len(x))
    model = tf.keras.Sequential([tf.keras.layers.Dense(64, activation="relu", input_shape=(32,)),
                                 tf.keras.layers.Dense(10)])
    model.compile(optimizer=lb.DistributedOptimizer(tf.keras.optimizers.SGD(0.01)),
                  loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    feed = lb.BalancedFeed(x, y, global_batch=64 * size)
    balancer = lb.LoadBalancer(feed, predictor="narx", csv_path=os.path.join(out, "steps_{rank}.csv"))
    slowed = rank == size - 1
    quota = CpuQuota(1.0, pids=[os.getpid()]) if slowed and cgroups_writable() else None
    cores = sorted(os.sched_getaffinity(0))
    hog = CpuHog([cores[rank % len(cores)]]) if slowed and quota is None else None
    process = psutil.Process()
    report = []

    class Soak(tf.keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            self.step = 0

        def on_train_batch_end(self, batch, logs=None):
            self.step += 1
            if slowed and self.step % args.switch == 0:
                on = (self.step // args.switch) % 2 == 1
                if quota is not None:
                    quota.set(0.4 if on else 1.0)
                elif hog is not None:
                    (hog.start if on else hog.stop)()
            if self.step % 1000 == 0:
                cost = [r["overhead"] for r in balancer.history[-500:]]
                report.append((self.step, process.memory_info().rss / 2**20, 1e3 * float(np.median(cost))))

    epochs = max(args.steps // feed.steps_per_epoch, 1)
    try:
        model.fit(feed.dataset(), steps_per_epoch=feed.steps_per_epoch, epochs=epochs, verbose=0,
                  callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0), balancer, Soak()])
    finally:
        if quota is not None:
            quota.close()
        if hog is not None:
            hog.close()
    everyone = hvd_core.allgather_object(report)
    if rank == 0:
        print(f"{size} workers, {epochs * feed.steps_per_epoch} steps, rank {size - 1}'s CPU switched every "
              f"{args.switch} steps ({'cgroup quota 1.0 <-> 0.4' if quota is not None or not slowed else 'hog'}); "
              f"step CSVs in {out}")
        print(f"{'step':>6} " + " ".join(f"{'rss MiB r' + str(r):>12} {'plugin ms r' + str(r):>13}"
                                        for r in range(size)))
        for i, row in enumerate(everyone[0]):
            print(f"{row[0]:>6} " + " ".join(f"{everyone[r][i][1]:>12.1f} {everyone[r][i][2]:>13.3f}"
                                            for r in range(size)))
        for r in range(size):
            first, last = everyone[r][0][1], everyone[r][-1][1]
            print(f"rank {r}: RSS {first:.1f} MiB at step {everyone[r][0][0]}, {last:.1f} MiB at step "
                  f"{everyone[r][-1][0]} ({100 * (last / first - 1):+.2f}%)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
