"""Annex: the gradients of a tensor's slices put together at once (the seam:
``faster(ops.GetItem, x)``).

The plain ``GetItem`` backward of a basic index (x[:, :C], x[0]) is a zeros array of x's shape with
gy written into the slice; a tensor cut into n slices (q, k and v of a fused projection; the hidden
layer shared by a feed-forward and its gate) gets n such arrays, summed: 2n + 2 array operations and
n passes over memory. Here the slice's gradient goes to the engine unevaluated (a ``Slices``, see
fast/accumulate.py), and the engine fills one array for all n: the gradients side by side (one
concatenate or stack) when the slices tile an axis, else one zeros array written into n times. Off
NumPy only, as the grouped ops: on NumPy the n arrays cost no more than the one.
"""
import numpy as np

from ..backend import array_module
from ..engine import register_faster
from ..ops.indexing import GetItem, _array_kind
from .accumulate import Deferred


class Slices(Deferred):
    """A slice's gradient: gy at a basic index of zeros, evaluated by the engine. The slices of one
    tensor fill one array: 1 + n operations, not 2n + 2."""
    __slots__ = ("index", "g")

    def __init__(self, index, g, shape):
        self.index, self.g, self.shape, self.dtype = index, g, shape, g.dtype

    @staticmethod
    def total(items):
        tiles = _tiling(items)
        # the slices cover the tensor once (q | k | v): their gradients side by side
        if tiles is not None:
            axis, kind, gs = tiles
            return getattr(array_module(gs[0]), kind)(gs, axis=axis)
        gx = array_module(items[0].g).zeros(items[0].shape, dtype=items[0].dtype)
        gx[items[0].index] = items[0].g
        for item in items[1:]:
            # not gx[index] += g: that also writes the view back, a second copy. The trailing ...
            # makes an all-int index (x[0, 1]) a 0-d view too, not a copy that the += would be lost
            # in.
            view = gx[item.index if any(i is Ellipsis for i in item.index) else item.index + (Ellipsis,)]
            view += item.g
        return gx


def _tiling(items):
    """(axis, "stack" or "concatenate", gradients in order) when every index is ``[:, ..., :, i]``
    with i an int (x[0], x[1], ...) or a step-1 slice (x[:, :C], x[:, C:]) on one axis, and they
    cover that axis exactly once; else None."""
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


class SlicingGetItem(GetItem):
    def backward(self, gy):
        # off NumPy only (as the grouped ops), basic indexing only (a scalar bool, x[True], is a mask)
        if type(gy) is not np.ndarray and all(_array_kind(i) is None and not isinstance(i, (bool, np.bool_))
                                              for i in self.index):
            return Slices(self.index, gy, self.shape)
        return super().backward(gy)


register_faster(GetItem, SlicingGetItem)
