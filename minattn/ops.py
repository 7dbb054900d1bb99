"""Primitive differentiable operations: a ``Function`` subclass each, forward and backward side by side.

Every op works on raw NumPy/CuPy arrays; ``xp = array_module(x)`` picks the module when an op must
create an array. Backward functions never write into ``gy`` (the engine may have handed the same
array to several nodes). Broadcasting is undone once, in the engine (``sum_to``), so binary ops
simply return gradients of the broadcast shape.

Sections: elementwise binary, elementwise unary, reductions, matmul, shape and indexing, fused
normalising ops (softmax, log_softmax, cross-entropy, layer norm), embedding, straight-through.
Softmax, log_softmax and cross-entropy are fused for numerical stability (max-subtraction) and
speed; ``tests/test_ops.py`` checks them against their composite definitions.
"""
import numpy as np

from .backend import array_module, device_of, to_device
from .engine import Deferred, Function, Tensor, _sum_arrays, sum_to


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
        # A NumPy scalar of x's dtype, not xp.asarray(value): on a GPU that would be a host-to-device copy.
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
        raise TypeError("pow: only scalar exponents are supported (use exp(p * log(x)) for tensors)")
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


# ---------------------------------------------------------------------------------------------
# Reductions
# ---------------------------------------------------------------------------------------------

def _expand_reduced(g, shape, axis, keepdims):
    """Bring a reduced gradient back to a shape that broadcasts against the input."""
    if axis is None or keepdims:
        return g if axis is not None else g.reshape((1,) * len(shape))
    axes = (axis,) if isinstance(axis, int) else axis
    axes = sorted(a % len(shape) for a in axes)
    for a in axes:
        g = array_module(g).expand_dims(g, a)
    return g


class Sum(Function):
    def __init__(self, axis=None, keepdims=False):
        self.axis, self.keepdims = axis, keepdims

    def forward(self, x):
        self.shape = x.shape
        return x.sum(axis=self.axis, keepdims=self.keepdims)

    def backward(self, gy):
        g = _expand_reduced(gy, self.shape, self.axis, self.keepdims)
        return array_module(gy).broadcast_to(g, self.shape)


class Mean(Sum):
    def forward(self, x):
        y = super().forward(x)
        self.n = x.size // y.size if y.size else 1
        return y / self.n

    def backward(self, gy):
        return super().backward(gy / self.n)


class Max(Function):
    """max over axes; the gradient is shared equally among tied maxima."""

    def __init__(self, axis=None, keepdims=False):
        self.axis, self.keepdims = axis, keepdims

    def forward(self, x):
        y = x.max(axis=self.axis, keepdims=True)
        self.mask = x == y
        if self.keepdims:
            return y
        return y.reshape(()) if self.axis is None else y.squeeze(axis=self.axis)

    def backward(self, gy):
        g = _expand_reduced(gy, self.mask.shape, self.axis, self.keepdims)
        count = self.mask.sum(axis=self.axis, keepdims=True)
        return (self.mask * g / count).astype(gy.dtype)


class Cumsum(Function):
    """Inclusive cumulative sum along ``axis``; ``reverse=True`` sums from the end."""

    def __init__(self, axis, reverse=False):
        self.axis, self.reverse = axis, reverse

    def forward(self, x):
        return _cumsum(x, self.axis, self.reverse)

    def backward(self, gy):
        return _cumsum(gy, self.axis, not self.reverse)


def _cumsum(x, axis, reverse):
    xp = array_module(x)
    if not reverse:
        return xp.cumsum(x, axis=axis)
    return xp.flip(xp.cumsum(xp.flip(x, axis=axis), axis=axis), axis=axis)


def sum(x, axis=None, keepdims=False):  # noqa: A001
    return Sum(axis, keepdims)(x)


def mean(x, axis=None, keepdims=False):
    return Mean(axis, keepdims)(x)


def max(x, axis=None, keepdims=False):  # noqa: A001
    return Max(axis, keepdims)(x)


def cumsum(x, axis=-1, reverse=False):
    return Cumsum(axis, reverse)(x)


# ---------------------------------------------------------------------------------------------
# Matrix product
# ---------------------------------------------------------------------------------------------

class MatMul(Function):
    """Batched a @ b for a (..., m, k), b (..., k, n); batch dims broadcast."""

    def forward(self, a, b):
        if a.ndim < 2 or b.ndim < 2:
            raise ValueError(f"matmul needs at least 2-D operands, got shapes {a.shape} and {b.shape}")
        self.a, self.b = a, b
        return _mm(a, b)

    def backward(self, gy):
        gb = None
        if _needs_grad(self, 1):  # off NumPy, a weight (a 2-D leaf times 2-D rows): aᵀ gy to the engine
            defer = type(gy) is not np.ndarray and self.inputs[1].creator is None and self.a.ndim == 2
            gb = Outer(self.a, gy) if defer else _mm(self.a.swapaxes(-1, -2), gy)
        return (_mm(gy, self.b.swapaxes(-1, -2)) if _needs_grad(self, 0) else None), gb


class Outer(Deferred):
    """aᵀ g for a (N, m), g (N, n): a weight's gradient, evaluated by the engine. The n products of a
    shared layer's weight are one product of their concatenated rows (3 array operations, not n + 2)."""
    __slots__ = ("a", "g")

    def __init__(self, a, g):
        self.a, self.g, self.shape, self.dtype = a, g, (a.shape[1], g.shape[1]), g.dtype

    @staticmethod
    def total(items):
        if len(items) == 1:
            return _mm(items[0].a.swapaxes(-1, -2), items[0].g)
        xp = array_module(items[0].g)
        return _mm(xp.concatenate([i.a for i in items]).swapaxes(-1, -2), xp.concatenate([i.g for i in items]))


class ProductSum(Deferred):
    """a ⊙ b summed to ``shape``: the gradient of a scale (a layer norm's weight, geometric attention's α),
    evaluated by the engine. The n products of a shared layer's scale are one product of stacked inputs
    (4 array operations, not n + 2). Made only off NumPy (see engine.Deferred)."""
    __slots__ = ("a", "b")

    def __init__(self, a, b, shape):
        self.a, self.b, self.shape, self.dtype = a, b, tuple(shape), a.dtype

    @staticmethod
    def total(items):
        first = items[0]
        if len(items) == 1 or any(i.a.shape != first.a.shape or i.b.shape != first.b.shape for i in items):
            return _sum_arrays([sum_to(i.a * i.b, i.shape) for i in items])
        xp = array_module(first.a)
        return sum_to(xp.stack([i.a for i in items]) * xp.stack([i.b for i in items]), first.shape)


def scale_grad(gy, x, shape):
    """The gradient gy ⊙ x of a scale of shape ``shape`` that multiplied x: unreduced on NumPy (the engine
    sums it), a ProductSum elsewhere."""
    return gy * x if type(gy) is np.ndarray else ProductSum(gy, x, shape)


def _mm(a, b):
    # NumPy's matmul skips BLAS when the inner dimension is 1 (an outer product, e.g. a weight
    # gradient at batch 1): 7× slower there than dot, which is the same product for 2-D arrays.
    return a.dot(b) if a.ndim == 2 and b.ndim == 2 else a @ b


def matmul(a, b):
    return MatMul()(a, b)


class Linear(MatMul):
    """x @ W + b for x (N, d_in), W (d_in, d_out), b (d_out,) or absent: the matmul and the bias add as
    one node, the bias added in place into the product (one temporary array less). Backward: MatMul's,
    and the bias gets gy unreduced (the engine sums it over the rows; see engine.Deferred)."""

    def forward(self, x, W, *b):
        if x.ndim != 2:
            raise ValueError(f"linear needs rows x (N, d_in), got shape {x.shape}")
        y = super().forward(x, W)
        if b:
            y += b[0]
        return y

    def backward(self, gy):
        return super().backward(gy) + ((gy,) if len(self.inputs) == 3 else ())


def linear(x, W, b=None):
    return Linear()(x, W) if b is None else Linear()(x, W, b)


# ---------------------------------------------------------------------------------------------
# Shape and indexing
# ---------------------------------------------------------------------------------------------

class Reshape(Function):
    def __init__(self, shape):
        self.shape = tuple(shape)

    def forward(self, x):
        self.in_shape = x.shape
        return x.reshape(self.shape)

    def backward(self, gy):
        return gy.reshape(self.in_shape)


class Transpose(Function):
    def __init__(self, axes):
        self.axes = tuple(axes) or None

    def forward(self, x):
        if self.axes is None:
            self.axes = tuple(reversed(range(x.ndim)))
        return x.transpose(self.axes)

    def backward(self, gy):
        return gy.transpose(tuple(np.argsort(self.axes)))


class SwapAxes(Function):
    def __init__(self, a, b):
        self.a, self.b = a, b

    def forward(self, x):
        return x.swapaxes(self.a, self.b)

    def backward(self, gy):
        return gy.swapaxes(self.a, self.b)


def _array_kind(i):
    """'b' for a boolean mask, 'i'/'u' for integer indices (arrays or lists), None for basic entries."""
    if hasattr(i, "shape"):
        return i.dtype.kind
    return np.asarray(i).dtype.kind if isinstance(i, list) else None


# On CPU (one BLAS thread, NumPy 2.4) a one-hot matmul beats sort-and-segment-sum up to some 32–128
# targets: an embedding of 896 ids × 128 over 19 rows took 0.08 ms vs 1.0 ms with add.at, over 200 rows
# 0.5 ms (sorted) vs 2.8 ms; the cost of the one-hot grows with the rows, that of the sort does not.
ONEHOT_MAX_ROWS = 64


def segment_sum(g, k, K):
    """out[p, j, q] = Σ_{i: k[i] = j} g[p, i, q] for g (P, m, Q) and integer k (m,) in [0, K): (P, K, Q).

    The backward of every gather. It is the same on every run, unlike ``xp.add.at``, whose CUDA
    version adds with float atomics in whatever order the threads arrive. A device other than NumPy
    (CuPy) uses a one-hot matmul: cuBLAS gives the same bits on every run and nothing is read back
    to the host (the guide's choice; not measured on a GPU). NumPy uses the one-hot matmul for a few
    targets and a stable sort + ``add.reduceat`` per segment beyond (measured; see ONEHOT_MAX_ROWS).
    Both sum in another order than ``add.at`` did, so results differ from it in the last bits.
    """
    xp = array_module(g)
    if xp is not np or K <= ONEHOT_MAX_ROWS:
        onehot = (xp.arange(K)[:, None] == k).astype(g.dtype)           # (K, m)
        return onehot @ g                                                 # (K, m) @ (P, m, Q)
    order = np.argsort(k, kind="stable")
    k_sorted = k[order]
    first = np.flatnonzero(np.r_[True, k_sorted[1:] != k_sorted[:-1]])  # where each distinct k starts
    out = np.zeros((g.shape[0], K, g.shape[2]), dtype=g.dtype)
    out[:, k_sorted[first]] = np.add.reduceat(g[:, order], first, axis=1)
    return out


def _gathered_axes(index, ndim):
    """(first axis, index arrays) when ``index`` is integer arrays on adjacent axes and ``:`` elsewhere
    (x[:, idx], w[ids], h[rows, cols], x[..., idx]), the form whose gradient is a segment sum; else None."""
    if any(i is Ellipsis for i in index):
        at = index.index(Ellipsis)
        index = index[:at] + (slice(None),) * (ndim - len(index) + 1) + index[at + 1:]
    arrays = [n for n, i in enumerate(index) if _array_kind(i) is not None]
    rest_full = all(isinstance(i, slice) and i == slice(None) for n, i in enumerate(index) if n not in arrays)
    adjacent = arrays == list(range(arrays[0], arrays[0] + len(arrays)))
    integer = all(_array_kind(index[n]) in ("i", "u") for n in arrays)
    if len(index) <= ndim and rest_full and adjacent and integer:
        return arrays[0], [index[n] for n in arrays]
    return None


class GetItem(Function):
    """x[index] with basic (slices, ints, None, ...) or integer/boolean-array indexing."""

    def __init__(self, index):
        index = index if isinstance(index, tuple) else (index,)
        self.index = tuple(i.data if isinstance(i, Tensor) else i for i in index)

    def forward(self, x):
        self.shape, self.dtype = x.shape, x.dtype
        return x[self.index]

    def backward(self, gy):
        # basic indexing (see engine.Deferred); a scalar bool (x[True]) is a mask, not basic
        if all(_array_kind(i) is None and not isinstance(i, (bool, np.bool_)) for i in self.index):
            return Slices(self.index, gy, self.shape)
        xp = array_module(gy)
        if all(_array_kind(i) in (None, "b") for i in self.index):
            gx = xp.zeros(self.shape, dtype=self.dtype)
            gx[self.index] = gy           # slices and masks pick each element at most once: no sum needed
            return gx
        axes = _gathered_axes(self.index, len(self.shape))
        if axes is None:
            # Any other mix (an int or a partial slice beside an array, arrays apart): sum over the flat
            # positions of x, x.size targets (on a GPU a one-hot of x.size × gy.size: small inputs only;
            # the library's own gathers all take the path below).
            size = int(np.prod(self.shape))
            flat = xp.arange(size).reshape(self.shape)[self.index]
            return segment_sum(gy.reshape(1, -1, 1), flat.reshape(-1), size).reshape(self.shape)
        a, arrays = axes
        sizes = self.shape[a:a + len(arrays)]
        k = 0
        for i, size in zip(arrays, sizes):                 # row-major position within the gathered axes
            k = k * size + xp.asarray(i) % size            # % size: negative indices count from the end
        P, K, Q = (int(np.prod(s)) for s in (self.shape[:a], sizes, self.shape[a + len(arrays):]))
        g = segment_sum(gy.reshape(P, k.size, Q), k.reshape(-1), K)                  # (P, K, Q)
        return g.reshape(self.shape)


class Slices(Deferred):
    """A slice's gradient: gy at a basic index of zeros, evaluated by the engine. The slices of one
    tensor (q, k and v of a fused projection) fill one array of zeros: 1 + n operations, not 2n + 2."""
    __slots__ = ("index", "g")

    def __init__(self, index, g, shape):
        self.index, self.g, self.shape, self.dtype = index, g, shape, g.dtype

    @staticmethod
    def total(items):
        tiles = _tiling(items)
        if tiles is not None:   # the slices cover the tensor once (q | k | v): their gradients side by side
            axis, kind, gs = tiles
            return getattr(array_module(gs[0]), kind)(gs, axis=axis)
        gx = array_module(items[0].g).zeros(items[0].shape, dtype=items[0].dtype)
        gx[items[0].index] = items[0].g
        for item in items[1:]:
            # not gx[index] += g: that also writes the view back, a second copy. The trailing ... makes an
            # all-int index (x[0, 1]) a 0-d view too, not a copy that the += would be lost in.
            view = gx[item.index if any(i is Ellipsis for i in item.index) else item.index + (Ellipsis,)]
            view += item.g
        return gx


def _tiling(items):
    """(axis, "stack" or "concatenate", gradients in order) when every index is ``[:, ..., :, i]`` with i an
    int (x[0], x[1], ...) or a step-1 slice (x[:, :C], x[:, C:]) on one axis, and they cover that axis
    exactly once; else None."""
    axis = len(items[0].index) - 1
    if not 0 <= axis < len(items[0].shape):
        return None
    n, spans = items[0].shape[axis], []
    for item in items:
        *lead, last = item.index
        if len(lead) != axis or any(not isinstance(i, slice) or i != slice(None) for i in lead):
            return None
        if isinstance(last, slice):
            start, stop, step = last.indices(n)
            if step != 1:
                return None
        elif isinstance(last, (int, np.integer)) and not isinstance(last, bool) and -n <= last < n:
            start = last % n
            stop = start + 1
        else:
            return None
        spans.append((start, stop, isinstance(last, slice), item.g))
    spans.sort(key=lambda span: span[0])
    kinds = {span[2] for span in spans}
    if len(kinds) > 1 or spans[0][0] != 0 or spans[-1][1] != n or any(
            a[1] != b[0] for a, b in zip(spans, spans[1:])):
        return None
    return axis, "concatenate" if kinds.pop() else "stack", [span[3] for span in spans]


class Concat(Function):
    def __init__(self, axis):
        self.axis = axis

    def forward(self, *xs):
        self.sizes = [x.shape[self.axis] for x in xs]
        return array_module(xs[0]).concatenate(xs, axis=self.axis)

    def backward(self, gy):
        xp = array_module(gy)
        return tuple(xp.split(gy, np.cumsum(self.sizes)[:-1].tolist(), axis=self.axis))


class Stack(Function):
    def __init__(self, axis):
        self.axis = axis

    def forward(self, *xs):
        return array_module(xs[0]).stack(xs, axis=self.axis)

    def backward(self, gy):
        n = gy.shape[self.axis]
        return tuple(gy.take(i, axis=self.axis) for i in range(n))


class BroadcastTo(Function):
    def __init__(self, shape):
        self.shape = tuple(shape)

    def forward(self, x):
        return array_module(x).broadcast_to(x, self.shape)

    def backward(self, gy):
        return gy  # the engine sums it back to the input's shape


def reshape(x, shape):
    return Reshape(shape)(x)


def transpose(x, axes=()):
    return Transpose(axes)(x)


def swapaxes(x, a, b):
    return SwapAxes(a, b)(x)


def getitem(x, index):
    return GetItem(index)(x)


def concat(xs, axis=0):
    return Concat(axis)(*xs)


def stack(xs, axis=0):
    return Stack(axis)(*xs)


def broadcast_to(x, shape):
    return BroadcastTo(shape)(x)


# ---------------------------------------------------------------------------------------------
# Fused normalising ops
# ---------------------------------------------------------------------------------------------

class Softmax(Function):
    """softmax along ``axis``. A row whose entries are all −inf (fully masked) gives zeros, not NaN."""

    def __init__(self, axis=-1):
        self.axis = axis

    def forward(self, x):
        xp = array_module(x)
        m = x.max(axis=self.axis, keepdims=True)
        m = xp.where(xp.isfinite(m), m, x.dtype.type(0))
        e = xp.exp(x - m)
        s = e.sum(axis=self.axis, keepdims=True)
        self.y = e / xp.where(s > 0, s, x.dtype.type(1))
        return self.y

    def backward(self, gy):
        y = self.y
        return y * (gy - (gy * y).sum(axis=self.axis, keepdims=True))


def _logsumexp(x, axis):
    xp = array_module(x)
    m = x.max(axis=axis, keepdims=True)
    m = xp.where(xp.isfinite(m), m, x.dtype.type(0))
    return xp.log(xp.exp(x - m).sum(axis=axis, keepdims=True)) + m


class LogSoftmax(Function):
    def __init__(self, axis=-1):
        self.axis = axis

    def forward(self, x):
        self.y = x - _logsumexp(x, self.axis)
        return self.y

    def backward(self, gy):
        xp = array_module(gy)
        return gy - xp.exp(self.y) * gy.sum(axis=self.axis, keepdims=True)


class CrossEntropy(Function):
    """Mean over targets of −log softmax(logits)[target], fused (log-sum-exp, one pass back).

    logits (..., C), targets (...) integer; targets equal to ``ignore_index`` are left out of the
    mean. With nothing left the loss is 0 (not NaN).
    """

    def __init__(self, targets, ignore_index=None):
        self.targets, self.ignore_index = targets, ignore_index

    def forward(self, x):
        xp = array_module(x)
        C = x.shape[-1]
        t = self.targets
        if t.shape != x.shape[:-1]:
            raise ValueError(f"cross_entropy: targets shape {t.shape} does not match logits {x.shape[:-1]}")
        valid = t != self.ignore_index if self.ignore_index is not None else xp.ones(t.shape, dtype=bool)
        t = xp.where(valid, t, 0)
        self.lse = _logsumexp(x, -1)
        self.onehot = t[..., None] == xp.arange(C)
        picked = (x * self.onehot).sum(axis=-1)
        # Divide by the count on the device (no host sync); an empty batch gives loss 0.
        self.weight = valid.astype(x.dtype) / xp.maximum(valid.sum(), 1).astype(x.dtype)
        self.x = x
        return ((self.lse[..., 0] - picked) * self.weight).sum()

    def backward(self, gy):
        xp = array_module(gy)
        p = xp.exp(self.x - self.lse)
        return (p - self.onehot) * (self.weight * gy)[..., None]


class LayerNorm(Function):
    """(x − mean)/sqrt(var + eps) · weight + bias over the last axis (biased variance, as PyTorch)."""

    def __init__(self, eps=1e-5):
        self.eps = eps

    def forward(self, x, weight, bias):
        xp = array_module(x)
        mu = x.mean(axis=-1, keepdims=True)
        xc = x - mu
        var = (xc * xc).mean(axis=-1, keepdims=True)
        self.rstd = 1 / xp.sqrt(var + x.dtype.type(self.eps))
        self.xhat = xc * self.rstd
        self.weight = weight
        return self.xhat * weight + bias

    def backward(self, gy):
        xhat = self.xhat
        # weight and bias get gy ⊙ x̂ and gy unreduced: the engine sums them over the leading axes, all
        # applications of a shared layer's norm in one reduction (engine.SumTo, ProductSum)
        gw, gb = scale_grad(gy, xhat, self.weight.shape), gy
        gh = gy * self.weight
        gx = self.rstd * (gh - gh.mean(axis=-1, keepdims=True) - xhat * (gh * xhat).mean(axis=-1, keepdims=True))
        return gx, gw, gb


def softmax(x, axis=-1):
    return Softmax(axis)(x)


def log_softmax(x, axis=-1):
    return LogSoftmax(axis)(x)


def cross_entropy(logits, targets, ignore_index=None):
    """See ``CrossEntropy``. Host (NumPy) targets are range-checked, then moved to the logits' device."""
    targets = targets.data if isinstance(targets, Tensor) else targets
    targets = _checked_ids(targets, logits.shape[-1], "cross_entropy: target", logits, ignore_index)
    return CrossEntropy(targets, ignore_index)(logits)


def layer_norm_fused(x, weight, bias, eps=1e-5):
    return LayerNorm(eps)(x, weight, bias)


# ---------------------------------------------------------------------------------------------
# Embedding lookup and straight-through
# ---------------------------------------------------------------------------------------------

class Embedding(Function):
    """weight[ids]; the backward sums the rows of repeated ids (``segment_sum``, no atomics)."""

    def __init__(self, ids):
        self.ids = ids

    def forward(self, weight):
        self.shape = weight.shape
        return weight[self.ids]

    def backward(self, gy):
        V, d = self.shape
        return segment_sum(gy.reshape(1, -1, d), self.ids.reshape(-1), V)[0]


class StraightThrough(Function):
    """Forward: the given ``hard`` array exactly. Backward: the gradient passes to ``soft`` unchanged.

    This is the straight-through estimator (Bengio et al. 2013) as used by Gumbel-softmax
    (Jang et al. 2017): the forward value is exactly one-hot, the backward is the soft sample's.
    """

    def __init__(self, hard):
        self.hard = hard

    def forward(self, soft):
        return self.hard.astype(soft.dtype)

    def backward(self, gy):
        return gy


def check_ids(ids, n, what="id", ignore_index=None):
    """Raise ValueError unless the integer HOST array ``ids`` lies in [0, n) (``ignore_index`` aside).

    Out-of-range ids must be caught on the host: CuPy's indexing wraps them around silently, and
    checking a device array would cost a host sync per batch. So check a batch before uploading it
    (``embedding`` and ``cross_entropy`` do it themselves for host arrays they are given)."""
    if ids.dtype.kind not in "iu":
        raise TypeError(f"{what}s must be integers, got {ids.dtype}")
    valid = ids[ids != ignore_index] if ignore_index is not None else ids
    if valid.size and (valid.min() < 0 or valid.max() >= n):
        raise ValueError(f"{what} out of range: must lie in [0, {n}), got [{valid.min()}, {valid.max()}]")


def _checked_ids(ids, n, what, like, ignore_index=None):
    """Host ids: checked, then moved to the device of ``like``. Device ids pass unchecked."""
    if type(ids) is not np.ndarray:
        return ids
    check_ids(ids, n, what, ignore_index)
    return to_device(ids, device_of(like.data if isinstance(like, Tensor) else like))   # a no-op on the host


def embedding(weight, ids):
    """weight[ids]. ``ids`` may be a host array whatever the weight's device (checked, then uploaded)."""
    ids = _checked_ids(ids.data if isinstance(ids, Tensor) else ids, weight.shape[0], "embedding: token id", weight)
    return Embedding(ids)(weight)


def straight_through(soft, hard):
    return StraightThrough(hard.data if isinstance(hard, Tensor) else hard)(soft)
