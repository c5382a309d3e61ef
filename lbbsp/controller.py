"""The global per-step decision of load-balanced BSP, without Keras (the callback and the simulator drive it).

Every rank holds one BalanceController and feeds it the same gathered rows
(lbbsp.exchange), so every rank arrives at the same batch sizes. The rows of
step t decide the split of step t + 1 + plan_ahead: with plan_ahead = 1 (the
default) the decision is computed while step t + 1 runs, off the critical
path, and the data for a step is known a whole step before it starts.
Forecasting is per worker (lbbsp.forecasting); per-step records are
lbbsp.history's.
"""
import numpy as np

from .exchange import Row
from .membership import worker_index
from .metrics import balanced_time
from .policies import StepStats, make_policy
from .sharding import EpochSchedule

__all__ = ["BalanceController"]


class BalanceController:
    """Decides every step's per-worker batch sizes from the gathered rows of the step that just ended."""

    def __init__(self, policy="lbbsp", warmup_steps=2, plan_ahead=1):
        for name, value in (("warmup_steps", warmup_steps), ("plan_ahead", plan_ahead)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name}={value!r} is not allowed: it must be an integer >= 0")
        self.policy = make_policy(policy)
        self.warmup_steps = warmup_steps
        self.plan_ahead = plan_ahead

    @property
    def uses_forecast(self):
        return self.policy.uses_forecast

    def offsets(self):
        """Each worker's fixed per-step cost in samples (zeros for policies without a step-time model)."""
        model = self.policy.model
        return model.offsets if model is not None else np.zeros(self.size)

    def start(self, size, schedule, b_min=1, b_max=None, epoch=0, step=0, multiple=1, finest_multiple=None):
        """Reset per-run state; return {(epoch, step): batch sizes} of the first 1 + plan_ahead steps.

        `schedule`: the global batch of each step of an epoch, or an
        `lbbsp.sharding.EpochSchedule` (whose resumed epoch may be shorter).
        `multiple`: the batch grid (lbbsp.allocation); `finest_multiple`: the finest grid the policy may
        refine it to (lbbsp.policies.Policy.start; None: keep it).
        """
        self.size = int(size)
        if not isinstance(schedule, EpochSchedule):
            schedule = EpochSchedule.from_steps(schedule)
        self.schedule = schedule
        self.b_min, self.b_max = b_min, b_max
        epoch, step = schedule.after(epoch, step, 0)
        first = self.policy.start(size, int(schedule.of(epoch)[step]), b_min, b_max, multiple, finest_multiple)
        self.batch_sizes = np.asarray(first, dtype=np.int64)
        self.steps_seen = 0
        return self.initial_plans(epoch, step)

    def initial_plans(self, epoch=0, step=0):
        """The current split for (epoch, step) and the plan_ahead steps after it (at the start or a resume)."""
        plans = {}
        for ahead in range(self.plan_ahead + 1):
            e, s = self.schedule.after(epoch, step, ahead)
            plans[(e, s)] = np.asarray(self.policy.resize(int(self.schedule.of(e)[s])), dtype=np.int64)
        return plans

    def rejoin(self, state, old_workers, new_workers):
        """Continue from `state()` saved with workers `old_workers` (stable ids) on `new_workers`.

        A worker in both keeps its estimates; a newcomer starts from the mean
        of the others' (lbbsp.membership); the split is recomputed for the new
        set. Call after `start` (the new size and schedule). Returns the
        index of each new worker among the old ones (-1: new).
        """
        index = worker_index(old_workers, new_workers)
        if state.get("policy") != self.policy.name:
            raise ValueError(f"a saved state of policy {state.get('policy')!r} cannot continue policy "
                             f"{self.policy.name!r}")
        self.policy.rejoin(state["state"], index, int(self.batch_sizes.sum()))
        self.batch_sizes = np.asarray(self.policy.batches, dtype=np.int64).copy()
        return index

    def decide(self, epoch, step, gathered, sizes):
        """Split of step (epoch, step) + 1 + plan_ahead from the gathered rows of (epoch, step), run with `sizes`.

        Returns ((epoch, step) the split is for, batch sizes, StepStats of the measured step).
        """
        row = Row(np.asarray(gathered, dtype=np.float64).reshape(self.size, -1))
        t_epoch, t_step = self.schedule.after(epoch, step, 1 + self.plan_ahead)
        next_global = int(self.schedule.of(t_epoch)[t_step])
        stats = StepStats(step=self.schedule.index(epoch, step), batches=np.asarray(sizes, dtype=np.int64).copy(),
                          compute=row.compute, wait=row.wait, forecast=row.forecast,
                          target=self.schedule.index(t_epoch, t_step))
        self.steps_seen += 1
        if self.steps_seen <= self.warmup_steps:
            # The first steps trace the train function (twice in Keras 2.15): their timings say nothing.
            sizes = self.policy.resize(next_global)
        else:
            sizes = self.policy.after_step(stats, next_global)
        if t_step == 0:
            sizes = self.policy.after_epoch(next_global)
        self.batch_sizes = np.asarray(sizes, dtype=np.int64)
        return (t_epoch, t_step), self.batch_sizes.copy(), stats

    def state(self):
        """The decision state (next split, policy state), identical on every rank; for checkpoints."""
        return {"policy": self.policy.name, "batch_sizes": self.batch_sizes.copy(), "state": self.policy.state()}

    def load_state(self, state):
        """Continue from `state()`; a state of another policy or size raises ValueError."""
        if state.get("policy") != self.policy.name:
            raise ValueError(f"a saved state of policy {state.get('policy')!r} cannot continue policy "
                             f"{self.policy.name!r}")
        self.policy.load_state(state["state"])
        sizes = np.asarray(state["batch_sizes"], dtype=np.int64)
        if sizes.shape != self.batch_sizes.shape:
            raise ValueError(f"a saved split for {sizes.size} workers cannot continue with {self.size}")
        self.batch_sizes = sizes

    @staticmethod
    def balance(stats):
        """(T*, max_i t_i) of a step: the balanced and the actual compute time (NaN when a time is missing)."""
        t = stats.compute
        if not np.all(np.isfinite(t) & (t > 0)):
            return float("nan"), float("nan")
        return balanced_time(stats.batches, t), float(t.max())
