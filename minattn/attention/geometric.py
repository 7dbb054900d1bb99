"""Geometric attention with directional encoding (Csordás, Irie & Schmidhuber 2022, "The Neural Data
Router", §3, Eqs. 7–10; spec ndr.md §3).

Instead of a softmax over keys, each query i scans the keys from the closest outwards and attends to
the first one that matches. With match probabilities P_ij = σ(z_ij), the weight of key j is

    A_ij = P_ij · Π_{k ∈ S_ij} (1 − P_ik)                                           (Eq. 7)

where S_ij holds the keys closer to i than j; on equal distance the key on the RIGHT counts as closer
(so the scan order of query i is i+1, i−1, i+2, i−2, …). Σ_j A_ij ≤ 1; the rest means "attend to
nothing". The logit has a content term and a directional term that lets a query prefer one side:

    z_ij = α · q_i·k_j + β · D_ij + γ,   D_ij = s→_i if j > i, s←_i if j < i          (Eqs. 9–10)

Following the official code, (s←, s→) = W_s x_i + b_s (per head, no nonlinearity), α, β, γ are
scalars shared by all heads, attention dropout acts on the keys, and the diagonal is masked (a
position never attends to itself). Everything is computed in log space (ℓ = log σ(z),
m = log(1 − σ(z))) so that no product of many probabilities underflows and no ±inf ever enters the
graph: masked logits are replaced by a large finite negative, which gives exactly A = 0 and m = 0.
"""
import math

import numpy as np

from .. import backend
from .. import functional as F
from ..engine import Function
from ..nn import Dropout, Linear, Module, Parameter, head_size, uniform

MASKED = -1e9  # substitute logit for masked keys: σ = 0 exactly, log(1 − σ) = 0 exactly


def scan_order(T):
    """perm[i] lists the keys in the order query i scans them: i, i+1, i−1, i+2, i−2, ... (right wins
    ties); inv is its inverse permutation (inv[i, perm[i, p]] = p)."""
    i, k = np.arange(T)[:, None], np.arange(T)[None, :]
    rank = 2 * np.abs(k - i) + (k < i)          # distance first; on a tie the right key first
    perm = np.argsort(rank, axis=1, kind="stable")
    return perm, np.argsort(perm, axis=1)


class PermuteKeys(Function):
    """y[..., i, p] = x[..., i, perm[i, p]] for a permutation per query row. Because every row is a
    permutation, the backward is the inverse gather (no scatter-add needed)."""

    def __init__(self, rows, perm, inv):
        self.rows, self.perm, self.inv = rows, perm, inv

    def forward(self, x):
        return x[..., self.rows, self.perm]

    def backward(self, gy):
        return gy[..., self.rows, self.inv]


_ORDER_CACHE = {}


def _device_scan_order(T, device):
    key = (T, device)
    if key not in _ORDER_CACHE:
        perm, inv = scan_order(T)
        _ORDER_CACHE[key] = tuple(backend.to_device(a, device) for a in (np.arange(T)[:, None], perm, inv))
    return _ORDER_CACHE[key]


def geometric_attention_weights(logits, key_mask=None, normalize=False):
    """Map logits z (B, H, T, T) to geometric attention weights A (B, H, T, T) (spec §3.3–3.6).

    ``key_mask`` (B, T) is True for real keys and False for padding. The diagonal is always masked.
    ``normalize=True`` divides each row by max(Σ_j A_ij, 1e-12) (the "+ geom. att." baseline).
    """
    B, H, T, _ = logits.shape
    xp = backend.array_module(logits.data)
    invalid = xp.eye(T, dtype=bool)
    if key_mask is not None:
        invalid = invalid | ~key_mask[:, None, None, :]                     # (B, 1, T, T)
    z = F.masked_fill(logits, invalid, MASKED)
    log_p = F.logsigmoid(z)                                                 # ℓ = log σ(z)
    log_not_p = F.logsigmoid(-z)                                            # m = log(1 − σ(z))
    rows, perm, inv = _device_scan_order(T, backend.device_of(logits.data))
    m_scan = PermuteKeys(rows, perm, inv)(log_not_p)                        # m in scan order
    blocked_scan = F.cumsum(m_scan, axis=-1) - m_scan                       # Σ of m over earlier keys
    blocked = PermuteKeys(rows, inv, perm)(blocked_scan)                    # back to key order
    A = F.exp(log_p + blocked)                                              # Eq. 7 in log space
    if normalize:
        A = A / F.maximum(A.sum(axis=-1, keepdims=True), 1e-12)
    return A


class GeometricAttention(Module):
    """Multi-head geometric attention with the directional term (spec §3). Letters follow the paper."""

    last_weights = None

    def __init__(self, d_model, n_head=1, attention_dropout=0.0, normalize=False, rng=None):
        rng = rng or np.random.default_rng(0)
        self.n_head, self.d_head = n_head, head_size(d_model, n_head)
        self.normalize = normalize
        bound = math.sqrt(6.0 / (d_model + self.d_head))  # the code's init: fans (d, d_h) for every matrix
        self.w_qkv = Parameter(uniform(rng, (d_model, 3 * d_model), bound))   # [W_q | W_k | W_v], no bias
        self.b_q = Parameter(np.zeros((n_head, 1, self.d_head), backend.DEFAULT_DTYPE))
        self.direction = Linear(d_model, 2 * n_head, rng=rng)                # W_s, b_s: (s←, s→) per head
        self.w_o = Parameter(uniform(rng, (d_model, d_model), bound))
        self.alpha = Parameter(np.array([1 / math.sqrt(self.d_head)], backend.DEFAULT_DTYPE))
        self.beta = Parameter(np.ones(1, backend.DEFAULT_DTYPE))
        self.gamma = Parameter(np.zeros(1, backend.DEFAULT_DTYPE))
        self.key_dropout = Dropout(attention_dropout)

    def forward(self, x, key_mask=None, return_weights=False):
        B, T, C = x.shape
        H, dh = self.n_head, self.d_head
        qkv = (x.reshape(B * T, C) @ self.w_qkv).reshape(B, T, 3, H, dh).transpose(2, 0, 3, 1, 4)
        q, k, v = qkv[0] + self.b_q, self.key_dropout(qkv[1]), qkv[2]            # (B, H, T, dh) each
        s = self.direction(x).reshape(B, T, H, 2).transpose(0, 2, 1, 3)           # (B, H, T, 2)
        left, right = self._sides(T, x.data)
        D = s[..., 0:1] * left + s[..., 1:2] * right                             # (B, H, T, T)
        z = self.alpha * (q @ k.swapaxes(-1, -2)) + self.beta * D + self.gamma
        A = geometric_attention_weights(z, key_mask, self.normalize)
        if self.record:  # kept for analysis and plots (see UniversalEncoder's trace)
            self.last_weights = A
        y = (A @ v).transpose(0, 2, 1, 3).reshape(B * T, C) @ self.w_o           # (B·T, C)
        y = y.reshape(B, T, C)
        return (y, A) if return_weights else y

    @staticmethod
    def _sides(T, like):
        """Constant (T, T) masks: left[i, j] = 1 if j < i, right[i, j] = 1 if j > i."""
        xp = backend.array_module(like)
        i, j = xp.arange(T)[:, None], xp.arange(T)[None, :]
        return (j < i).astype(like.dtype), (j > i).astype(like.dtype)
