"""Batch-size policies: the next step's per-worker batch sizes from the gathered measurements (`StepStats`).

Framework-free and deterministic: every rank feeds the same numbers and reaches the same integer split.
`LBBSPPolicy` is lbbsp's; the others are the baselines it is measured against.
"""
import dataclasses
import statistics

import numpy as np

from .allocation import Bounds, expected_slowest, sanitize, split, step_times
from .checks import integer, number
from .membership import remap
from .steptime import StepTimeModel

__all__ = ["StepStats", "proportional", "largest_normal", "Policy", "EqualPolicy", "FixedPolicy", "StaticPolicy",
           "DBSPolicy", "PIDPolicy", "LBBSPPolicy", "POLICIES", "make_policy"]


@dataclasses.dataclass(frozen=True)
class StepStats:
    """What every worker measured in one step (arrays of length N). `step`: steps since training began; `target`:
    the step being decided; `horizon`: steps from it to its epoch's end (None: unknown); `elapsed`: steps since the
    previous decision, which the measured step stands for (0: no decision from this step)."""

    step: int
    batches: np.ndarray
    compute: np.ndarray
    forecast: np.ndarray
    target: int = 0
    horizon: int = None
    elapsed: int = 1

    @property
    def speed(self):
        """Measured speed b_i / compute_i (NaN where compute is not positive)."""
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(self.compute > 0, self.batches / self.compute, np.nan)


def largest_normal(n):
    """The mean of the largest of n standard normal draws (Blom's approximation: within 5% from n = 2, within 1%
    from n = 8; 0 for one draw)."""
    return statistics.NormalDist().inv_cdf((n - 0.375) / (n + 0.25))


def proportional(total, bounds, shares):
    """Batches of `total` proportional to `shares` (no fixed costs, no floors), within `bounds` and on its grid."""
    zeros = np.zeros(bounds.num_workers)
    return split(int(total), bounds, sanitize(shares, 1.0), zeros, zeros)


class Policy:
    """Base class: equal batches (plain BSP) until a subclass decides otherwise."""

    name = "base"
    #: True when the policy needs per-rank speed forecasts (the callback then runs a predictor).
    uses_forecast = False
    #: Per-worker state fields (lbbsp.membership) besides the split, with what a newcomer starts from.
    PER_WORKER = {}

    def start(self, global_batch, bounds):
        """Reset for a new training run within `bounds` (lbbsp.allocation.Bounds); the first step's batches."""
        if not isinstance(bounds, Bounds):
            raise ValueError(f"bounds={bounds!r} is not allowed: give a lbbsp.allocation.Bounds")
        self.bounds, self._equals = bounds, {}
        self.batches = self._equal(bounds.check(global_batch))
        return self.batches.copy()

    @property
    def num_workers(self):
        return self.bounds.num_workers

    def _split(self, shares, total):
        return proportional(total, self.bounds, shares)

    def _equal(self, total):
        """The equal split of `total` within the bounds (cached: lbbsp's policy proposes it at every decision)."""
        if total not in self._equals:
            self._equals[total] = self._split(np.ones(self.num_workers), total)
        return self._equals[total].copy()

    def resize(self, global_batch):
        """The current shares for a step whose global batch differs (the end of an epoch)."""
        if int(global_batch) != int(self.batches.sum()):
            return self._split(self.batches.astype(np.float64), global_batch)
        return self.batches.copy()

    def seen(self, batches):
        """The batches every worker ran in a step, also one whose timings are not used (warm-up)."""

    def prepare(self, warm_shapes=(), gpu=False):
        """Before training: the batch sizes every worker has set up; whether some worker trains on a GPU."""

    def surprised(self, stats):
        """Whether a step between decisions (lbbsp.controller's period) calls for a decision at once."""
        return False

    def after_step(self, stats, next_global_batch):
        """Batches for the next step, given the step that just ended."""
        return self.resize(next_global_batch)

    def after_epoch(self, next_global_batch):
        """Batches for the first step of the next epoch."""
        return self.resize(next_global_batch)

    def state(self):
        """The state between steps, for checkpoints (plain values and numpy arrays)."""
        return {"batches": self.batches.copy(), **{name: getattr(self, name) for name in self.PER_WORKER}}

    def load_state(self, state):
        """Continue from `state()` of the same kind of policy for the same number of workers."""
        batches = np.asarray(state.get("batches", ()), dtype=np.int64)
        if batches.shape != (self.num_workers,):
            raise ValueError(f"a saved split of shape {batches.shape} does not fit {self.num_workers} workers")
        self.batches = batches.copy()
        for name in self.PER_WORKER:
            setattr(self, name, np.array(state[name]))

    def rejoin(self, state, index, global_batch):
        """Continue (after `start`) from `state()` of another set of workers; new worker j was old worker `index[j]`
        (-1: new). Per-worker state follows its worker; the old batches become shares, a newcomer's their mean."""
        moved = remap(state, index, dict(self.PER_WORKER, batches="mean"))
        self.load_state(dict(moved, batches=self.batches))
        self.batches = self._split(moved["batches"].astype(np.float64), global_batch)


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

    def start(self, global_batch, bounds):
        if self.shares.size != bounds.num_workers:
            raise ValueError(f"shares={self.shares.tolist()!r} is not allowed with {bounds.num_workers} workers: "
                             f"give {bounds.num_workers} shares")
        super().start(global_batch, bounds)
        self.batches = self._split(self.shares, global_batch)
        return self.batches.copy()


class StaticPolicy(Policy):
    """Profile once at the start (mean speed over `profile_steps` steps), then keep that split."""

    name = "static"
    PER_WORKER = {"_speeds": 0.0}

    def __init__(self, profile_steps=5):
        self.profile_steps = integer("profile_steps", profile_steps, 1)

    def start(self, global_batch, bounds):
        self._speeds, self._steps = np.zeros(bounds.num_workers), 0
        return super().start(global_batch, bounds)

    def after_step(self, stats, next_global_batch):
        if self._steps < self.profile_steps:
            self._speeds = self._speeds + np.nan_to_num(stats.speed) / self.profile_steps
            self._steps += 1
            if self._steps == self.profile_steps:
                self.batches = self._split(self._speeds, int(self.batches.sum()))
        return self.resize(next_global_batch)

    def state(self):
        return dict(super().state(), steps=self._steps)

    def load_state(self, state):
        super().load_state(state)
        self._steps = int(state["steps"])


class DBSPolicy(Policy):
    """DBS: once per epoch, shares p_i <- (p_i / t_i) / sum_j (p_j / t_j) from the epoch's pure compute time."""

    name = "dbs"
    PER_WORKER = {"_compute": 0.0, "_samples": 0.0}

    def start(self, global_batch, bounds):
        self._compute, self._samples = np.zeros(bounds.num_workers), np.zeros(bounds.num_workers)
        self._global = int(global_batch)
        return super().start(global_batch, bounds)

    def after_step(self, stats, next_global_batch):
        self._compute = self._compute + np.nan_to_num(stats.compute, nan=0.0)
        self._samples = self._samples + stats.batches
        return self.resize(next_global_batch)

    def after_epoch(self, next_global_batch):
        if (self._compute > 0).all():
            # A worker's share over its per-sample time of the epoch is its new share.
            shares = self.batches / (self._compute / np.maximum(self._samples, 1))
            self.batches = self._split(shares, self._global)
        self._compute, self._samples = np.zeros(self.num_workers), np.zeros(self.num_workers)
        return self.resize(next_global_batch)


class PIDPolicy(Policy):
    """A PID controller on the compute-time imbalance: worker i's batch times exp(kp e_i + ki sum(e_i) + kd delta(e_i)),
    e_i = log(t_mean / t_i), renormalised; kp=1, ki=kd=0 is the literature's b_i <- b_i t_mean / t_i. Applied only
    when some worker's batch changes by more than `deadband` (0.2 in the original code)."""

    name = "pid"
    PER_WORKER = {"_integral": 0.0, "_last_error": 0.0}

    def __init__(self, kp=1.0, ki=0.0, kd=0.0, deadband=0.2):
        self.kp, self.ki, self.kd = (number(n, v) for n, v in (("kp", kp), ("ki", ki), ("kd", kd)))
        self.deadband = number("deadband", deadband, high=1.0)

    def start(self, global_batch, bounds):
        self._integral, self._last_error = np.zeros(bounds.num_workers), np.zeros(bounds.num_workers)
        return super().start(global_batch, bounds)

    def after_step(self, stats, next_global_batch):
        times = np.asarray(stats.compute, dtype=np.float64)
        if np.isfinite(times).all() and (times > 0).all():
            error = np.log(times.mean() / times)
            self._integral = self._integral + error
            gain = self.kp * error + self.ki * self._integral + self.kd * (error - self._last_error)
            self._last_error = error
            proposal = self._split(stats.batches * np.exp(gain), int(self.batches.sum()))
            if (np.abs(proposal - self.batches) / self.batches).max() > self.deadband:
                self.batches = proposal
        return self.resize(next_global_batch)


class LBBSPPolicy(Policy):
    """LB-BSP: the min-max split of the predicted step times, taken where it pays (docs/method.md).

    Each worker is planned at its forecast, last speed or running mean speed, whichever has lately been closest. Of
    the equal split and those balancing the planned speeds and their tails, the one lately fastest is the target,
    taken when it saves more than `min_gain` of the step and its new batch shapes pay for their set-up within
    `horizon` steps (None: the epoch's rest). `model`: StepTimeParams or a dict of its fields."""

    name = "lbbsp"
    uses_forecast = True
    PER_WORKER = {"_errors": "mean", "_spread": "mean", "_previous": np.nan, "_windows": "mean"}
    #: Weight of the newest step in the running |log error| of each worker's forecast, last and mean speed.
    SCORE_RATE = 0.1
    #: Weight of the newest step in a worker's running squared planning error (the tail's spread; debiased).
    SPREAD_RATE = 0.005
    #: The tail split plans each worker TAIL_SCALE `largest_normal(N)` spreads slow (where the largest of N normal
    #: draws falls, scaled for heavier tails).
    TAIL_SCALE = 1.45
    #: Weight of the newest step in each candidate split's running log time, and the margin by which another must
    #: beat the one in use to replace it.
    CHOICE_RATE, MARGIN = 0.05, 0.01
    #: Steps per window of the lasting speeds (each worker's mean log speed over a window), at which a move whose
    #: set-up costs more than a step is valued.
    WINDOW = 50
    #: Fixed normal draws per worker on which a lasting move's expected slowest time is estimated.
    DRAWS = 256

    def __init__(self, min_gain=0.02, horizon=None, model=None):
        self.min_gain = number("min_gain", min_gain, high=1.0)
        self.horizon = integer("horizon", horizon, 1, optional=True)
        self.model = StepTimeModel(model)

    def start(self, global_batch, bounds):
        self.model.start(bounds.num_workers)
        self._curves, self._regret, self._proposal = None, 0.0, None
        # Per worker: the running |log error| of forecast, last and mean speed; the tail spread's running weight and
        # squared error; the three candidates and the curves last planned with.
        self._errors, self._spread = np.zeros((3, bounds.num_workers)), np.zeros((2, bounds.num_workers))
        self._previous = np.full((6, bounds.num_workers), np.nan)
        # The candidate splits' scores, the one in use (0 equal, 1 balanced, 2 tail) and the splits proposed.
        self._scores, self._chosen, self._proposals, self._bought = np.zeros(3), 0, {}, None
        # Per worker: the current window's sum of log speeds, the means of the last two full windows.
        self._windows = np.vstack([np.zeros(bounds.num_workers), np.full((2, bounds.num_workers), np.nan)])
        self._window_steps = 0
        self._draws = np.random.default_rng(0).standard_normal((self.DRAWS, bounds.num_workers))
        return super().start(global_batch, bounds)

    def seen(self, batches):
        self.model.seen(batches)

    def prepare(self, warm_shapes=(), gpu=False):
        self.model.start(self.num_workers, gpu, self.batches.mean())
        for shape in warm_shapes:
            self.model.seen(np.full(self.num_workers, int(shape)))

    def curves(self, forecast, batches=None, compute=None):
        """(speeds, offsets, floors) to plan with: each worker's forecast, last or running mean speed, whichever has
        lately been closest to its measured speed. `batches`, `compute`: the step just measured, which also scores
        the planning error in time (a refitted fixed cost changes what a speed means)."""
        forecast = np.asarray(forecast, dtype=np.float64)
        last, measured = self.model.speeds, self.model.measured
        mean = np.where(np.isfinite(self.model.means), self.model.means, last)
        with np.errstate(all="ignore"):
            errors = np.log(self._previous[:3] / measured)
            if batches is not None:
                planned = step_times(batches, *self._previous[3:])
                errors = np.vstack([errors, np.where(np.isfinite(measured), np.log(planned / compute), np.nan)])
        seen = np.isfinite(errors)
        errors = np.where(seen, errors, 0.0)
        self._errors += np.where(seen[:3], self.SCORE_RATE * (np.abs(errors[:3]) - self._errors), 0.0)
        if batches is not None:
            squared = np.array([np.ones_like(errors[3]), errors[3] ** 2])
            self._spread += np.where(seen[3], self.SPREAD_RATE * (squared - self._spread), 0.0)
        speeds = sanitize(np.choose(self._choice(forecast), [last, forecast, mean]), 1.0)
        offsets, floors = sanitize(self.model.offsets, 0.0, positive=False), sanitize(self.model.floors, 0.0,
                                                                                       positive=False)
        self._previous = np.array([forecast, last, mean, speeds, offsets, floors])
        return speeds, offsets, floors

    def _choice(self, forecast):
        """Per worker, the candidate lately closest: 0 its last speed, 1 its forecast (where it is a speed), 2 its
        running mean; a tie goes to the lower number."""
        valid = np.isfinite(forecast) & (forecast > 0)
        return np.argmin([self._errors[1], np.where(valid, self._errors[0], np.inf), self._errors[2]], axis=0)

    @property
    def planned_with(self):
        """Per worker, what the latest curves planned it at: 0 its last speed, 1 its forecast, 2 its running mean."""
        return self._choice(self._previous[0])

    @property
    def planning_spread2(self):
        """Each worker's squared planning-error spread, debiased by the weight its mean has had (0 before any)."""
        weight, squared = self._spread
        return np.divide(squared, weight, out=np.zeros_like(squared), where=weight > 0)

    def tail(self, speeds):
        """`speeds` planned for the slowest of N draws: each at exp(-z s_i), z = TAIL_SCALE `largest_normal(N)`,
        s_i^2 its `planning_spread2`."""
        z = self.TAIL_SCALE * largest_normal(speeds.size)
        return speeds * np.exp(-z * np.sqrt(self.planning_spread2))

    def _choose(self, stats, curves):
        """Of the equal split and the splits balancing the planned speeds and their tails, the one lately fastest:
        each is scored once the step it was proposed for is measured (its slowest time at the measured speeds), and
        replaces the one in use when it beats it by MARGIN. Equal batches are in use at first: the scores favour the
        split that ran (measured, the others modelled), so among workers that differ only by noise it stays."""
        total = int(self.batches.sum())
        speeds, offsets, floors = curves
        tail = self.tail(speeds)
        balanced = [split(total, self.bounds, v, offsets, floors) for v in (speeds, tail)]
        splits = np.array([self._equal(total), *balanced])
        # The speeds the step measured; a worker whose step measured none (on its floor, say): its last.
        measured = np.where(np.isfinite(self.model.measured), self.model.measured, self.model.speeds)
        # The proposals in force in the measured step: the latest made for it or before.
        due = [step for step in self._proposals if step <= stats.step]
        proposed = self._proposals[max(due)] if due else None
        if proposed is not None and proposed.shape == splits.shape and np.isfinite(measured).all():
            times = step_times(proposed, measured, offsets, floors).max(axis=1)
            self._scores += self.CHOICE_RATE * (np.log(times / times[1]) - self._scores)
            best = int(np.argmin(self._scores))
            if self._scores[best] < self._scores[self._chosen] - self.MARGIN:
                self._chosen = best
        self._proposals = {step: s for step, s in self._proposals.items() if step > stats.step}
        self._proposals[stats.target] = splits
        return splits[self._chosen], (tail if self._chosen == 2 else speeds, offsets, floors)

    def surprised(self, stats):
        """A worker's step departed from the model's prediction beyond noise: its speed changed."""
        with np.errstate(all="ignore"):
            departure = np.abs(np.log(stats.compute / self.model.predict(stats.batches)))
        return bool(np.any(departure > self.model.threshold))

    def after_step(self, stats, next_global_batch):
        new = self.model.update(stats.batches, stats.compute)
        # A forecast sent with a first step at a batch size predates that step: not a candidate.
        forecast = np.where(new, np.nan, stats.forecast)
        self._window(stats.elapsed)
        mean = self.curves(forecast, stats.batches, stats.compute)
        target, self._curves = self._choose(stats, mean)
        target = self._move(target, mean, stats)
        if target is not None:
            self.batches, self._regret, self._proposal = target, 0.0, None
        return self.resize(next_global_batch)

    def _saving(self, split_, curves, noise=None):
        """Each worker's time in the current split, and the seconds `split_` saves at `curves` on the slowest worker
        it can move (one at its lower bound in both takes as long whatever the split). `noise` (`_noise`): the
        saving in the expected slowest time."""
        times, after = step_times(self.batches, *curves), step_times(split_, *curves)
        lower, _, q = self.bounds.grid(int(self.batches.sum()))
        free = (self.batches > lower * q) | (split_ > lower * q)
        if not free.any():
            return times, 0.0
        if noise is not None:
            now, later = expected_slowest([times[free], after[free]], noise[:, free])
            return times, now - later
        return times, times[free].max() - after[free].max()

    def _noise(self):
        """exp(s_i z) on the fixed draws z: each worker's time's scatter by its step-to-step spread s_i."""
        return np.exp(np.sqrt(self.model.spread2) * self._draws)

    def _move(self, target, mean, stats):
        """The split to take now, or None: `target` where it saves more than min_gain of the step and needs no new
        shape. One that does is taken once its set-up is paid twice: by the saving forgone while the move stayed
        worth making (ski rental), and by the saving over the horizon, both at the planned (`mean`) speeds. A move
        whose set-up costs more than a step is split and valued at the lasting speeds, in the expected slowest time
        under the workers' noise, over as much of the horizon as their pattern lasts; until it is bought, a split
        already set up is taken where it pays (`_free`)."""
        times, saving = self._saving(target, self._curves)
        setup = self.setup_cost(target)
        lasting = saving > self.min_gain * times.max() and setup > times.max()
        planned, now, noise = mean, times.max(), None
        if lasting:  # from here on, split and value at the lasting speeds
            speeds = np.exp(self._lasting_logs())
            mean = (sanitize(np.where(np.isfinite(speeds), speeds, mean[0]), 1.0), *mean[1:])
            target = split(int(self.batches.sum()), self.bounds, *mean)
            if not self.model.new_shapes(target).any():  # nothing to buy: the splits set up, at the planned speeds
                self._regret, self._proposal = 0.0, None
                return self._free(planned, now, target)
            noise = self._noise()  # once for every saving this decision values
            times, saving = self._saving(target, mean, noise)  # the set-up is the same: both splits need new shapes
        if not saving > self.min_gain * times.max() or setup == 0:
            self._regret, self._proposal = 0.0, None
            return target if saving > self.min_gain * times.max() else None
        if not lasting:  # a lasting move's are at `mean` already
            times, saving = self._saving(target, mean)
        # Still worth making while the previous proposal would save more than min_gain.
        same = self._proposal is not None and \
            self._saving(self._proposal, mean, noise)[1] > self.min_gain * times.max()
        self._regret, self._proposal = (self._regret if same else 0.0) + saving * stats.elapsed, target
        horizon = self.horizon or stats.horizon or np.inf
        horizon = self._lasting_steps(horizon) if lasting else horizon
        if self._regret >= setup and saving * horizon >= setup:
            self._bought = target
            return target
        return self._free(planned, now) if lasting else None

    def _window(self, elapsed):
        """Add the latest speeds (standing for `elapsed` steps) to the current window; a full one becomes the last."""
        logs = np.log(self.model.speeds)
        if elapsed < 1 or not np.isfinite(logs).all():
            return
        self._windows[0] += elapsed * logs
        self._window_steps += elapsed
        if self._window_steps >= self.WINDOW:
            self._windows = np.vstack([np.zeros_like(logs), self._windows[0] / self._window_steps, self._windows[1]])
            self._window_steps = 0

    def _lasting_logs(self):
        """Each worker's lasting log speed: the mean of the last full window, until then of the steps so far."""
        if np.isfinite(self._windows[1]).all() or self._window_steps == 0:
            return self._windows[1]
        return self._windows[0] / self._window_steps

    def _lasting_steps(self, horizon):
        """Steps of a lasting move's saving within `horizon`: the workers' pattern of lasting log speeds carries over
        from one window to the next with correlation rho, so a saving decays as rho^(steps / WINDOW) (rho is about 1
        between generations of GPUs, far less among co-tenants that come and go). Until two windows are full it is
        read between the last full window and the steps since, from half a window on; before that nothing lasts."""
        pair = self._windows[1:]
        if not np.isfinite(pair[1]).all():
            if not (np.isfinite(pair[0]).all() and 2 * self._window_steps >= self.WINDOW):
                return 0.0
            pair = np.vstack([self._windows[0] / self._window_steps, pair[0]])
        last, before = pair - np.mean(pair, axis=1, keepdims=True)
        norm = float(np.sqrt((last @ last) * (before @ before)))
        rho = float(last @ before) / norm if norm > 0 else 0.0  # identical speeds: no pattern to last
        if not rho > 0:
            return 0.0
        if rho >= 1.0:
            return horizon
        return min(horizon, self.WINDOW * (1.0 - rho ** (horizon / self.WINDOW)) / -np.log(rho))

    def _free(self, curves, now, also=None):
        """Of the equal split, the last split bought and `also`, those every worker has set up, the one saving most at
        `curves` where it saves more than min_gain of the step `now`."""
        total = int(self.batches.sum())
        free = [s for s in (self._equal(total), self._bought, also)
                if s is not None and s.sum() == total and not self.model.new_shapes(s).any()]
        savings = [self._saving(s, curves)[1] for s in free]
        return free[int(np.argmax(savings))] if free and max(savings) > self.min_gain * now else None

    def setup_cost(self, target):
        """Seconds the batch shapes of `target` that some worker has not run cost to set up (in parallel)."""
        return self.model.setup_cost() if self.model.new_shapes(target).any() else 0.0

    def resize(self, global_batch):
        if int(global_batch) == int(self.batches.sum()) or self._curves is None:
            return super().resize(global_batch)
        return split(int(global_batch), self.bounds, *self._curves)

    def state(self):
        return dict(super().state(), model=self.model.state(), choice=(self._scores.copy(), self._chosen),
                    proposals={step: s.copy() for step, s in self._proposals.items()}, regret=self._regret,
                    proposal=self._proposal, bought=self._bought, window_steps=self._window_steps)

    def load_state(self, state):
        super().load_state(state)
        self.model.load_state(state["model"])
        (self._scores, self._chosen), self._regret = state["choice"], state["regret"]
        self._proposals, self._proposal, self._bought = dict(state["proposals"]), state["proposal"], state["bought"]
        self._window_steps = state["window_steps"]

    def rejoin(self, state, index, global_batch):
        super().rejoin(dict(state, model=remap(state["model"], index, StepTimeModel.PER_WORKER)), index,
                       global_batch)
        self._proposals, self._proposal, self._regret, self._bought = {}, None, 0.0, None  # the old workers' splits
        if np.isfinite(self.model.speeds).any():  # the split from the workers' curves, a newcomer's the mean
            self.batches = split(int(global_batch), self.bounds, *self.curves(np.full(self.num_workers, np.nan)))


POLICIES = {cls.name: cls for cls in (EqualPolicy, StaticPolicy, DBSPolicy, PIDPolicy, LBBSPPolicy)}


def make_policy(policy):
    """A Policy from an instance or a name in POLICIES."""
    if isinstance(policy, Policy):
        return policy
    if isinstance(policy, str) and policy in POLICIES:
        return POLICIES[policy]()
    raise ValueError(f"policy={policy!r} is not allowed: give a Policy or one of {sorted(POLICIES)}")
