"""Scaled dot-product multi-head attention (Vaswani et al. 2017, "Attention Is All You Need",
§3.2, Eqs. 1–2; its use in the NDR baselines: docs/ndr.md §4.1).

    Attention(Q, K, V) = softmax(Q Kᵀ / sqrt(d_head)) V,   per head, heads concatenated, then W_o

Masks are boolean arrays that are True where attention is ALLOWED: ``key_mask`` (B, T_k) marks the
real (unpadded) keys; ``causal=True`` additionally forbids keys after the query. Forbidden logits
are replaced by a large finite negative (not −inf), so even a fully masked row stays finite.
Following the NDR code, the projections have no bias, queries and the fused key|value projection are
Xavier-initialised, and W_o uses the default Linear init. The plain softmax attention of that code
applies no attention dropout; ``attention_dropout`` (on the weights) defaults to 0.
"""
import math

import numpy as np

from .. import backend
from .. import functional as F
from ..nn import Dropout, Linear, Module, Parameter, head_size, keras_fans, xavier_uniform

# how the Abstractor-family models draw their kernels (docs/abstractor.md §5.1)
INITS = ("default", "keras")


def check_init(init):
    if init not in INITS:
        raise ValueError(f"unknown init {init!r}; use one of {', '.join(INITS)}")


def attention_mask(key_mask, T_q, T_k, causal, like):
    """Boolean mask broadcastable to (B, 1, T_q, T_k), True = may attend; None when nothing is
    masked."""
    xp = backend.array_module(like)
    mask = None if key_mask is None else key_mask[:, None, None, :]
    if causal:
        tri = xp.arange(T_k)[None, :] <= xp.arange(T_q)[:, None]
        mask = tri if mask is None else mask & tri
    return mask


def masked_softmax(logits, key_mask=None, causal=False):
    """softmax over the keys of logits (B, H, T, S); forbidden keys get the finite F.MASKED
    logit."""
    mask = attention_mask(key_mask, logits.shape[-2], logits.shape[-1], causal, logits.data)
    if mask is not None:
        logits = F.masked_fill(logits, ~mask, F.MASKED)
    return F.softmax(logits, axis=-1)


class MultiHeadAttention(Module):
    last_weights = None

    def __init__(self, d_model, n_head, attention_dropout=0.0, rng=None, d_head=None, bias=False,
                 init="default"):
        """``d_head`` (default d_model / n_head) and ``bias`` (on q, k, v and o, initialised to 0)
        give the Keras layer of the Abstractor code, whose heads are each d_model wide
        (docs/abstractor.md §5). ``init="keras"`` draws the kernels as that layer does:
        Glorot-uniform with the fans of its (d_model, H, d_head) and (H, d_head, d_model) kernels
        (docs/abstractor.md §5.1)."""
        check_init(init)
        rng = rng or np.random.default_rng(0)
        self.n_head, self.d_head = n_head, d_head or head_size(d_model, n_head)
        inner = n_head * self.d_head
        keras = init == "keras"
        # W_q, W_k, W_v alike
        qkv_fans = keras_fans((d_model, n_head, self.d_head)) if keras else None
        self.w_q = Parameter(xavier_uniform(rng, *(qkv_fans or (d_model, inner)),
                                            shape=(d_model, inner)))
        # fused [W_k | W_v]
        self.w_kv = Parameter(xavier_uniform(rng, *(qkv_fans or (d_model, 2 * inner)),
                                             shape=(d_model, 2 * inner)))
        self.b_q = Parameter(np.zeros(inner, backend.DEFAULT_DTYPE)) if bias else None
        self.b_kv = Parameter(np.zeros(2 * inner, backend.DEFAULT_DTYPE)) if bias else None
        o_fans = keras_fans((n_head, self.d_head, d_model))
        # None: Linear's own init
        w_o = xavier_uniform(rng, *o_fans, shape=(inner, d_model)) if keras else None
        self.out = Linear(inner, d_model, bias=bias, rng=rng, weight=w_o)
        if bias:
            self.out.bias.data[:] = 0
        self.dropout = Dropout(attention_dropout)

    def kv(self, context):
        """Keys and values of ``context`` (B, S, C), each (B, H, S, d_head). A decoder projects a
        fixed context once and passes them to every step (``forward(..., kv=...)``)."""
        B, S, C = context.shape
        kv = context.reshape(B * S, C) @ self.w_kv
        if self.b_kv is not None:
            kv = kv + self.b_kv
        kv = kv.reshape(B, S, 2, self.n_head, self.d_head).transpose(2, 0, 3, 1, 4)
        return kv[0], kv[1]

    def project(self, x, context=None, kv=None):
        """Queries (B, H, T, dh) from x; keys and values (B, H, S, dh) from ``kv`` or the
        context."""
        B, T, C = x.shape
        q = x.reshape(B * T, C) @ self.w_q
        if self.b_q is not None:
            q = q + self.b_q
        q = q.reshape(B, T, self.n_head, self.d_head).transpose(0, 2, 1, 3)
        k, v = kv if kv is not None else self.kv(x if context is None else context)
        return q, k, v

    def forward(self, x, context=None, key_mask=None, causal=False, return_weights=False, kv=None):
        """x (B, T, C) queries; context (B, S, C) keys/values (default: x, self-attention), or
        ``kv``, the context's keys and values already projected by ``kv()``."""
        B, T, C = x.shape
        H, dh = self.n_head, self.d_head
        q, k, v = self.project(x, context, kv)
        # (B, H, T, S)
        logits = (q @ k.swapaxes(-1, -2)) * (1.0 / math.sqrt(dh))
        A = masked_softmax(logits, key_mask, causal)
        if self.record:  # kept for analysis and plots (see UniversalEncoder's trace)
            self.last_weights = A
        y = (self.dropout(A) @ v).transpose(0, 2, 1, 3).reshape(B, T, H * dh)
        y = self.out(y)
        return (y, A) if return_weights else y
