"""Relational cross-attention (Altabaa, Webb, Cohen & Lafferty 2024, "Abstractors and relational
cross-attention", §2.2, Eqs. 4–6; design note docs/abstractor.md §1–2).

Self-attention reads values from the objects it compares. Relational cross-attention (RCA) compares
the objects X (queries and keys) but reads the values from symbols S that carry no object features:

    R = φ_q(X) φ_k(X)ᵀ,   A = σ_rel(R) S          (Eq. 5; the paper's letters: R relations, S symbols)

so A holds only relational information (the "relational bottleneck"). σ_rel is softmax over the keys
or an elementwise sigmoid, tanh or identity ("linear"); with ``symmetric=True`` one projection
serves queries and keys (W_q = W_k), so every R is symmetric. Three forms live here: the multi-head
MHA form of the sorting Abstractor (docs/abstractor.md §1.2), the "simplified" per-relation form of
the discriminative models (docs/abstractor.md §1.3), and position-relative symbols
(docs/abstractor.md §2.2), whose values depend on the offset j − i.
"""
import math

import numpy as np

from .. import backend
from .. import functional as F
from ..nn import Dropout, Linear, Module, Parameter, keras_fans, xavier_uniform
from .multihead import attention_mask, check_init

ACTIVATIONS = ("softmax", "sigmoid", "tanh", "linear")


def relation_activation(R, activation, mask=None):
    """σ_rel(R) over the last axis; ``mask`` (broadcastable, True = may attend) zeroes forbidden
    keys: through −1e9 logits for softmax, by multiplication for the elementwise activations."""
    if activation == "softmax":
        return F.softmax(R if mask is None else F.masked_fill(R, ~mask, F.MASKED), axis=-1)
    out = {"sigmoid": F.sigmoid, "tanh": F.tanh, "linear": lambda r: r}[activation](R)
    return out if mask is None else F.masked_fill(out, ~mask, 0.0)


def _zeros(n):
    return np.zeros(n, backend.DEFAULT_DTYPE)


class RelationalCrossAttention(Module):
    """Multi-head RCA in MHA form (paper Eq. 6; docs/abstractor.md §1.2):
        α_h = σ_rel(scale · Q_h K_hᵀ) with Q_h = X W_q^h + b_q^h, K_h = X W_k^h + b_k^h;
        O = concat_h(Drop(α_h) (S W_v^h + b_v^h)) W_o + b_o.
    Each head is ``d_head`` wide (default d_model, as in the reference code);
    ``scale`` is "sqrt" (1/√d_head) or "none". Causal masks are allowed only with softmax; any other
    σ_rel refuses them (docs/abstractor.md §1.2). ``init="keras"`` draws the kernels as the
    reference code's Keras layer does (docs/abstractor.md §5.1)."""
    last_weights = None

    def __init__(self, d_model, n_head, d_head=None, d_symbol=None, activation="softmax",
                 symmetric=False,
                 scale="sqrt", attention_dropout=0.0, rng=None, init="default"):
        if activation not in ACTIVATIONS:
            raise ValueError(f"unknown relation activation {activation!r}; use one of "
                             f"{', '.join(ACTIVATIONS)}")
        if scale not in ("sqrt", "none"):
            raise ValueError(f"unknown scale {scale!r}; use 'sqrt' (1/sqrt(d_head)) or 'none'")
        check_init(init)
        rng = rng or np.random.default_rng(0)
        self.n_head, self.d_head = n_head, d_head or d_model
        self.activation, self.symmetric = activation, symmetric
        self.scale = 1 / math.sqrt(self.d_head) if scale == "sqrt" else 1.0
        inner, n_proj = n_head * self.d_head, 1 if symmetric else 2
        d_symbol = d_symbol or d_model
        # Keras' kernels: (d, H, d_head) for q, k and v, (H, d_head, d_symbol) for o
        if init == "keras":
            qk_fans = keras_fans((d_model, n_head, self.d_head))
            v_fans = keras_fans((d_symbol, n_head, self.d_head))
            o_fans = keras_fans((n_head, self.d_head, d_symbol))
        else:                 # Glorot on the matrices as stored
            qk_fans, v_fans, o_fans = (d_model, n_proj * inner), (d_symbol, inner), (inner, d_symbol)
        # [W_q | W_k] or W_q
        self.w_qk = Parameter(xavier_uniform(rng, *qk_fans, shape=(d_model, n_proj * inner)))
        self.b_qk = Parameter(_zeros(n_proj * inner))
        self.w_v = Parameter(xavier_uniform(rng, *v_fans, shape=(d_symbol, inner)))
        self.b_v = Parameter(_zeros(inner))
        self.out = Linear(inner, d_symbol, rng=rng,
                          weight=xavier_uniform(rng, *o_fans, shape=(inner, d_symbol)))
        self.out.bias.data[:] = 0
        self.dropout = Dropout(attention_dropout)

    def relations(self, x):
        """The relation logits scale · Q_h K_hᵀ, (B, H, T, T), before σ_rel."""
        B, T, C = x.shape
        n_proj = 1 if self.symmetric else 2
        qk = (x.reshape(B * T, C) @ self.w_qk + self.b_qk).reshape(B, T, n_proj, self.n_head, self.d_head)
        # (n_proj, B, H, T, d_head)
        qk = qk.transpose(2, 0, 3, 1, 4)
        q, k = qk[0], qk[n_proj - 1]
        return (q @ k.swapaxes(-1, -2)) * self.scale

    def weights(self, x, key_mask=None, causal=False):
        """σ_rel(relations) with the masks applied, (B, H, T, T)."""
        if causal and self.activation != "softmax":
            raise ValueError(f"causal masking needs activation='softmax' (got "
                             f"{self.activation!r}): the "
                             "Abstractor's causal RCA is softmax RCA (docs/abstractor.md §1.2)")
        T = x.shape[1]
        mask = attention_mask(key_mask, T, T, causal, x.data)
        A = relation_activation(self.relations(x), self.activation, mask)
        if self.record:
            self.last_weights = A
        return A

    def forward(self, x, symbols, key_mask=None, causal=False, return_weights=False):
        """x (B, T, d_model) objects; symbols (B, T, d_symbol). Returns (B, T, d_symbol)."""
        A = self.weights(x, key_mask, causal)
        B, T, D = symbols.shape
        v = (symbols.reshape(B * T, D) @ self.w_v + self.b_v).reshape(B, T, self.n_head, self.d_head)
        # (B, H, T, d_head)
        y = self.dropout(A) @ v.transpose(0, 2, 1, 3)
        y = self.out(y.transpose(0, 2, 1, 3).reshape(B, T, self.n_head * self.d_head))
        return (y, A) if return_weights else y


class PositionRelativeRCA(RelationalCrossAttention):
    """RCA with position-relative symbols (docs/abstractor.md §2.2): out_h[i] = Σ_j α_h[i, j] V_h[i,
    j], where V_h[i, j] = P[clip(j − i, −R_max, R_max)] W_v^h + b_v^h reads a learned table P of
    2·R_max + 1 offset symbols (N(0, 1) init). The symbols are part of the layer, so ``forward``
    takes only X."""

    def __init__(self, d_model, n_head, max_offset, rng=None, **kwargs):
        rng = rng or np.random.default_rng(0)
        super().__init__(d_model, n_head, d_symbol=d_model, rng=rng, **kwargs)
        self.max_offset = max_offset
        self.table = Parameter(rng.standard_normal((2 * max_offset + 1,
                                                    d_model)).astype(backend.DEFAULT_DTYPE))

    def forward(self, x, key_mask=None, causal=False, return_weights=False):
        A = self.weights(x, key_mask, causal)                                      # (B, H, T, T)
        B, T, _ = x.shape
        H, dh, R = self.n_head, self.d_head, self.max_offset
        xp = backend.array_module(x.data)
        # (T, T): row i, column j
        offset = xp.clip(xp.arange(T)[None, :] - xp.arange(T)[:, None], -R, R) + R
        # (H,T,T,dh)
        V = (self.table @ self.w_v + self.b_v).reshape(2 * R + 1, H, dh).transpose(1, 0, 2)[:, offset]
        # Batch over (head, query i): (H, T, B, T_j) @ (H, T, T_j, dh) sums α[i, j] V[i, j] over j.
        y = self.dropout(A).transpose(1, 2, 0, 3) @ V                              # (H, T, B, dh)
        y = self.out(y.transpose(2, 1, 0, 3).reshape(B, T, H * dh))
        return (y, A) if return_weights else y


class SimplifiedRCA(Module):
    """The simplified Abstractor's RCA (docs/abstractor.md §1.3; the d_r-dimensional relation of
    paper Eq. 1), one block per relation r = 1..d_r: R^r_ij = ⟨W_q^r x_i + b_q^r, W_k^r x_j + b_k^r⟩
    (unscaled; biases only with ``bias=True``), Ã^r = σ_rel(R^r) S, then a per-relation Dense P^r:
    d_s → d_s / d_r, and A = concat_r P^r Ã^r. Unlike the MHA form, the symbols are aggregated
    unprojected and there is no output matrix. ``init="keras"``: W_q^r, W_k^r Glorot-uniform as the
    reference code's one Dense(d_k) per relation (docs/abstractor.md §5.1), not over the stored
    (d_model, 2·d_r·d_k) matrix."""
    last_weights = None

    def __init__(self, d_model, n_relations, d_key, d_symbol=None, activation="softmax",
                 symmetric=False,
                 bias=False, rng=None, init="default"):
        if activation not in ACTIVATIONS:
            raise ValueError(f"unknown relation activation {activation!r}; use one of "
                             f"{', '.join(ACTIVATIONS)}")
        d_symbol = d_symbol or d_model
        if d_symbol % n_relations:
            raise ValueError(f"d_symbol {d_symbol} must be a multiple of n_relations {n_relations}")
        check_init(init)
        rng = rng or np.random.default_rng(0)
        n_proj, d_out = 1 if symmetric else 2, d_symbol // n_relations
        self.n_relations, self.d_key = n_relations, d_key
        self.activation, self.symmetric = activation, symmetric
        qk_fans = (d_model, d_key) if init == "keras" else (d_model, n_proj * n_relations * d_key)
        self.w_qk = Parameter(xavier_uniform(rng, *qk_fans,
                                             shape=(d_model, n_proj * n_relations * d_key)))
        self.b_qk = Parameter(_zeros(n_proj * n_relations * d_key)) if bias else None
        self.w_p = Parameter(xavier_uniform(rng, d_symbol, d_out,
                                            shape=(n_relations, d_symbol, d_out)))
        self.b_p = Parameter(np.zeros((n_relations, 1, d_out), backend.DEFAULT_DTYPE))

    def forward(self, x, symbols, key_mask=None):
        """x (B, T, d_model) objects; symbols (B, T, d_symbol). Returns (B, T, d_symbol)."""
        B, T, C = x.shape
        n_proj, Dr, dk = 1 if self.symmetric else 2, self.n_relations, self.d_key
        qk = x.reshape(B * T, C) @ self.w_qk
        if self.b_qk is not None:
            qk = qk + self.b_qk
        # (n_proj, B, d_r, T, d_k)
        qk = qk.reshape(B, T, n_proj, Dr, dk).transpose(2, 0, 3, 1, 4)
        R = qk[0] @ qk[n_proj - 1].swapaxes(-1, -2)                                 # (B, d_r, T, T)
        A = relation_activation(R, self.activation,
                                None if key_mask is None else key_mask[:, None, None, :])
        if self.record:
            self.last_weights = A
        # (B, d_r, T, d_s / d_r)
        y = (A @ symbols[:, None]) @ self.w_p + self.b_p
        return y.transpose(0, 2, 1, 3).reshape(B, T, -1)
