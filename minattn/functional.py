"""minattn.functional (import as ``F``): the functions models are written with.

Primitives come from ``ops`` (layer norm among them, fused beside its composed form); the composites
here (Gumbel-softmax) are built from ops and so get correct gradients for free. Dropout is one
module, ``nn.Dropout``, which owns its random stream. Signatures follow PyTorch's, with NumPy's
``axis=`` keyword.
"""
from .backend import array_module, default_rng, device_of
from .engine import Tensor
from .ops import (abs, broadcast_to, concat, cross_entropy, cumsum, embedding, exp, layer_norm,
                  linear,  # noqa: F401
                  log, log_softmax, logsigmoid, masked_fill, matmul, max, maximum, mean,
                  merge_heads, minimum,
                  relu, reshape, sigmoid, softmax, softplus, split_heads, sqrt, stack,
                  straight_through, sum,
                  swapaxes, tanh, transpose, where)


# The logit a forbidden key gets before a softmax or sigmoid: finite, so that a row with every key
# masked stays finite (−inf would give NaN), and so far below any real logit that its weight is
# exactly 0 in float32.
MASKED = -1e9


def one_hot_argmax(x, axis=-1):
    """A plain array: 1 at the (first) maximum along ``axis``, 0 elsewhere."""
    data = x.data if isinstance(x, Tensor) else x
    xp = array_module(data)
    idx = data.argmax(axis=axis)
    n = data.shape[axis]
    positions = xp.arange(n).reshape([-1 if a == axis % data.ndim else 1 for a in range(data.ndim)])
    return (xp.expand_dims(idx, axis) == positions).astype(data.dtype)


def gumbel_softmax(logits, tau=1.0, hard=True, rng=None, axis=-1, noise=None):
    """Gumbel-softmax sample (Jang et al. 2017, Eq. 1): softmax((logits + g) / τ), g ~ Gumbel(0, 1).

    ``hard=True`` returns the straight-through sample: exactly one-hot forward, gradient of the
    soft sample backward. ``tau`` may be a Tensor (a learned or predicted temperature) that
    broadcasts against ``logits``; its gradient flows through the soft sample. ``noise`` lets
    tests fix g; otherwise it is drawn from ``rng``.
    """
    if noise is None:
        if rng is None:
            rng = default_rng(device_of(logits.data if isinstance(logits, Tensor) else logits))
        noise = rng.gumbel(logits.shape, logits.dtype)
    soft = softmax((logits + noise) / tau, axis=axis)
    if not hard:
        return soft
    return straight_through(soft, one_hot_argmax(soft, axis))
