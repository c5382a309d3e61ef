"""What a batch size never run before costs, and what lbbsp's batch grid saves.

    python -m benchmarks.shapes [--workload conv] [--batch 128] [--steps 120] [--rounds 3] [--grid 8]

Each case trains the workload's model (plain Keras, no Horovod) on a sequence
of batch sizes around `--batch`, in a process of its own: TensorFlow's oneDNN
kernels on CPU (like cuDNN's autotuning or XLA on GPUs) are set up once per
input shape and cached for the life of the process. The cases:

- fixed: one size at every step;
- grid: sizes drawn at random from the multiples of `--grid` within
  [batch / 2, 3 batch / 2] (a moving split under BalancedFeed(batch_multiple=...));
- fresh: a size the process has not run before at every step (a moving split
  without a grid; lbbsp changed the split at 44-57 of 64 steps on dynamic-2).

Each process is pinned to one core with one TensorFlow thread per pool, as
every benchmark worker runs. Per case: the median step time, and a least-squares
fit t = c + m b over the steps after the first 10, whose c (a per-step cost
independent of the batch) is where a new shape's set-up shows. Cases are
interleaved over the rounds; cells are medians over rounds [min-max].
"""
import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np

CASES = ("fixed", "grid", "fresh")


def batch_sizes(case, batch, steps, grid, seed=0):
    """The batch size of every step of `case` (see the module docstring)."""
    rng = np.random.default_rng(seed)
    low, high = max(1, batch // 2), batch + batch // 2
    if case == "fixed":
        return np.full(steps, batch)
    if case == "grid":
        return rng.choice(np.arange(-(-low // grid) * grid, high + 1, grid), size=steps)
    return rng.permutation(np.arange(low, high + 1))[:steps]


def run_case(case, workload, batch, steps, grid):
    """Train on the case's sizes in this process; return the per-step times (s) and sizes after warm-up."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    from .workloads import build_model, load_data

    sizes = batch_sizes(case, batch, steps, grid)
    x, y, _, _ = load_data(workload, num_samples=int(sizes.max()))
    model = build_model(workload, seed=0)
    model.compile(optimizer=tf.keras.optimizers.SGD(0.01),
                  loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    spec = (tf.TensorSpec((None,) + x.shape[1:], x.dtype), tf.TensorSpec((None,) + y.shape[1:], y.dtype))
    data = tf.data.Dataset.from_generator(lambda: ((x[:b], y[:b]) for b in sizes), output_signature=spec)

    class Clock(tf.keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            self.times = []

        def on_train_batch_begin(self, step, logs=None):
            self.started = time.perf_counter()

        def on_train_batch_end(self, step, logs=None):
            self.times.append(time.perf_counter() - self.started)

    clock = Clock()
    model.fit(data, epochs=1, verbose=0, callbacks=[clock])
    return clock.times[10:], sizes[10:len(clock.times)].tolist()


def fit(times, sizes):
    """(c, m) of t = c + m b by least squares, in ms and ms per sample."""
    t, b = 1e3 * np.asarray(times), np.asarray(sizes, dtype=np.float64)
    (c, m), *_ = np.linalg.lstsq(np.c_[np.ones_like(b), b], t, rcond=None)
    return float(c), float(m)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workload", default="conv", choices=("conv", "mlp", "cnn"))
    parser.add_argument("--batch", type=int, default=128, help="the mean batch size")
    parser.add_argument("--steps", type=int, default=120)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--grid", type=int, default=8, help="the grid case's multiple")
    parser.add_argument("--case", choices=CASES, help=argparse.SUPPRESS)  # one case, in a child process
    args = parser.parse_args(argv)
    if args.batch < 4 or args.rounds < 1 or not 1 <= args.grid <= args.batch // 2 \
            or not 20 <= args.steps <= args.batch + 1:
        parser.error(f"--batch={args.batch} (>= 4), --rounds={args.rounds} (>= 1), --grid={args.grid} "
                     f"(1..batch / 2), --steps={args.steps} (20..batch + 1: the fresh case needs a new size per step)")
    if args.case:
        os.sched_setaffinity(0, [sorted(os.sched_getaffinity(0))[-1]])
        times, sizes = run_case(args.case, args.workload, args.batch, args.steps, args.grid)
        print(json.dumps({"times": times, "sizes": sizes}))
        return 0
    results = {case: [] for case in CASES}
    for r in range(args.rounds):
        for case in CASES[r % len(CASES):] + CASES[:r % len(CASES)]:
            cmd = [sys.executable, "-m", "benchmarks.shapes", "--case", case, "--workload", args.workload,
                   "--batch", str(args.batch), "--steps", str(args.steps), "--grid", str(args.grid)]
            out = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True).stdout
            run = json.loads(out.strip().splitlines()[-1])
            c, m = fit(run["times"], run["sizes"])
            results[case].append((1e3 * float(np.median(run["times"])), c, m, len(set(run["sizes"]))))
    print(f"{args.workload}, batch sizes around {args.batch}, {args.steps} steps (first 10 not counted), "
          f"{args.rounds} interleaved rounds, one process per case; median [min-max] over rounds")
    print(f"{'case':<7}{'sizes':>6}{'step ms':>24}{'fixed cost c ms':>24}{'ms per sample':>24}")
    for case in CASES:
        rows = np.array(results[case])
        columns = rows[:, :3].T if case != "fixed" else rows[:, :1].T  # one size: c and m are not identified
        cells = "".join(f"{np.median(col):.3f} [{col.min():.3f}-{col.max():.3f}]".rjust(24) for col in columns)
        print(f"{case:<7}{int(rows[0, 3]):>6}{cells}{'-'.rjust(24) * (3 - len(columns))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
