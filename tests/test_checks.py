"""The shared argument checks: what they take, and errors that name the value and say what is allowed."""
import math

import numpy as np
import pytest

from lbbsp.checks import integer, number


def test_integer_takes_python_and_numpy_integers_within_the_bounds():
    assert integer("n", 3, 1) == 3 and type(integer("n", np.int64(3), 1)) is int
    assert integer("n", -7) == -7  # no bound
    assert integer("rank", 1, 0, 1) == 1
    assert integer("keep", None, 0, optional=True) is None


@pytest.mark.parametrize("value, low, high, message", [
    (0, 1, None, "n=0 is not allowed: it must be an integer >= 1"),
    (2, 0, 1, r"n=2 is not allowed: it must be an integer in \[0, 1\]"),
    (1.0, 1, None, "n=1.0 is not allowed"),
    (True, 0, None, "n=True is not allowed"),
    (None, 0, None, "n=None is not allowed"),
    ("3", 0, None, "n='3' is not allowed"),
])
def test_integer_rejects_with_the_value_named(value, low, high, message):
    with pytest.raises(ValueError, match=message):
        integer("n", value, low, high)


def test_integer_says_none_is_allowed_and_what_the_value_means():
    with pytest.raises(ValueError, match=r"keep=-1 is not allowed: it must be an integer >= 0, or None \(rows\)"):
        integer("keep", -1, 0, optional=True, what=" (rows)")


def test_number_bounds_open_and_closed():
    assert number("x", 0) == 0.0 and type(number("x", np.float32(0.5))) is float
    assert number("x", 1.0, 0.0, 1.0, high_open=False) == 1.0
    for value, kwargs in ((1.0, {"high": 1.0}), (0.0, {"low_open": True}), (-0.1, {}), (math.inf, {}),
                          (math.nan, {}), (True, {}), ("0.5", {}), (None, {})):
        with pytest.raises(ValueError, match=f"x={value!r} is not allowed: it must be a number in"):
            number("x", value, **kwargs)
    assert number("x", None, optional=True) is None
    with pytest.raises(ValueError, match=r"x=-1 is not allowed: it must be a number in \(0.0, 1.0\], or None"):
        number("x", -1, 0.0, 1.0, low_open=True, high_open=False, optional=True)
