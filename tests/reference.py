"""Composite references of fused ops: the same equations written with ops (so their gradients come from
the engine), which the tests compare the fused ops against and gradient-check on their own.

Geometric attention (Csordás, Irie & Schmidhuber 2022, "The Neural Data Router", Eqs. 7 and 9–10):
the form minattn.attention.geometric used before its fused ``GeometricWeights`` and ``DirectionalLogits``.
"""
from minattn import backend
from minattn import functional as F
from minattn.attention.geometric import MASKED, constants, invalid_keys
from minattn.engine import Function


class PermuteKeys(Function):
    """y[..., i, p] = x[..., i, perm[i, p]] for a permutation per query row. Because every row is a
    permutation, the backward is the inverse gather (no scatter-add needed)."""

    def __init__(self, rows, perm, inv):
        self.rows, self.perm, self.inv = rows, perm, inv

    def forward(self, x):
        return x[..., self.rows, self.perm]

    def backward(self, gy):
        return gy[..., self.rows, self.inv]


def geometric_attention_weights_reference(logits, key_mask=None, normalize=False):
    """Eq. 7 in log space, composed of ops: A = exp(log σ(z) + Σ_{k∈S_ij} log(1 − σ(z_ik)))."""
    T = logits.shape[-1]
    z = F.masked_fill(logits, invalid_keys(key_mask, T, logits.data), MASKED)
    log_p = F.logsigmoid(z)                                                 # ℓ = log σ(z)
    log_not_p = F.logsigmoid(-z)                                            # m = log(1 − σ(z))
    rows, perm, inv = constants(T, logits.data)[:3]
    m_scan = PermuteKeys(rows, perm, inv)(log_not_p)                        # m in scan order
    blocked_scan = F.cumsum(m_scan, axis=-1) - m_scan                       # Σ of m over earlier keys
    blocked = PermuteKeys(rows, inv, perm)(blocked_scan)                    # back to key order
    A = F.exp(log_p + blocked)
    return A / F.maximum(A.sum(axis=-1, keepdims=True), 1e-12) if normalize else A


def directional_logits_reference(qk, s, alpha, beta, gamma):
    """Eqs. 9–10 composed of ops: α qk + β D + γ with D_ij = s→_i (j > i), s←_i (j < i), 0 (j = i)."""
    xp = backend.array_module(qk.data)
    T = qk.shape[-1]
    i, j = xp.arange(T)[:, None], xp.arange(T)[None, :]
    left, right = (j < i).astype(qk.dtype), (j > i).astype(qk.dtype)
    return alpha * qk + beta * (s[..., 0:1] * left + s[..., 1:2] * right) + gamma
