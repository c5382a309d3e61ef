"""Property tests of the allocator: sum, bounds, monotonicity, determinism, bad speeds, bad input."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lbbsp.allocation import Rebalancer, allocate, predicted_step_time, proportional_shares, sanitize_speeds

speed = st.floats(min_value=1e-3, max_value=1e4, allow_nan=False)
weird = st.one_of(speed, st.just(0.0), st.just(-1.0), st.just(float("nan")), st.just(float("inf")),
                  st.just(-float("inf")))


@st.composite
def problems(draw, speeds=speed):
    n = draw(st.integers(1, 12))
    b_min = draw(st.integers(1, 4))
    v = np.array(draw(st.lists(speeds, min_size=n, max_size=n)))
    if draw(st.booleans()):
        b_max = np.array(draw(st.lists(st.integers(b_min, 80), min_size=n, max_size=n)))
        high = int(b_max.sum())
    else:
        b_max, high = None, 1000
    global_batch = draw(st.integers(n * b_min, max(n * b_min, high)))
    return v, global_batch, b_min, b_max


ROUNDING = st.sampled_from(["remainder", "time"])


@given(problems(weird), ROUNDING)
@settings(max_examples=400, deadline=None)
def test_sum_and_bounds_hold_for_any_speeds(problem, rounding):
    v, global_batch, b_min, b_max = problem
    b = allocate(v, global_batch, b_min, b_max, rounding=rounding)
    assert b.dtype == np.int64 and b.shape == v.shape
    assert int(b.sum()) == global_batch
    assert (b >= b_min).all()
    if b_max is not None:
        assert (b <= b_max).all()


@given(problems(), ROUNDING)
@settings(max_examples=300, deadline=None)
def test_within_one_sample_of_the_real_shares(problem, rounding):
    v, global_batch, b_min, b_max = problem
    upper = global_batch if b_max is None else b_max
    x = proportional_shares(v, global_batch, b_min, upper)
    assert abs(x.sum() - global_batch) < 1e-6 * global_batch
    assert np.all(np.abs(allocate(v, global_batch, b_min, b_max, rounding=rounding) - x) < 1.0 + 1e-9)


@given(problems())
@settings(max_examples=300, deadline=None)
def test_time_rounding_never_makes_the_step_longer(problem):
    v, global_batch, b_min, b_max = problem
    by_time = allocate(v, global_batch, b_min, b_max, rounding="time")
    by_remainder = allocate(v, global_batch, b_min, b_max)
    assert predicted_step_time(by_time, v) <= predicted_step_time(by_remainder, v) * (1 + 1e-12)


@given(problems(), ROUNDING)
@settings(max_examples=300, deadline=None)
def test_monotone_in_speed_with_common_bounds(problem, rounding):
    v, global_batch, b_min, _ = problem
    b = allocate(v, global_batch, b_min, rounding=rounding)
    order = np.argsort(v, kind="stable")
    for lo, hi in zip(order[:-1], order[1:]):
        if v[hi] > v[lo]:
            assert b[hi] >= b[lo]


@given(problems(weird), ROUNDING)
@settings(max_examples=200, deadline=None)
def test_deterministic(problem, rounding):
    v, global_batch, b_min, b_max = problem
    first = allocate(v.copy(), global_batch, b_min, b_max, rounding=rounding)
    assert np.array_equal(first, allocate(v.copy(), global_batch, b_min, b_max, rounding=rounding))


@given(st.integers(1, 16), st.integers(1, 500))
def test_equal_speeds_give_equal_batches(n, extra):
    b = allocate(np.full(n, 3.0), n + extra)
    assert b.max() - b.min() <= 1


def test_balances_compute_time():
    v = np.array([100.0, 100.0, 50.0, 25.0])
    b = allocate(v, 550)
    assert b.tolist() == [200, 200, 100, 50]
    assert predicted_step_time(b, v) == pytest.approx(2.0)


def test_clipped_samples_go_to_the_others():
    b = allocate([1000.0, 1.0, 1.0], 30, b_min=2, b_max=[10, 30, 30])
    assert b.tolist() == [10, 10, 10]


def test_invalid_speeds_take_the_median_and_all_invalid_gives_equal():
    assert sanitize_speeds([1.0, np.nan, 3.0, -2.0, np.inf]).tolist() == [1.0, 2.0, 3.0, 2.0, 2.0]
    assert allocate([np.nan, 0.0, -np.inf], 9).tolist() == [3, 3, 3]


@pytest.mark.parametrize("kwargs, message", [
    ({"global_batch": 5, "b_min": 2}, "global_batch=5"),
    ({"global_batch": 0}, "global_batch=0"),
    ({"global_batch": 12.5}, "global_batch=12.5"),
    ({"global_batch": 12, "b_min": 0}, "b_min=0"),
    ({"global_batch": 12, "b_min": 3, "b_max": 2}, "b_max=2"),
    ({"global_batch": 100, "b_max": [10, 10, 10]}, "global_batch=100"),
    ({"global_batch": 12, "b_max": [10, 10]}, "b_max=[10, 10]"),
    ({"global_batch": True}, "global_batch=True"),
])
def test_bad_input_names_the_value(kwargs, message):
    with pytest.raises(ValueError) as err:
        allocate([1.0, 1.0, 1.0], **kwargs)
    assert message in str(err.value)


def test_rebalancer_hysteresis_keeps_allocation_for_small_gains():
    r = Rebalancer(2, 100, min_gain=0.05)
    assert r.update([1.0, 1.04]).tolist() == [50, 50]
    assert r.update([1.0, 2.0]).tolist() == [33, 67]


def test_rebalancer_damps_reversals():
    r = Rebalancer(2, 200, min_gain=0.0)
    assert r.update([1.0, 3.0]).tolist() == [50, 150]
    # Forecasts swing back: the step is halved, so it moves only half way to [150, 50].
    assert r.update([3.0, 1.0]).tolist() == [100, 100]
    # A move in the same direction is undamped again.
    assert r.update([3.0, 1.0]).tolist() == [150, 50]


@given(st.lists(st.floats(0.5, 2.0), min_size=3, max_size=3), st.integers(0, 3))
@settings(max_examples=100, deadline=None)
def test_rebalancer_reaches_the_balanced_allocation_under_steady_speeds(v, seed):
    r = Rebalancer(3, 300, min_gain=0.0)
    rng = np.random.default_rng(seed)
    for _ in range(3):
        r.update(rng.uniform(0.5, 2.0, 3))
    for _ in range(40):
        b = r.update(v)
    v = np.asarray(v)
    # Within one sample's time of the continuous optimum T* = B / sum(v).
    assert predicted_step_time(b, v) <= 300 / v.sum() + 1 / v.min() + 1e-9


def test_time_rounding_example():
    # Shares [1.4, 1.4, 4.2]: largest remainder gives the extra sample to worker 0 (step 2.0 s),
    # time rounding to worker 2, whose step grows least (step 1.67 s).
    v = [1.0, 1.0, 3.0]
    assert allocate(v, 7).tolist() == [2, 1, 4]
    assert allocate(v, 7, rounding="time").tolist() == [1, 1, 5]
    assert predicted_step_time([1, 1, 5], v) < predicted_step_time([2, 1, 4], v)
    with pytest.raises(ValueError, match="rounding='up'"):
        allocate([1.0], 3, rounding="up")


def test_rebalancer_bad_arguments():
    with pytest.raises(ValueError, match="min_gain=1.5"):
        Rebalancer(2, 10, min_gain=1.5)
    with pytest.raises(ValueError, match="min_step=0"):
        Rebalancer(2, 10, min_step=0)
