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
    # batches on a grid of 8 samples (BalancedFeed batch_multiple=8): few batch shapes, each set up once
    "pid-grid8": ("pid", None, ("--batch-multiple", "8")),
    "lbbsp-ema-grid8": ("lbbsp", "ema", ("--batch-multiple", "8")),
    "lbbsp-narx-grid8": ("lbbsp", "narx", ("--batch-multiple", "8")),
    "lbbsp-last-grid8": ("lbbsp", "last", ("--batch-multiple", "8")),
}

#: Variants that only make sense in live runs (the simulator has no batch-shape set-up cost).
LIVE_ONLY = ("horovod", "lbbsp-narx-noprefetch", "pid-grid8", "lbbsp-ema-grid8", "lbbsp-narx-grid8", "lbbsp-last-grid8")
#: What `benchmarks.compare` runs by default: everything, and the grid for PID and lbbsp-narx.
LIVE_DEFAULT = tuple(v for v in VARIANTS if v not in LIVE_ONLY or v in ("horovod", "pid-grid8", "lbbsp-narx-grid8"))
