"""Reductions: sum, mean, max and cumulative sum along axes. A reduction's backward broadcasts the
output gradient back over the reduced axes."""
from ..backend import array_module
from ..engine import Function


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
