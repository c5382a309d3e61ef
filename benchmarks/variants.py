"""The variants every benchmark compares: label -> (policy, predictor[, worker options]).

One table for live runs and the simulator; a third element holds extra
command-line options of benchmarks.worker (live runs only).
"""

__all__ = ["VARIANTS", "LIVE_DEFAULT", "LIVE_ONLY"]

VARIANTS = {
    "horovod": ("horovod", None),      # plain Horovod: hvd.DistributedOptimizer, static shards (live runs only)
    "equal": ("equal", None),          # BSP through lbbsp: what lbbsp itself costs
    "static": ("static", None),        # profiled once, then fixed
    "dbs": ("dbs", None),              # per-epoch shares from pure compute time
    "pid": ("pid", None),              # dynamic batching, proportional control with a deadband
    "lbbsp-ema": ("lbbsp", "ema"),     # step-time model + EMA forecasts
    "lbbsp-narx": ("lbbsp", "narx"),   # step-time model + NARX forecasts (the default)
    "lbbsp-last": ("lbbsp", "last"),   # step-time model + the last measurement (what the NARX must beat)
    "oracle": ("oracle", None),        # knows every worker's measured curve for the coming step
    # the input pipeline without read-ahead (the data of a step is prepared when the step starts)
    "lbbsp-narx-noprefetch": ("lbbsp", "narx", ("--prefetch", "0")),
}

#: Variants that only make sense in live runs.
LIVE_ONLY = ("horovod", "lbbsp-narx-noprefetch")
LIVE_DEFAULT = tuple(v for v in VARIANTS if v != "lbbsp-narx-noprefetch")
