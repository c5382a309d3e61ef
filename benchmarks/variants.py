"""The variants every benchmark compares: label -> (policy, predictor[, worker options]).

One table for live runs and the simulator; a third element holds extra
command-line options of benchmarks.worker (live runs only). The simulators
build the lbbsp configurations they name from LBBSP_CONFIGS; the live worker
sets the same through its options.
"""

__all__ = ["VARIANTS", "LIVE_DEFAULT", "LIVE_ONLY", "LBBSP_CONFIGS", "ABLATIONS", "SIM_ABLATIONS", "worker_options"]

VARIANTS = {
    "horovod": ("horovod", None),      # plain Horovod: hvd.DistributedOptimizer, static shards (live runs only)
    "equal": ("equal", None),          # BSP through lbbsp: what lbbsp itself costs
    "static": ("static", None),        # profiled once, then fixed
    "dbs": ("dbs", None),              # per-epoch shares from pure compute time
    "pid": ("pid", None),              # dynamic batching, proportional control with a deadband
    "lbbsp-ema": ("lbbsp", "ema"),     # step-time model + EMA forecasts
    "lbbsp-narx": ("lbbsp", "narx"),   # step-time model + NARX forecasts (the default)
    "lbbsp-last": ("lbbsp", "last"),   # step-time model + the last measurement (what the NARX must beat)
    # the NARX at every step, whatever it costs (lbbsp-narx drops to the last value where it costs > 1% of compute)
    "lbbsp-narx-always": ("lbbsp", "narx", ("--forecast-budget", "none")),
    # every departure of the forecasts from the current split's balance point moves it, noise included
    "lbbsp-narx-noshrink": ("lbbsp", "narx", ("--no-shrink-noise",)),
    # the mean-only split, the default before the choice in hindsight (LBBSPPolicy(variance_aware=False))
    "lbbsp-narx-mean": ("lbbsp", "narx", ("--variance-aware", "false")),
    # each worker's fixed cost fitted alone, not pooled with the others' (StepTimeModel(pool=False))
    "lbbsp-narx-unpooled": ("lbbsp", "narx", ("--no-pool-offsets",)),
    # the previous release's candidates in hindsight: every one shrunk for noise (no "unshrunk")
    "lbbsp-narx-shrunk": ("lbbsp", "narx", ("--candidates", "forecast,corrected,quantile")),
    # no dither of the first splits: the fixed costs are identified only where the split moves on its own
    "lbbsp-narx-nocal": ("lbbsp", "narx", ("--calibration", "0")),
    # a wider trust region: a batch may triple in one decision without a measured jump (the default doubles)
    "lbbsp-narx-mc3": ("lbbsp", "narx", ("--max-change", "3")),
    "oracle": ("oracle", None),        # knows every worker's measured curve for the coming step
    # the input pipeline without read-ahead (the data of a step is prepared when the step starts)
    "lbbsp-narx-noprefetch": ("lbbsp", "narx", ("--prefetch", "0")),
    # any batch size (BalancedFeed batch_multiple=1) instead of the default grid: a new batch shape at most
    # moves of the split, each set up anew (see benchmarks.shapes)
    "pid-exact": ("pid", None, ("--batch-multiple", "1")),
    "lbbsp-ema-exact": ("lbbsp", "ema", ("--batch-multiple", "1")),
    "lbbsp-narx-exact": ("lbbsp", "narx", ("--batch-multiple", "1")),
    "lbbsp-last-exact": ("lbbsp", "last", ("--batch-multiple", "1")),
    # a fixed grid (a given batch_multiple is never refined): 4 samples, half the default where the equal share
    # is 64 (static-4, homogeneous-2-images); 8, the default held fixed
    "pid-q4": ("pid", None, ("--batch-multiple", "4")),
    "lbbsp-narx-q4": ("lbbsp", "narx", ("--batch-multiple", "4")),
    "lbbsp-narx-q8": ("lbbsp", "narx", ("--batch-multiple", "8")),
}

#: The ablation of issue 39 (docs/ablation.md): lbbsp-narx with one mechanism of its decision switched off.
ABLATIONS = {
    "abl-nochange": ("--config", '{"model": {"change": 1e9}}'),   # no speed-change detection (nor gating)
    "abl-notrust": ("--max-change", "1e9"),                       # no trust region around the current split
    "abl-nogate": ("--config", '{"gate": false}'),                # forecasts used even far from the measurement
    "abl-mean": ("--variance-aware", "false"),                    # no candidates in hindsight, bias, quantile
    "abl-noshrink": ("--no-shrink-noise",),                       # no noise garrote
    "abl-nofree": ("--config", '{"free_mask": false}'),           # the garrote applied to every worker
    "abl-unpooled": ("--no-pool-offsets",),                       # fixed costs fitted alone, not pooled
    "abl-nohyst": ("--config", '{"min_gain": 0}'),                # no hysteresis
    "abl-nodamp": ("--config", '{"min_step": 1}'),                # no damping of reversals
    "abl-norefine": ("--batch-multiple", "8"),                    # the default grid, never refined
    "abl-nocal": ("--calibration", "0"),                          # no calibration dither
    "abl-always": ("--forecast-budget", "none"),                  # no forecast cost budget
    "abl-nofixed": ("--calibration", "0", "--config", '{"model": {"min_spread": 1.0}}'),  # k = 0 throughout
}
VARIANTS.update({label: ("lbbsp", "narx", options) for label, options in ABLATIONS.items()})
#: The same ablations as LBBSPPolicy keyword arguments, for the simulator (which splits exactly, so it has no
#: grid to refine, and times no forecast).
SIM_ABLATIONS = {
    "abl-nochange": {"model": {"change": 1e9}}, "abl-notrust": {"max_change": 1e9}, "abl-nogate": {"gate": False},
    "abl-mean": {"variance_aware": False}, "abl-noshrink": {"shrink_noise": False},
    "abl-nofree": {"free_mask": False}, "abl-unpooled": {"model": {"pool": False}}, "abl-nohyst": {"min_gain": 0},
    "abl-nodamp": {"min_step": 1}, "abl-nocal": {"calibration": 0},
    "abl-nofixed": {"calibration": 0, "model": {"min_spread": 1.0}},
}

#: Variants that only make sense in live runs. The simulator has no batch-shape set-up cost and splits
#: exactly (batch_multiple=1), so it runs the others as the "-exact" variants.
LIVE_ONLY = ("horovod", "lbbsp-narx-noprefetch", "lbbsp-narx-always", "lbbsp-narx-noshrink", "lbbsp-narx-mean",
             "lbbsp-narx-unpooled", "lbbsp-narx-shrunk", "lbbsp-narx-nocal", "lbbsp-narx-mc3",
             "pid-exact", "lbbsp-ema-exact", "lbbsp-narx-exact", "lbbsp-last-exact", "pid-q4", "lbbsp-narx-q4",
             "lbbsp-narx-q8") + tuple(ABLATIONS)
#: What `benchmarks.compare` runs by default: everything, and PID and lbbsp-narx without the grid.
LIVE_DEFAULT = tuple(v for v in VARIANTS if v not in LIVE_ONLY or v in ("horovod", "pid-exact", "lbbsp-narx-exact"))

#: Policy names the simulators (benchmarks.simulate, benchmarks.decision) build as LBBSPPolicy(**config).
LBBSP_CONFIGS = {
    "lbbsp-mean": {"variance_aware": False},  # balance the forecast means (--variance-aware false)
    "lbbsp-va": {"variance_aware": True},  # always balance a high quantile (--variance-aware true)
    "lbbsp-noshrink": {"shrink_noise": False},  # no noise shrinkage (--no-shrink-noise)
}
LBBSP_CONFIGS.update(SIM_ABLATIONS)


def worker_options(label):
    """The benchmarks.worker options that run variant `label`: its policy, predictor and extra options."""
    policy, predictor, *options = VARIANTS[label]
    extra = list(options[0]) if options else []
    return ["--policy", policy] + (["--predictor", predictor] if predictor else []) + extra
