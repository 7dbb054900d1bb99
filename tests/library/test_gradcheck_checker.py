"""The gradient checker checked (issue 31 item 3): its documented defaults are its defaults, a gradient wrong by
1% fails at them (whether the gradient is large or small), and a NaN or ±inf analytic or numerical gradient
fails. tests/library/test_gradcheck.py plants gross errors; these plant subtle ones.
"""
import inspect
import re

import numpy as np
import pytest

from minattn import backend, gradcheck
from minattn.engine import Function, is_grad_enabled
from minattn.gradcheck import GradcheckError, check_backward

DOCUMENTED = {"eps": 1e-6, "rtol": 1e-4, "atol": 1e-6}


def test_the_defaults_are_the_documented_ones():
    params = inspect.signature(check_backward).parameters
    assert {k: params[k].default for k in DOCUMENTED} == DOCUMENTED
    stated = dict(re.findall(r"(eps|rtol|atol) = (\d+(?:\.\d+)?e-?\d+)", gradcheck.__doc__))
    assert {k: float(v) for k, v in stated.items()} == DOCUMENTED, "the module docstring states other defaults"


class _Scale(Function):
    """y = c·x with a backward off by the factor ``error``."""

    def __init__(self, c, error=1.0):
        self.c, self.error = c, error

    def forward(self, x):
        return x * self.c

    def backward(self, gy):
        return gy * (self.c * self.error)


@pytest.mark.parametrize("c", [10.0, 1.0, 1e-3], ids=["large", "unit", "small"])
@pytest.mark.parametrize("error", [1.01, 0.99])
def test_a_gradient_wrong_by_one_percent_fails_at_the_defaults(c, error, device):
    """The directional derivatives here are ~c: a 1% error is ~0.1 (large), ~0.01, ~1e-5 (small), all above
    atol + rtol·|numeric| at the defaults, and each would pass with rtol or atol 1000× looser."""
    x = backend.to_device(np.random.default_rng(0).standard_normal((3, 4)), device)
    check_backward(lambda a: _Scale(c)(a), [x])
    with pytest.raises(GradcheckError, match="numeric .* vs analytic"):
        check_backward(lambda a: _Scale(c, error)(a), [x])


def test_a_gradient_right_to_rounding_passes():
    x = np.random.default_rng(0).standard_normal((3, 4))
    check_backward(lambda a: _Scale(3.0, 1 + 1e-9)(a), [x])


class _Poisoned(Function):
    """x² with NaN or inf planted in the backward (analytic) or in the no-grad forward the checker's finite
    differences use (numeric)."""

    def __init__(self, where, value):
        self.where, self.value = where, value

    def forward(self, x):
        self.x = x
        y = x * x
        return y * self.value if self.where == "numeric" and not is_grad_enabled() else y

    def backward(self, gy):
        g = 2 * self.x * gy
        return g * self.value if self.where == "analytic" else g


@pytest.mark.filterwarnings("ignore::RuntimeWarning")     # NaN and inf in the sums are the point here
@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf], ids=["nan", "inf", "-inf"])
@pytest.mark.parametrize("where", ["analytic", "numeric"])
def test_a_nan_or_inf_gradient_fails(where, value):
    x = np.random.default_rng(0).standard_normal((2, 3))
    check_backward(lambda a: _Poisoned(where, 1.0)(a), [x])
    with pytest.raises(GradcheckError):
        check_backward(lambda a: _Poisoned(where, value)(a), [x])


def test_the_tolerances_are_applied_as_documented():
    """|numeric − analytic| ≤ atol + rtol·|numeric|: an error of 0.5·atol passes, 2·atol fails (on a gradient
    ~1e-9, where rtol adds nothing), and a relative 0.5·rtol passes where 2·rtol fails (on a gradient ~1e3)."""
    x = np.ones((1,))
    u = abs(np.random.default_rng(0).standard_normal(1)[0])      # the checker's upstream gradient (seed 0)

    def ok(derivative, err):   # |directional derivative| = c·u (the direction of a 1-element tensor is ±1)
        check_backward(lambda a: _Scale(derivative / u, err)(a), [x], n_directions=1)
    ok(1e-9, 1 + 0.5e-6 / 1e-9)
    with pytest.raises(GradcheckError):
        ok(1e-9, 1 + 2e-6 / 1e-9)
    ok(1e3, 1 + 0.5e-4)
    with pytest.raises(GradcheckError):
        ok(1e3, 1 + 2e-4)


def test_an_integer_input_that_receives_a_gradient_fails():
    """Integer inputs (ids, targets) are constants: the checker asserts that nothing gave them a gradient."""
    from minattn import functional as F
    from minattn.engine import Tensor
    ids = Tensor(np.array([0, 2, 1]))

    def leaky(w, i):                 # a broken op that writes a gradient onto its integer argument
        i.grad = np.ones(i.shape)
        return F.embedding(w, i.data)

    check_backward(lambda w, i: F.embedding(w, i.data), [np.random.default_rng(0).standard_normal((3, 2)), ids])
    ids.grad = None
    with pytest.raises(GradcheckError, match="integer input"):
        check_backward(leaky, [np.random.default_rng(0).standard_normal((3, 2)), ids])
