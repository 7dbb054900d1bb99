"""Models of the Contextual Retrieval Task (Mittal et al. 2022, Appendix C.1;
design note docs/compositional.md §2, §9).

Every object is encoded on its own by an MLP, ONE attention layer lets it look at the other objects
(the diagonal is masked: an object never finds itself), and an MLP decodes one number per object:

    x_i → Linear → ReLU → Linear → attention (no residual, no LayerNorm) → Linear → ReLU → Linear → ŷ_i

The attention is multi-head (``mha``, the code's ``Transformer`` class: docs/compositional.md §2),
compositional with dot-product value scores (``compositional``: docs/compositional.md §3) or with
the linear-score ablation (``compositional-mlp``: docs/compositional.md §4). All of them use
``concat`` (the token's own projection appended before W_o), biases everywhere and D = search_dim =
value_dim, as the CRT code does.
"""
import math
from dataclasses import dataclass

import numpy as np

from .. import backend
from .. import functional as F
from ..attention.compositional import CompositionalAttention, search_mask
from ..nn import Linear, Module

@dataclass
class CRTConfig:
    """Model hyperparameters; defaults: the 2-search/4-retrieval task at D = 64 (paper Table 6)."""
    searches: int = 2      # S_gt of the task; compositional attention uses S = S_gt searches
    retrievals: int = 4    # R_gt of the task; compositional attention uses R = R_gt retrievals
    n_head: int = 0        # MHA heads h (0: h = searches; Table 6 also runs 4 and 8 heads)
    d_model: int = 64      # D = search_dim = value_dim
    # append the token's own projection x W_c before W_o (always on in the CRT)
    concat: bool = True
    # compositional: one retrieval key W̄_k^r per retrieval (docs/compositional.md §3.4)
    separate: bool = False


class CRTMultiHeadAttention(Module):
    """Multi-head attention as the CRT code's baseline (docs/compositional.md §2): h heads of size
    d_s = search_dim/h (queries, keys) and d_v = value_dim/h (values), biases on every projection,
    the diagonal masked (``mask_diagonal``) and, with ``concat``, x W_c appended before W_o. It is
    CompositionalAttention with S = R = h and the value scores fixed to the identity
    (docs/compositional.md §5)."""
    last_weights = None

    def __init__(self, d_model, n_head, search_dim=None, value_dim=None, concat=True,
                 mask_diagonal=True,
                 rng=None):
        rng = rng or np.random.default_rng(0)
        search_dim, value_dim = search_dim or d_model, value_dim or d_model
        if n_head < 1 or search_dim % n_head or value_dim % n_head:
            raise ValueError(f"search_dim {search_dim} and value_dim {value_dim} must be multiples "
                             f"of n_head {n_head}")
        self.n_head, self.d_s, self.d_v = n_head, search_dim // n_head, value_dim // n_head
        self.concat, self.mask_diagonal = concat, mask_diagonal
        self.query = Linear(d_model, search_dim, rng=rng)
        self.key = Linear(d_model, search_dim, rng=rng)
        self.value = Linear(d_model, value_dim, rng=rng)
        self.own = Linear(d_model, self.d_v, rng=rng) if concat else None     # W_c (concat option)
        self.out = Linear((n_head + int(concat)) * self.d_v, d_model, rng=rng)

    def forward(self, x, key_mask=None, return_weights=False):
        B, T, _ = x.shape
        H, ds, dv = self.n_head, self.d_s, self.d_v
        # (B, H, T, ds)
        q, k = (f(x).reshape(B, T, H, ds).transpose(0, 2, 1, 3) for f in (self.query, self.key))
        # (B, H, T, dv)
        v = self.value(x).reshape(B, T, H, dv).transpose(0, 2, 1, 3)
        # (B, H, T, T)
        logits = (q @ k.swapaxes(-1, -2)) * (1.0 / math.sqrt(ds))
        invalid = search_mask(key_mask, T, self.mask_diagonal, x.data)
        if invalid is not None:
            logits = F.masked_fill(logits, invalid, F.MASKED)
        A = F.softmax(logits, axis=-1)
        h = (A @ v).transpose(0, 2, 1, 3).reshape(B, T, H * dv)
        if self.concat:
            h = F.concat([h, self.own(x)], axis=-1)
        if self.record:
            self.last_weights = A
        y = self.out(h)
        return (y, A, None) if return_weights else y


def _compositional(score):
    return lambda cfg, rng: CompositionalAttention(cfg.d_model, cfg.searches, cfg.retrievals,
                                                   concat=cfg.concat,
                                                   score=score, separate=cfg.separate,
                                                   mask_diagonal=True, rng=rng)


# The CRT models by name: the attention layer each builds from the config, ``(cfg, rng) → module``.
MODELS = {
    "mha": dict(attention=lambda cfg, rng: CRTMultiHeadAttention(cfg.d_model,
                                                                cfg.n_head or cfg.searches,
                                                                concat=cfg.concat, rng=rng)),
    "compositional": dict(attention=_compositional("dot")),
    # the linear-score ablation
    "compositional-mlp": dict(attention=_compositional("mlp")),
}


class CRTModel(Module):
    """Encoder MLP → one attention layer → decoder MLP (docs/compositional.md §9). ``name``: one of
    ``MODELS``."""

    def __init__(self, name, in_dim, cfg, seed=0):
        if name not in MODELS:
            raise ValueError(f"unknown CRT model {name!r}; valid models: {', '.join(MODELS)}")
        rng = np.random.default_rng(seed)
        D = cfg.d_model
        self.name, self.cfg = name, cfg
        self.enc1, self.enc2 = Linear(in_dim, D, rng=rng), Linear(D, D, rng=rng)
        self.attn = MODELS[name]["attention"](cfg, rng)
        self.dec1, self.dec2 = Linear(D, D, rng=rng), Linear(D, 1, rng=rng)

    def forward(self, x, return_weights=False):
        """x (B, N, in_dim) → predictions (B, N); with ``return_weights`` also the attention's
        search weights (B, S, N, N) and value scores (B, N, S, R) (None for ``mha``)."""
        B, N, _ = x.shape
        h, A, c = self.attn(self.enc2(F.relu(self.enc1(x))), return_weights=True)
        y = self.dec2(F.relu(self.dec1(h))).reshape(B, N)
        return (y, A, c) if return_weights else y


def specialisation(c, prefs, n_retrieval):
    """Paper Fig. 5: the mean value score per ground-truth retrieval choice, on the host.

    c (B, N, S, R) value scores; prefs (B, N, S_gt) the task's retrieval choices r*. Returns M
    (S_gt, R_gt, S, R) with M[g, r_gt, s, r] = mean of c[..., s, r] over the objects whose
    ground-truth search g retrieves r_gt (NaN where none did). A model that learned the task's
    structure shows, for every (g, r_gt), one search s whose scores put almost all weight on one
    retrieval r.
    """
    c, prefs = backend.to_numpy(c), backend.to_numpy(prefs)
    S_gt = prefs.shape[-1]
    M = np.full((S_gt, n_retrieval) + c.shape[2:], np.nan)
    for g in range(S_gt):
        for r in range(n_retrieval):
            chosen = prefs[..., g] == r                                 # (B, N)
            if chosen.any():
                M[g, r] = c[chosen].mean(axis=0)
    return M


def format_specialisation(M):
    """M of ``specialisation`` as a text table: a row per ground truth (search g, retrieval r), a
    column per model (search s, retrieval r). Ground truths that never occurred (NaN) are left
    out."""
    S_gt, R_gt, S, R = M.shape
    head = "ground truth |" + "".join(f"  s{s} r{r}" for s in range(S) for r in range(R))
    rows = [f"{f'g{g} r{r}':>12} |" + "".join(f"{v:7.2f}" for v in M[g, r].ravel())
            for g in range(S_gt) for r in range(R_gt) if not np.isnan(M[g, r]).all()]
    return "\n".join([head, "-" * len(head)] + rows)
