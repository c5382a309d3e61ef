"""PlanningError: the per-worker spread of log(measured / planned speed) behind the variance-aware split."""
import re

import numpy as np
import pytest

from lbbsp.allocation import allocate, tail_speeds
from lbbsp.membership import remap_workers
from lbbsp.policies import LBBSPPolicy, StepStats
from lbbsp.uncertainty import PlanningError


def _feed(errors, spreads, steps, rng):
    speeds = np.full(len(spreads), 100.0)
    for step in range(steps):
        errors.plan(step, speeds)
        errors.observe(step, speeds * np.exp(rng.normal(0.0, spreads)))


def test_spread_converges_to_the_error_distribution_of_each_worker():
    rng = np.random.default_rng(0)
    errors = PlanningError()
    errors.start(3)
    _feed(errors, np.array([0.02, 0.1, 0.3]), 2000, rng)
    np.testing.assert_allclose(errors.spread, [0.02, 0.1, 0.3], rtol=0.2)


def test_workers_alike_in_truth_share_one_spread_despite_sampling_noise():
    """16 workers with the same error distribution, heavy-tailed (rare stragglers): the spreads agree far
    more closely than the raw per-worker root mean squares do."""
    rng = np.random.default_rng(3)
    errors = PlanningError()
    errors.start(16)
    speeds = np.full(16, 100.0)
    for step in range(400):
        errors.plan(step, speeds)
        straggle = np.where(rng.random(16) < 0.01, np.log(0.5), 0.0)
        errors.observe(step, speeds * np.exp(rng.normal(0.0, 0.03, 16) + straggle))
    weight, _, squares, _ = errors.state()["_moments"]
    raw = np.sqrt(squares / weight)
    assert np.ptp(errors.spread) < 0.25 * np.ptp(raw), (errors.spread, raw)


def test_before_any_error_the_spread_is_zero_and_a_worker_without_errors_gets_the_clusters():
    errors = PlanningError()
    errors.start(3)
    assert errors.spread.tolist() == [0.0, 0.0, 0.0]
    errors.plan(0, [1.0, 1.0, 1.0])
    errors.observe(0, [np.exp(0.1), np.exp(-0.3), np.nan])  # worker 2 measured nothing
    spread = errors.spread
    assert spread[2] == pytest.approx(np.sqrt(0.05))  # the mean of 0.1^2 and 0.3^2
    # One error each says little: both are pulled towards the cluster's.
    assert 0.1 < spread[0] <= spread[2] <= spread[1] < 0.3


def test_only_the_step_a_plan_was_for_is_compared_and_stale_plans_are_dropped():
    errors = PlanningError()
    errors.start(1)
    errors.plan(5, [1.0])
    errors.plan(3, [1.0])
    errors.observe(4, [10.0])  # no plan for step 4; the plan for step 3 is stale now
    assert errors.spread.tolist() == [0.0] and list(errors.state()["_planned"]) == [5]
    errors.observe(5, [np.exp(0.5)])
    assert errors.spread[0] == pytest.approx(0.5)


def test_one_stalled_step_is_clipped():
    errors = PlanningError(max_error=2.0)
    errors.start(1)
    errors.plan(0, [100.0])
    errors.observe(0, [1e-6])
    assert errors.spread[0] == pytest.approx(2.0)


def test_state_round_trip_and_newcomers_start_without_errors():
    rng = np.random.default_rng(1)
    errors = PlanningError()
    errors.start(2)
    _feed(errors, np.array([0.05, 0.2]), 50, rng)
    errors.plan(50, [100.0, 100.0])
    copy = PlanningError()
    copy.start(2)
    copy.load_state(errors.state())
    np.testing.assert_array_equal(copy.spread, errors.spread)
    # Worker 1 leaves, a newcomer joins: its estimate is the cluster median until it has errors of its own.
    grown = PlanningError()
    grown.start(2)
    grown.load_state(remap_workers(errors.state(), np.array([0, -1]), 2, PlanningError.EMPTY))
    weight, _, squares, _ = errors.state()["_moments"]
    assert grown.spread[1] == pytest.approx(np.sqrt(squares[0] / weight[0]))  # the one who stayed
    assert grown.state()["_planned"][50][0].tolist() == [100.0, 100.0]  # the forecasts; then planned, departures
    assert np.isfinite(grown.state()["_level"]).tolist() == [True, False]  # the newcomer's level is its own
    with pytest.raises(ValueError, match="for 1 workers"):
        PlanningError().load_state(PlanningError().state() | {"_moments": np.zeros((4, 3))})


def test_an_lbbsp_state_from_before_planning_errors_is_refused_by_name():
    saved, fresh = LBBSPPolicy(), LBBSPPolicy()
    saved.start(2, 64)
    fresh.start(2, 64)
    state = saved.state()
    del state["errors"]
    with pytest.raises(ValueError, match="without planning errors"):
        fresh.load_state(state)


def test_an_lbbsp_state_scored_among_other_candidates_starts_the_choice_anew():
    saved = LBBSPPolicy(candidates=("forecast", "corrected", "quantile"))  # the previous release's three
    saved.start(2, 64)
    state = saved.state()
    state["choice"]["scores"], state["choice"]["best"] = [0.0, -0.1, -0.2], 2
    fresh = LBBSPPolicy()
    fresh.start(2, 64)
    fresh.load_state(state)
    assert fresh.choice.best == 0 and fresh.choice.scores.tolist() == [0.0] * len(LBBSPPolicy.CANDIDATES)
    same = LBBSPPolicy(candidates=("forecast", "corrected", "quantile"))
    same.start(2, 64)
    same.load_state(state)
    assert same.choice.best == 2


@pytest.mark.parametrize("kwargs, bad", [({"forgetting": 1.0}, "forgetting=1.0"), ({"max_error": 0}, "max_error=0"), ({"forgetting": True}, "forgetting=True")])
def test_bad_arguments_name_the_value(kwargs, bad):
    with pytest.raises(ValueError, match=bad):
        PlanningError(**kwargs)


def test_variance_aware_lbbsp_gives_slack_to_the_worker_it_forecasts_worst():
    """Two workers of the same mean speed; worker 1's speed is erratic. The variance-aware split gives it less."""
    rng = np.random.default_rng(2)
    n, total = 16, 16 * 64
    splits = {}
    for aware in (False, True):
        policy = LBBSPPolicy(variance_aware=aware, min_gain=0.0)
        batches = policy.start(n, total)
        noise = np.where(np.arange(n) == 1, 0.3, 0.02)
        for step in range(300):
            speeds = 1000.0 * np.exp(rng.normal(0.0, noise))
            compute = (16.0 + batches) / speeds
            stats = StepStats(step=step, batches=batches, compute=compute, wait=np.zeros(n),
                              forecast=np.full(n, np.nan), target=step + 1)
            batches = policy.after_step(stats, total)
        splits[aware] = batches
        if aware:
            assert policy.errors.spread[1] > 5 * np.median(policy.errors.spread)
    assert splits[True][1] < 0.7 * np.median(splits[True]), splits[True]
    assert splits[False][1] > 0.7 * np.median(splits[False]), splits[False]
    assert splits[True].sum() == splits[False].sum() == total
    assert allocate(tail_speeds(np.ones(n), np.zeros(n)), total).tolist() == allocate(np.ones(n), total).tolist()


def test_the_bias_of_forecasts_that_overshoot_is_learnt_and_corrected():
    """Speeds wander around a level; the forecast is the last measured speed, which overshoots the next one
    by half its departure from the level. The pooled slope finds -0.5 and the corrected errors are narrower."""
    rng = np.random.default_rng(3)
    n = 32
    errors = PlanningError(level_rate=0.05)  # a level of long memory: close to the constant mean
    errors.start(n)
    mean = np.log(1000.0)
    last = np.full(n, mean)
    raw, corrected = [], []
    for step in range(400):
        forecast = np.exp(last)
        planned = errors.plan(step, forecast)
        # An AR(1) with coefficient 0.5 around a level that the forecast (the last value) already sits at half way.
        now = mean + 0.5 * (last - mean) + rng.normal(0.0, 0.2, n)
        errors.observe(step, np.exp(now))
        if step > 100:
            raw.append(now - np.log(forecast))
            corrected.append(now - np.log(planned))
        last = now
    assert errors.bias == pytest.approx(-0.5, abs=0.1)
    assert np.std(corrected) < 0.9 * np.std(raw)
    assert errors.spread.mean() == pytest.approx(np.std(corrected), rel=0.15)
    # A measured jump (a quota cut to a quarter) is not an overshoot: the jumped worker keeps its forecast,
    # the others are corrected as before, and the pair is remembered with its true departure.
    forecast = np.exp(last)
    forecast[0] /= 4.0
    jumped = np.arange(n) == 0
    plain, kept = errors.plan(None, forecast), errors.plan(400, forecast, jumped=jumped)
    assert kept[0] == forecast[0] and plain[0] > 1.5 * forecast[0]
    np.testing.assert_array_equal(kept[1:], plain[1:])
    assert errors.state()["_planned"][400][2][0] < -1.0


def test_no_bias_is_applied_before_enough_pairs_nor_beyond_its_range():
    errors = PlanningError(min_pairs=16)
    errors.start(4)
    errors.observe(0, np.full(4, 100.0))  # sets the level
    errors.plan(1, np.full(4, 200.0))
    errors.observe(1, np.full(4, 100.0))  # 4 pairs, each a forecast twice too high
    assert errors.bias == 0.0 and errors.plan(None, [200.0] * 4).tolist() == [200.0] * 4
    for step in range(2, 6):
        level = np.exp(errors.state()["_level"])
        errors.plan(step, 2.0 * level)
        errors.observe(step, level / 8.0)  # a slope of about -3, held to the range
    assert errors.bias == PlanningError.BIAS_RANGE[0]


def test_a_state_saved_before_the_bias_was_learnt_loads():
    errors = PlanningError()
    errors.start(2)
    old = {"_moments": np.ones((4, 2)), "_planned": {7: np.array([1.0, 2.0])}}
    errors.load_state(old)
    assert np.isnan(errors.state()["_level"]).all() and errors.bias == 0.0
    errors.observe(7, [1.0, 2.0])
    np.testing.assert_allclose(errors.spread, np.sqrt(0.995 / 1.995))  # one zero error each after the saved ones


@pytest.mark.parametrize("value", ["yes", 1, None, 0.5])
def test_a_bad_variance_aware_value_is_named(value):
    with pytest.raises(ValueError, match=f"variance_aware={value!r}"):
        LBBSPPolicy(variance_aware=value)


def _run(policy, noise, steps, rng, total):
    """`noise(step)`: each worker's log-normal noise at that step."""
    n = noise(0).size
    batches = policy.start(n, total)
    for step in range(steps):
        speeds = 1000.0 * np.exp(rng.normal(0.0, noise(step)))
        compute = (16.0 + batches) / speeds
        stats = StepStats(step=step, batches=batches, compute=compute, wait=np.zeros(n),
                          forecast=np.full(n, np.nan), target=step + 1)
        batches = policy.after_step(stats, total)
    return batches


def test_auto_chooses_the_quantile_with_many_noisy_workers_and_leaves_it_when_it_stops_paying():
    rng = np.random.default_rng(4)
    noisy = LBBSPPolicy()  # variance_aware="auto"
    _run(noisy, lambda step: np.where(np.arange(256) % 4 == 0, 0.4, 0.05), 200, rng, 256 * 64)
    assert LBBSPPolicy.CANDIDATES[noisy.choice.best] == "quantile", noisy.choice.scores
    # Worker 0 of 8 is erratic for 100 steps, then as steady as the others: its spread (a memory of about
    # 200 steps) still asks for slack it no longer needs, and the quantile candidate falls behind.
    calmed = LBBSPPolicy()
    _run(calmed, lambda step: np.where((np.arange(8) == 0) & (step < 100), 0.5, 0.01), 300, rng, 8 * 64)
    assert calmed.errors.spread[0] > 5 * calmed.errors.spread[1]
    assert LBBSPPolicy.CANDIDATES[calmed.choice.best] != "quantile", calmed.choice.scores
    assert calmed.choice.scores[2] > 0.02 and calmed.choice.scored > 250


@pytest.mark.parametrize("value", [(), ("quantile", "forecast"), ("forecast", "forecast"), ("forecast", "median"),
                                   "forecast", None])
def test_bad_candidates_are_named(value):
    with pytest.raises(ValueError, match=re.escape(f"candidates={value!r} is not allowed")):
        LBBSPPolicy(candidates=value)


def test_the_unshrunk_candidate_splits_as_a_policy_without_noise_shrinkage():
    rng = np.random.default_rng(5)
    n, total = 8, 8 * 64
    chosen, plain, shrunk = LBBSPPolicy(), LBBSPPolicy(variance_aware=False, shrink_noise=False), \
        LBBSPPolicy(variance_aware=False)
    batches = [p.start(n, total) for p in (chosen, plain, shrunk)]
    chosen.choice.margin = 0.999  # holds the choice where it is put
    chosen.choice.best = chosen.candidates.index("unshrunk")
    differ = 0
    for step in range(60):
        speeds = 1000.0 * (1.0 + np.arange(n) / 8.0) * np.exp(rng.normal(0.0, 0.05, n))
        forecast = speeds * np.exp(rng.normal(0.0, 0.02, n))
        batches = [p.after_step(StepStats(step=step, batches=b, compute=(16.0 + b) / speeds, wait=np.zeros(n),
                                          forecast=forecast, target=step + 1), total)
                   for p, b in zip((chosen, plain, shrunk), batches)]
        assert batches[0].tolist() == batches[1].tolist(), step
        differ += batches[0].tolist() != batches[2].tolist()
    assert chosen.candidates[chosen.choice.best] == "unshrunk" and differ > 0, "the shrinkage did move other splits"


def test_auto_keeps_the_noise_shrinkage_on_workers_that_differ_by_noise_only():
    rng = np.random.default_rng(0)
    still = LBBSPPolicy()
    _run(still, lambda step: np.full(16, 0.05), 300, rng, 16 * 512)
    unshrunk = still.candidates.index("unshrunk")
    assert still.choice.best != unshrunk and still.choice.scores[unshrunk] > 0.005, still.choice.scores
