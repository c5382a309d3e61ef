"""PlanningError: the per-worker spread of log(measured / planned speed) behind the variance-aware split."""
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
    assert grown.state()["_planned"][50].tolist() == [100.0, 100.0]
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
