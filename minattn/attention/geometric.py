"""Geometric attention with directional encoding (Csordás, Irie & Schmidhuber 2022, "The Neural Data
Router", §3, Eqs. 7–10; docs/ndr.md §3).

Instead of a softmax over keys, each query i scans the keys from the closest outwards and attends to
the first one that matches. With match probabilities P_ij = σ(z_ij), the weight of key j is

    A_ij = P_ij · Π_{k ∈ S_ij} (1 − P_ik)                                           (Eq. 7)

where S_ij holds the keys closer to i than j; on equal distance the key on the RIGHT counts as
closer (so the scan order of query i is i+1, i−1, i+2, i−2, …). Σ_j A_ij ≤ 1; the rest means "attend
to nothing". The logit has a content term and a directional term that lets a query prefer one side:

    z_ij = α · q_i·k_j + β · D_ij + γ,   D_ij = s→_i if j > i, s←_i if j < i          (Eqs. 9–10)

Following the official code, (s←, s→) = W_s x_i + b_s (per head, no nonlinearity), α, β, γ are
scalars shared by all heads, attention dropout acts on the keys, and the diagonal is masked (a
position never attends to itself). Everything is computed in log space (ℓ = log σ(z),
m = log(1 − σ(z))) so that no product of many probabilities underflows and no ±inf ever enters the
graph: masked logits are replaced by a large finite negative, which gives exactly A = 0 and m = 0.
"""
import math
from collections import namedtuple

import numpy as np

from .. import backend
from .. import functional as F
from ..engine import Function, faster
from ..nn import Dropout, Linear, Module, Parameter, head_size, uniform


def scan_order(T):
    """perm[i] lists the keys in the order query i scans them: i, i+1, i−1, i+2, i−2, ... (right
    wins ties); inv is its inverse permutation (inv[i, perm[i, p]] = p)."""
    i, k = np.arange(T)[:, None], np.arange(T)[None, :]
    rank = 2 * np.abs(k - i) + (k < i)          # distance first; on a tie the right key first
    perm = np.argsort(rank, axis=1, kind="stable")
    return perm, np.argsort(perm, axis=1)


Constants = namedtuple("Constants", "rows perm inv right")
_CONSTANTS = {}


def constants(T, like):
    """Per-length constants on the device of ``like``, made once: the scan order as gather indices
    (``rows`` (T, 1), ``perm``, ``inv``: ``x[..., rows, perm]``) and ``right`` (T, T), the mask of
    j > i."""
    key = (T, backend.device_of(like))
    if key not in _CONSTANTS:
        perm, inv = scan_order(T)
        i, j = np.arange(T)[:, None], np.arange(T)[None, :]
        _CONSTANTS[key] = Constants(*(backend.to_device(a, key[1]) for a in (i, perm, inv, j > i)))
    return _CONSTANTS[key]


def invalid_keys(key_mask, T, like):
    """Boolean (B or 1, 1, T, T): True where query i may not attend to key j (the diagonal,
    padding)."""
    invalid = backend.array_module(like).eye(T, dtype=bool)
    return invalid if key_mask is None else invalid | ~key_mask[:, None, None, :]


class PermuteKeys(Function):
    """y[..., i, p] = x[..., i, perm[i, p]] for a permutation per query row. Because every row is a
    permutation, the backward is the inverse gather (no scatter-add needed)."""

    def __init__(self, rows, perm, inv):
        self.rows, self.perm, self.inv = rows, perm, inv

    def forward(self, x):
        return x[..., self.rows, self.perm]

    def backward(self, gy):
        return gy[..., self.rows, self.inv]


def geometric_weights(z, invalid):
    """Eq. 7 in log space: A = exp(log σ(z) + Σ_{k∈S_ij} log(1 − σ(z_ik))). Masked keys (``invalid``)
    get z = F.MASKED: σ = 0, so A = 0 and log(1 − σ) = 0 (they block nothing)."""
    z = F.masked_fill(z, invalid, F.MASKED)
    log_p = F.logsigmoid(z)                                                 # ℓ = log σ(z)
    log_not_p = F.logsigmoid(-z)                                            # m = log(1 − σ(z))
    c = constants(z.shape[-1], z.data)
    m_scan = PermuteKeys(c.rows, c.perm, c.inv)(log_not_p)                  # m in scan order
    # Σ of m over the keys scanned before j
    blocked_scan = F.cumsum(m_scan, axis=-1) - m_scan
    blocked = PermuteKeys(c.rows, c.inv, c.perm)(blocked_scan)              # back to key order
    return F.exp(log_p + blocked)


def geometric_attention_weights(logits, key_mask=None, normalize=False, invalid=None):
    """Map logits z (B, H, T, T) to geometric attention weights A (B, H, T, T) (Eq. 7).

    ``key_mask`` (B, T) is True for real keys and False for padding. The diagonal is always masked.
    ``normalize=True`` divides each row by max(Σ_j A_ij, 1e-12) (the "+ geom. att." baseline).
    ``invalid``: ``invalid_keys(key_mask, T, ...)``, when the caller keeps it for several calls.
    """
    T = logits.shape[-1]
    invalid = invalid_keys(key_mask, T, logits.data) if invalid is None else invalid
    # the annex's fused op on CuPy: one cumulative sum in scan order (fast/geometric.py)
    A = faster(geometric_weights, logits)(logits, invalid)
    return A / F.maximum(A.sum(axis=-1, keepdims=True), 1e-12) if normalize else A


def directional_logits(qk, s, alpha, beta, gamma, right):
    """Eqs. 9–10: z_ij = α q_i·k_j + β D_ij + γ, D_ij = s→_i if j > i (``right``) else s←_i, for
    qk = q kᵀ (B, H, T, T), s = (s←, s→) (B, H, T, 2), α, β, γ (1,). D_ii = s←_i on the (always
    masked) diagonal."""
    bs = s * beta + gamma                                               # (B, H, T, 2)
    return alpha * qk + F.where(right, bs[..., 1:], bs[..., :1])


class GeometricAttention(Module):
    """Multi-head geometric attention with directions (docs/ndr.md §3), in the paper's letters."""

    last_weights = None

    def __init__(self, d_model, n_head=1, attention_dropout=0.0, normalize=False, rng=None):
        rng = rng or np.random.default_rng(0)
        self.n_head, self.d_head = n_head, head_size(d_model, n_head)
        self.normalize = normalize
        # the code's init: fans (d, d_h) for every matrix
        bound = math.sqrt(6.0 / (d_model + self.d_head))
        # [W_q | W_k | W_v], no bias
        self.w_qkv = Parameter(uniform(rng, (d_model, 3 * d_model), bound))
        self.b_q = Parameter(np.zeros((n_head, 1, self.d_head), backend.DEFAULT_DTYPE))
        # W_s, b_s: (s←, s→) per head
        self.direction = Linear(d_model, 2 * n_head, rng=rng)
        self.w_o = Parameter(uniform(rng, (d_model, d_model), bound))
        self.alpha = Parameter(np.array([1 / math.sqrt(self.d_head)], backend.DEFAULT_DTYPE))
        self.beta = Parameter(np.ones(1, backend.DEFAULT_DTYPE))
        self.gamma = Parameter(np.zeros(1, backend.DEFAULT_DTYPE))
        self.key_dropout = Dropout(attention_dropout)
        # a buffer: k and v have no bias
        self.no_kv_bias = np.zeros(2 * d_model, backend.DEFAULT_DTYPE)

    def in_projection(self):
        """[W_q | W_k | W_v | W_s] and [b_q | 0 | 0 | b_s]: q, k, v and s read the same x, so one
        matmul."""
        return (F.concat([self.w_qkv, self.direction.weight], axis=1),
                F.concat([self.b_q.reshape(-1), self.no_kv_bias, self.direction.bias]))

    def forward(self, x, key_mask=None, return_weights=False):
        B, T, C = x.shape
        H, dh = self.n_head, self.d_head
        W, b = self.in_projection()
        y = F.linear(x, W, b)                                                     # (B, T, 3C + 2H)
        # (B, H, T, dh) each
        q, k, v = (F.split_heads(y, i * C, H, dh) for i in range(3))
        k = self.key_dropout(k)
        # (B, H, T, 2): (s←, s→)
        s = F.split_heads(y, 3 * C, H, 2)
        qk = q @ k.swapaxes(-1, -2)                                               # (B, H, T, T)
        right = constants(T, x.data).right
        z = faster(directional_logits, qk)(qk, s, self.alpha, self.beta, self.gamma, right)
        invalid = self._invalid(key_mask, T, x.data)
        A = geometric_attention_weights(z, normalize=self.normalize, invalid=invalid)
        if self.record:  # kept for analysis and plots (see UniversalEncoder's trace)
            self.last_weights = A
        y = F.linear(F.merge_heads(A @ v), self.w_o)                              # (B, T, C)
        return (y, A) if return_weights else y

    def _invalid(self, key_mask, T, like):
        """invalid_keys, kept while the same key_mask comes back (a layer applied n times)."""
        key = (T, backend.device_of(like))
        cached = vars(self).get("_invalid_cache")
        if cached is None or cached[0] is not key_mask or cached[1] != key:
            cached = self._invalid_cache = (key_mask, key, invalid_keys(key_mask, T, like))
        return cached[2]
