"""Per-step cost of lbbsp on homogeneous workers, against plain Horovod, in one job (ratios, not timings).

    horovodrun -np 2 -H localhost:2 --gloo python -m benchmarks.overhead [--rounds 3] [--hidden 512]

Plain Horovod (hvd.DistributedOptimizer, a static shard, equal batches) and
lbbsp with policies equal, lbbsp+EMA and lbbsp+NARX (fused exchange) and
lbbsp+NARX with the eager exchange train the same model on identical
workers, interleaved over several rounds in the same processes, so machine
noise hits all alike. Reported per variant: the median steady-state step time
(warm-up steps dropped), the extra milliseconds per step over plain Horovod
and their share of its step time, and the callback's own median cost.
"""
import argparse
import sys
import time

import numpy as np

VARIANTS = ("horovod", "equal", "lbbsp-ema", "lbbsp-narx", "lbbsp-narx-eager")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=80, help="steps per variant and round")
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--batch", type=int, default=256, help="per-worker batch")
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.steps < 30:
        parser.error(f"--rounds={args.rounds} (>= 1) and --steps={args.steps} (>= 30)")

    import os
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    import horovod.tensorflow.keras as hvd

    import lbbsp.keras as lb
    from lbbsp.contention import pin_to_cores
    from lbbsp.workloads import build_model, load_data

    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    cores = sorted(os.sched_getaffinity(0))
    pin_to_cores([cores[rank % len(cores)]])
    global_batch = args.batch * size
    x, y, _, _ = load_data("mlp", num_samples=global_batch * 32)
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

    def run(variant):
        model = build_model("mlp", hidden=args.hidden, seed=0)
        clock = StepClock()
        callbacks = [hvd.callbacks.BroadcastGlobalVariablesCallback(0)]
        if variant == "horovod":
            model.compile(optimizer=hvd.DistributedOptimizer(tf.keras.optimizers.SGD(0.01)), loss=loss)
            sx, sy = x[rank::size], y[rank::size]

            def batches():
                while True:
                    for i in range(0, len(sx) - args.batch + 1, args.batch):
                        yield sx[i:i + args.batch], sy[i:i + args.batch]

            sig = (tf.TensorSpec((None, x.shape[1]), tf.float32), tf.TensorSpec((None,), tf.int64))
            model.fit(tf.data.Dataset.from_generator(batches, output_signature=sig), steps_per_epoch=args.steps,
                      epochs=1, verbose=0, callbacks=callbacks + [clock])
            return clock.times[warmup:], float("nan")
        policy, _, rest = variant.partition("-")
        predictor, _, exchange = rest.partition("-")
        model.compile(optimizer=lb.DistributedOptimizer(tf.keras.optimizers.SGD(0.01)), loss=loss)
        feed = lb.BalancedFeed(x[:global_batch * args.steps], y[:global_batch * args.steps],
                               global_batch=global_batch)
        balancer = lb.LoadBalancer(feed, policy="equal" if policy == "equal" else "lbbsp",
                                   predictor=predictor or "ema", exchange=exchange or "fused")
        model.fit(feed.dataset(), steps_per_epoch=feed.steps_per_epoch, epochs=1, verbose=0,
                  callbacks=callbacks + [balancer, clock])
        return clock.times[warmup:], float(np.median([r["overhead"] for r in balancer.history[warmup:]]))

    times = {v: [] for v in VARIANTS}
    callback = {v: [] for v in VARIANTS}
    for _ in range(args.rounds):
        for variant in VARIANTS:
            t, c = run(variant)
            times[variant].extend(t)
            callback[variant].append(c)
    if rank == 0:
        base = float(np.median(times["horovod"]))
        print(f"{size} workers, per-worker batch {args.batch}, mlp hidden {args.hidden}, {args.rounds} rounds x "
              f"{args.steps - warmup - 1} steady steps per variant, interleaved")
        print(f"{'variant':<18}{'step ms':>9}{'extra ms':>10}{'extra %':>9}{'callback ms':>13}")
        for variant in VARIANTS:
            step = float(np.median(times[variant]))
            cb = float(np.nanmedian(callback[variant])) if variant != "horovod" else float("nan")
            print(f"{variant:<18}{1e3 * step:>9.2f}{1e3 * (step - base):>+10.2f}{100 * (step / base - 1):>+8.1f}%"
                  f"{1e3 * cb:>13.2f}" if variant != "horovod" else
                  f"{variant:<18}{1e3 * step:>9.2f}{'-':>10}{'-':>9}{'-':>13}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
