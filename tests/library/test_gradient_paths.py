"""Gradient paths the OPS table does not take (issue 31 item 2), on the cpu and the strict device:

* every reduction (sum, mean, max) over every axis choice of a 3-D input — each axis, negative ones, several
  at once in either order, all — with keepdims and without; cumsum both ways along every axis; every
  softmax-like op (softmax, log_softmax, the Gumbel soft sample) along every axis;
* ties: max shares the gradient equally among tied maxima (over one axis, several, all); softmax-likes of
  tied logits are smooth and gradient-checked;
* one scale parameter meeting two input shapes in one graph (a LayerNorm weight, geometric attention's α, β, γ),
  which off NumPy goes through the engine's deferred ``ProductSum``;
* the engine's dtype guard: a backward returning the wrong float dtype is a TypeError naming the op.

Each test here fails with a planted wrong gradient: the catalogue of tests/mutation.py plants them
(``make mutation``).
"""
import numpy as np
import pytest

from minattn import backend, nn
from minattn import functional as F
from minattn.attention.geometric import GeometricAttention
from minattn.engine import Function, Tensor
from minattn.gradcheck import check_backward

AXES = [None, 0, 1, 2, -1, -2, -3, (0, 1), (0, 2), (1, 2), (-1, -3), (-3, -1), (-2, -1), (0, -1), (-1, 0),
        (0, 1, 2), (-1, -2, -3)]
AXIS_IDS = [str(a).replace(" ", "") for a in AXES]


def _x(device, shape=(2, 3, 4), seed=0):
    return backend.to_device(np.random.default_rng(seed).standard_normal(shape), device)


@pytest.mark.parametrize("keepdims", [False, True], ids=["flat", "keepdims"])
@pytest.mark.parametrize("axis", AXES, ids=AXIS_IDS)
@pytest.mark.parametrize("op", ["sum", "mean", "max"])
def test_reductions_over_every_axis_spec(op, axis, keepdims, device):
    check_backward(lambda a: getattr(a, op)(axis=axis, keepdims=keepdims), [_x(device)])
    check_backward(lambda a: getattr(F, op)(a, axis=axis, keepdims=keepdims) * 3.0, [_x(device, seed=1)])


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("axis", [0, 1, 2, -1, -2, -3])
def test_cumsum_along_every_axis(axis, reverse, device):
    check_backward(lambda a: F.cumsum(a, axis=axis, reverse=reverse), [_x(device)])


SOFTMAX_LIKE = {
    "softmax": lambda a, axis: F.softmax(a, axis=axis),
    "log_softmax": lambda a, axis: F.log_softmax(a, axis=axis),
    "gumbel_soft": lambda a, axis: F.gumbel_softmax(a, tau=0.7, hard=False, axis=axis,
                                                    noise=backend.to_device(np.linspace(-1, 1, a.size).reshape(a.shape),
                                                                            backend.device_of(a.data))),
}


@pytest.mark.parametrize("axis", [0, 1, 2, -1, -2, -3])
@pytest.mark.parametrize("name", list(SOFTMAX_LIKE))
def test_softmax_likes_along_every_axis(name, axis, device):
    check_backward(lambda a: SOFTMAX_LIKE[name](a, axis), [_x(device)])


@pytest.mark.parametrize("axis", [0, -1, -2])
@pytest.mark.parametrize("name", list(SOFTMAX_LIKE))
def test_softmax_likes_of_tied_logits(name, axis, device):
    x = np.array([[[0.5, 0.5, -1.0], [2.0, 2.0, 2.0]], [[0.5, 0.5, -1.0], [0.0, 1.0, 1.0]]])
    check_backward(lambda a: SOFTMAX_LIKE[name](a, axis), [backend.to_device(x, device)])


def test_log_softmax_on_a_non_last_axis_is_the_log_of_softmax(device):
    x = _x(device)
    for axis in (0, 1, -2):
        np.testing.assert_allclose(backend.to_numpy(F.log_softmax(Tensor(x), axis=axis).data),
                                   np.log(backend.to_numpy(F.softmax(Tensor(x), axis=axis).data)), rtol=1e-12)


TIED = np.array([[[1.0, 3.0, 3.0, 0.0], [2.0, 2.0, 2.0, 2.0], [-1.0, 5.0, 0.0, 5.0]],
                 [[3.0, 1.0, 0.0, 3.0], [0.0, -2.0, 4.0, 1.0], [4.0, 4.0, 4.0, 0.0]]])


@pytest.mark.parametrize("keepdims", [False, True], ids=["flat", "keepdims"])
@pytest.mark.parametrize("axis", [None, 0, 1, 2, -1, (1, 2), (-1, -3), (0, 1, 2)],
                         ids=["None", "0", "1", "2", "-1", "(1,2)", "(-1,-3)", "(0,1,2)"])
def test_max_shares_the_gradient_equally_among_tied_maxima(axis, keepdims, device):
    """max is not differentiable at a tie; its gradient is the subgradient that splits the upstream gradient
    equally among the tied maxima (as NumPy-based autograd libraries do), so the entries still sum to it."""
    x = Tensor(backend.to_device(TIED, device), requires_grad=True)
    y = x.max(axis=axis, keepdims=keepdims)
    gy = np.random.default_rng(0).standard_normal(y.shape) + 2.0
    y.backward(backend.to_device(gy, device))
    is_max = TIED == TIED.max(axis=axis, keepdims=True)
    g = np.reshape(gy, TIED.max(axis=axis, keepdims=True).shape)
    want = is_max * g / is_max.sum(axis=axis, keepdims=True)
    np.testing.assert_allclose(backend.to_numpy(x.grad), want, rtol=1e-12, atol=0)


def test_max_of_tied_entries_moved_together_is_gradient_checked(device):
    """Along a direction that moves the tied maxima together, max is differentiable and the shared gradient
    must give the directional derivative (a gradient given to one of them only, or to each in full, fails)."""
    x = np.array([[1.0, 3.0, 3.0, 0.0], [2.0, 2.0, 2.0, 2.0]])
    d = np.array([[0.0, 1.0, 1.0, 0.0], [0.5, 0.5, 0.5, 0.5]])

    def f(t):   # max(x + s d) as a function of the scalar s
        return (Tensor(backend.to_device(x, device)) + t * Tensor(backend.to_device(d, device))).max(axis=-1)

    check_backward(f, [backend.to_device(np.array([0.0]), device)])


def test_a_layer_norm_weight_meeting_two_shapes_in_one_graph(device):
    """One LayerNorm applied to inputs of two shapes in one graph: its weight gets two products of different
    shapes, which off NumPy the engine sums as deferred ProductSums (and one shape twice: the stacked path)."""
    ln = nn.LayerNorm(5).to(device).double()
    ln.weight.data = backend.to_device(np.linspace(0.5, 1.5, 5), device)
    ln.bias.data = backend.to_device(np.linspace(-0.2, 0.3, 5), device)

    def f(a, b, c):
        return F.concat([ln(a).reshape(-1), ln(b).reshape(-1), ln(c).reshape(-1)], axis=0)

    rng = np.random.default_rng(0)
    xs = [backend.to_device(rng.standard_normal(s), device) for s in [(2, 3, 5), (4, 5), (4, 5)]]
    check_backward(f, xs, params=ln)


def test_geometric_attention_scales_meeting_two_lengths_in_one_graph(device):
    """α, β, γ of geometric attention (DirectionalLogits' deferred products) over two sequence lengths."""
    m = GeometricAttention(4, 2).to(device)
    rng = np.random.default_rng(0)
    xs = [backend.to_device(rng.standard_normal(s), device) for s in [(2, 3, 4), (1, 5, 4)]]
    check_backward(lambda a, b: F.concat([m(a).reshape(-1), m(b).reshape(-1)], axis=0), xs, params=m)


class _WrongDtype(Function):
    def __init__(self, dtype):
        self.dtype = dtype

    def forward(self, x):
        return x * 2

    def backward(self, gy):
        return (gy * 2).astype(self.dtype)


@pytest.mark.parametrize("data_dtype,grad_dtype", [(np.float64, np.float32), (np.float32, np.float64)])
def test_the_engine_refuses_a_backward_of_the_wrong_dtype(data_dtype, grad_dtype, device):
    x = Tensor(backend.to_device(np.ones(3, data_dtype), device), requires_grad=True)
    y = (_WrongDtype(grad_dtype)(x) * 1.0).sum()
    with pytest.raises(TypeError, match=f"_WrongDtype.backward returned {np.dtype(grad_dtype)} for a "
                                        f"{np.dtype(data_dtype)} input"):
        y.backward()
    x2 = Tensor(backend.to_device(np.ones(3, data_dtype), device), requires_grad=True)
    (_WrongDtype(data_dtype)(x2) * 1.0).sum().backward()     # the right dtype passes
    np.testing.assert_array_equal(backend.to_numpy(x2.grad), 2.0)
