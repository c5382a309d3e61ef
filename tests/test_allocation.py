"""Property tests of the allocator: optimal against brute force (floors included), sum, bounds, grid, ties on
floors, determinism, bad input."""
import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lbbsp.allocation import Bounds, default_multiple, expected_slowest, sanitize, split, step_times

speed = st.floats(min_value=1e-3, max_value=1e4, allow_nan=False)
offset = st.floats(min_value=0.0, max_value=200.0, allow_nan=False)


@st.composite
def problems(draw, max_workers=12, max_batch=1000, multiple=st.just(1)):
    """(total, bounds, speeds, offsets, floors): a floor, where drawn, sits somewhere on the worker's line."""
    n = draw(st.integers(1, max_workers))
    b_min = draw(st.integers(1, 4))
    v = np.array(draw(st.lists(speed, min_size=n, max_size=n)))
    k = np.array(draw(st.lists(offset, min_size=n, max_size=n))) if draw(st.booleans()) else np.zeros(n)
    if draw(st.booleans()):
        b_max = np.array(draw(st.lists(st.integers(b_min, max(b_min, max_batch // n)), min_size=n, max_size=n)))
        high = int(b_max.sum())
    else:
        b_max, high = None, max_batch
    total = draw(st.integers(n * b_min, max(n * b_min, high)))
    knee = np.array(draw(st.lists(st.integers(0, max(total, 1)), min_size=n, max_size=n)))
    f = np.where(np.array(draw(st.lists(st.booleans(), min_size=n, max_size=n))), (k + knee) / v, 0.0)
    return total, Bounds.of(n, total, b_min, b_max, draw(multiple)), v, k, f


def brute_force(total, bounds, v, k, f):
    """The smallest max time of every split within the bounds (on its grid where the grid holds `total`)."""
    lo, hi, q = bounds.grid(total)
    grids = [range(int(a) * q, int(b) * q + 1, q) for a, b in zip(lo, hi)]
    return min(step_times(c, v, k, f).max() for c in itertools.product(*grids) if sum(c) == total)


@given(problems())
@settings(max_examples=300, deadline=None)
def test_sum_and_bounds_hold(problem):
    total, bounds, v, k, f = problem
    b = split(total, bounds, v, k, f)
    assert b.dtype == np.int64 and b.shape == v.shape and int(b.sum()) == total
    assert (b >= bounds.lower).all() and (b <= bounds.upper).all()


@given(problems(max_workers=4, max_batch=14))
@settings(max_examples=500, deadline=None)
def test_optimal_against_brute_force_with_floors(problem):
    total, bounds, v, k, f = problem
    got = step_times(split(total, bounds, v, k, f), v, k, f).max()
    assert got <= brute_force(total, bounds, v, k, f) * (1 + 1e-9)


@given(problems(max_workers=4, max_batch=40, multiple=st.sampled_from([2, 4])))
@settings(max_examples=300, deadline=None)
def test_grid_batches_are_multiples_and_optimal_among_them(problem):
    total, bounds, v, k, f = problem
    lo, hi, q = bounds.grid(total)
    if total % q:  # a remainder goes out sample by sample: checked for sum and bounds above
        return
    b = split(total, bounds, v, k, f)
    assert (b % q == 0).all(), b
    assert step_times(b, v, k, f).max() <= brute_force(total, bounds, v, k, f) * (1 + 1e-9)


@given(problems(max_workers=6, max_batch=200))
@settings(max_examples=200, deadline=None)
def test_deterministic_bit_for_bit(problem):
    total, bounds, v, k, f = problem
    assert np.array_equal(split(total, bounds, v, k, f), split(total, bounds, v.copy(), k.copy(), f.copy()))


def test_workers_tied_on_their_floors_get_equal_batches():
    # Eight GPUs on the floor at 32 each (their line reaches 15 ms only at 50 samples): any split up to the knee
    # runs as fast; the ties go to equal batches, whatever the noise says of the speeds.
    v, k = np.random.default_rng(0).uniform(4500, 5500, 8), np.full(8, 25.0)
    f = np.full(8, 0.015)
    assert split(256, Bounds.of(8, 256, multiple=8), v, k, f).tolist() == [32] * 8


def test_a_slow_worker_on_its_line_sheds_samples_to_floor_bound_fast_ones():
    # Fast GPUs at 32 sit on a 15 ms floor up to ~50 samples; a GPU at 0.4 of their speed is on its line: its
    # samples move to the fast ones for free until their knee.
    v = np.array([5000.0, 5000.0, 5000.0, 2000.0])
    k, f = np.full(4, 25.0), np.array([0.015, 0.015, 0.015, 0.0])
    b = split(128, Bounds.of(4, 128, multiple=8), v, k, f)
    assert b[3] < 32 and step_times(b, v, k, f).max() < step_times(np.full(4, 32), v, k, f).max()


def test_closed_form_with_fixed_costs_and_proportional_without():
    v, k = np.array([1.0, 2.0, 1.0]), np.array([10.0, 10.0, 20.0])
    # T = (B + sum k) / sum v = (100 + 40) / 4 = 35: b = v T - k = 25, 60, 15.
    assert split(100, Bounds.of(3, 100), v, k, np.zeros(3)).tolist() == [25, 60, 15]
    assert split(12, Bounds.of(3, 12), np.array([1.0, 2.0, 3.0]), np.zeros(3), np.zeros(3)).tolist() == [2, 4, 6]


def test_clipped_samples_go_to_the_others():
    b = split(30, Bounds.of(3, 30, 2, [4, 100, 100]), np.array([10.0, 1.0, 1.0]), np.zeros(3), np.zeros(3))
    assert b.tolist() == [4, 13, 13]


@settings(max_examples=50, deadline=None)
@given(st.lists(st.floats(0.001, 1.0), min_size=1, max_size=8), st.floats(0.01, 0.3))
def test_expected_slowest_is_the_slowest_without_noise_and_grows_as_workers_crowd_it(times, spread):
    times = np.array(times)
    draws = np.random.default_rng(0).standard_normal((4000, times.size))
    assert expected_slowest(times, np.ones_like(draws)) == pytest.approx(times.max(), rel=1e-12)
    # One worker: the lognormal's mean, t exp(s^2 / 2), within the draws' error.
    one = expected_slowest(times[:1], np.exp(spread * draws[:, :1]))
    assert one == pytest.approx(times[0] * np.exp(spread ** 2 / 2), rel=4 * spread / np.sqrt(4000) + 1e-9)
    # The same slowest mean time, every worker brought up to it: the expected slowest can only grow.
    crowded = np.full(times.size, times.max())
    noise = np.exp(spread * draws)
    assert expected_slowest(crowded, noise) >= expected_slowest(times, noise)
    # Several splits at once: each row's estimate, to the last bit, as it alone gives.
    rows = expected_slowest([crowded, times], noise)
    assert rows.tolist() == [expected_slowest(crowded, noise), expected_slowest(times, noise)]


def test_sanitize_takes_the_median_of_the_good_values_or_the_fallback():
    assert sanitize([1.0, np.nan, 3.0, -1.0, np.inf], 1.0).tolist() == [1.0, 2.0, 3.0, 2.0, 2.0]
    assert sanitize([np.nan, 0.0], 7.0).tolist() == [7.0, 7.0]
    assert sanitize([0.0, np.nan], 1.0, positive=False).tolist() == [0.0, 0.0]


@pytest.mark.parametrize("kwargs, message", [
    (dict(num_workers=0, global_batch=4), "num_workers=0"),
    (dict(num_workers=2, global_batch=1), "global_batch=1 is not allowed with 2 workers"),
    (dict(num_workers=2, global_batch=8, b_min=0), "b_min=0"),
    (dict(num_workers=2, global_batch=8, b_max=[1, 2, 3]), "b_max=.*one integer or 2 integers"),
    (dict(num_workers=2, global_batch=8, b_max=3), r"global_batch=8 is not allowed with b_max=\[3, 3\]"),
    (dict(num_workers=2, global_batch=8, multiple=0), "multiple=0"),
    (dict(num_workers=2, global_batch=8.0), "global_batch=8.0"),
])
def test_bad_bounds_name_the_value(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Bounds.of(**kwargs)


@pytest.mark.parametrize("global_batch, workers, expected", [(256, 2, 8), (256, 4, 8), (256, 3, 1), (64, 4, 2),
                                                              (24, 2, 1), (1024, 8, 8), (96, 2, 4)])
def test_default_grid_keeps_the_equal_split_and_eight_steps_per_share(global_batch, workers, expected):
    q = default_multiple(global_batch, workers, gpu=True)
    assert q == expected and (global_batch // workers) % q == 0
    assert default_multiple(global_batch, workers) == 1, "CPU workers: any batch size"
