"""Composite references of fused ops: the same equations written with ops (so their gradients come from
the engine), which the tests compare the fused ops against and gradient-check on their own.

Geometric attention (Csordás, Irie & Schmidhuber 2022, "The Neural Data Router", Eqs. 7 and 9–10):
the composed form of minattn.attention.geometric (the fused ``GeometricWeights`` is in minattn/fast/), and
the directional logits as the paper writes them (D_ii = 0 on the always-masked diagonal, where the fused op
has s←_i).
"""
from minattn import backend
from minattn import functional as F
from minattn.attention.geometric import geometric_weights, invalid_keys


def geometric_attention_weights_reference(logits, key_mask=None, normalize=False):
    """Eq. 7 in log space, composed of ops (``geometric_weights``), with the optional normalisation."""
    A = geometric_weights(logits, invalid_keys(key_mask, logits.shape[-1], logits.data))
    return A / F.maximum(A.sum(axis=-1, keepdims=True), 1e-12) if normalize else A


def directional_logits_reference(qk, s, alpha, beta, gamma):
    """Eqs. 9–10 composed of ops: α qk + β D + γ with D_ij = s→_i (j > i), s←_i (j < i), 0 (j = i)."""
    xp = backend.array_module(qk.data)
    T = qk.shape[-1]
    i, j = xp.arange(T)[:, None], xp.arange(T)[None, :]
    left, right = (j < i).astype(qk.dtype), (j > i).astype(qk.dtype)
    return alpha * qk + beta * (s[..., 0:1] * left + s[..., 1:2] * right) + gamma
