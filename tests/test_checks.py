"""The shared argument checks."""

import math

import numpy as np
import pytest

from papernotes import checks


def test_integer_accepts_integers_at_or_above_the_bound():
    assert checks.integer("steps", 3) == 3
    assert checks.integer("steps", np.int64(5)) == 5
    assert checks.integer("offset", 0, low=0) == 0


@pytest.mark.parametrize(
    ("value", "error"),
    [(0, ValueError), (-2, ValueError), (2.5, TypeError), (True, TypeError), ("3", TypeError)],
)
def test_integer_rejects_with_the_name(value, error):
    with pytest.raises(error, match="steps must be an integer"):
        checks.integer("steps", value)


def test_number_accepts_values_in_the_interval():
    assert checks.number("lr", 1) == 1.0 and isinstance(checks.number("lr", 1), float)
    assert checks.number("decay", 0.0, 0, 1) == 0.0 and checks.number("decay", 1.0, 0, 1) == 1.0
    assert checks.number("x", np.float32(0.5), 0, 1) == 0.5


@pytest.mark.parametrize(
    ("value", "kwargs", "message"),
    [
        (0.0, {"low": 0, "low_open": True}, r"lr must be a finite number in \(0, inf\); got 0"),
        (1.5, {"low": 0, "high": 1}, r"in \[0, 1\]; got 1.5"),
        (1.0, {"low": 0, "high": 1, "high_open": True}, r"in \[0, 1\); got 1"),
        (math.nan, {}, r"in \(-inf, inf\); got nan"),
        (math.inf, {"low": 0}, r"in \[0, inf\); got inf"),
    ],
)
def test_number_rejects_values_outside_with_the_interval(value, kwargs, message):
    with pytest.raises(ValueError, match=message):
        checks.number("lr", value, **kwargs)


@pytest.mark.parametrize("value", ["0.1", None, True, [0.1]])
def test_number_rejects_non_numbers_as_type_errors(value):
    with pytest.raises(TypeError, match="lr must be a number"):
        checks.number("lr", value)


def test_one_of_accepts_an_option_and_names_them_all_otherwise():
    assert checks.one_of("activation", "relu", ("sigmoid", "relu")) == "relu"
    with pytest.raises(ValueError, match="activation must be one of 'sigmoid', 'relu'; got 'tanh'"):
        checks.one_of("activation", "tanh", ("sigmoid", "relu"))


def test_tensor_returns_the_named_sizes():
    import torch

    assert checks.tensor("x", torch.zeros(2, 5, 3), "(B, T, D)") == {"B": 2, "T": 5, "D": 3}
    assert checks.tensor("x", torch.zeros(4, 4), "(N, N)") == {"N": 4}
    assert checks.tensor("x", torch.zeros(2, 3), "(B, 3)", B=2) == {"B": 2}


@pytest.mark.parametrize(
    ("value", "shape", "sizes", "message"),
    [
        ((2, 5), "(B, T, D)", {}, r"x must have shape \(B, T, D\); got \(2, 5\)"),
        ((2, 5, 4), "(B, T, D)", {"D": 3}, r"shape \(B, T, D\) with D = 3; got \(2, 5, 4\)"),
        ((3, 4), "(N, N)", {}, r"shape \(N, N\) with N = 3; got \(3, 4\)"),
        ((2, 4), "(B, 3)", {}, r"shape \(B, 3\); got \(2, 4\)"),
    ],
)
def test_tensor_rejects_wrong_shapes_with_a_readable_expected_shape(value, shape, sizes, message):
    import torch

    with pytest.raises(ValueError, match=message):
        checks.tensor("x", torch.zeros(value), shape, **sizes)


def test_tensor_rejects_non_tensors_and_wrong_dtypes():
    import torch

    with pytest.raises(TypeError, match=r"x must be a tensor of shape \(N,\); got list"):
        checks.tensor("x", [1, 2], "(N,)")
    with pytest.raises(TypeError, match="x must be a floating-point tensor; got torch.int64"):
        checks.tensor("x", torch.zeros(2, dtype=torch.long), "(N,)", dtype="floating")
    with pytest.raises(TypeError, match="x must be a torch.int64 tensor; got torch.float32"):
        checks.tensor("x", torch.zeros(2), "(N,)", dtype=torch.long)


def test_boolean_accepts_flags_only():
    assert checks.boolean("batch_norm", True) is True
    assert checks.boolean("batch_norm", np.bool_(False)) is False
    for value in (1, 0, "True", None):
        with pytest.raises(TypeError, match="batch_norm must be True or False"):
            checks.boolean("batch_norm", value)
