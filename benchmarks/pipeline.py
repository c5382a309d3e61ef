"""CPU cost per step of lbbsp's planned input pipeline against the pipeline a plain Horovod user writes.

    python -m benchmarks.pipeline [--batch 64] [--rounds 5] [--cores 1]

No training and no Horovod job: one process, pinned to `--cores` cores with
one TensorFlow thread per pool (as each benchmark worker runs), pulls one
epoch of batches of the image-file workload as fast as it can. Plain Horovod's
pipeline is `map(load, AUTOTUNE).batch(b).prefetch(1)` over shuffled indices;
lbbsp's is `BalancedFeed.from_sample_fn(load, prefetch=k)`, whose batch sizes
come from a plan (here every step is planned at the start, as a balanced run
plans one step ahead). Each pipeline runs with prefetch 1 and 0, and with the
real per-sample load (read a PNG file, decode, crop, flip) and with a trivial
one, which leaves the cost of the pipeline's own machinery: for lbbsp, the
Python generator that reads the plan and the per-step nested dataset. Building
the pipeline and its first batch (tracing, thread start) are not counted. Rounds
are interleaved; the medians are milliseconds of wall time per step, which on
a single core is the pipeline's CPU time, all of it on a training step's
critical path when the worker has no spare core.
"""
import argparse
import os
import sys
import tempfile
import time

import numpy as np


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=64, help="samples per step")
    parser.add_argument("--samples", type=int, default=2048, help="images in the epoch")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--cores", type=int, default=1, help="cores the process may use")
    parser.add_argument("--dir", default=os.path.join(tempfile.gettempdir(), "lbbsp-pipeline-images"),
                        help="where the image files are written (kept for the next run)")
    args = parser.parse_args(argv)
    cores = sorted(os.sched_getaffinity(0))
    if args.batch < 1 or args.samples < 2 * args.batch or args.rounds < 1 or not 1 <= args.cores <= len(cores):
        parser.error(f"--batch={args.batch} (>= 1), --samples={args.samples} (>= 2 x batch), --rounds={args.rounds} "
                     f"(>= 1), --cores={args.cores} (1..{len(cores)})")
    os.sched_setaffinity(0, cores[:args.cores])
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    import lbbsp.keras as lb
    from lbbsp.controller import Plan

    from .workloads import image_files, image_loader, load_data

    x, y, _, _ = load_data("images", num_samples=args.samples)
    loaders = {"images": image_loader(image_files(x, args.dir), y), "trivial": lambda i: (i, i)}
    steps = args.samples // args.batch

    def horovod(load, prefetch):
        data = tf.data.Dataset.from_tensor_slices(np.arange(args.samples)).shuffle(args.samples, seed=0)
        data = data.map(load, num_parallel_calls=tf.data.AUTOTUNE).batch(args.batch, drop_remainder=True)
        batches = iter(data.prefetch(1) if prefetch else data)
        next(batches)
        started = time.perf_counter()
        for _ in range(steps - 1):
            next(batches)
        return time.perf_counter() - started

    def lbbsp(load, prefetch):
        feed = lb.BalancedFeed.from_sample_fn(load, args.samples, global_batch=args.batch, prefetch=prefetch,
                                              drop_remainder=True, rank=0, size=1)
        sizes = feed.epoch_schedule.of(0)
        for step in range(steps):
            feed.publish(Plan(0, step, np.array([sizes[step]]), np.zeros(1)))
        batches = iter(feed.dataset())
        feed.start_step(0, 0)
        next(batches)
        started = time.perf_counter()
        for step in range(1, steps):
            feed.start_step(0, step)
            next(batches)
        elapsed = time.perf_counter() - started
        feed.close()
        return elapsed

    runs = {"horovod": horovod, "lbbsp": lbbsp}
    cases = [(variant, load, prefetch) for load in loaders for prefetch in (1, 0) for variant in runs]
    times = {case: [] for case in cases}
    for case in cases:  # warm-up: tracing and the file cache
        runs[case[0]](loaders[case[1]], case[2])
    for _ in range(args.rounds):
        for case in cases:
            variant, load, prefetch = case
            times[case].append(1e3 * runs[variant](loaders[load], prefetch) / (steps - 1))
    print(f"{args.batch} samples per step, {steps - 1} steps per round after the first, {args.rounds} interleaved "
          f"rounds, {args.cores} core(s), one TensorFlow thread per pool; ms per step, median [min-max]")
    print(f"{'load':<9}{'prefetch':>9}{'horovod':>22}{'lbbsp':>22}{'lbbsp extra':>13}")
    for load in loaders:
        for prefetch in (1, 0):
            runs_of = {v: times[(v, load, prefetch)] for v in runs}
            med = {v: float(np.median(t)) for v, t in runs_of.items()}
            cells = "".join(f"{med[v]:.2f} [{min(t):.2f}-{max(t):.2f}]".rjust(22) for v, t in runs_of.items())
            print(f"{load:<9}{prefetch:>9}{cells}{med['lbbsp'] - med['horovod']:>+13.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
