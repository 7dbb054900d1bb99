"""Annex: how ``Tensor.backward`` adds gradients, made faster (the seam:
``faster(engine.Accumulation, data)``).

The textbook ``engine.Accumulation`` adds out of place: a tensor used n times gets n − 1 new arrays,
and a leaf's ``.grad`` is a copy. ``GroupedAccumulation`` does the same sums with fewer array
operations:

* On NumPy it adds in place into a buffer that it made for that same tensor (the first sum), never
  into an array it was handed: an op that passes its gradient through (add, reshape, broadcast...)
  gives one array to several inputs, and adding into it would corrupt the other input's gradient
  (tests/library/test_random_graphs.py). Ownership is keyed on the id() of the *tensor*, alive until backward
  returns. A leaf keeps such a buffer as its ``.grad`` without a copy.
* Off NumPy (CuPy, where every array operation is a kernel launch of ~10 µs of host time) it
  collects a tensor's gradients and sums them when it reaches the tensor: two with one add, more
  with one stack and one sum (``sum_arrays``); gradients an op hands over unevaluated (a
  ``Deferred``: a leaf's broadcast gradient ``SumTo`` here, the grouped products of fast/grouped.py,
  the slices of fast/slices.py) are evaluated together, one kind at a time.

The sums run in another order than one by one, so the last bits may differ from the textbook
path.
"""
import numpy as np

from .. import backend
from ..engine import Accumulation, register_faster, sum_to


class Deferred:
    """A gradient handed to the engine unevaluated, so that all gradients of one kind of a tensor
    are evaluated together: a parameter of a layer applied n times per step gets n of them, and n
    products (or reductions) cost n array operations where one over concatenated inputs costs two or
    three. ``total(items)`` evaluates a list of them. Subclasses set ``shape`` and ``dtype`` (the
    engine checks them as it checks any gradient)."""
    __slots__ = ("shape", "dtype")


class SumTo(Deferred):
    """``sum_to(g, shape)``: a broadcast gradient reduced to a leaf's shape (a bias, a scalar)."""
    __slots__ = ("g",)

    def __init__(self, g, shape):
        lead = g.ndim - len(shape)
        fits = lead >= 0 and all(n in (1, m) for n, m in zip(shape, g.shape[lead:]))
        self.g, self.shape, self.dtype = g, tuple(shape) if fits else g.shape, g.dtype

    @staticmethod
    def total(items):
        shape, gs = items[0].shape, [i.g for i in items]
        if len(gs) > 1 and all(g.shape == gs[0].shape for g in gs):
            # one reduction over all of them
            return sum_to(backend.array_module(gs[0]).stack(gs), shape)
        return sum_arrays([sum_to(g, shape) for g in gs])


def total(items):
    """The sum of a tensor's gradients: arrays and Deferred ones, each kind evaluated together."""
    arrays, kinds = [], {}
    for item in items:
        if isinstance(item, Deferred):
            kinds.setdefault(type(item), []).append(item)
        else:
            arrays.append(item)
    return sum_arrays(arrays + [kind.total(group) for kind, group in kinds.items()])


def sum_arrays(arrays):
    if len(arrays) == 1:
        return arrays[0]
    if len(arrays) == 2:
        return arrays[0] + arrays[1]
    return _sum_in_order(backend.array_module(arrays[0]), arrays)


def _sum_in_order(xp, arrays):
    """g0 + g1 + g2 + ... in two array operations. NumPy (under the strict and counting test
    devices) sums a stack along axis 0 left to right, the bits of adding one by one, except for
    one-element arrays, where the axis is contiguous and it sums pairwise: there a cumulative sum
    keeps the order. A GPU reduction may add in another order."""
    stacked = xp.stack(arrays)
    return stacked.sum(axis=0) if arrays[0].size > 1 else xp.cumsum(stacked, axis=0)[-1]


class GroupedAccumulation(Accumulation):
    """In place into owned buffers on NumPy; collected and summed at once elsewhere (see above)."""

    def __init__(self):
        # ids of the tensors whose summed gradient the engine made for them alone
        self.owns = set()
        self.owned = False     # whether the gradient ``take`` returned last is such a buffer

    def take(self, t):
        g, t._g = t._g, None
        if type(g) is list or isinstance(g, Deferred):
            g, self.owned = total(g if type(g) is list else [g]), True
        else:
            self.owned = id(t) in self.owns
        return g

    def add(self, t, gx):
        prev = t._g              # arrays here may be shared with other inputs: never written into
        if prev is None:
            t._g = gx
        elif type(prev) is np.ndarray and type(gx) is np.ndarray:
            # a buffer of t's own, made by the first sum, takes the rest in place
            if id(t) in self.owns:
                prev += gx
            else:
                t._g = prev + gx
                self.owns.add(id(t))
        elif type(prev) is list:
            prev.append(gx)
        else:
            t._g = [prev, gx]

    def sum_to(self, gx, t):
        # off NumPy a leaf (a parameter, maybe of a shared layer) reduces all its gradients at once
        if type(t.data) is np.ndarray or t.creator is not None:
            return sum_to(gx, t.data.shape)
        return SumTo(gx, t.data.shape)

    def keep(self, leaf, g):
        if leaf.grad is None:
            leaf.grad = g if self.owned else g.copy()
        else:
            leaf.grad = leaf.grad + g


register_faster(Accumulation, GroupedAccumulation)
