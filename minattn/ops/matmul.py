"""The matrix product, and the linear layer's product-plus-bias as one op. The backward of a @ b is
gy @ bᵀ and aᵀ @ gy, written with ``swapaxes(-1, -2)`` so that batched operands work too."""
from ..engine import Function, faster
from .elementwise import _needs_grad


class MatMul(Function):
    """Batched a @ b for a (..., m, k), b (..., k, n); batch dims broadcast."""

    def forward(self, a, b):
        if a.ndim < 2 or b.ndim < 2:
            raise ValueError(f"matmul needs at least 2-D operands, got shapes {a.shape} and "
                             f"{b.shape}")
        self.a, self.b = a, b
        return _mm(a, b)

    def backward(self, gy):
        return (_mm(gy, self.b.swapaxes(-1, -2)) if _needs_grad(self, 0) else None,
                _mm(self.a.swapaxes(-1, -2), gy) if _needs_grad(self, 1) else None)


def _mm(a, b):
    # matmul hands a strided operand (a column slice such as hidden[:, :d_ff], or its transpose) to
    # BLAS with its stride, where dot would copy it first; but matmul skips BLAS when the inner
    # dimension is 1 (an outer product, e.g. a weight gradient at batch 1), where dot does not. Both
    # give the same bits.
    return a.dot(b) if a.ndim == 2 and b.ndim == 2 and a.shape[1] == 1 else a @ b


def matmul(a, b):
    return faster(MatMul, a)()(a, b)


class Linear(MatMul):
    """x @ W + b for x (..., d_in), W (d_in, d_out), b (d_out,) or absent: the matmul and the bias
    add as one node, the bias added in place into the product (one temporary array less). Leading
    axes are folded into rows, x (N, d_in), and unfolded after: one 2-D product is much faster than
    a batched one, and the two reshapes are not two more nodes (as
    ``x.reshape(-1, d_in)``, the linear, and ``.reshape(*lead, d_out)`` would be: 2 of the ~16 nodes
    of a copy-gate layer's step). Backward: MatMul's on the rows, and the bias gets gy, which the
    engine sums over the rows (``sum_to``)."""

    def forward(self, x, W, *b):
        self.x_shape = x.shape
        y = super().forward(x.reshape(-1, x.shape[-1]), W)                # rows (N, d_in) @ W
        if b:
            y += b[0]
        return y.reshape(x.shape[:-1] + y.shape[-1:])

    def backward(self, gy):
        # rows, as the forward's product
        gy = gy.reshape(-1, gy.shape[-1])
        gx, gW = super().backward(gy)
        gx = None if gx is None else gx.reshape(self.x_shape)
        return (gx, gW) + ((gy,) if len(self.inputs) == 3 else ())


def linear(x, W, b=None):
    fn = faster(Linear, x)()
    return fn(x, W) if b is None else fn(x, W, b)
