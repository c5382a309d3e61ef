"""A complete Horovod Keras job with lbbsp, next to the same job on plain Horovod.

    horovodrun -np 2 -H localhost:2 python examples/train.py --slow-rank 1

Both jobs train the same model on the same data with the same global batch,
interleaved over `--rounds` rounds in the same processes; rank 0 prints each
one's steady epoch time (epochs after the first), medians over the rounds,
and its final accuracy. `--slow-rank R` makes rank R a straggler: a cgroup
CPU quota of `--slow-share` of a core where cgroups are writable (root),
else a busy process on its core. The parts marked "lbbsp" are all a job
needs to change.
"""
import argparse
import atexit
import os
import subprocess
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import horovod.tensorflow as hvd_tf  # noqa: E402
import horovod.tensorflow.keras as hvd  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import lbbsp.keras as lb  # noqa: E402 - lbbsp


def make_data(n, seed=0):
    """A learnable 10-class problem: labels from a fixed random teacher network on 64 features."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 64)).astype(np.float32)
    hidden = np.tanh(x @ rng.normal(size=(64, 32)))
    return x, np.argmax(hidden @ rng.normal(size=(32, 10)), axis=1).astype(np.int64)


def make_model(width):
    tf.keras.utils.set_random_seed(1)  # the same initial weights for both jobs
    return tf.keras.Sequential([tf.keras.Input((64,)), tf.keras.layers.Dense(width, activation="relu"),
                                tf.keras.layers.Dense(width, activation="relu"), tf.keras.layers.Dense(10)])


class EpochTimes(tf.keras.callbacks.Callback):
    def on_epoch_begin(self, epoch, logs=None):
        self.started = time.perf_counter()

    def on_epoch_end(self, epoch, logs=None):
        self.times = getattr(self, "times", []) + [time.perf_counter() - self.started]


def train(balanced, x, y, args):
    """One training run; (steady epoch times, final training accuracy)."""
    model, clock = make_model(args.width), EpochTimes()
    sgd = tf.keras.optimizers.SGD(0.05, momentum=0.9)
    loss = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    callbacks = [hvd.callbacks.BroadcastGlobalVariablesCallback(0), clock]
    if balanced:  # lbbsp: weighted gradients, the whole data set in the feed, the balancing callback
        model.compile(optimizer=lb.DistributedOptimizer(sgd), loss=loss, metrics=["accuracy"])
        feed = lb.BalancedFeed(x, y, global_batch=args.batch * hvd.size(), prefetch=1)  # reads a step ahead
        callbacks.append(lb.LoadBalancer(feed, policy=args.policy))
        data, steps = feed.dataset(), feed.steps_per_epoch
    else:  # plain Horovod: a shard per rank, equal batches
        model.compile(optimizer=hvd.DistributedOptimizer(sgd), loss=loss, metrics=["accuracy"])
        data = tf.data.Dataset.from_tensor_slices((x, y)).shard(hvd.size(), hvd.rank()).shuffle(4096, seed=0)
        data = data.repeat().batch(args.batch, drop_remainder=True).prefetch(1)
        steps = len(x) // (args.batch * hvd.size())
    history = model.fit(data, steps_per_epoch=steps, epochs=args.epochs, callbacks=callbacks, verbose=0)
    accuracy = history.history["accuracy"][-1]
    if not balanced:  # this rank's shard only: averaged over ranks (lbbsp's logs are global already)
        accuracy = float(hvd_tf.allreduce(tf.constant(accuracy, tf.float32), op=hvd_tf.Average, name="accuracy"))
    return clock.times[1:], accuracy


def slow_down(share):
    """Make this process a straggler: a CPU quota of `share` cores, or a busy process on its core."""
    for cgroup, limit, value in (("/sys/fs/cgroup/cpu/lbbsp-example", "cpu.cfs_quota_us", int(share * 100000)),
                                 ("/sys/fs/cgroup/lbbsp-example", "cpu.max", f"{int(share * 100000)} 100000")):
        try:
            os.makedirs(cgroup, exist_ok=True)
            with open(os.path.join(cgroup, limit), "w") as fh:
                fh.write(str(value))
            with open(os.path.join(cgroup, "cgroup.procs"), "w") as fh:
                fh.write(str(os.getpid()))
            atexit.register(_leave, cgroup)
            return f"a CPU quota of {share} cores"
        except OSError:
            continue
    core = sorted(os.sched_getaffinity(0))[0]
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    atexit.register(busy.kill)
    os.sched_setaffinity(busy.pid, {core})
    os.sched_setaffinity(0, {core})
    return "a busy process on its core"


def _leave(cgroup):
    """Back to the parent group, and the quota's group removed."""
    try:
        with open(os.path.join(os.path.dirname(cgroup), "cgroup.procs"), "w") as fh:
            fh.write(str(os.getpid()))
        os.rmdir(cgroup)
    except OSError:
        pass


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--slow-rank", type=int, help="the rank to slow down (default: none)")
    parser.add_argument("--slow-share", type=float, default=0.3, help="the slowed rank's CPU quota, in cores")
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=1, help="interleaved rounds of both jobs")
    parser.add_argument("--samples", type=int, default=16384)
    parser.add_argument("--batch", type=int, default=128, help="per-worker batch of plain Horovod")
    parser.add_argument("--width", type=int, default=1024, help="units of the two hidden layers")
    parser.add_argument("--policy", default="lbbsp", help="lbbsp's policy: lbbsp, or equal for an A/B check")
    args = parser.parse_args()
    tf.config.threading.set_intra_op_parallelism_threads(1)  # several workers share a small machine
    tf.config.threading.set_inter_op_parallelism_threads(1)
    hvd.init()
    if args.epochs < 2 or args.rounds < 1 or not (args.slow_rank is None or 0 <= args.slow_rank < hvd.size()):
        parser.error(f"--epochs={args.epochs} (>= 2), --rounds={args.rounds} (>= 1), --slow-rank={args.slow_rank} "
                     f"(a rank in [0, {hvd.size()}))")
    cores = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cores[hvd.local_rank() % len(cores)]})
    if hvd.rank() == args.slow_rank:
        print(f"rank {hvd.rank()} is slowed by {slow_down(args.slow_share)}", flush=True)
    x, y = make_data(args.samples)
    results = {"plain Horovod": [], "lbbsp": []}
    for r in range(args.rounds):
        for name in (list(results) if r % 2 == 0 else list(results)[::-1]):
            results[name].append(train(name == "lbbsp", x, y, args))
    if hvd.rank() == 0:
        base = np.median([t for times, _ in results["plain Horovod"] for t in times])
        print(f"{hvd.size()} workers, global batch {args.batch * hvd.size()}, {args.rounds} round(s) of "
              f"{args.epochs} epochs; steady epochs (after the first), median [min-max]:")
        for name, runs in results.items():
            times = [t for run_times, _ in runs for t in run_times]
            print(f"  {name:<14} {np.median(times):6.2f} s/epoch [{min(times):.2f}-{max(times):.2f}]  "
                  f"{base / np.median(times):5.2f}x  final accuracy {np.median([a for _, a in runs]):.3f}")


if __name__ == "__main__":
    main()
