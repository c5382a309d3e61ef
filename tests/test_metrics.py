"""lbbsp.metrics: the balanced time, the step's balance, the epoch summary and the median."""
import math

import numpy as np
import pytest

from lbbsp.metrics import balanced_time, median, step_balance, summarize_steps


def test_the_median_is_numpys_to_the_bit():
    rng = np.random.default_rng(0)
    for size in list(range(1, 12)) + [64, 1023, 1024]:
        for _ in range(20):
            values = rng.lognormal(rng.normal(-5.0, 3.0), 1.0, size)
            values[rng.random(size) < 0.1] = rng.choice([np.inf, 0.0, -1.0])
            expected = float(np.median(values))
            assert median(values) == expected and median(list(values)) == expected
            values[rng.integers(size)] = np.nan
            assert np.isnan(median(values))
    assert np.isnan(median([]))


def test_the_balanced_time_lies_between_the_fastest_and_slowest_worker_and_is_reached_by_the_speed_split():
    rng = np.random.default_rng(1)
    for _ in range(200):
        n = int(rng.integers(1, 9))
        batches = rng.integers(1, 200, n).astype(np.float64)
        compute = rng.lognormal(-3.0, 0.7, n)
        ideal = balanced_time(batches, compute)
        assert compute.min() * (1 - 1e-12) <= ideal <= compute.max() * (1 + 1e-12)
        # The same samples split in proportion to the measured speeds: every worker takes the balanced time.
        speeds = batches / compute
        even = batches.sum() * speeds / speeds.sum()
        assert even / speeds == pytest.approx(np.full(n, ideal))
        assert balanced_time(even, even / speeds) == pytest.approx(ideal)
    # Several steps at once: one balanced time per step.
    steps = np.array([[10.0, 30.0], [20.0, 20.0]])
    times = np.array([[0.1, 0.1], [0.1, 0.4]])
    assert balanced_time(steps, times) == pytest.approx([0.1, 40.0 / (200.0 + 50.0)])


def test_a_step_with_a_missing_time_has_no_balance():
    assert step_balance([8, 8], [0.1, 0.3]) == pytest.approx((16 / (80 + 80 / 3), 0.3))
    for bad in (math.nan, 0.0, -1.0, math.inf):
        assert all(math.isnan(x) for x in step_balance([8, 8], [0.1, bad]))


def test_the_epoch_summary_weighs_steps_by_their_time_and_skips_those_without_one():
    batches = np.array([[16, 16], [16, 16], [16, 16]])
    compute = np.array([[0.1, 0.1], [0.1, 0.3], [math.nan, 0.2]])
    summary = summarize_steps(batches, compute)
    # Step 3 has no time; steps 1 and 2: balanced 0.1 and 0.15, actual 0.1 and 0.3.
    assert summary["efficiency"] == pytest.approx((0.1 + 0.15) / (0.1 + 0.3))
    assert summary["straggler"] == pytest.approx((0.0 + 0.2 / 0.2) / 2)
    assert summarize_steps(batches[:1], compute[:1])["efficiency"] == pytest.approx(1.0)
    assert all(math.isnan(v) for v in summarize_steps(batches[2:], compute[2:]).values())
