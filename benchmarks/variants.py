"""The variants every benchmark compares: label -> (policy, predictor[, worker options]).

One table for live runs and the simulator; a third element holds extra
command-line options of benchmarks.worker (live runs only). A label ending in
"@base" runs its variant from another checkout given to benchmarks.compare
(`--base-tree`, e.g. the previous release), interleaved with this one's.
"""

__all__ = ["VARIANTS", "LIVE_DEFAULT", "LIVE_ONLY", "BASE_SUFFIX", "worker_options", "split_label"]

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
    # every batch a multiple of 8 (BalancedFeed batch_multiple=8: GPU workers' default grid here, CPU workers' until
    # 2026-12-01) instead of any batch size
    "pid-q8": ("pid", None, ("--batch-multiple", "8")),
    "lbbsp-narx-q8": ("lbbsp", "narx", ("--batch-multiple", "8")),
}

#: Variants that only make sense in live runs (the simulator splits exactly and has no input pipeline).
LIVE_ONLY = ("horovod", "lbbsp-narx-noprefetch", "pid-q8", "lbbsp-narx-q8")
#: What `benchmarks.compare` runs by default.
LIVE_DEFAULT = ("horovod", "equal", "static", "dbs", "pid", "lbbsp-ema", "lbbsp-narx", "oracle")
#: The suffix of a label run from the base checkout (benchmarks.compare --base-tree).
BASE_SUFFIX = "@base"


def split_label(label):
    """(variant, True when it runs from the base checkout) of a label such as "lbbsp-narx@base"."""
    base = label.endswith(BASE_SUFFIX)
    return (label[:-len(BASE_SUFFIX)] if base else label), base


def worker_options(label):
    """The benchmarks.worker options that run variant `label`: its policy, predictor and extra options."""
    policy, predictor, *options = VARIANTS[split_label(label)[0]]
    extra = list(options[0]) if options else []
    return ["--policy", policy] + (["--predictor", predictor] if predictor else []) + extra
