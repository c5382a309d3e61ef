"""The online step-time model t_i(b) = (k_i + b) / v_i: identification, change detection, robustness."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lbbsp.steptime import StepTimeModel, _median, _pool


def feed(model, batches, v, k, noise=0.0, seed=0):
    rng = np.random.default_rng(seed)
    for b in batches:
        b = np.asarray(b, dtype=np.float64)
        model.update(b, (k + b) / v * (1 + noise * rng.standard_normal(b.size)))


def test_fixed_cost_is_identified_once_the_batch_varies():
    m = StepTimeModel()
    m.start(2)
    v, k = np.array([1000.0, 250.0]), np.array([20.0, 5.0])
    feed(m, [[64, 64]] * 5, v, k)
    assert not m.identified.any() and np.allclose(m.offsets, 0.0)  # one batch size: k stays at its prior
    feed(m, [[64, 64], [80, 40], [100, 20], [90, 30]], v, k)
    assert m.identified.all()
    # Exact timings: each fit is exact, and pooling moves it by what the error floor (1% of the batch) allows.
    np.testing.assert_allclose(m.offsets, k, rtol=1e-2)
    np.testing.assert_allclose(m.speeds, v, rtol=1e-2)
    np.testing.assert_allclose(m.predict([10, 10]), (k + 10) / v, rtol=1e-2)


def test_a_speed_change_is_followed_in_one_step_and_the_fixed_cost_is_kept():
    m = StepTimeModel()
    m.start(1)
    feed(m, [[64], [80], [50], [64], [70]], np.array([1000.0]), np.array([20.0]))
    assert m.offsets[0] == pytest.approx(20.0)
    feed(m, [[70]], np.array([250.0]), np.array([20.0]))  # quota cut 4x
    assert m.changed[0]
    assert m.speeds[0] == pytest.approx(250.0) and m.offsets[0] == pytest.approx(20.0)


def test_noisy_timings_over_a_narrow_batch_range_do_not_give_absurd_offsets():
    m = StepTimeModel()
    m.start(1)
    rng = np.random.default_rng(3)
    feed(m, [[int(b)] for b in rng.integers(60, 64, 60)], np.array([500.0]), np.array([10.0]), noise=0.1)
    assert m.offsets[0] <= 16 * 64


@given(st.lists(st.tuples(st.integers(1, 500), st.floats(1e-4, 10.0)), min_size=1, max_size=40))
@settings(max_examples=200, deadline=None)
def test_state_stays_finite_and_bounded(pairs):
    m = StepTimeModel()
    m.start(1)
    for b, t in pairs:
        m.update([b], [t])
        assert np.isfinite(m.offsets).all() and (m.offsets >= 0).all()
        assert not np.isfinite(m.speeds[0]) or m.speeds[0] > 0


def test_invalid_timings_are_skipped():
    m = StepTimeModel()
    m.start(2)
    m.update([10, 10], [np.nan, -1.0])
    assert np.isnan(m.speeds).all()
    with pytest.raises(ValueError, match="2 entries"):
        m.update([10], [1.0])


@pytest.mark.parametrize("kwargs, message", [
    ({"forgetting": 1.0}, "forgetting=1.0"), ({"min_spread": 0}, "min_spread=0"), ({"change": -1}, "change=-1"),
    ({"offset": -3}, "offset=-3"), ({"max_error": float("nan")}, "max_error=nan"), ({"forgetting": True}, "True"),
    ({"min_error": 0.0}, "min_error=0.0"), ({"pool": 1}, "pool=1"),
])
def test_bad_arguments_name_the_value(kwargs, message):
    with pytest.raises(ValueError, match=message):
        StepTimeModel(**kwargs)


def test_fixed_cost_is_not_confounded_by_a_drift_the_batch_follows():
    # Under a balancer the batch follows the speed: a regression of t on b over a drift mistakes the drift
    # for a fixed cost (the previous model's estimates here: 0, 0.1, 0.4, 48 or none, over 10 seeds).
    # Consecutive-step differences with the batch change as instrument are not misled.
    k, steps, estimates = 16.0, 400, []
    v = 1000.0 * (1.0 + 0.5 * np.sin(np.arange(steps) / 15.0))  # up to 3% per step
    for seed in range(10):
        rng = np.random.default_rng(seed)
        m = StepTimeModel()
        m.start(1)
        for t in range(steps):
            b = max(4, int(64 * v[max(t - 2, 0)] / 1000.0) + int(rng.integers(-10, 11)))
            m.update([b], [(k + b) / v[t] * np.exp(0.03 * rng.standard_normal())])
        assert m.identified[0]
        estimates.append(m.offsets[0])
    assert np.median(estimates) == pytest.approx(k, rel=0.2), estimates
    assert np.all(np.abs(np.array(estimates) - k) < 0.5 * k), estimates


def test_speeds_are_the_last_measurement_not_an_average():
    m = StepTimeModel(offset=10.0, min_spread=1.0)  # k pinned at its prior
    m.start(1)
    for v in (1000.0, 900.0, 800.0, 700.0):
        m.update([50], [(10.0 + 50) / v])
    assert m.speeds[0] == pytest.approx(700.0)
    assert m.threshold[0] >= m.change


def balanced_run(model, v, k, steps, seed, noise=0.03, batch=512):
    """Feed `model` a balancer's steps: every worker's batch near its share of the total, moved by up to 10%."""
    rng = np.random.default_rng(seed)
    share = batch * v / v.mean()
    for _ in range(steps):
        b = np.maximum(1, np.round(share * rng.uniform(0.9, 1.1, v.size)))
        model.update(b, (k + b) / v * np.exp(noise * rng.standard_normal(v.size)))


def own_fits(model):
    """Each worker's own instrumental-variables fit of k, before pooling."""
    _, _, _, szx, szy, _, _, _ = model._sums
    return szy / szx


def test_pooling_cuts_the_error_of_fits_on_large_batches():
    # k is 3% of a 512-sample step and timings carry 3% noise: one worker's own fit is poor.
    v, k = 1000.0 * np.random.default_rng(0).choice([1.0, 0.5, 0.25], 64), 16.0
    m = StepTimeModel()
    m.start(v.size)
    balanced_run(m, v, k, 200, seed=1)
    own = own_fits(m)
    assert m.identified.all()
    assert np.median(np.abs(own - k)) > 5.0  # the fits alone are off by a third of k or more
    assert np.median(np.abs(m.offsets - k)) < 0.3 * np.median(np.abs(own - k)), (m.offsets, own)
    alone = StepTimeModel(pool=False)  # the same steps, each fit taken alone where precise enough
    alone.start(v.size)
    balanced_run(alone, v, k, 200, seed=1)
    np.testing.assert_allclose(alone.offsets[alone.identified], np.clip(own, 0, None)[alone.identified])


def test_workers_that_differ_keep_their_own_fixed_cost():
    v = np.full(32, 1000.0)
    k = np.where(np.arange(32) < 16, 5.0, 60.0)  # two kinds of worker
    m = StepTimeModel()
    m.start(v.size)
    balanced_run(m, v, k, 150, seed=2, noise=0.01, batch=64)
    # Each kind keeps its own level: pooling pulls a fit by a fraction of its own error, not to the mean (32).
    assert abs(m.offsets[:16].mean() - 5.0) < 1.5 and abs(m.offsets[16:].mean() - 60.0) < 0.1 * 60.0, m.offsets
    assert m.offsets[16:].min() > 2 * m.offsets[:16].max()


def test_a_worker_whose_batch_never_moved_takes_the_pooled_fixed_cost():
    v, k = np.array([1000.0, 800.0, 700.0, 600.0]), 20.0
    rng = np.random.default_rng(3)
    m = StepTimeModel()
    m.start(4)
    for _ in range(30):
        b = np.append(rng.integers(40, 90, 3), 8.0)  # worker 3 held at one size
        m.update(b, (k + b) / v)
    assert m.identified.tolist() == [True, True, True, False]
    assert m.offsets[3] == pytest.approx(k, rel=0.05)
    assert m.speeds[3] == pytest.approx(v[3], rel=0.05)


def test_a_fit_on_one_moved_pair_does_not_set_everyones_fixed_cost():
    # Found on static-4: the slowest worker sat at the grid's floor after the calibration, so its fit rested on
    # the one pair whose batch moved, had no residual, read as exact and set the pooled k of all four workers.
    v, k = np.array([1000.0, 900.0, 800.0, 200.0]), 20.0
    rng = np.random.default_rng(5)
    m = StepTimeModel()
    m.start(4)
    for step in range(60):
        b = np.append(rng.integers(60, 100, 3), 4.0 if step < 40 else 8.0).astype(np.float64)
        noise = np.exp(0.05 * rng.standard_normal(4))
        noise[3] = 1.2 if step == 40 else 1.0  # the one move of worker 3 lands on a slow step
        m.update(b, (k + b) / v * noise)
    own = own_fits(m)
    assert m.identified.all() and abs(own[3] - k) > 10.0, own  # worker 3's own fit is far off, with no residual
    # It counts as one fit among four: the pooled k lies nearer the other three fits than to it.
    pooled = np.median(m.offsets)
    assert abs(pooled - own[:3].mean()) < abs(pooled - own[3]), (m.offsets, own)


def test_two_workers_fits_are_not_pooled():
    v, k = np.array([1000.0, 250.0]), np.array([20.0, 40.0])
    models = [StepTimeModel(), StepTimeModel(pool=False)]
    for m in models:
        m.start(2)
        balanced_run(m, v, k, 60, seed=4, noise=0.02, batch=64)
    assert np.array_equal(models[0].offsets, models[1].offsets)


@given(st.lists(st.tuples(st.floats(0.0, 500.0), st.floats(0.01, 100.0)), min_size=2, max_size=30))
@settings(max_examples=200, deadline=None)
def test_pooled_fits_lie_between_each_fit_and_the_mean(fits):
    estimates, errors = (np.array(c) for c in zip(*fits))
    pooled, shrunk = _pool(estimates, errors)
    assert estimates.min() - 1e-9 <= pooled <= estimates.max() + 1e-9
    low, high = np.minimum(estimates, pooled), np.maximum(estimates, pooled)
    assert np.all(shrunk >= low - 1e-9) and np.all(shrunk <= high + 1e-9)
    again = _pool(estimates.copy(), errors.copy())
    assert again[0] == pooled and np.array_equal(again[1], shrunk)  # bit for bit: every rank decides alike


@given(st.lists(st.floats(0.0, 1e9), min_size=1, max_size=60))
@settings(max_examples=200, deadline=None)
def test_median_is_numpys(values):
    x = np.array(values)
    assert _median(x) == np.median(x)
