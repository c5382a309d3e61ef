"""The decision core with one mechanism switched off, for docs/ablation.md (simulator and GPU profile).

    python -m benchmarks.simulate --workers 4,64 --policies lbbsp-narx,abl-mean,abl-nohyst,mean-oracle
    python -m benchmarks.gpusim --policies equal,lbbsp-narx,abl-nofloor,abl-nosetup,mean-oracle

Each entry subclasses the shipped policy or model and overrides one thing,
so the rest is the code users run. Live runs of the release before this
core were ablated with that release's own switches (docs/ablation.md).
"""
import numpy as np

from lbbsp.allocation import split
from lbbsp.policies import LBBSPPolicy
from lbbsp.steptime import StepTimeModel

__all__ = ["ABLATIONS"]


class _MeanOnly(LBBSPPolicy):
    """No hindsight choice: always the split that balances the planned speeds."""

    def _choose(self, stats, curves):
        return split(int(self.batches.sum()), self.bounds, *curves), curves


class _BalancedFirst(LBBSPPolicy):
    """The balanced split in use at first, until equal batches have been faster (before 2026-11-30)."""

    def start(self, global_batch, bounds):
        batches = super().start(global_batch, bounds)
        self._chosen = 1
        return batches


class _NormalTail(LBBSPPolicy):
    """The tail split at the normal quantile alone (`largest_normal(N)` spreads, unscaled)."""

    TAIL_SCALE = 1.0


class _Spread50(LBBSPPolicy):
    """The tail's spread a running mean over about 50 steps that starts at zero (before 2026-11-27)."""

    SPREAD_RATE = 0.02

    @property
    def planning_spread2(self):
        return self._spread[1]


class _NoSetupCost(LBBSPPolicy):
    """New batch shapes taken to cost nothing: moves pass on min_gain alone."""

    def setup_cost(self, target):
        return 0.0


class _NoFreeSplits(LBBSPPolicy):
    """No free move to the equal split or the last split bought while a move that needs new shapes waits."""

    def _free(self, curves, now, also=None):
        return None


class _Undecayed(LBBSPPolicy):
    """A lasting move's saving counted over the whole horizon, whether the workers' pattern of speeds lasts or not."""

    def _lasting_steps(self, horizon):
        return horizon


class _NoLastingSpeeds(_Undecayed):
    """Moves whose set-up costs more than a step split and valued at the planned speeds over the whole horizon: no
    lasting speeds, so no pattern whose persistence cuts the horizon."""

    def _move(self, target, mean, stats):
        windows = self._windows
        self._windows = np.full_like(windows, np.nan)  # where no lasting speed is known, the planned one stands in
        try:
            return super()._move(target, mean, stats)
        finally:
            self._windows = windows


class _NoiselessValue(LBBSPPolicy):
    """A lasting move valued in the slowest worker's time at the curves, without the workers' noise."""

    def _saving(self, split_, curves, noise=None):
        return super()._saving(split_, curves)


class _UnpooledModel(StepTimeModel):
    POOL_FROM = np.inf


class _FloorlessModel(StepTimeModel):
    def _update(self, b, t, new):
        super()._update(b, t, new)
        self.floors = np.zeros_like(self.floors)


def _with_model(model_class):
    def make():
        policy = LBBSPPolicy()
        policy.model = model_class()
        return policy
    return make


#: name: (what is switched off, a policy factory, the predictor)
ABLATIONS = {
    "abl-mean": ("the choice in hindsight (of the equal, balanced and tail splits)", _MeanOnly, "narx"),
    "abl-balancedfirst": ("equal batches in use at first (the balanced split instead)", _BalancedFirst, "narx"),
    "abl-normal": ("the tails' scale (TAIL_SCALE = 1: normal tails)", _NormalTail, "narx"),
    "abl-spread50": ("the tail spread's 200-step memory and its debiasing (50 steps from zero)", _Spread50, "narx"),
    "abl-nosetup": ("the set-up cost of new batch shapes (ski rental and horizon)", _NoSetupCost, "narx"),
    "abl-unpooled": ("pooling of the fixed costs across workers", _with_model(_UnpooledModel), "narx"),
    "abl-nofree": ("the free move to a split already set up while a new shape waits", _NoFreeSplits, "narx"),
    "abl-nolasting": ("lasting speeds (window means) for moves whose set-up costs more than a step", _NoLastingSpeeds,
                      "narx"),
    "abl-nodecay": ("the horizon cut to how long the workers' pattern of speeds lasts", _Undecayed, "narx"),
    "abl-nonoise": ("a lasting move valued in the expected slowest time under the workers' noise", _NoiselessValue,
                    "narx"),
    "abl-nomean": ("the running mean speed as a candidate on GPU workers (mean_rate = 1)",
                   lambda: LBBSPPolicy(model={"mean_rate": 1.0}), "narx"),
    "abl-nofloor": ("the floor of the step-time model", _with_model(_FloorlessModel), "narx"),
    "abl-nohyst": ("hysteresis (min_gain = 0)", lambda: LBBSPPolicy(min_gain=0.0), "narx"),
    "abl-noprior": ("the GPU prior of the fixed cost k (k = 0 until fitted)",
                    lambda: LBBSPPolicy(model={"offset": 0.0}), "narx"),
    "abl-nochange": ("speed-change detection (every test against noise: change, floor, costly first visit)",
                     lambda: LBBSPPolicy(model={"change": 1e9, "sigmas": 0.0}), "narx"),
}
