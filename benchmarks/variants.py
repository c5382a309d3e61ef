"""The variants every benchmark compares: label -> (policy, predictor). One table for live runs and the simulator."""

__all__ = ["VARIANTS", "LIVE_DEFAULT"]

VARIANTS = {
    "horovod": ("horovod", None),      # plain Horovod: hvd.DistributedOptimizer, static shards (live runs only)
    "equal": ("equal", None),          # BSP through lbbsp: what lbbsp itself costs
    "static": ("static", None),        # profiled once, then fixed
    "dbs": ("dbs", None),              # per-epoch shares from pure compute time
    "pid": ("pid", None),              # dynamic batching, proportional control with a deadband
    "lbbsp-ema": ("lbbsp", "ema"),     # step-time model + EMA forecasts
    "lbbsp-narx": ("lbbsp", "narx"),   # step-time model + NARX forecasts (the default)
    "oracle": ("oracle", None),        # knows every worker's measured curve for the coming step
}

LIVE_DEFAULT = tuple(VARIANTS)
