"""The per-step decision of load-balanced BSP without Keras (the balancer, the simulator and the replay drive it).

Every rank feeds its BalanceController the same gathered rows (lbbsp.exchange) and reaches the same split. The rows
of step t decide step t + 1 + plan_ahead, off the critical path, published as a `Plan`: an immutable snapshot of
what the train thread needs. Where a decision would take more than `budget` of the workers' compute time, decisions
are made every `period` steps (set from the gathered rows, so alike on every rank); a step that surprises the policy
is decided on at once, and so is the step where that decision's plan runs.
"""
import dataclasses
import logging
import math
import time

import numpy as np

from .allocation import Bounds
from .checks import check_budget, integer
from .consistency import digest as split_digest
from .exchange import unpack
from .membership import worker_index
from .metrics import median
from .policies import StepStats, make_policy, proportional
from .sharding import EpochSchedule

__all__ = ["BalanceController", "Plan", "DECISION_BUDGET", "MAX_PERIOD"]

log = logging.getLogger(__name__)

#: Default share of the workers' compute time one decision's CPU may take per step.
DECISION_BUDGET = 0.01
#: Most steps a split holds between decisions.
MAX_PERIOD = 64


def _frozen(values, dtype):
    out = np.array(values, dtype=dtype)
    out.setflags(write=False)
    return out


@dataclasses.dataclass(frozen=True)
class Plan:
    """The split of step (epoch, step), each worker's fixed cost in samples (for its batch-free speed), the split's
    digest, and the CPU seconds of this rank's latest decision."""

    epoch: int
    step: int
    sizes: np.ndarray
    offsets: np.ndarray
    cost: float = 0.0
    digest: float = dataclasses.field(init=False, repr=False)

    def __post_init__(self):
        object.__setattr__(self, "digest", split_digest(self.sizes))

    @property
    def key(self):
        return self.epoch, self.step


class BalanceController:
    """Decides every step's per-worker batch sizes from the gathered rows of the step that just ended."""

    def __init__(self, policy="lbbsp", warmup_steps=2, plan_ahead=1, budget=DECISION_BUDGET):
        self.warmup_steps = integer("warmup_steps", warmup_steps, 0)
        self.plan_ahead = integer("plan_ahead", plan_ahead, 0)
        self.policy = make_policy(policy)
        self._failed, self._changes, self._period = False, 0, 1
        self.budget = check_budget(budget, "decision_budget")

    @property
    def uses_forecast(self):
        return self.policy.uses_forecast

    def start(self, schedule, bounds, epoch=0, step=0, warm_shapes=(), gpu=False):
        """Reset per-run state; return the Plans of the first 1 + plan_ahead steps. `schedule`: the global batch of
        each step of an epoch, or an `lbbsp.sharding.EpochSchedule`; `bounds`: lbbsp.allocation.Bounds;
        `warm_shapes`: batch sizes every worker has set up; `gpu`: some worker trains on a GPU."""
        if not isinstance(schedule, EpochSchedule):
            schedule = EpochSchedule.from_steps(schedule)
        if not isinstance(bounds, Bounds):
            raise ValueError(f"bounds={bounds!r} is not allowed: give a lbbsp.allocation.Bounds")
        self.schedule, self.size = schedule, bounds.num_workers
        epoch, step = schedule.after(epoch, step, 0)
        self.policy.start(int(schedule.of(epoch)[step]), bounds)
        self.policy.prepare(warm_shapes, gpu)
        self.steps_seen, self.decided_at, self.next_decision, self.cost, self._period = 0, None, 0, 0.0, 1
        self._held = self.policy.batches.copy()
        return self.initial_plans(epoch, step)

    def _plan(self, key, sizes):
        model = getattr(self.policy, "model", None)
        offsets = model.offsets if model is not None else np.zeros(self.size)
        return Plan(*key, _frozen(sizes, np.int64), _frozen(offsets, np.float64), self.cost)

    def initial_plans(self, epoch=0, step=0):
        """The current split for (epoch, step) and the plan_ahead steps after it (at the start or a resume)."""
        keys = [self.schedule.after(epoch, step, ahead) for ahead in range(self.plan_ahead + 1)]
        return [self._plan(key, self._guarded(self.policy.resize, int(self.schedule.of(key[0])[key[1]])))
                for key in keys]

    def decide(self, epoch, step, gathered, sizes):
        """The Plan of step (epoch, step) + 1 + plan_ahead from the gathered rows of (epoch, step), run with `sizes`;
        and the measured step's StepStats (`elapsed` 0 where no decision was made)."""
        started = time.thread_time()
        row = unpack(np.asarray(gathered, dtype=np.float64).reshape(self.size, -1))
        key = self.schedule.after(epoch, step, 1 + self.plan_ahead)
        next_global = int(self.schedule.of(key[0])[key[1]])
        index = self.schedule.index(epoch, step)
        self.steps_seen += 1
        stats = StepStats(step=index, batches=np.asarray(sizes, dtype=np.int64).copy(), compute=row.compute,
                          forecast=row.forecast, target=self.schedule.index(*key),
                          horizon=self.schedule.steps_in(key[0]) - key[1], elapsed=0)
        decides = self.steps_seen > self.warmup_steps and (index >= self.next_decision or
                                                           self._guarded(self.policy.surprised, stats,
                                                                         fallback=False))
        if decides:
            stats = dataclasses.replace(stats, elapsed=1 if self.decided_at is None else index - self.decided_at)
            # A surprise's splits are scored once its plan runs: decide again then.
            early = stats.target if index < self.next_decision else math.inf
            self.decided_at, self.next_decision = index, min(index + self.period(row.decision, row.compute), early)
            decided = self._guarded(self.policy.after_step, stats, next_global)
        else:
            # Warm-up steps trace the train function: their timings say nothing. Between decisions the split holds.
            self._guarded(self.policy.seen, stats.batches, fallback=False)
            decided = self._guarded(self.policy.resize, next_global)
        if key[1] == 0:
            decided = self._guarded(self.policy.after_epoch, next_global)
        if decides:
            self.cost = time.thread_time() - started
        return self._plan(key, decided), stats

    def period(self, costs, compute):
        """Steps the split decided now holds: 1 while the ranks' median decision CPU time is within `budget` of the
        median compute time, else the power of two that brings it within (at most MAX_PERIOD)."""
        cost, step = median(costs), median(compute)
        period = 1
        if self.budget is not None and cost > self.budget * step > 0:  # NaN anywhere: every step
            period = min(2 ** math.ceil(math.log2(cost / (self.budget * step))), MAX_PERIOD)
        if period != self._period:
            self._changes += 1
            log.log(logging.INFO if self._changes == 1 else logging.DEBUG,
                    "lbbsp: a decision takes %.2f ms of CPU, %.1f%% of the workers' %.1f ms of compute (budget "
                    "%.1f%%); deciding every %d step(s)", 1e3 * cost, 100 * cost / step, 1e3 * step,
                    100 * self.budget, period)
            self._period = period
        return period

    def _guarded(self, decide, *args, fallback=None):
        """A policy call that raises answers `fallback`; without one it must return a split of the global batch
        `args[-1]` within the bounds, else the latest split holds (resized). One warning; every rank fails alike on
        the same numbers, and a failure that differs shows in the digests."""
        try:
            out = decide(*args)
            if fallback is None:
                out, bounds = np.asarray(out), self.policy.bounds
                if out.shape != (self.size,) or out.dtype.kind not in "iu" or out.sum() != args[-1] or \
                        not ((bounds.lower <= out) & (out <= bounds.upper)).all():
                    raise ValueError(f"it returned the split {out.tolist()}, not {self.size} integers within the "
                                     f"bounds summing to {args[-1]}")
                self._held = out.astype(np.int64)
            return out
        except Exception as exc:  # noqa: BLE001 - a plugin failure must not stop training
            if not self._failed:
                log.warning("lbbsp: the %s policy failed (%r); keeping the split it had (warned once)",
                            self.policy.name, exc)
            self._failed = True
            if fallback is not None:
                return fallback
            if int(self._held.sum()) == args[-1]:
                return self._held.copy()
            return proportional(args[-1], self.policy.bounds, self._held)  # another global batch: an epoch's last step

    def state(self):
        """The decision state, identical on every rank; for checkpoints."""
        return {"policy": self.policy.name, "steps_seen": self.steps_seen, "decided_at": self.decided_at,
                "next_decision": self.next_decision, "state": self.policy.state()}

    def _check(self, state):
        if state.get("policy") != self.policy.name:
            raise ValueError(f"a saved state of policy {state.get('policy')!r} cannot continue policy "
                             f"{self.policy.name!r}")

    def load_state(self, state):
        """Continue from `state()`; a state of another policy or size raises ValueError."""
        self._check(state)
        self.policy.load_state(state["state"])
        self._continue(state)

    def _continue(self, state):
        self.steps_seen, self.next_decision = int(state["steps_seen"]), int(state.get("next_decision", 0))
        self.decided_at, self._held = state.get("decided_at"), self.policy.batches.copy()

    def rejoin(self, state, old_workers, new_workers):
        """Continue (after `start`) from `state()` saved with workers `old_workers` (stable ids) on `new_workers`: a
        worker in both keeps its estimates, a newcomer starts from the others' mean. Returns each new worker's index
        among the old ones (-1: new)."""
        self._check(state)
        index = worker_index(old_workers, new_workers)
        self.policy.rejoin(state["state"], index, int(self.policy.batches.sum()))
        self._continue(state)
        return index

    @property
    def batch_sizes(self):
        return self.policy.batches.copy()
