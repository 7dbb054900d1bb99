"""Annex: the weight gradients of a layer applied n times, computed as one product (off NumPy).

A shared layer (the NDR encoder applies one layer 14 times) gets n gradients for each weight: n
matrix products aᵀ gy for a weight matrix, n products gy ⊙ x summed for a scale (a layer norm's
weight; geometric attention's α and β, in fast/geometric.py). Here those ops hand them to the engine
unevaluated (``Deferred``, see fast/accumulate.py), which evaluates all n at once: ``Outer``, one
product of the concatenated rows (3 array operations, not n + 2), and ``ProductSum``, one product of
stacked inputs (4, not n + 2). On NumPy an operation is a function call, not a kernel launch, and
concatenating costs more than it saves: there the ops below behave as their plain forms.

Seam: each op here is a subclass of its plain form, registered with ``engine.register_faster``; the
core asks ``faster(MatMul, a)`` etc.
"""
import numpy as np

from ..backend import array_module
from ..engine import register_faster, sum_to
from ..ops.elementwise import _needs_grad
from ..ops.fused import LayerNorm
from ..ops.matmul import Linear, MatMul, _mm
from .accumulate import Deferred, sum_arrays


class Outer(Deferred):
    """aᵀ g for a (N, m), g (N, n): a weight's gradient, evaluated by the engine. The n products of
    a shared layer's weight are one product of their concatenated rows."""
    __slots__ = ("a", "g")

    def __init__(self, a, g):
        self.a, self.g, self.shape, self.dtype = a, g, (a.shape[1], g.shape[1]), g.dtype

    @staticmethod
    def total(items):
        if len(items) == 1:
            return _mm(items[0].a.swapaxes(-1, -2), items[0].g)
        xp = array_module(items[0].g)
        return _mm(xp.concatenate([i.a for i in items]).swapaxes(-1, -2),
                   xp.concatenate([i.g for i in items]))


class ProductSum(Deferred):
    """a ⊙ b summed to ``shape``: the gradient of a scale, evaluated by the engine. The n products
    of a shared layer's scale are one product of stacked inputs."""
    __slots__ = ("a", "b")

    def __init__(self, a, b, shape):
        self.a, self.b, self.shape, self.dtype = a, b, tuple(shape), a.dtype

    @staticmethod
    def total(items):
        first = items[0]
        if len(items) == 1 or any(i.a.shape != first.a.shape or i.b.shape != first.b.shape
                                  for i in items):
            return sum_arrays([sum_to(i.a * i.b, i.shape) for i in items])
        xp = array_module(first.a)
        return sum_to(xp.stack([i.a for i in items]) * xp.stack([i.b for i in items]), first.shape)


def _grouped(gy):
    return type(gy) is not np.ndarray


class GroupedMatMul(MatMul):
    """Off NumPy, a weight's gradient (a 2-D leaf times 2-D rows) goes to the engine as an
    ``Outer``."""

    def backward(self, gy):
        if not (_grouped(gy) and _needs_grad(self, 1) and self.inputs[1].creator is None
                and self.a.ndim == 2):
            return super().backward(gy)
        return (_mm(gy, self.b.swapaxes(-1, -2)) if _needs_grad(self, 0) else None), Outer(self.a, gy)


class GroupedLinear(Linear, GroupedMatMul):
    """Linear's backward over GroupedMatMul's (method order: Linear, GroupedMatMul, MatMul)."""


class GroupedLayerNorm(LayerNorm):
    def backward(self, gy):
        if not _grouped(gy):
            return super().backward(gy)
        return self.grad_x(gy), ProductSum(gy, self.xhat, self.weight.shape), gy


for _plain, _fast in ((MatMul, GroupedMatMul), (Linear, GroupedLinear),
                      (LayerNorm, GroupedLayerNorm)):
    register_faster(_plain, _fast)
