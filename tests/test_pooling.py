"""Empirical-Bayes pooling of per-worker estimates (lbbsp.pooling)."""
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from lbbsp.pooling import shrink_towards


@given(st.lists(st.tuples(st.floats(-100.0, 100.0), st.floats(0.0, 100.0)), min_size=1, max_size=30),
       st.floats(-100.0, 100.0))
@settings(max_examples=200, deadline=None)
def test_each_estimate_moves_towards_the_centre_and_no_further(pairs, center):
    estimates, variances = (np.array(c) for c in zip(*pairs))
    shrunk = shrink_towards(center, estimates, variances)
    low, high = np.minimum(estimates, center), np.maximum(estimates, center)
    assert np.all(np.isfinite(shrunk)) and np.all(shrunk >= low - 1e-9) and np.all(shrunk <= high + 1e-9)


def test_noise_goes_to_the_centre_and_real_differences_stay():
    rng = np.random.default_rng(0)
    alike = rng.normal(1.0, 0.1, 200)  # one true value, sampling error 0.1
    np.testing.assert_allclose(shrink_towards(1.0, alike, np.full(200, 0.01)), 1.0, atol=0.05)
    apart = np.concatenate([rng.normal(1.0, 0.1, 100), rng.normal(5.0, 0.1, 100)])  # two kinds, far apart
    shrunk = shrink_towards(3.0, apart, np.full(200, 0.01))
    assert abs(shrunk[:100].mean() - 1.0) < 0.05 and abs(shrunk[100:].mean() - 5.0) < 0.05
    assert np.array_equal(shrink_towards(2.0, np.array([1.0, 3.0]), np.zeros(2)), [1.0, 3.0])  # exact: kept
    assert np.array_equal(shrink_towards(2.0, np.array([2.0, 2.0]), np.zeros(2)), [2.0, 2.0])  # tau^2 = 0 = s^2


@given(st.lists(st.tuples(st.floats(-1e6, 1e6), st.floats(0.0, 1e6)), min_size=1, max_size=40),
       st.floats(-1e6, 1e6))
@settings(max_examples=200, deadline=None)
def test_the_between_variance_is_numpys_bit_for_bit(pairs, center):
    """The per-step path writes np.var and np.mean out; every rank, and replays of recorded runs, rely on
    the same numbers as before."""
    estimates, variances = (np.array(c) for c in zip(*pairs))
    tau2 = max(float(np.var(estimates)) - float(np.mean(variances)), 0.0)
    total = tau2 + variances
    keep = np.divide(tau2, total, out=np.zeros_like(total), where=total > 0)
    assert np.array_equal(shrink_towards(center, estimates, variances), center + keep * (estimates - center))
