"""Elementwise ops: binary (with NumPy broadcasting), unary, and the straight-through estimator.

Binary ops return gradients of the broadcast shape; the engine sums them back to each input's shape
(``engine.sum_to``). A backward never writes into ``gy``: the engine may have handed that array to
several nodes.
"""
import numpy as np

from ..backend import array_module
from ..engine import Function, Tensor


def _is_scalar(x):
    t = type(x)
    return t is float or t is int or isinstance(x, np.generic)


def _needs_grad(fn, i):
    return fn.inputs[i].requires_grad

# ---------------------------------------------------------------------------------------------
# Elementwise binary (broadcasting)
# ---------------------------------------------------------------------------------------------

class Add(Function):
    def forward(self, a, b):
        return a + b

    def backward(self, gy):
        return gy, gy


class Sub(Function):
    def forward(self, a, b):
        return a - b

    def backward(self, gy):
        return gy, -gy


class Mul(Function):
    def forward(self, a, b):
        self.a, self.b = a, b
        return a * b

    def backward(self, gy):
        return (gy * self.b if _needs_grad(self, 0) else None,
                gy * self.a if _needs_grad(self, 1) else None)


class Div(Function):
    def forward(self, a, b):
        self.b = b
        self.y = a / b
        return self.y

    def backward(self, gy):
        ga = gy / self.b
        return ga, (-ga * self.y if _needs_grad(self, 1) else None)


class Maximum(Function):
    def forward(self, a, b):
        self.mask = a >= b  # ties go to a
        return array_module(a).maximum(a, b)

    def backward(self, gy):
        return gy * self.mask, gy * ~self.mask


class Minimum(Function):
    def forward(self, a, b):
        self.mask = a <= b  # ties go to a
        return array_module(a).minimum(a, b)

    def backward(self, gy):
        return gy * self.mask, gy * ~self.mask


class AddScalar(Function):
    def __init__(self, c):
        self.c = c

    def forward(self, x):
        return x + self.c

    def backward(self, gy):
        return gy


class MulScalar(Function):
    def __init__(self, c):
        self.c = c

    def forward(self, x):
        return x * self.c

    def backward(self, gy):
        return gy * self.c


class PowScalar(Function):
    def __init__(self, p):
        self.p = p

    def forward(self, x):
        self.x = x
        return x ** self.p

    def backward(self, gy):
        return gy * (self.p * self.x ** (self.p - 1))


class Where(Function):
    """where(cond, a, b); ``cond`` is a plain boolean array (no gradient)."""

    def __init__(self, cond):
        self.cond = cond

    def forward(self, a, b):
        return array_module(a).where(self.cond, a, b)

    def backward(self, gy):
        zero = gy.dtype.type(0)
        xp = array_module(gy)
        return (xp.where(self.cond, gy, zero) if _needs_grad(self, 0) else None,
                xp.where(self.cond, zero, gy) if _needs_grad(self, 1) else None)


class MaskedFill(Function):
    """x with ``value`` wherever ``mask`` is true; the filled entries get no gradient."""

    def __init__(self, mask, value):
        self.mask, self.value = mask, value

    def forward(self, x):
        # A NumPy scalar of x's dtype, not xp.asarray(value): on a GPU that would be a
        # host-to-device copy.
        return array_module(x).where(self.mask, x.dtype.type(self.value), x)

    def backward(self, gy):
        return array_module(gy).where(self.mask, gy.dtype.type(0), gy)


def add(a, b):
    if _is_scalar(b):
        return AddScalar(b)(a)
    if _is_scalar(a):
        return AddScalar(a)(b)
    return Add()(a, b)


def sub(a, b):
    if _is_scalar(b):
        return AddScalar(-b)(a)
    if _is_scalar(a):
        return AddScalar(a)(MulScalar(-1)(b))
    return Sub()(a, b)


def mul(a, b):
    if _is_scalar(b):
        return MulScalar(b)(a)
    if _is_scalar(a):
        return MulScalar(a)(b)
    return Mul()(a, b)


def div(a, b):
    if _is_scalar(b):
        return MulScalar(1.0 / b)(a)
    if _is_scalar(a):
        return MulScalar(a)(PowScalar(-1)(b))
    return Div()(a, b)


def pow(x, p):
    if not _is_scalar(p):
        raise TypeError("pow: only scalar exponents are supported (use exp(p * log(x)) for "
                        "tensors)")
    return PowScalar(p)(x)


class ClampMin(Function):
    """max(x, c) for a scalar c; entries at or below c get no gradient."""

    def __init__(self, c):
        self.c = c

    def forward(self, x):
        self.mask = x > self.c
        return array_module(x).maximum(x, x.dtype.type(self.c))

    def backward(self, gy):
        return gy * self.mask


def maximum(a, b):
    if _is_scalar(b):
        return ClampMin(b)(a)
    return Maximum()(a, b)


def minimum(a, b):
    return Minimum()(a, b)


def where(cond, a, b):
    cond = cond.data if isinstance(cond, Tensor) else cond
    if _is_scalar(a) or _is_scalar(b):
        if _is_scalar(a) and _is_scalar(b):
            raise TypeError("where: at least one of a, b must be a tensor")
        if _is_scalar(a):
            return MaskedFill(cond, a)(b)
        return MaskedFill(~cond, b)(a)
    return Where(cond)(a, b)


def masked_fill(x, mask, value):
    """Fill ``x`` with the scalar ``value`` where ``mask`` (broadcastable boolean array) is true."""
    return MaskedFill(mask.data if isinstance(mask, Tensor) else mask, value)(x)


# ---------------------------------------------------------------------------------------------
# Elementwise unary
# ---------------------------------------------------------------------------------------------

class Neg(Function):
    def forward(self, x):
        return -x

    def backward(self, gy):
        return -gy


class Exp(Function):
    def forward(self, x):
        self.y = array_module(x).exp(x)
        return self.y

    def backward(self, gy):
        return gy * self.y


class Log(Function):
    def forward(self, x):
        self.x = x
        return array_module(x).log(x)

    def backward(self, gy):
        return gy / self.x


class Sqrt(Function):
    def forward(self, x):
        self.y = array_module(x).sqrt(x)
        return self.y

    def backward(self, gy):
        return gy * 0.5 / self.y


class Abs(Function):
    def forward(self, x):
        self.x = x
        return array_module(x).abs(x)

    def backward(self, gy):
        return gy * array_module(gy).sign(self.x)


class Tanh(Function):
    def forward(self, x):
        self.y = array_module(x).tanh(x)
        return self.y

    def backward(self, gy):
        return gy * (1 - self.y * self.y)


class Sigmoid(Function):
    def forward(self, x):
        # 0.5·(1 + tanh(x/2)) equals 1/(1+e^-x) but never overflows (no warnings at ±1000).
        self.y = 0.5 * (array_module(x).tanh(0.5 * x) + 1)
        return self.y

    def backward(self, gy):
        return gy * self.y * (1 - self.y)


class ReLU(Function):
    def forward(self, x):
        self.mask = x > 0
        return x * self.mask

    def backward(self, gy):
        return gy * self.mask


class Softplus(Function):
    """log(1 + e^x), computed as logaddexp(0, x) so it is finite for any x."""

    def forward(self, x):
        self.x = x
        return array_module(x).logaddexp(x.dtype.type(0), x)

    def backward(self, gy):
        return gy * (0.5 * (array_module(gy).tanh(0.5 * self.x) + 1))  # sigmoid(x)


class LogSigmoid(Function):
    """log σ(x) = −softplus(−x); fused so log σ(−1000) = −1000 instead of log(0)."""

    def forward(self, x):
        self.x = x
        return -array_module(x).logaddexp(x.dtype.type(0), -x)

    def backward(self, gy):
        return gy * (0.5 * (1 - array_module(gy).tanh(0.5 * self.x)))  # 1 − σ(x) = σ(−x)


def neg(x):
    return Neg()(x)


def exp(x):
    return Exp()(x)


def log(x):
    return Log()(x)


def sqrt(x):
    return Sqrt()(x)


def abs(x):  # noqa: A001 (mirrors numpy's name)
    return Abs()(x)


def tanh(x):
    return Tanh()(x)


def sigmoid(x):
    return Sigmoid()(x)


def relu(x):
    return ReLU()(x)


def softplus(x):
    return Softplus()(x)


def logsigmoid(x):
    return LogSigmoid()(x)



class StraightThrough(Function):
    """Forward: the given ``hard`` array exactly. Backward: the gradient passes to ``soft``
    unchanged.

    This is the straight-through estimator (Bengio et al. 2013) as used by Gumbel-softmax
    (Jang et al. 2017): the forward value is exactly one-hot, the backward is the soft sample's.
    """

    def __init__(self, hard):
        self.hard = hard

    def forward(self, soft):
        return self.hard.astype(soft.dtype)

    def backward(self, gy):
        return gy



def straight_through(soft, hard):
    return StraightThrough(hard.data if isinstance(hard, Tensor) else hard)(soft)
