"""CoDA, Compositional De-Attention (Tay, Luu, Zhang, Wang & Hui 2019, "Compositional De-Attention
Networks", NeurIPS; design note docs/coda.md): quasi-attention without softmax.

Softmax weights lie in (0, 1) and sum to 1 over the keys, so attention can only re-weight values.
CoDA's quasi-attention M = tanh(E) ⊙ gate(N) lies in (−1, 1) and is NOT normalised over keys: a
query can add (+1), subtract (−1) or delete (0) each value. E is an ordinary similarity (dot
product); N ≤ 0 is a dissimilarity, the negative L1 distance, whose gate erases pairs that are far
apart. The paper's letters are kept: E affinity, N negative affinity, M quasi-attention, α and β
temperatures.

* Transformer form (paper Eq. 10; docs/coda.md §3), ``CoDAttention``, a drop-in for
  ``MultiHeadAttention`` with the same parameters: per head, E = α Q Kᵀ/√d_k, N = β G/√d_k with G_ij
  = −Σ_c |Q_ic − K_jc|, Out = (tanh(E) ⊙ 2σ(N) ⊙ mask) V, heads concatenated, then W_o.
* Pairwise form (paper Eqs. 1–7; docs/coda.md §2), ``PairwiseCoDA``: A′ = M B and B′ = Mᵀ A.

Gate (the paper's range fix): "scaled" 2σ(N) ∈ (0, 1] (Eq. 5, the default) or "centered" σ(N − Mean
N) (Eq. 4); ``center_e`` also centres E (Eq. 6). Mean(·) is over the valid entries of each (sample,
head) matrix (docs/coda.md §2), except with ``row_mean`` (decoder self- and cross-attention): a
matrix-wide mean would let position i see later positions, so each query row is centred over its own
keys (project choice). ``composition`` selects the paper's Table 9 variants F_X(E) ⊙ F_Y(N) (one
flag, "tanh-sigmoid" by default). Masks are True where attention is allowed and are multiplicative:
a masked key gets weight exactly 0 — never a −∞ logit, since tanh(−∞) = −1 would subtract it — so a
fully masked row reads nothing.

Memory: the L1 distance is one fused op (``L1Distance``) that walks over blocks of (sample, head)
slabs or of query rows. Besides its (…, T_q, T_k) result it holds at most two temporaries of
``L1_BLOCK`` elements (or of one query row, T_k·d_k, where that is larger); its backward recomputes
the signs and saves only Q and K. The composite ``l1_distance_reference`` keeps the
(B, H, T_q, T_k, d_k) differences for the backward, d_k times the attention matrix; the tests check
that both agree, and the fused peak.
"""
import math
from dataclasses import dataclass

import numpy as np

from .. import backend
from .. import functional as F
from ..engine import Function
from ..nn import Linear, Module
from .multihead import MultiHeadAttention, attention_mask

# Elements per block of the fused L1 distance: 512 KiB of float32 stays in a CPU's cache (~2× faster
# than one big block on the 2-core machine); a GPU wants few, large kernels. Tests pass small
# ``block``s.
L1_BLOCK, L1_BLOCK_GPU = 1 << 17, 1 << 24
GATES = ("scaled", "centered")


class L1Distance(Function):
    """D_ij = Σ_c |q_ic − k_jc| for q (N, T_q, d), k (N, T_k, d) → (N, T_q, T_k), block by block.
    ∂D_ij/∂q_ic = sign(q_ic − k_jc) = −∂D_ij/∂k_jc, with sign(0) = 0 (docs/coda.md §3.1)."""

    def __init__(self, block=None):
        self.block = block

    def _blocks(self, N, T_q, T_k, d, xp):
        """(n0, n1, i0, i1): whole (sample, head) slabs while one fits in a block, else query rows
        of one."""
        rows = max(1, (self.block or (L1_BLOCK if xp is np else L1_BLOCK_GPU)) // (T_k * d))
        if rows >= T_q:
            return [(n, min(n + rows // T_q, N), 0, T_q) for n in range(0, N, rows // T_q)]
        return [(n, n + 1, i, min(i + rows, T_q)) for n in range(N) for i in range(0, T_q, rows)]

    def forward(self, q, k):
        self.q, self.k = q, k
        xp = backend.array_module(q)
        (N, T_q, d), T_k = q.shape, k.shape[1]
        D, ones = xp.empty((N, T_q, T_k), q.dtype), xp.ones(d, q.dtype)
        for n0, n1, i0, i1 in self._blocks(N, T_q, T_k, d, xp):
            # (n, i, T_k, d)
            diff = q[n0:n1, i0:i1, None, :] - k[n0:n1, None, :, :]
            xp.abs(diff, out=diff)
            # Σ_c as a matrix-vector product: ~8× faster here than NumPy's .sum(-1) over a short
            # last axis.
            D[n0:n1, i0:i1] = (diff.reshape(-1, d) @ ones).reshape(n1 - n0, i1 - i0, T_k)
        return D

    def backward(self, gD):
        q, k = self.q, self.k
        xp = backend.array_module(gD)
        (N, T_q, d), T_k = q.shape, k.shape[1]
        gq, gk, ones = xp.empty_like(q), xp.zeros_like(k), xp.ones(T_k, q.dtype)
        for n0, n1, i0, i1 in self._blocks(N, T_q, T_k, d, xp):
            # Not sign(diff, out=diff): NumPy's in-place sign was ~10× slower than into a new array.
            # (n, i, T_k, d)
            s = xp.sign(q[n0:n1, i0:i1, None, :] - k[n0:n1, None, :, :])
            s *= gD[n0:n1, i0:i1, :, None]
            # Σ_j over keys (~5× .sum(2)'s speed)
            gq[n0:n1, i0:i1] = ones @ s
            # Σ_i over queries
            gk[n0:n1] -= s.sum(axis=1)
        return gq, gk


def l1_distance(q, k, block=None):
    """Σ_c |q_ic − k_jc| for q (..., T_q, d) and k (..., T_k, d) with the same leading dims →
    (..., T_q, T_k)."""
    if q.shape[:-2] != k.shape[:-2] or q.shape[-1] != k.shape[-1]:
        raise ValueError(f"l1_distance: shapes {q.shape} and {k.shape} differ outside the T_q/T_k "
                         "axis")
    *lead, T_q, d = q.shape
    D = L1Distance(block)(q.reshape(-1, T_q, d), k.reshape(-1, k.shape[-2], d))
    return D.reshape(*lead, T_q, k.shape[-2])


def l1_distance_reference(q, k):
    """The composite definition: materialises the (..., T_q, T_k, d) differences (tests compare
    against it)."""
    return (q[..., :, None, :] - k[..., None, :, :]).abs().sum(axis=-1)


class Arctan(Function):
    """arctan(x); d/dx = 1/(1 + x²). Only the Table 9 compositions use it."""

    def forward(self, x):
        self.x = x
        return backend.array_module(x).arctan(x)

    def backward(self, gy):
        return gy / (1 + self.x * self.x)


# Paper Table 9, M = F_X(E) ⊙ F_Y(N), read literally: F_Y replaces the gate's σ, and the factor 2 of
# Eq. 5 stays with σ (it undoes σ(0) = 1/2; the others map 0 to 0). arctan is rescaled by 2/π and
# "algebraic" is x/√(1 + x²), both project choices (docs/coda.md §4). With σ(E), weights are never
# negative.
E_FUNCTIONS = {"tanh": F.tanh, "sigmoid": F.sigmoid}
N_FUNCTIONS = {"sigmoid": F.sigmoid, "tanh": F.tanh,
               "arctan": lambda n: Arctan()(n) * (2 / math.pi),
               "algebraic": lambda n: n * (n * n + 1.0) ** -0.5}
COMPOSITIONS = tuple(f"{e}-{n}" for e in E_FUNCTIONS for n in N_FUNCTIONS)


def masked_mean(x, valid, axes):
    """Mean of x over ``axes`` (kept) counting only entries where ``valid`` (broadcastable bool;
    None: all). Masked entries are selected away, never multiplied by 0 (inf · 0 is NaN); an empty
    selection has mean 0."""
    if valid is None:
        return x.mean(axis=axes, keepdims=True)
    xp = backend.array_module(x.data)
    count = xp.broadcast_to(valid, x.shape).sum(axis=axes, keepdims=True)
    return F.masked_fill(x, ~valid, 0.0).sum(axis=axes, keepdims=True) / xp.maximum(count, 1).astype(x.dtype)


def quasi_attention(E, N, mask=None, stats=None, gate="scaled", center_e=False,
                    composition="tanh-sigmoid",
                    row_mean=False):
    """(M, gate): M = F_X(E) ⊙ gate(N) ⊙ mask (paper Eqs. 3–6; docs/coda.md §3). ``stats`` marks the
    entries that count in Mean(·) (default: ``mask``); ``row_mean`` takes Mean(·) per query row
    instead of per matrix."""
    f_e, f_n = (fns[name] for fns, name in zip((E_FUNCTIONS, N_FUNCTIONS), composition.split("-")))
    axes, stats = (-1,) if row_mean else (-2, -1), mask if stats is None else stats
    if center_e:
        E = E - masked_mean(E, stats, axes)                                          # Eq. 6
    if gate == "centered":
        g = f_n(N - masked_mean(N, stats, axes))                                     # Eq. 4
    else:
        g = f_n(N) * 2.0 if f_n is F.sigmoid else f_n(N)                             # Eq. 5
    # Eq. 3 / Table 9
    M = f_e(E) * g
    return (M if mask is None else F.masked_fill(M, ~mask, 0.0)), g


def _check_options(gate, composition, alpha, beta):
    if alpha < 0 or beta < 0:
        raise ValueError(f"CoDA temperatures must be ≥ 0 (a negative β would open the gate for FAR "
                         f"pairs), got alpha={alpha}, beta={beta}")
    if gate not in GATES:
        raise ValueError(f"unknown CoDA gate {gate!r}; use one of {', '.join(GATES)}")
    if composition not in COMPOSITIONS:
        raise ValueError(f"unknown CoDA composition {composition!r}; use one of "
                         f"{', '.join(COMPOSITIONS)}")


@dataclass
class CoDAConfig:
    """CoDA's options as fields of a model configuration (so ``--set coda_beta=0.18`` reaches
    them)."""
    coda_alpha: float = 1.0                  # α, temperature of E
    # β, temperature of N; < 1 opens the gate at init (docs/coda.md §3)
    coda_beta: float = 1.0
    coda_gate: str = "scaled"                # "scaled": 2σ(N) (Eq. 5); "centered": σ(N − Mean N) (Eq. 4)
    coda_center_e: bool = False              # E ← E − Mean(E) (Eq. 6)
    coda_scale: bool = True                  # the 1/√d_k of E and N (paper footnote 3 allows dropping it)
    coda_composition: str = "tanh-sigmoid"   # F_X(E) ⊙ F_Y(N) of paper Table 9


class CoDAttention(MultiHeadAttention):
    """CoDA in the Transformer (paper Eq. 10): MultiHeadAttention's projections and interface
    (key_mask, causal, context, kv, return_weights, record → ``last_weights`` = M and
    ``last_gate``), with softmax replaced by the quasi-attention M; no new parameters. While
    ``gate_log`` is a list, every call appends its gate and the mask of its valid entries
    (``mean_gate``, ``gate_statistics``): at β = 1 the gate starts almost closed
    (docs/coda.md §3)."""
    last_gate = gate_log = None

    def __init__(self, d_model, n_head, attention_dropout=0.0, rng=None, d_head=None, bias=False, alpha=1.0,
                 beta=1.0, gate="scaled", center_e=False, scale=True, composition="tanh-sigmoid",
                 row_mean=False,
                 init="default"):
        _check_options(gate, composition, alpha, beta)
        super().__init__(d_model, n_head, attention_dropout, rng, d_head, bias, init)
        self.alpha, self.beta, self.gate, self.center_e = alpha, beta, gate, center_e
        self.scale = 1 / math.sqrt(self.d_head) if scale else 1.0
        self.composition, self.row_mean = composition, row_mean

    @classmethod
    def from_config(cls, cfg, d_model, n_head, attention_dropout=0.0, rng=None, **kw):
        """Options from a config's ``coda_*`` fields (CoDAConfig's defaults where it has none)."""
        opt = {f: getattr(cfg, f"coda_{f}", getattr(CoDAConfig, f"coda_{f}"))
               for f in ("alpha", "beta", "gate", "center_e", "scale", "composition")}
        return cls(d_model, n_head, attention_dropout, rng, **kw, **opt)

    def forward(self, x, context=None, key_mask=None, causal=False, return_weights=False, kv=None):
        B, T, C = x.shape
        H, dh = self.n_head, self.d_head
        # (B, H, T|S, dh)
        q, k, v = self.project(x, context, kv)
        S = k.shape[2]
        # (B, H, T, S)
        E = (q @ k.swapaxes(-1, -2)) * (self.alpha * self.scale)
        # β G/√d_k, G = −L1
        N = l1_distance(q, k) * (-self.beta * self.scale)
        mask = stats = attention_mask(key_mask, T, S, causal, x.data)
        if key_mask is not None and context is None and kv is None:
            # self-attention: padded queries are left out of Mean(·) too
            stats = mask & key_mask[:, None, :, None]
        M, g = quasi_attention(E, N, mask, stats, self.gate, self.center_e, self.composition,
                               self.row_mean)
        if self.record:
            self.last_weights, self.last_gate = M, g
        if self.gate_log is not None:
            # arrays, not the graph: read after the forward pass
            self.gate_log.append((g.data, stats))
        y = (self.dropout(M) @ v).transpose(0, 2, 1, 3).reshape(B, T, H * dh)
        y = self.out(y)
        return (y, M) if return_weights else y


def gate_values(model, run):
    """{module name: its gate entries that count (valid keys and queries), as one host array} for
    every CoDAttention call that ``run()`` makes in ``model`` (a module called several times: all
    calls)."""
    mods = {}
    for name, m in model.named_modules():
        if isinstance(m, CoDAttention) and all(m is not other for other in mods.values()):
            mods[name.rstrip(".") or "attention"] = m
    for m in mods.values():
        m.gate_log = []
    try:
        run()
        out = {}
        for name, m in mods.items():
            calls = [(backend.to_numpy(g), None if s is None else backend.to_numpy(s))
                     for g, s in m.gate_log]
            out[name] = [g.ravel() if s is None else g[np.broadcast_to(s, g.shape)]
                         for g, s in calls]
    finally:
        for m in mods.values():
            m.gate_log = None
    return out


def mean_gate(model, run):
    """Mean gate of every CoDAttention call that ``run()`` makes in ``model`` (each call's mean over
    its valid entries, averaged over calls): the number the training logs report as
    ``gate_mean``."""
    means = [v.mean() for calls in gate_values(model, run).values() for v in calls if v.size]
    return float(np.mean(means)) if means else float("nan")


def gate_statistics(model, run, low=0.1, high=0.9):
    """{module name: (mean gate, share of entries < low, share > high)} over every call ``run()``
    makes, and the same over all modules ("all"): does the gate keep or erase (near 1 or 0, the
    paper's argument, docs/coda.md §3) or stay soft in between?"""
    values = {name: np.concatenate(calls) for name, calls in gate_values(model, run).items() if calls}
    values["all"] = np.concatenate(list(values.values()))
    return {name: (float(v.mean()), float((v < low).mean()), float((v > high).mean()))
            for name, v in values.items()}


class PairwiseCoDA(Module):
    """The pairwise (cross) form (paper Eqs. 1–7; docs/coda.md §2) for sequences A (B, ℓ_A, d) and B
    (B, ℓ_B, d):
        E = α F_E(A) F_E(B)ᵀ,  N_ij = −β ‖F_N(a_i) − F_N(b_j)‖₁,  M = tanh(E) ⊙ gate(N),  A′ = M B,  B′ = Mᵀ A
    F_E, F_N are linear maps d → d_proj (``shared``: F_N = F_E); no 1/√d (Eqs. 1–2 have none: use α,
    β). The raw sequences are pooled, with no value projection (Eq. 7). Masks (B, ℓ) mark real
    positions. Self-attention with ``shared`` (A = B) puts N's diagonal exactly on the kink of |·|:
    its backward there uses sign(0) = 0."""

    def __init__(self, d, d_proj=None, alpha=1.0, beta=1.0, gate="scaled", center_e=False,
                 composition="tanh-sigmoid", shared=False, rng=None):
        _check_options(gate, composition, alpha, beta)
        rng = rng or np.random.default_rng(0)
        self.f_e = Linear(d, d_proj or d, bias=False, rng=rng)
        self.f_n = self.f_e if shared else Linear(d, d_proj or d, bias=False, rng=rng)
        self.alpha, self.beta, self.gate = alpha, beta, gate
        self.center_e, self.composition = center_e, composition

    def forward(self, a, b, a_mask=None, b_mask=None, return_weights=False):
        ea, eb = self.f_e(a), self.f_e(b)
        na, nb = (ea, eb) if self.f_n is self.f_e else (self.f_n(a), self.f_n(b))
        # Eq. 1, (B, ℓ_A, ℓ_B)
        E = (ea @ eb.swapaxes(-1, -2)) * self.alpha
        N = l1_distance(na, nb) * -self.beta                                            # Eq. 2
        mask = None
        if a_mask is not None or b_mask is not None:
            xp = backend.array_module(a.data)
            mask = ((xp.ones(a.shape[:2], bool) if a_mask is None else a_mask)[:, :, None]
                    & (xp.ones(b.shape[:2], bool) if b_mask is None else b_mask)[:, None, :])
        M, _ = quasi_attention(E, N, mask, mask, self.gate, self.center_e, self.composition)
        a2, b2 = M @ b, M.swapaxes(-1, -2) @ a                                          # Eq. 7
        return (a2, b2, M) if return_weights else (a2, b2)
