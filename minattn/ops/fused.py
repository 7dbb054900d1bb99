"""The normalising ops, each a primitive with its analytic backward beside its composed definition:
softmax, log_softmax, cross-entropy and layer norm.

Each is one node, on every path: the max-subtraction that keeps exp finite and the fully masked row
(all −inf, zeros out, not NaN) are handled in one place, for numerical stability, and the graph is a
few arrays instead of a dozen nodes (the design guide names exactly these). The composed form
(``*_composed``) is the definition, written with ops so the engine derives its gradient; the tests
check that both agree and gradient-check both. Only layer norm has a faster form in the annex
(``faster(LayerNorm, x)``: fast/grouped.py, and the GPU tier's kernel).
"""
from ..backend import array_module
from ..engine import Function, Tensor, faster
from . import elementwise as E
from . import reductions as R
from .indexing import _checked_ids


def _row_max(x, axis):
    """The maximum along ``axis`` of the array x (kept), 0 where it is not finite (a fully masked
    row)."""
    xp = array_module(x)
    m = x.max(axis=axis, keepdims=True)
    return xp.where(xp.isfinite(m), m, x.dtype.type(0))


# --- softmax --------------------------------------------------------------------------------------

class Softmax(Function):
    """softmax along ``axis`` as one op. A row whose entries are all −inf (fully masked) gives
    zeros, not NaN."""

    def __init__(self, axis=-1):
        self.axis = axis

    def forward(self, x):
        xp = array_module(x)
        e = xp.exp(x - _row_max(x, self.axis))
        s = e.sum(axis=self.axis, keepdims=True)
        self.y = e / xp.where(s > 0, s, x.dtype.type(1))
        return self.y

    def backward(self, gy):
        y = self.y
        return y * (gy - (gy * y).sum(axis=self.axis, keepdims=True))


def softmax_composed(x, axis=-1):
    """softmax(x) = e / Σ e, e = exp(x − m): the row maximum m is a constant (it cancels in the
    ratio, and subtracting it keeps exp finite); a fully masked row (all −inf) gives zeros, as the
    fused op does."""
    e = E.exp(x - _row_max(x.data, axis))
    s = R.sum(e, axis, keepdims=True)
    return e / E.where(s.data > 0, s, 1.0)


def softmax(x, axis=-1):
    return Softmax(axis)(x)


# --- log_softmax ----------------------------------------------------------------------------------

def _logsumexp(x, axis):
    m = _row_max(x, axis)
    return array_module(x).log(array_module(x).exp(x - m).sum(axis=axis, keepdims=True)) + m


class LogSoftmax(Function):
    def __init__(self, axis=-1):
        self.axis = axis

    def forward(self, x):
        self.y = x - _logsumexp(x, self.axis)
        return self.y

    def backward(self, gy):
        xp = array_module(gy)
        return gy - xp.exp(self.y) * gy.sum(axis=self.axis, keepdims=True)


def log_softmax_composed(x, axis=-1):
    """log softmax(x) = (x − m) − log Σ exp(x − m), with the row maximum m a constant (see
    softmax)."""
    shifted = x - _row_max(x.data, axis)
    return shifted - E.log(R.sum(E.exp(shifted), axis, keepdims=True))


def log_softmax(x, axis=-1):
    return LogSoftmax(axis)(x)


# --- cross-entropy --------------------------------------------------------------------------------

def _target_weights(t, ignore_index, dtype):
    """(targets with ignored ones set to 0, weight per target: 1/count for the counted ones, else
    0). The count is divided on the device (no host sync); with nothing counted the loss is 0, not
    NaN."""
    xp = array_module(t)
    valid = t != ignore_index if ignore_index is not None else xp.ones(t.shape, dtype=bool)
    return xp.where(valid, t, 0), valid.astype(dtype) / xp.maximum(valid.sum(), 1).astype(dtype)


class CrossEntropy(Function):
    """Mean over targets of −log softmax(logits)[target], fused (log-sum-exp, one pass back).

    logits (..., C), targets (...) integer; targets equal to ``ignore_index`` are left out of the
    mean. With nothing left the loss is 0 (not NaN).
    """

    def __init__(self, targets, ignore_index=None):
        self.targets, self.ignore_index = targets, ignore_index

    def forward(self, x):
        t, self.weight = _target_weights(self.targets, self.ignore_index, x.dtype)
        self.lse = _logsumexp(x, -1)
        self.onehot = t[..., None] == array_module(x).arange(x.shape[-1])
        picked = (x * self.onehot).sum(axis=-1)
        self.x = x
        return ((self.lse[..., 0] - picked) * self.weight).sum()

    def backward(self, gy):
        xp = array_module(gy)
        p = xp.exp(self.x - self.lse)
        return (p - self.onehot) * (self.weight * gy)[..., None]


def cross_entropy_composed(logits, targets, ignore_index=None):
    """−Σ_i w_i log softmax(logits_i)[t_i], w_i = 1/(number of counted targets) or 0 for an ignored
    one."""
    t, weight = _target_weights(targets, ignore_index, logits.dtype)
    onehot = (t[..., None] == array_module(t).arange(logits.shape[-1])).astype(logits.dtype)
    # log p of each target
    picked = R.sum(log_softmax_composed(logits) * onehot, -1)
    return -R.sum(picked * weight)


def cross_entropy(logits, targets, ignore_index=None):
    """See ``CrossEntropy``. Host (NumPy) targets are range-checked, then moved to the logits'
    device."""
    targets = targets.data if isinstance(targets, Tensor) else targets
    targets = _checked_ids(targets, logits.shape[-1], "cross_entropy: target", logits, ignore_index)
    if targets.shape != logits.shape[:-1]:
        raise ValueError(f"cross_entropy: targets shape {targets.shape} does not match logits "
                         f"{logits.shape[:-1]}")
    return CrossEntropy(targets, ignore_index)(logits)


# --- layer norm -----------------------------------------------------------------------------------

class LayerNorm(Function):
    """(x − mean)/sqrt(var + eps) · weight + bias over the last axis (biased variance, as
    PyTorch)."""

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
        # weight and bias: the engine sums them over the leading axes
        return self.grad_x(gy), gy * self.xhat, gy

    def grad_x(self, gy):
        xhat, gh = self.xhat, gy * self.weight
        return self.rstd * (gh - gh.mean(axis=-1, keepdims=True)
                            - xhat * (gh * xhat).mean(axis=-1, keepdims=True))


def layer_norm_composed(x, weight, bias, eps=1e-5):
    """(x − μ) / sqrt(σ² + eps) · weight + bias, μ and σ² the mean and (biased) variance of the last
    axis."""
    xc = x - R.mean(x, -1, keepdims=True)
    var = R.mean(xc * xc, -1, keepdims=True)
    return xc / E.sqrt(var + eps) * weight + bias


def layer_norm(x, weight, bias, eps=1e-5):
    """LayerNorm over the last axis (Ba et al. 2016)."""
    return faster(LayerNorm, x)(eps)(x, weight, bias)
