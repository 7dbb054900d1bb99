"""MLP ("additive") attention with Gumbel-softmax straight-through weights, as in seq2attn (Korrel,
Hupkes, Dankers & Bruni 2019, "Transcoding compositionally", §3, Eqs. 5–8; design note
docs/seq2attn.md §1.3–1.5).

The score of key k_j (an encoder state) for the query q (the transcoder state) is an MLP of their
concatenation, e_j = w2 · ReLU(W1 [k_j ; q] + b1) + b2 (Eq. 5). The weights α are, by
``activation``: ``softmax`` (the baseline); ``gumbel_st`` — in training the straight-through sample
α = one_hot(argmax y) − sg(y) + y with y = softmax((e + g)/τ), g ~ Gumbel(0, 1) (Eqs. 7–8), so the
forward value is exactly one-hot while the gradient is the soft sample's, and at evaluation
α = one_hot(argmax e), without noise; or ``gumbel`` — in training the soft sample y itself (ablations
and gradient checks), at evaluation the same argmax. The reference feeds log_softmax(e) rather than
e into the sample; softmax ignores a constant shift per row, so using e gives identical values and
gradients with one op fewer. The temperature τ is ``fixed``, ``latent`` (τ = exp(θ), θ a learned
scalar) or ``conditioned`` on the query: τ = 1 / (softplus(w_τ · q + b_τ) + 1/τ_max) ∈ (0, τ_max],
one value per step and sequence. W1 is stored as its key and query halves so that W1_k k_j + b1 is
computed once per sequence (``prepare``) and each decoding step costs a single (B, H) × (H, H)
product for the query. Padding keys get a large finite negative score (not −inf), so their weight is
exactly 0 and no inf · 0 = NaN can enter a gradient (e.g. the one of τ).
"""
import math

import numpy as np

from .. import backend
from .. import functional as F
from ..engine import Tensor, is_training
from ..nn import Linear, Module, Parameter, uniform

ACTIVATIONS = ("softmax", "gumbel_st", "gumbel")
TEMPERATURES = ("conditioned", "latent", "fixed")


class AdditiveAttention(Module):
    """Scores keys (B, n, d_key) against a query (B, d_query) and returns weights α (B, n)."""

    def __init__(self, d_key, d_query, d_hidden, activation="gumbel_st", temperature="conditioned",
                 tau_init=5.0, tau_max=5.0, rng=None):
        if activation not in ACTIVATIONS:
            raise ValueError(f"unknown attention activation {activation!r}; valid: "
                             f"{', '.join(ACTIVATIONS)}")
        if temperature not in TEMPERATURES:
            raise ValueError(f"unknown temperature mode {temperature!r}; valid: "
                             f"{', '.join(TEMPERATURES)}")
        tiny = np.finfo(backend.DEFAULT_DTYPE).tiny   # 1/τ must be a finite float32: τ positive and normal
        if not (tiny <= tau_init < math.inf and tiny <= tau_max < math.inf):
            raise ValueError(f"temperatures must be positive normal numbers (≥ {tiny:.3g}), got "
                             f"tau_init={tau_init}, tau_max={tau_max}")
        rng = rng or np.random.default_rng(0)
        bound = 1 / math.sqrt(d_key + d_query)  # PyTorch's Linear(d_key + d_query, d_hidden) init
        self.w1_key = Parameter(uniform(rng, (d_key, d_hidden), bound))      # W1 = [W1_k ; W1_q]
        self.w1_query = Parameter(uniform(rng, (d_query, d_hidden), bound))
        self.b1 = Parameter(uniform(rng, (d_hidden,), bound))
        self.w2 = Linear(d_hidden, 1, rng=rng)
        self.activation, self.temperature, self.tau_init = activation, temperature, tau_init
        self.inv_tau_max = 1.0 / tau_max
        if activation != "softmax" and temperature == "conditioned":
            self.w_tau = Linear(d_query, 1, rng=rng)                          # w_τ, b_τ
        if activation != "softmax" and temperature == "latent":
            # θ
            self.log_tau = Parameter(np.full((1,), math.log(tau_init), dtype=backend.DEFAULT_DTYPE))
        self.rng = None  # the Gumbel noise stream (Module.set_rng)

    def prepare(self, keys, key_mask=None):
        """Per-sequence work: (W1_k k_j + b1 (B, n, H), additive score bias (B, n)).

        The bias holds b2 and the padding mask (0 or F.MASKED). b2 shifts every score of a row
        equally, so it changes nothing; it exists for parity with the reference's parameter
        count."""
        B, n, d_key = keys.shape
        projected = (keys.reshape(B * n, d_key) @ self.w1_key + self.b1).reshape(B, n, -1)
        if key_mask is None:
            return projected, self.w2.bias
        xp = backend.array_module(keys.data)
        return projected, self.w2.bias + xp.where(key_mask, 0.0, F.MASKED).astype(keys.dtype)

    def scores(self, query, prepared):
        """e (B, n) for a query (B, d_query), given ``prepare``'s output."""
        projected, bias = prepared
        B, n, H = projected.shape
        hidden = F.relu(projected + (query @ self.w1_query).reshape(B, 1, H))   # (B, n, H)
        return (hidden.reshape(B * n, H) @ self.w2.weight).reshape(B, n) + bias

    def tau(self, query):
        """The temperature: a Python float (fixed), a (1,) or a (B, 1) tensor."""
        if self.temperature == "fixed":
            return self.tau_init
        if self.temperature == "latent":
            return F.exp(self.log_tau)
        return 1.0 / (F.softplus(self.w_tau(query)) + self.inv_tau_max)

    def forward(self, query, prepared, noise=None):
        """Attention weights α (B, n). ``noise`` fixes the Gumbel sample g (tests); otherwise it is
        drawn from ``self.rng``."""
        e = self.scores(query, prepared)
        if self.activation == "softmax":
            return F.softmax(e)
        if not (self.training and is_training()):
            return Tensor(F.one_hot_argmax(e))  # a constant: argmax attention passes no gradient
        return F.gumbel_softmax(e, self.tau(query), hard=self.activation == "gumbel_st",
                                rng=self.rng, noise=noise)
