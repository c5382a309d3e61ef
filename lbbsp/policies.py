"""Batch-size policies: how the next step's per-worker batch sizes follow from what was measured.

A policy is framework-free and deterministic: the callback (on every rank)
and the simulator feed it the same gathered per-worker numbers, a
`StepStats`, and it answers with integer batch sizes that sum to the
global batch. Every rank therefore reaches the same decision.
"""
import dataclasses
import logging

import numpy as np

from .allocation import (Rebalancer, allocate, allocate_clean, continuous_split, dithered, finer_grid, grid_units,
                         sanitize, shrink_to_current, tail_speeds, validate_bounds)
from .hindsight import Hindsight
from .membership import remap_workers
from .steptime import StepTimeModel
from .uncertainty import PlanningError

log = logging.getLogger(__name__)

__all__ = [
    "StepStats",
    "Policy",
    "EqualPolicy",
    "FixedPolicy",
    "StaticPolicy",
    "DBSPolicy",
    "PIDPolicy",
    "LBBSPPolicy",
    "POLICIES",
    "make_policy",
]


@dataclasses.dataclass
class StepStats:
    """What every worker measured in one step, gathered from all ranks (arrays of length N).

    `step` counts steps from the start of training; `target` is the step
    whose split is being decided (step + 1 + the controller's plan_ahead).
    """

    step: int
    batches: np.ndarray
    compute: np.ndarray
    wait: np.ndarray
    forecast: np.ndarray
    target: int = None

    @property
    def speed(self):
        """Measured speed b_i / compute_i (NaN where compute is not positive)."""
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(self.compute > 0, self.batches / self.compute, np.nan)


class Policy:
    """Base class: equal batches until a subclass decides otherwise."""

    name = "base"
    #: True when the policy needs per-rank speed forecasts (the callback then runs a predictor).
    uses_forecast = False
    #: The StepTimeModel whose fixed costs turn a worker's timing into its batch-free speed, if any.
    model = None

    #: Attributes that make up the policy's state between steps (saved with checkpoints). An array
    #: whose last axis has one entry per worker is per worker along it (lbbsp.membership).
    _STATE = ("batches",)
    #: State keys that are observations, with the value a newcomer starts from (lbbsp.membership).
    _EMPTY = {}

    def state(self):
        """The policy's state between steps, for checkpoints (plain values and numpy arrays)."""
        return {name: getattr(self, name) for name in self._STATE if hasattr(self, name)}

    def load_state(self, state):
        """Continue from `state()` saved by the same kind of policy for the same number of workers."""
        batches = np.asarray(state.get("batches", ()))
        if batches.shape != (self.num_workers,):
            raise ValueError(f"a saved split of shape {batches.shape} does not fit {self.num_workers} workers")
        for name in self._STATE:
            if name in state:
                setattr(self, name, state[name])

    def rejoin(self, state, index, global_batch):
        """Continue from `state()` of another set of workers; new worker j was old worker `index[j]` (-1: new).

        Call after `start` for the new set. Per-worker estimates follow their
        workers and newcomers get the mean of the others (lbbsp.membership);
        the new split comes from them.
        """
        old = np.asarray(state["batches"], dtype=np.float64)
        self.load_state(remap_workers(state, index, old.size, self._EMPTY))
        if hasattr(self, "_global"):
            self._global = int(global_batch)
        self.batches = self._rejoin_split(remap_workers(old, index, old.size), int(global_batch))

    def _rejoin_split(self, shares, global_batch):
        """The split after a membership change: the old batches as shares (a newcomer's is their mean)."""
        return self._allocate(shares, global_batch)

    def _allocate(self, speeds, global_batch, offsets=None):
        """lbbsp.allocation.allocate with this run's bounds and batch grid."""
        return allocate(speeds, global_batch, self.b_min, self.b_max, offsets=offsets, multiple=self.multiple)

    def start(self, num_workers, global_batch, b_min=1, b_max=None, multiple=1, finest_multiple=None):
        """Reset for a new training run; return the batches of the first step.

        Batches stay within [b_min, b_max] and, with `multiple` > 1, on multiples of it
        (lbbsp.allocation's batch grid). A policy that predicts each worker's best batch may refine the
        grid down to `finest_multiple` (a divisor of `multiple`; None keeps `multiple`) where the grid's
        floor holds a worker above it (lbbsp.allocation.finer_grid).
        """
        validate_bounds(num_workers, global_batch, b_min, b_max, multiple)
        finest = multiple if finest_multiple is None else finest_multiple
        if isinstance(finest, bool) or not isinstance(finest, (int, np.integer)) or finest < 1 or multiple % finest:
            raise ValueError(f"finest_multiple={finest_multiple!r} is not allowed: give None or a divisor of "
                             f"multiple={multiple!r}")
        self.num_workers, self.b_min, self.b_max, self.multiple = int(num_workers), int(b_min), b_max, int(multiple)
        self.finest_multiple = int(finest)
        self.batches = self._allocate(np.ones(num_workers), global_batch)
        return self.batches.copy()

    def resize(self, global_batch):
        """Keep the current shares but for a step whose global batch differs (end of an epoch)."""
        if int(global_batch) != int(self.batches.sum()):
            return self._allocate(self.batches.astype(np.float64), global_batch)
        return self.batches.copy()

    def after_step(self, stats, next_global_batch):
        """Batches for the next step, given the step that just ended."""
        return self.resize(next_global_batch)

    def after_epoch(self, next_global_batch):
        """Batches for the first step of the next epoch."""
        return self.resize(next_global_batch)


class EqualPolicy(Policy):
    """Plain Horovod BSP: b_i = B / N (the remainder to the lowest ranks when B is not a multiple of N)."""

    name = "equal"


class FixedPolicy(Policy):
    """Batches proportional to fixed per-worker shares known in advance (e.g. the GPUs' relative speeds)."""

    name = "fixed"

    def __init__(self, shares):
        shares = np.asarray(shares, dtype=np.float64).reshape(-1)
        if shares.size == 0 or not np.all(np.isfinite(shares) & (shares > 0)):
            raise ValueError(f"shares={shares.tolist()!r} is not allowed: give one positive number per worker")
        self.shares = shares

    def start(self, num_workers, global_batch, b_min=1, b_max=None, multiple=1, finest_multiple=None):
        if self.shares.size != num_workers:
            raise ValueError(
                f"shares={self.shares.tolist()!r} is not allowed with {num_workers} workers: give {num_workers} shares"
            )
        super().start(num_workers, global_batch, b_min, b_max, multiple, finest_multiple)
        self.batches = self._allocate(self.shares, global_batch)
        return self.batches.copy()


class StaticPolicy(Policy):
    """Profile once at the start (mean speed over `profile_steps` steps), then keep that allocation."""

    name = "static"
    _STATE = ("batches", "_samples", "_fixed")

    def __init__(self, profile_steps=5):
        if not isinstance(profile_steps, int) or profile_steps < 1:
            raise ValueError(f"profile_steps={profile_steps!r} is not allowed: it must be an integer >= 1")
        self.profile_steps = profile_steps

    def start(self, num_workers, global_batch, b_min=1, b_max=None, multiple=1, finest_multiple=None):
        self._samples = []
        self._fixed = False
        return super().start(num_workers, global_batch, b_min, b_max, multiple, finest_multiple)

    def after_step(self, stats, next_global_batch):
        if not self._fixed:
            self._samples.append(stats.speed)
            if len(self._samples) >= self.profile_steps:
                speeds = np.nanmean(np.vstack(self._samples), axis=0)
                self.batches = self._allocate(speeds, int(self.batches.sum()))
                self._fixed = True
        return self.resize(next_global_batch)


class DBSPolicy(Policy):
    """DBS: once per epoch, shares p_i <- (p_i / t_i) / sum_j (p_j / t_j) from the epoch's pure compute time."""

    name = "dbs"
    _STATE = ("batches", "_shares", "_compute", "_samples", "_global")

    def start(self, num_workers, global_batch, b_min=1, b_max=None, multiple=1, finest_multiple=None):
        batches = super().start(num_workers, global_batch, b_min, b_max, multiple, finest_multiple)
        self._shares = batches / batches.sum()
        self._compute = np.zeros(num_workers)
        self._samples = np.zeros(num_workers)
        self._global = int(global_batch)
        return batches

    def after_step(self, stats, next_global_batch):
        self._compute += np.nan_to_num(stats.compute, nan=0.0)
        self._samples += stats.batches
        return self.resize(next_global_batch)

    def after_epoch(self, next_global_batch):
        if (self._compute > 0).all():
            # Per-sample time of each worker over the epoch; dividing p_i by it gives the new share.
            per_sample = self._compute / np.maximum(self._samples, 1)
            raw = self._shares / per_sample
            self._shares = raw / raw.sum()
            self.batches = self._allocate(self._shares, self._global)
        self._compute[:] = 0.0
        self._samples[:] = 0.0
        return self.resize(next_global_batch)


class PIDPolicy(Policy):
    """Dynamic batching with a PID controller on the compute-time imbalance, with a deadband.

    The error of worker i is e_i = log(t_mean / t_i); its batch is multiplied by
    exp(kp*e_i + ki*sum(e_i) + kd*delta(e_i)), then renormalised to the global
    batch and clamped to the bounds. With kp=1 and ki=kd=0 this is the
    literature's b_i <- b_i * t_mean / t_i. The update is applied only when some
    worker's relative change exceeds `deadband` (0.2 in the original code).
    """

    name = "pid"
    _STATE = ("batches", "_integral", "_last_error", "_window", "_global")

    def __init__(self, kp=1.0, ki=0.0, kd=0.0, deadband=0.2, every=1):
        for name, value in (("kp", kp), ("ki", ki), ("kd", kd)):
            if not isinstance(value, (int, float)) or value < 0:
                raise ValueError(f"{name}={value!r} is not allowed: it must be a number >= 0")
        if not isinstance(deadband, (int, float)) or not 0 <= deadband < 1:
            raise ValueError(f"deadband={deadband!r} is not allowed: it must be a number in [0, 1)")
        if not isinstance(every, int) or every < 1:
            raise ValueError(f"every={every!r} is not allowed: it must be an integer >= 1")
        self.kp, self.ki, self.kd, self.deadband, self.every = kp, ki, kd, deadband, every

    def start(self, num_workers, global_batch, b_min=1, b_max=None, multiple=1, finest_multiple=None):
        batches = super().start(num_workers, global_batch, b_min, b_max, multiple, finest_multiple)
        self._integral = np.zeros(num_workers)
        self._last_error = np.zeros(num_workers)
        self._window = []
        self._global = int(global_batch)
        return batches

    def after_step(self, stats, next_global_batch):
        self._window.append(np.asarray(stats.compute, dtype=np.float64))
        if len(self._window) >= self.every:
            times = np.nanmean(np.vstack(self._window), axis=0)
            self._window = []
            if np.isfinite(times).all() and (times > 0).all():
                error = np.log(times.mean() / times)
                self._integral += error
                gain = self.kp * error + self.ki * self._integral + self.kd * (error - self._last_error)
                self._last_error = error
                proposal = self._allocate(stats.batches * np.exp(gain), self._global)
                change = np.abs(proposal - self.batches) / self.batches
                if change.max() > self.deadband:
                    self.batches = proposal
        return self.resize(next_global_batch)


class LBBSPPolicy(Policy):
    """LB-BSP on a step-time model: minimise the predicted slowest finish time, with hysteresis and damping.

    Every rank fits the same per-worker model t_i(b) = (k_i + b) / v_i from the
    gathered (batch, compute time) pairs (lbbsp.steptime). Each worker's
    forecast of its next batch-free speed v_i, made by its own predictor from
    its speed history up to the step just measured and its telemetry, and
    exchanged in that step's allreduce, is used where valid; the model's last
    measured batch-free speed stands in for a missing one, and for a forecast
    further from it than that worker's noise explains (the model's change
    threshold, max(change, 4 x spread)): a smoothing or learned forecaster
    may trail a jump the measurement already shows. The split
    minimising max_i t_i(b_i) is then taken if it beats the current one by
    more than `min_gain` (lbbsp.allocation.Rebalancer). No worker's batch
    moves by more than a factor `max_change` in one decision (a trust region
    around the batches the model was fitted on), unless the model just
    measured that worker's speed jump: then it may move by the measured
    ratio. With `shrink_noise` (default), a worker's departure from the
    speeds the current split balances counts only by how far it exceeds
    that worker's per-step noise (lbbsp.allocation.shrink_to_current, the
    noise measured by the model): identical workers keep their split through
    timing noise, different ones move at once. With `variance_aware=True`,
    the speeds are corrected by the forecasts' learnt bias and the split
    balances a high quantile of each worker's time instead of its mean,
    giving slack to the workers whose planned speeds have been furthest
    from the speeds they then ran at (lbbsp.uncertainty,
    lbbsp.allocation.tail_speeds): with many workers the largest error sets
    the pace. With "auto" (the default), every step plans the
    `candidates` (by default all of CANDIDATES: the forecasts as they
    are, corrected, the quantile of the corrected, and the forecasts
    without noise shrinkage, which wins where contention drifts by less
    than the per-step noise), scores each against the speeds then
    measured, and takes the one that has lately been fastest by more than
    a margin (lbbsp.hindsight); the forecasts as they are until the scores
    say otherwise. False always balances the forecasts as they are.
    `model` takes a StepTimeModel or a dict of its arguments.

    The fixed costs k_i are identified only where batches move (lbbsp.steptime),
    and a worker held at a small batch with k_i unknown (0) looks slower
    than it is, by (k_i + b_i) / b_i. So for its first `calibration`
    decisions the policy dithers the split it runs: the workers whose k is
    not yet identified trade `dither` of their batch in pairs, the sign
    flipping every step, with the total unchanged (lbbsp.allocation.dithered).
    The split it plans with stays undithered, and the dither ends for good
    once every worker's k is identified.
    """

    name = "lbbsp"
    uses_forecast = True
    #: Decisions in a row that must find the grid's floor above a worker's best batch before the grid is refined
    #: (down to the `finest_multiple` given to `start`).
    REFINE_AFTER = 3
    _STATE = ("batches", "_speeds", "_shadows", "_calibrating")
    _EMPTY = dict(StepTimeModel.EMPTY, **PlanningError.EMPTY)
    #: The candidates variance_aware="auto" may score (lbbsp.hindsight): the forecasts, corrected by their
    #: learnt bias, the quantile of the corrected, and the forecasts without the noise shrinkage.
    CANDIDATES = ("forecast", "corrected", "quantile", "unshrunk")
    #: Decisions whose split is dithered, by default, to identify the fixed costs.
    CALIBRATION = 8

    def state(self):
        return dict(super().state(), model=self.model.state(), rebalancer=self.rebalancer.state(),
                    errors=self.errors.state(), choice=self.choice.state())

    def load_state(self, state):
        super().load_state(state)
        self.model.load_state(state["model"])
        self.rebalancer.load_state(state["rebalancer"])
        if "errors" not in state:
            raise ValueError("an lbbsp state without planning errors cannot be loaded (saved by an older version)")
        self.errors.load_state(state["errors"])
        # A state saved before the choice was scored, or when it chose among other candidates, starts it anew.
        if len(state.get("choice", {}).get("scores", ())) == len(self.candidates):
            self.choice.load_state(state["choice"])

    def __init__(self, min_gain=0.02, min_step=0.125, model=None, variance_aware="auto", max_change=2.0,
                 shrink_noise=True, candidates=CANDIDATES, calibration=CALIBRATION, dither=0.25, gate=True,
                 free_mask=True):
        # gate, free_mask: ablation switches (docs/ablation.md), each one mechanism off when False.
        self.gate, self.free_mask = bool(gate), bool(free_mask)
        self.rebalancer = Rebalancer(min_gain, min_step)
        if isinstance(calibration, bool) or not isinstance(calibration, int) or calibration < 0:
            raise ValueError(f"calibration={calibration!r} is not allowed: give the number of decisions (an integer "
                             ">= 0) whose split is dithered to identify the fixed costs")
        if isinstance(dither, bool) or not isinstance(dither, (int, float)) or not 0.0 < dither < 1.0:
            raise ValueError(f"dither={dither!r} is not allowed: give the share of a batch traded, in (0, 1)")
        self.calibration, self.dither = calibration, float(dither)
        names = tuple(candidates) if isinstance(candidates, (list, tuple)) else ()
        if not names or names[0] != "forecast" or len(set(names)) < len(names) or \
                any(name not in self.CANDIDATES for name in names):
            raise ValueError(f"candidates={candidates!r} is not allowed: give a list of distinct names from "
                             f"{self.CANDIDATES}, \"forecast\" first")
        self.candidates = names
        self._unshrunk = np.array([name == "unshrunk" for name in names])
        if not isinstance(shrink_noise, bool):
            raise ValueError(f"shrink_noise={shrink_noise!r} is not allowed: it must be True or False")
        self.shrink_noise = shrink_noise
        if isinstance(max_change, bool) or not isinstance(max_change, (int, float)) or not max_change > 1:
            raise ValueError(f"max_change={max_change!r} is not allowed: it must be a number > 1")
        self.max_change = float(max_change)
        if not (isinstance(variance_aware, bool) or isinstance(variance_aware, str) and variance_aware == "auto"):
            raise ValueError(f"variance_aware={variance_aware!r} is not allowed: give True, False or 'auto'")
        self.variance_aware = variance_aware
        self.choice = Hindsight(len(self.candidates))
        if model is None or isinstance(model, dict):
            model = StepTimeModel(**(model or {}))
        if not isinstance(model, StepTimeModel):
            raise ValueError(f"model={model!r} is not allowed: give a lbbsp.steptime.StepTimeModel or a dict of its arguments")
        self.model = model
        self.errors = PlanningError()

    def start(self, num_workers, global_batch, b_min=1, b_max=None, multiple=1, finest_multiple=None):
        batches = super().start(num_workers, global_batch, b_min, b_max, multiple, finest_multiple)
        self.model.start(num_workers)
        self.rebalancer.start(num_workers)
        self.errors.start(num_workers)
        self.choice.start()
        self._speeds = self._shadows = None
        self._bounds = (None, None, None, None)
        self._calibrating = self.calibration
        self._finer_for, self._finer_to = 0, multiple  # decisions in a row that asked for a finer grid; the coarsest
        return batches

    def speeds(self, forecast):
        """Batch-free speeds for the next step: the forecasts where valid and consistent with the last
        measurement, else the last measured ones."""
        forecast = np.asarray(forecast, dtype=np.float64)
        measured = self.model.speeds
        with np.errstate(all="ignore"):
            trails = np.abs(np.log(forecast / measured)) > self.model.threshold  # False where nothing was measured
        good = np.isfinite(forecast) & (forecast > 0) & (~trails if self.gate else True)
        return sanitize(np.where(good, forecast, measured))

    def after_step(self, stats, next_global_batch):
        before = self.model.speeds
        self.model.update(stats.batches, stats.compute)
        if self.variance_aware:
            self.errors.observe(stats.step, self.model.speeds)
        if self.variance_aware == "auto":  # only "auto" proposes candidates to score
            self.choice.observe(stats.step, self.model.speeds, self.model.offsets)
        with np.errstate(all="ignore"):
            jump = np.exp(np.abs(np.log(before / self.model.speeds)))
        trust = np.where(self.model.changed & np.isfinite(jump), np.maximum(self.max_change, jump), self.max_change)
        total = int(self.batches.sum())
        if total != self._bounds[0]:
            _, _, upper = validate_bounds(self.num_workers, total, self.b_min, self.b_max)
            lower = np.full(self.num_workers, self.b_min, dtype=np.int64)
            # The bounds as the grid rounds them, in samples: a worker at 8 with q = 8 and b_min = 1 is at its floor.
            on_grid = np.stack(grid_units(lower, upper, self.multiple)) * self.multiple
            self._bounds = (total, lower, upper, on_grid)
        _, lower, upper, (grid_lower, grid_upper) = self._bounds
        speeds = self.speeds(stats.forecast)
        # The workers whose departure from the current split's balance may be taken for noise: not at a bound
        # (the split is not balanced for them there), not just measured to jump.
        free = (self.batches > grid_lower) & (self.batches < grid_upper) & ~self.model.changed
        if not self.free_mask:
            free = np.ones_like(free)
        if self.variance_aware:
            speeds = self._plan(speeds, stats.target, total, lower, upper, free)
        elif self.shrink_noise:
            speeds = shrink_to_current(speeds, self.model.offsets, self.batches, self.model.noise, free)
        if not self.rebalancer.keeps(self.batches, speeds, self.model.offsets, lower, jumped=self.model.changed,
                                     multiple=self.multiple):
            target = allocate_clean(speeds, self.model.offsets, total, lower, upper, near=self.batches,
                                    max_change=trust, multiple=self.multiple)
            self.batches = self.rebalancer.update(self.batches, target, speeds, self.model.offsets, lower, upper,
                                                  jumped=self.model.changed, multiple=self.multiple)
        self._speeds = speeds
        if self.multiple > self.finest_multiple:
            self._refine(speeds, total, lower, upper, at_floor=np.any(self.batches <= grid_lower))
        sizes = self.resize(next_global_batch)
        unknown = ~self.model.identified if self._calibrating > 0 else None
        if unknown is not None and not unknown.any():
            self._calibrating = 0
        elif unknown is not None:
            self._calibrating -= 1
            if int(sizes.sum()) == total:
                sign = 1 if self._calibrating % 2 else -1
                sizes = dithered(sizes, unknown, sign, self.dither, lower, upper, self.multiple)
        return sizes

    def _plan(self, speeds, target, total, lower, upper, free):
        """The speeds to split by when variance-aware: the quantile of the corrected forecasts (True) or the
        candidate lbbsp.hindsight has found fastest ("auto", whose candidate splits are remembered for
        `target`), shrunk towards the current split for its `free` workers where the noise shrinkage applies
        (not to the "unshrunk" candidate)."""
        corrected = self.errors.plan(target, speeds, jumped=self.model.changed)
        quantile = tail_speeds(corrected, self.errors.spread)
        offsets, noise = self.model.offsets, self.model.noise
        if self.variance_aware is True:
            return shrink_to_current(quantile, offsets, self.batches, noise, free) if self.shrink_noise else quantile
        named = {"forecast": speeds, "corrected": corrected, "quantile": quantile, "unshrunk": speeds}
        candidates = [named[name] for name in self.candidates]
        best = self.choice.best
        shadows = self._shadows
        if shadows is None or shadows.shape != (len(candidates), self.num_workers):
            shadows = np.tile(self.batches.astype(np.float64), (len(candidates), 1))
        if self.shrink_noise:
            # Each candidate shrunk towards its own last continuous split, and the chosen one, as a last row,
            # towards the split in use: one call for all rows.
            shadow_free = (shadows > lower) & (shadows < upper) & ~self.model.changed
            shadow_free[self._unshrunk] = False
            rows = shrink_to_current(np.array(candidates + [candidates[best]]), offsets,
                                     np.concatenate([shadows, self.batches[None]]), noise,
                                     np.concatenate([shadow_free, (free & ~self._unshrunk[best])[None]]))
            planned, chosen = rows[:-1], rows[-1]
        else:
            planned, chosen = np.array(candidates), candidates[best]
        # A new array: a saved state() keeps the one it was given.
        self._shadows = continuous_split(offsets, planned, total, lower, upper)[0]
        if target is not None:
            self.choice.propose(target, self._shadows)
        return chosen

    def _refine(self, speeds, total, lower, upper, at_floor):
        """Refine the batch grid once its floor has held a worker above its best batch in REFINE_AFTER
        decisions in a row, to the coarsest grid all of them asked for; never back to a coarser one."""
        finer = self.multiple
        if at_floor:
            best, _ = continuous_split(self.model.offsets, speeds, total, lower, upper)
            finer = finer_grid(best, lower, upper, self.multiple, self.finest_multiple)
        if finer == self.multiple:
            self._finer_for = 0
            return
        self._finer_to = max(self._finer_to, finer) if self._finer_for else finer
        self._finer_for += 1
        if self._finer_for < self.REFINE_AFTER:
            return
        slow = int(np.argmin(best))
        log.info("lbbsp: batch grid %d -> %d: worker %d is best at %.1f samples, below the grid's floor",
                 self.multiple, self._finer_to, slow, best[slow])
        self.multiple, self._bounds, self._finer_for = self._finer_to, (None, None, None, None), 0

    def _rejoin_split(self, shares, global_batch):
        if self._speeds is None:
            return super()._rejoin_split(shares, global_batch)
        return self._allocate(self._speeds, global_batch, offsets=self.model.offsets)

    def resize(self, global_batch):
        if int(global_batch) == int(self.batches.sum()) or self._speeds is None:
            return super().resize(global_batch)
        return self._allocate(self._speeds, global_batch, offsets=self.model.offsets)


POLICIES = {cls.name: cls for cls in (EqualPolicy, StaticPolicy, DBSPolicy, PIDPolicy, LBBSPPolicy)}


def make_policy(policy):
    """A Policy from an instance or a name in POLICIES."""
    if isinstance(policy, Policy):
        return policy
    if isinstance(policy, str) and policy in POLICIES:
        return POLICIES[policy]()
    raise ValueError(f"policy={policy!r} is not allowed: give a Policy or one of {sorted(POLICIES)}")
