"""Transformer-XL relative multi-head attention (Dai et al. 2019, §3.3, the four terms (a)–(d)) and
the NDR paper's gated absolute/relative variant (Csordás et al. 2022, Appendix A, term (e)); design
note docs/ndr.md §4.2–4.3 (the official code:
layers/transformer/multi_head_relative_pos_attention.py).

    logit_ij = α · [ (q_i + u)·k̃_j  +  (q_i + v)·r̃_{j−i} ]            (a)+(c), (b)+(d)

with r_m = W_R PE(m) for the signed offset m = j − i (key minus query), u and v learned per-head
vectors, α learned (init 1/sqrt(d_head)), and attention dropout on k and r (the code's site, where
the paper says the query). With ``abs_gate=True`` a per-head, per-query gate g_i = σ(W_abs x_i + b)
mixes relative and absolute key positions in the position term:

    (q_i + v)·[ g_i · r̃_{j−i} + (1 − g_i) · r̃^abs_j ],   r^abs_j = W_R PE(j)       (e)

The content term is never gated. A softmax over keys with the padding mask follows, as in
multihead.py.
"""
import math

import numpy as np

from .. import backend
from .. import functional as F
from ..nn import Dropout, Linear, Module, Parameter, head_size, sinusoidal_positions, xavier_uniform
from .multihead import masked_softmax


class RelativeMultiHeadAttention(Module):
    last_weights = None

    def __init__(self, d_model, n_head, attention_dropout=0.0, abs_gate=False, rng=None):
        rng = rng or np.random.default_rng(0)
        self.d_model, self.n_head, self.d_head = d_model, n_head, head_size(d_model, n_head)
        self.w_q = Parameter(xavier_uniform(rng, d_model, d_model))
        self.w_kv = Parameter(xavier_uniform(rng, d_model, 2 * d_model))   # fused [W_k | W_v]
        # W_R: positions -> per-head keys
        self.w_r = Parameter(xavier_uniform(rng, d_model, d_model))
        self.u = Parameter(np.zeros((n_head, 1, self.d_head), backend.DEFAULT_DTYPE))
        self.v = Parameter(np.zeros((n_head, 1, self.d_head), backend.DEFAULT_DTYPE))
        self.alpha = Parameter(np.array([1 / math.sqrt(self.d_head)], backend.DEFAULT_DTYPE))
        self.out = Linear(d_model, d_model, bias=False, rng=rng)
        self.abs_gate = Linear(d_model, n_head, rng=rng) if abs_gate else None
        self.key_dropout = Dropout(attention_dropout)
        self.pos_dropout = Dropout(attention_dropout)
        self._pe_cache = {}

    def _positions(self, T, like):
        """PE rows for offsets −(T−1)..T−1 (relative) and 0..T−1 (absolute), cached per length."""
        key = (T, backend.device_of(like), like.dtype)
        if key not in self._pe_cache:
            pe = sinusoidal_positions(np.arange(-(T - 1), T), self.d_model, dtype=like.dtype)
            self._pe_cache[key] = backend.to_device(pe, key[1])
        return self._pe_cache[key]

    def forward(self, x, key_mask=None, causal=False, return_weights=False):
        B, T, C = x.shape
        H, dh = self.n_head, self.d_head
        pe = self._positions(T, x.data)
        # (B, H, T, dh)
        q = (x.reshape(B * T, C) @ self.w_q).reshape(B, T, H, dh).transpose(0, 2, 1, 3)
        kv = (x.reshape(B * T, C) @ self.w_kv).reshape(B, T, 2, H, dh).transpose(2, 0, 3, 1, 4)
        k, v = self.key_dropout(kv[0]), kv[1]
        # (H, 2T−1, dh)
        r = self.pos_dropout((pe @ self.w_r).reshape(2 * T - 1, H, dh).transpose(1, 0, 2))
        # (a)+(c): (B, H, T, T)
        content = (q + self.u) @ k.swapaxes(-1, -2)
        qv = q + self.v
        # (b)+(d): (B, H, T, T)
        position = rel_shift(qv @ r.swapaxes(-1, -2))
        if self.abs_gate is not None:
            # offsets 0..T−1 = absolute positions j
            r_abs = r[:, T - 1:]
            # (B, H, T, T)
            absolute = qv @ r_abs.swapaxes(-1, -2)
            # (B, H, T, 1)
            g = F.sigmoid(self.abs_gate(x)).transpose(0, 2, 1)[..., None]
            # (e)
            position = g * position + (1 - g) * absolute
        A = masked_softmax(self.alpha * (content + position), key_mask, causal)
        if self.record:  # kept for analysis and plots (see UniversalEncoder's trace)
            self.last_weights = A
        y = self.out((A @ v).transpose(0, 2, 1, 3).reshape(B, T, C))
        return (y, A) if return_weights else y


def rel_shift(by_offset):
    """position[..., i, j] = by_offset[..., i, j − i + T − 1]: the scores of each query against the
    2T − 1 offsets (−(T−1)..T−1) to those against the T keys, by views alone (Dai et al. 2019,
    Appendix B's shift). Row i starts at column T − 1 − i, so in the flattened (T, 2T − 1) block the
    entry (i, j) sits at T − 1 + i·(2T − 2) + j: drop the first T − 1 entries, read rows of 2T − 2,
    keep the first T columns. A gather with an index table did the same, but its gradient is a
    scatter-add (on a GPU a one-hot matmul with T²·T(2T − 1) entries); the gradient of views is the
    same views of zeros."""
    *lead, T, n = by_offset.shape
    if T == 1:
        return by_offset
    flat = by_offset.reshape(*lead, T * n)[..., T - 1:T - 1 + T * (n - 1)]
    return flat.reshape(*lead, T, n - 1)[..., :T]
