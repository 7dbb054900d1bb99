"""Compositional attention (Mittal, Raparthy, Rish, Bengio & Lajoie 2022, "Compositional Attention:
Disentangling Search and Retrieval", §3, Eqs. 7–14; design note docs/compositional.md §3–5).

A head of multi-head attention ties a search (which token to read: a query–key match) to one fixed
retrieval (what to read from it: a value projection). Compositional attention unties the two: S
searches A_s = softmax_j(Q_s K_sᵀ / √d_s) (Eqs. 7–8) run over R value projections V_r shared by all
searches (Eq. 9), giving all S·R candidates O_sr = A_s V_r (Eq. 10); each token then chooses, per
search, a soft mixture of its R candidates by a second attention whose query Q̄_s = x W̄_q comes
from the token itself and whose keys K̄_sr = O_sr W̄_k are the candidates (Eqs. 11–13: value scores
c_sr = softmax_r(Q̄_s · K̄_sr / √d_s)); the S chosen values Σ_r c_sr O_sr are concatenated and
mapped out by W_o (Eq. 14). With R = 1, or with S = R and c fixed to a permutation, it is multi-head
attention (docs/compositional.md §5). Options: ``score="mlp"`` replaces the dot-product score by the
linear score w·[Q̄_s; O_sr] + b (Appendix B.7); ``concat`` appends the token's own projection x W_c
before W_o (always on in the CRT code); ``separate`` gives every retrieval its own W̄_k^r;
``mask_diagonal`` forbids a token to find itself (the CRT). Letters follow the paper: S searches, R
retrievals, d_s the per-search query/key size (the retrieval query/key size d_r equals d_s, as in
the CRT code), d_v the per-retrieval value size. Every projection has a bias and, but for
``separate``'s keys, PyTorch's default init, as in the code.
"""
import math

import numpy as np

from .. import backend
from .. import functional as F
from ..nn import Linear, Module, Parameter, uniform


def search_mask(key_mask, T, mask_diagonal, like):
    """Boolean mask broadcastable to (B, heads, T, T), True = FORBIDDEN key; None when nothing
    is."""
    xp = backend.array_module(like)
    invalid = xp.eye(T, dtype=bool) if mask_diagonal else None
    if key_mask is not None:
        pad = ~key_mask[:, None, None, :]                                   # (B, 1, 1, T)
        invalid = pad if invalid is None else invalid | pad
    return invalid


class CompositionalAttention(Module):
    last_weights = None  # kept when ``record`` is on (see UniversalEncoder's trace)

    def __init__(self, d_model, n_search, n_retrieval, search_dim=None, value_dim=None, score="dot",
                 concat=False, separate=False, mask_diagonal=False, rng=None):
        rng = rng or np.random.default_rng(0)
        search_dim, value_dim = search_dim or d_model, value_dim or d_model
        if score not in ("dot", "mlp"):
            raise ValueError(f"unknown value score {score!r}; use 'dot' (Eq. 13) or 'mlp' "
                             "(Appendix B.7)")
        if n_search < 1 or n_retrieval < 1 or search_dim % n_search or value_dim % n_retrieval:
            raise ValueError(f"search_dim {search_dim} must be a multiple of n_search {n_search} "
                             f"and value_dim {value_dim} a multiple of n_retrieval {n_retrieval} "
                             "(both ≥ 1)")
        if separate and score == "mlp":
            raise ValueError("separate=True needs score='dot': the MLP score has no retrieval key "
                             "W̄_k")
        self.S, self.R = n_search, n_retrieval
        self.d_s, self.d_v = search_dim // n_search, value_dim // n_retrieval
        self.score, self.concat, self.separate, self.mask_diagonal = score, concat, separate, mask_diagonal
        self.query = Linear(d_model, search_dim, rng=rng)                     # W_q   (Eq. 7)
        self.key_search = Linear(d_model, search_dim, rng=rng)                # W_k   (Eq. 7)
        # W_v   (Eq. 9), R blocks
        self.value = Linear(d_model, value_dim, rng=rng)
        # W̄_q   (Eq. 11), S blocks
        self.retrieval_query = Linear(d_model, search_dim, rng=rng)
        # W_c   (concat option)
        self.own = Linear(d_model, self.d_v, rng=rng) if concat else None
        if score == "mlp":
            self.score_net = Linear(self.d_s + self.d_v, 1, rng=rng)          # w, b of Appendix B.7
        # the code's GroupLinear init: U(±sqrt(6/(d_v + d_r))), zero bias
        # (docs/compositional.md §3.4)
        elif separate:
            self.w_key = Parameter(uniform(rng, (n_retrieval, self.d_v, self.d_s),
                                           math.sqrt(6.0 / (self.d_v + self.d_s))))
            self.b_key = Parameter(np.zeros((n_retrieval, 1, self.d_s), backend.DEFAULT_DTYPE))
        else:
            # W̄_k: ONE for all s and r
            self.retrieval_key = Linear(self.d_v, self.d_s, rng=rng)
        self.out = Linear((n_search + int(concat)) * self.d_v, d_model, rng=rng)  # W_o

    def forward(self, x, key_mask=None, return_weights=False):
        """x (B, T, d_model); key_mask (B, T) bool, True for real tokens. Returns y (B, T, d_model),
        and with ``return_weights`` the triple
        (y, search weights A (B, S, T, T), value scores c (B, T, S, R))."""
        B, T, _ = x.shape
        S, R, ds, dv = self.S, self.R, self.d_s, self.d_v
        q, k, q_bar = (f(x).reshape(B, T, S, ds).transpose(0, 2, 1, 3)
                       for f in (self.query, self.key_search, self.retrieval_query))  # (B, S, T, ds) each
        # all R values side by side
        v = self.value(x).reshape(B, 1, T, R * dv)
        # (B, S, T, T)   Eq. 7
        logits = (q @ k.swapaxes(-1, -2)) * (1.0 / math.sqrt(ds))
        invalid = search_mask(key_mask, T, self.mask_diagonal, x.data)
        if invalid is not None:
            # finite: no inf − inf (docs/compositional.md §3.3)
            logits = F.masked_fill(logits, invalid, F.MASKED)
        A = F.softmax(logits, axis=-1)                                          # Eq. 8
        # Eq. 10 in ONE batched matmul: A_s @ [V_1 | … | V_R] = [A_s V_1 | … | A_s V_R], as V is
        # shared.
        O_sr = (A @ v).reshape(B, S, T, R, dv)                                  # (B, S, T, R, dv)
        # (B, S, T, R)   Eqs. 11–13
        c = self.value_scores(q_bar, O_sr)
        h = (c.reshape(B, S, T, 1, R) @ O_sr).reshape(B, S, T, dv)              # Σ_r c_sr O_sr
        h = h.transpose(0, 2, 1, 3).reshape(B, T, S * dv)
        if self.concat:
            h = F.concat([h, self.own(x)], axis=-1)                             # (B, T, (S+1)·dv)
        y = self.out(h)                                                         # Eq. 14
        c = c.transpose(0, 2, 1, 3)                                             # (B, T, S, R)
        if self.record:
            self.last_weights = A
        return (y, A, c) if return_weights else y

    def value_scores(self, q_bar, O_sr):
        """c[b, s, t, r] = softmax_r(score(Q̄[b, s, t], O_sr[b, s, t, r])): which retrieval search s
        of token t reads. q_bar (B, S, T, d_s), O_sr (B, S, T, R, d_v) → (B, S, T, R)."""
        B, S, T, R, dv = O_sr.shape
        ds = self.d_s
        # w·[Q̄; O_sr] + b = w_q·Q̄ + w_o·O_sr + b: no hidden layer, no scaling
        if self.score == "mlp":
            w = self.score_net.weight                                           # (ds + dv, 1)
            logits = ((q_bar.reshape(-1, ds) @ w[:ds]).reshape(B, S, T, 1)
                      + (O_sr.reshape(-1, dv) @ w[ds:]).reshape(B, S, T, R) + self.score_net.bias)
        else:
            if self.separate:  # (R, B·S·T, dv) @ (R, dv, ds): one batched matmul over the R keys
                k_bar = O_sr.reshape(-1, R, dv).transpose(1, 0, 2) @ self.w_key + self.b_key
                k_bar = k_bar.transpose(1, 0, 2).reshape(B, S, T, R, ds)
            else:
                # (B, S, T, R, ds)  Eq. 12
                k_bar = self.retrieval_key(O_sr)
            # (R, ds) @ (ds, 1) per (b, s, t): a batched matmul, faster than multiply-and-sum
            logits = (k_bar @ q_bar.reshape(B, S, T, ds, 1)).reshape(B, S, T, R) * (1.0 / math.sqrt(ds))
        return F.softmax(logits, axis=-1)
