"""The online step-time model t_i(b) = max(f_i, (k_i + b) / v_i): fixed costs, changes, floors and the
set-up of new batch shapes, each learned from the gathered (batch, time) pairs."""
import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lbbsp.membership import remap
from lbbsp.steptime import GPU_OFFSET_SHARE, GPU_SHAPE_COST, StepTimeModel, StepTimeParams


def model(n, gpu=False, **params):
    m = StepTimeModel(params or None)
    m.start(n, gpu)
    return m


def feed(m, batches, v, k, f=0.0, noise=0.0, seed=0, setup=0.0):
    """Steps of t = max(f, (k + b) / v) (times a log-normal noise), plus `setup` seconds at a new shape."""
    rng = np.random.default_rng(seed)
    for b in batches:
        b = np.asarray(b, dtype=np.float64)
        t = np.maximum(f, (k + b) / v) * np.exp(noise * rng.standard_normal(b.size))
        m.update(b, t + setup * m.new_shapes(b))


def test_fixed_cost_is_identified_once_the_batch_varies():
    m = model(2)
    v, k = np.array([1000.0, 250.0]), np.array([20.0, 5.0])
    feed(m, [[64, 64]] * 5, v, k)
    assert not m.identified.any() and np.allclose(m.offsets, 0.0)  # one batch size: k keeps its prior
    feed(m, [[80, 40], [100, 20], [90, 30], [64, 64], [72, 48]], v, k)
    assert m.identified.all()
    np.testing.assert_allclose(m.offsets, k, rtol=1e-6)
    np.testing.assert_allclose(m.speeds, v, rtol=1e-6)
    np.testing.assert_allclose(m.predict([10, 10]), (k + 10) / v, rtol=1e-6)


def test_a_gpu_worker_plans_with_a_prior_fixed_cost_until_its_own_is_fitted():
    # Before any move k cannot be fitted (one batch size): GPU workers start from GPU_OFFSET_SHARE of the equal
    # batch, CPU workers from 0, and a given `offset` overrides both. Fitted, k is the measured one.
    v, k = np.array([1000.0, 250.0]), np.array([40.0, 40.0])
    m = StepTimeModel()
    m.start(2, gpu=True, share=128)
    assert m.offset_prior == pytest.approx(GPU_OFFSET_SHARE * 128) and np.allclose(m.offsets, m.offset_prior)
    feed(m, [[128, 128]] * 5, v, k)
    assert not m.identified.any() and np.allclose(m.offsets, GPU_OFFSET_SHARE * 128)
    # The speeds are batch-free at the prior: (b + k) / t, so a split planned before any move counts it.
    np.testing.assert_allclose(m.speeds, (128 + GPU_OFFSET_SHARE * 128) * v / (k + 128))
    feed(m, [[160, 96], [192, 64], [176, 80], [128, 128], [144, 112]], v, k, noise=0.001)
    assert m.identified.all()
    np.testing.assert_allclose(m.offsets, k, rtol=0.1)
    m.start(2, share=128)
    assert m.offset_prior == 0.0 and np.allclose(m.offsets, 0.0)
    m = StepTimeModel({"offset": 10.0})
    for gpu in (False, True):
        m.start(2, gpu=gpu, share=128)
        assert np.allclose(m.offsets, 10.0)


def test_from_three_fits_on_a_gpu_without_one_takes_their_pooled_fixed_cost():
    # Workers of one model have about the same k: a worker without a fit of its own (here its batch never moved;
    # on GPUs, one on its floor, whose fits are too noisy to take alone) is planned with the others' pooled k
    # instead of the prior 0 (docs/method.md).
    v, k = np.array([1000.0, 800.0, 600.0, 900.0]), np.full(4, 20.0)
    moves = [[64, 64, 64, 64], [80, 72, 56, 64], [100, 60, 40, 64], [90, 84, 30, 64], [64, 50, 70, 64],
             [72, 90, 48, 64]]
    m = model(4, gpu=True)
    feed(m, [row[:2] + [64, 64] for row in moves], v, k, noise=0.002)  # two fits: nothing to pool
    assert m.identified[:2].all() and not m.identified[2:].any() and np.allclose(m.offsets[2:], 0.0)
    m = model(4, gpu=True)
    feed(m, moves, v, k, noise=0.002)
    assert m.identified[:3].all() and not m.identified[3]
    assert m.offsets[3] == pytest.approx(20.0, rel=0.05)
    np.testing.assert_allclose(m.offsets[:3], 20.0, rtol=0.05)
    m = model(4)  # CPU workers: each fit alone
    feed(m, moves, v, k, noise=0.002)
    assert m.identified[:3].all() and not m.identified[3] and m.offsets[3] == 0.0


def test_one_moved_pair_fits_nothing():
    # A fit through the one pair whose batch moved has no residual, hence no error to judge it by.
    m = model(1)
    feed(m, [[64], [64], [64], [80], [80], [80]], np.array([1000.0]), np.array([20.0]), noise=0.05)
    assert not m.identified[0]


def test_the_speed_is_the_last_measurement_and_a_change_is_flagged():
    m = model(1)
    feed(m, [[64]] * 6, np.array([1000.0]), np.array([0.0]))
    feed(m, [[64]], np.array([850.0]), np.array([0.0]))  # one step 15% slow: below the change threshold
    assert not m.changed[0] and m.speeds[0] == pytest.approx(850.0)
    feed(m, [[64]], np.array([250.0]), np.array([0.0]))  # a quota cut 4x
    assert m.changed[0] and m.speeds[0] == pytest.approx(250.0)


def test_noise_beyond_the_change_threshold_from_the_first_step_is_learned_as_noise():
    # Two workers without quotas on two cores: each one's steps alternate fast and slow by about 30% from the start
    # (live, 2026-11-30). Fed by steady steps alone, the spread stayed at 0 and the threshold at `change`, which every
    # step crossed: each read as a speed change, for good, and no pair entered the fit of k.
    m = model(1)
    rng = np.random.default_rng(0)
    flags = []
    for step in range(300):
        alternate = 0.3 if step % 2 else -0.3
        m.update([128.0], [0.03 * np.exp(alternate + 0.05 * rng.standard_normal())])
        flags.append(bool(m.changed[0]))
    assert np.sqrt(m.spread2[0]) > 0.3 and sum(flags[10:]) == 0


def test_the_floor_is_learned_from_a_batch_that_fell_without_its_time():
    # A GPU whose step is 20 ms for every batch below 75 (its line t = (25 + b) / 5000 s): once k is known
    # from moves above the floor, a quarter of its batch does not take a quarter of the time; the floor is that.
    m = model(1, gpu=True, shape_cost=0.0)  # set-ups that cost nothing: a first visit is a measurement
    v, k, f = np.array([5000.0]), np.array([25.0]), 0.02
    feed(m, [[128], [160], [96], [128], [192]] + [[128]] * 8, v, k, f)
    assert m.identified[0] and m.offsets[0] == pytest.approx(25.0) and m.floors[0] == 0.0
    measured = m.setup[0, 0]
    feed(m, [[32]], v, k, f)  # a first visit, counted as a set-up and, costing nothing, a measurement
    assert m.setup[0, 0] == measured + 1
    assert m.floors[0] == pytest.approx(0.02) and not m.changed[0]
    assert m.speeds[0] == pytest.approx(5000.0), "a step on the floor says nothing of the speed"
    assert m.predict([16])[0] == pytest.approx(0.02) and m.predict([160])[0] == pytest.approx(185 / 5000)
    feed(m, [[32]], np.array([5000.0]), k, 0.007)  # the floor fell (a co-tenant left): cleared
    assert m.floors[0] == 0.0


def test_a_floor_is_capped_by_the_step_before_and_cleared_by_a_step_well_under_it():
    # A GPU beside a co-tenant that comes and goes: a spread of 0.15 puts its change threshold at 0.6, and a stray
    # slow step at a smaller batch passes for a floor. A floor is at most the time of the larger batch before it, and
    # a step more than `change` under it refutes it, however noisy the worker: on a floor a step says nothing of the
    # speed, so a floor that only the worker's noise could refute would hold the speed for as long as it held.
    m = model(1, gpu=True, shape_cost=0.0)
    v, k = np.array([5000.0]), np.array([25.0])
    feed(m, [[128], [160], [96], [128], [192]] + [[128]] * 8, v, k)
    assert m.identified[0] and m.floors[0] == 0.0
    m.spread2[:] = 0.15 ** 2
    before = (25.0 + 128.0) / 5000.0
    m.update([96.0], [1.6 * before])  # rose by 0.47 from the step before, 0.70 above the line at 96
    assert m.floors[0] == pytest.approx(before)
    feed(m, [[80]] * 3, np.array([4500.0]), k)  # 0.27 under the floor: within the worker's noise, beyond `change`
    assert m.floors[0] == 0.0 and m.speeds[0] == pytest.approx(4500.0)


def test_a_cpu_worker_learns_no_floor():
    # The same steps on a CPU worker: its time falling less than its batch is noise or contention, not a floor.
    m = model(1, shape_cost=0.0)
    v, k = np.array([5000.0]), np.array([25.0])
    feed(m, [[128], [160], [96], [128], [192]] + [[128]] * 8 + [[32]], v, k, 0.02)
    assert m.identified[0] and m.floors[0] == 0.0


def test_on_a_gpu_a_first_visit_is_a_set_up_not_a_floor():
    m = StepTimeModel()
    m.start(1, gpu=True)  # set-ups (seconds) exceed the step: a first visit is not a measurement
    v, k, f = np.array([5000.0]), np.array([25.0]), 0.02
    feed(m, [[128]] * 2, v, k, f)  # the first shape's set-up falls in steps without a prediction
    feed(m, [[160]] * 2 + [[96]] * 2 + [[128]] + [[192]] * 2 + [[128]] * 8, v, k, f, setup=4.0)
    assert m.identified[0] and m.offsets[0] == pytest.approx(25.0)
    feed(m, [[32]], v, k, f, setup=4.0)
    assert m.floors[0] == 0.0 and m.speeds[0] == pytest.approx(5000.0)
    feed(m, [[32]], v, k, f, setup=4.0)
    assert m.floors[0] == pytest.approx(0.02)


def test_a_floor_is_learned_before_k_is_fitted_and_cleared_by_a_faster_step():
    # With k not yet fitted, a step's time falls less than its batch whether there is a fixed cost or a floor; either
    # way it is what the worker takes at that batch (held unlearned, a floor-bound GPU sent below its floor reads as
    # slow). Read as a floor, it goes once a step runs more than `change` under it.
    m = model(1, gpu=True, shape_cost=0.0)
    v, k = np.array([1000.0]), np.array([30.0])
    feed(m, [[64]] * 3 + [[32]], v, k)
    assert not m.identified[0] and m.floors[0] == pytest.approx((30.0 + 32.0) / 1000.0)
    feed(m, [[32]], 2 * v, k)
    assert m.floors[0] == 0.0 and m.speeds[0] == pytest.approx(2 * 32 / 0.062)


def test_first_steps_at_new_shapes_measure_their_set_up():
    m = StepTimeModel()
    m.start(2, gpu=True)
    v, k = np.array([1000.0, 1000.0]), np.zeros(2)
    feed(m, [[64, 64]] * 3, v, k, setup=4.0)
    assert m.setup[0].tolist() == [0.0, 0.0], "the first shape's set-up falls in steps without a prediction"
    assert m.new_shapes([64, 72]).tolist() == [False, True]
    assert m.setup_cost() == GPU_SHAPE_COST  # nothing measured: the prior of GPU workers
    feed(m, [[72, 56]], v, k, setup=4.0)
    np.testing.assert_allclose(m.setup[1], [4.0, 4.0])
    assert m.speeds.tolist() == [1000.0, 1000.0], "a step slower by its set-up is no speed measurement"
    feed(m, [[80, 56]], v, k, setup=2.0)
    assert m.setup_cost() == pytest.approx(3.5)  # the median of the workers' means, 3 and 4


def test_where_a_set_up_costs_less_than_a_step_a_first_visit_is_a_measurement():
    m = model(1)  # a CPU worker: set-ups are milliseconds
    feed(m, [[64]] * 3, np.array([1000.0]), np.zeros(1))
    feed(m, [[72]], np.array([250.0]), np.zeros(1))  # a quota cut at a new batch size
    assert m.changed[0] and m.speeds[0] == pytest.approx(250.0)


def test_the_set_up_prior_depends_on_the_device_until_measured():
    m = StepTimeModel()
    m.start(2, gpu=True)
    assert m.setup_cost() == GPU_SHAPE_COST
    m = StepTimeModel({"shape_cost": 0.5})
    m.start(2, gpu=True)
    assert m.setup_cost() == 0.5


def test_fixed_cost_is_not_confounded_by_a_drift_the_batch_follows():
    # Under a balancer the batch follows the speed: a regression of t on b over a drift mistakes the drift for
    # a fixed cost. Consecutive-step differences with the batch change as instrument are not misled.
    k, steps, estimates = 16.0, 400, []
    v = 1000.0 * (1.0 + 0.5 * np.sin(np.arange(steps) / 15.0))  # up to 3% per step
    for seed in range(10):
        rng = np.random.default_rng(seed)
        m = model(1)
        for t in range(steps):
            b = max(4, int(64 * v[max(t - 2, 0)] / 1000.0) + int(rng.integers(-10, 11)))
            m.update([b], [(k + b) / v[t] * np.exp(0.03 * rng.standard_normal())])
        assert m.identified[0]
        estimates.append(m.offsets[0])
    assert np.median(estimates) == pytest.approx(k, rel=0.2), estimates


def test_a_pair_is_two_steps_above_the_floor_with_none_on_it_between():
    # A GPU is moved onto its floor and back, as a balancer answers a step it measured slow. The step back and the
    # step before the floor are no pair: their batch change answers the earlier step's own time, and an instrument
    # that answers the noise it is fitted against lowers k (docs/gpu.md, "No pair across the floor"). A step that
    # measures a set-up is skipped: the steps on either side of it are a pair.
    v, k, floor = np.array([1000.0]), np.array([40.0]), 0.12
    m = model(1, gpu=True)
    feed(m, [[128], [96], [96], [128], [112], [112], [128], [96], [112], [128]], v, k, floor, setup=4.0)
    assert m.identified[0] and m.offsets[0] == pytest.approx(40.0)

    def pairs_after(batches, **kwargs):
        feed(m, batches, v, k, floor, **kwargs)
        return m.sums[-1, 0]  # the discounted count of pairs

    before = pairs_after([[96]])
    assert pairs_after([[8], [8]], setup=4.0) == before and m.floors[0] == pytest.approx(floor)  # a set-up, the floor
    assert pairs_after([[128]]) == before, "the step back from the floor pairs with nothing"
    before = pairs_after([[112]])
    assert before > 1.0
    assert pairs_after([[136]], setup=4.0) == before  # a set-up: no measurement
    assert pairs_after([[136]]) == pytest.approx(0.98 * before + 1.0), "the steps on either side of it are a pair"
    assert m.offsets[0] == pytest.approx(40.0)


@given(st.lists(st.tuples(st.integers(1, 500), st.floats(1e-4, 10.0)), min_size=1, max_size=40))
@settings(max_examples=200, deadline=None)
def test_state_stays_finite_and_bounded(pairs):
    m = model(1)
    for b, t in pairs:
        m.update([b], [t])
        assert np.isfinite(m.offsets).all() and (m.offsets >= 0).all() and (m.floors >= 0).all()
        assert not np.isfinite(m.speeds[0]) or m.speeds[0] > 0


def test_invalid_timings_are_skipped():
    m = model(2)
    m.update([10, 10], [np.nan, -1.0])
    assert np.isnan(m.speeds).all()
    with pytest.raises(ValueError, match="2 entries"):
        m.update([10], [1.0])


def test_state_round_trip_and_remap_by_name():
    m = model(3)
    feed(m, [[64, 64, 64], [80, 40, 72], [100, 20, 56], [90, 30, 64], [70, 50, 72]],
         np.array([1000.0, 250.0, 500.0]), np.array([20.0, 5.0, 10.0]))
    twin = model(3)
    twin.load_state(m.state())
    assert all(np.array_equal(np.asarray(getattr(m, n), dtype=object), np.asarray(getattr(twin, n), dtype=object))
               for n in StepTimeModel.PER_WORKER)
    moved = model(2)
    moved.load_state(remap(m.state(), np.array([2, -1]), StepTimeModel.PER_WORKER))
    assert moved.offsets[0] == m.offsets[2] and moved.shapes[0] == m.shapes[2]
    assert moved.speeds[1] == pytest.approx(np.mean(m.speeds[[2]])), "a newcomer's speed is the others' mean"
    assert moved.shapes[1] == frozenset() and moved.sums[:, 1].sum() == 0, "and it has observed nothing"
    with pytest.raises(ValueError, match="3 workers cannot be loaded into a model of 2"):
        moved.load_state(m.state())


@pytest.mark.parametrize("params, message", [
    ({"forgetting": 1.0}, "forgetting=1.0"), ({"min_spread": 0}, "min_spread=0"), ({"change": -1}, "change=-1"),
    ({"offset": -3}, "offset=-3"), ({"max_error": float("nan")}, "max_error=nan"), ({"forgetting": True}, "True"),
    ({"shape_cost": -1.0}, "shape_cost=-1.0"), ({"speed": 3}, "model=.*fields"), ({"change": "x"}, "change='x'"),
    ({"mean_rate": 0.0}, r"mean_rate=0.0 is not allowed: it must be a number in \(0.0, 1.0\], or None"),
])
def test_bad_parameters_name_the_value(params, message):
    with pytest.raises(ValueError, match=message):
        StepTimeModel(params)


def test_parameters_are_one_named_value_object():
    params = StepTimeParams()
    assert dataclasses.replace(params, change=0.5).change == 0.5 and params.change == 0.25
    assert StepTimeParams.of({"change": 0.5}).change == 0.5 and StepTimeParams.of(None) == params
