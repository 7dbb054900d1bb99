"""Abstractor models (Altabaa, Webb, Cohen & Lafferty 2024, "Abstractors and relational
cross-attention"; design note docs/abstractor.md §2–5).

An Abstractor turns objects E into abstract states A that carry only relations between the objects:
it starts from symbols A^(0) that say nothing about the objects (one per position, or retrieved from
a library) and updates them with relational cross-attention (RCA, attention/relational.py), whose
values are the symbols. Two forms:

* MHA form (paper §2.3, Algorithm 1; docs/abstractor.md §3; the sorting models): per layer, optional
  symbol self-attention, then A ← LN(A + RCA(E, A)) — the residual goes onto the symbols — then the
  FF block. Architectures (paper §3, Fig. 2; docs/abstractor.md §4):
  (a) decoder ← Abstractor(embedded X); (b) decoder ← Abstractor(Encoder(X));
  (d) multi-attention decoder ← [E, Abstractor(E)]; (e) ← [E, Abstractor2(Abstractor1(E))]
  (+ A1 with ``attend_a1``). The Ablation
  model replaces RCA by standard cross-attention A ← LN(A + MHA(Q = A, K = V = E)).
* Simplified form (§1.3; pairwise order and SET): per-relation RCA, FF block, dropout; objects →
  Dense → simplified Abstractor → flatten → MLP head.

Model names (``--model``): ``abstractor`` (b), ``abstractor-ablation``, ``transformer-seq2seq`` (the
baseline, models/seq2seq.py) and ``abstractor-simplified`` (the discriminative models). Section
numbers below without "paper" are those of docs/abstractor.md.
"""
import dataclasses
import functools
import math
from dataclasses import dataclass

import numpy as np

from .. import backend
from .. import functional as F
from ..attention.multihead import check_init
from ..attention.relational import ACTIVATIONS, RelationalCrossAttention, SimplifiedRCA
from ..engine import Tensor
from ..nn import Dropout, LayerNorm, Module, Parameter, sinusoidal_positions, xavier_uniform
from .seq2seq import EncoderDecoderConfig, FeedForwardBlock, Seq2SeqTransformer, dense, keras_attention

SYMBOLS = ("learned", "sinusoidal", "symbolic")


# ---------------------------------------------------------------------------------------------------------
# Symbol assignment (§2.1, §2.3; position-relative symbols are an RCA variant:
# attention/relational.py)
# ---------------------------------------------------------------------------------------------------------

class PositionalSymbols(Module):
    """Object i gets symbol s_i (§2.1): learned (N(0, 1), ``max_len`` of them, fixed at build time)
    or sinusoidal (s_i = PE_i, concatenated sin | cos halves; no parameters). Returns (B, T, d)."""

    def __init__(self, max_len, d_model, kind="learned", rng=None):
        if kind not in ("learned", "sinusoidal"):
            raise ValueError(f"unknown positional symbols {kind!r}; use 'learned' or 'sinusoidal'")
        rng = rng or np.random.default_rng(0)
        self.max_len = max_len
        if kind == "learned":
            self.symbols = Parameter(rng.standard_normal((max_len, d_model)).astype(backend.DEFAULT_DTYPE))
        else:
            # a buffer: moves with .to()
            self.symbols = sinusoidal_positions(max_len, d_model, "concat")

    def forward(self, x):
        B, T = x.shape[:2]
        if T > self.max_len:
            raise ValueError(f"{T} objects, but the positional symbols were built for at most "
                             f"{self.max_len}")
        S = self.symbols[:T] if isinstance(self.symbols, Tensor) else Tensor(self.symbols[:T])
        return F.broadcast_to(S, (B, T, S.shape[1]))


class SymbolicAttention(Module):
    """Symbol retrieval from a learned library (§2.3): per head h, S^h = softmax_j(scale · (X W_q^h)
    B^hᵀ) S_lib^h, where the library S_lib (n_s × d) is split along features into n_h chunks and B^h
    (n_s × d_b) are learned binding vectors; S = concat_h S^h. ``scale`` "sqrt" (1/√d_b, the code)
    or "none" (paper)."""

    def __init__(self, d_model, n_symbols, n_head, d_binding=None, scale="sqrt", rng=None):
        if d_model % n_head:
            raise ValueError(f"d_model {d_model} must be a multiple of n_head {n_head}")
        if scale not in ("sqrt", "none"):
            raise ValueError(f"unknown scale {scale!r}; use 'sqrt' or 'none'")
        rng = rng or np.random.default_rng(0)
        self.n_head, self.d_binding = n_head, d_binding or d_model // n_head
        self.scale = 1 / math.sqrt(self.d_binding) if scale == "sqrt" else 1.0
        f32 = backend.DEFAULT_DTYPE
        self.library = Parameter((0.05 * rng.standard_normal((n_symbols, d_model))).astype(f32))
        self.binding = Parameter((0.05 * rng.standard_normal((n_head, n_symbols,
                                                              self.d_binding))).astype(f32))
        # no bias (the code)
        self.w_q = Parameter(xavier_uniform(rng, d_model, n_head * self.d_binding))

    def forward(self, x):
        B, T, C = x.shape
        H, n_s = self.n_head, self.library.shape[0]
        # (B,H,T,d_b)
        q = (x.reshape(B * T, C) @ self.w_q).reshape(B, T, H, self.d_binding).transpose(0, 2, 1, 3)
        # (B,H,T,n_s)
        w = F.softmax((q @ self.binding.swapaxes(-1, -2)) * self.scale, axis=-1)
        # (B,H,T,d/H)
        S = w @ self.library.reshape(n_s, H, C // H).transpose(1, 0, 2)
        return S.transpose(0, 2, 1, 3).reshape(B, T, C)


# ---------------------------------------------------------------------------------------------------------
# The MHA-form Abstractor and the sorting models (§3–5)
# ---------------------------------------------------------------------------------------------------------

@dataclass
class AbstractorConfig(EncoderDecoderConfig):
    """The sorting Abstractor (§6.1) on top of the encoder–decoder's fields
    (EncoderDecoderConfig)."""
    n_encoder_layers: int = 2
    n_decoder_layers: int = 2
    n_abstractor_layers: int = 2
    architecture: str = "b"            # "a", "b", "d" or "e" (§4)
    activation: str = "softmax"        # σ_rel
    symmetric: bool = False            # W_q = W_k in RCA
    rca_scale: str = "sqrt"            # 1/√d_head ("sqrt") or 1 ("none") inside RCA
    symbols: str = "learned"           # "learned", "sinusoidal" or "symbolic" (§2)
    max_len: int = 10                  # objects the positional symbols are built for
    n_library: int = 256               # symbolic attention: library size n_s
    add_pe: bool = True                # A^(0) = Drop(√d · S + PE); False: A^(0) = S
    symbol_self_attention: bool = True  # step 1 of §3 in every layer
    # A ← LN(A + RCA); False: A ← RCA (the pre-training "SimpleAbstractor")
    rca_residual: bool = True
    attend_a1: bool = False            # architecture (e): the decoder also attends to A1


class AbstractorLayer(Module):
    """[A ← LN(A + MHA(A, A, A))]; A ← LN(A + RCA(X = E, S = A)); A ← FF block (§3). With
    ``ablation`` the middle step is standard cross-attention A ← LN(A + MHA(Q = A, K = V = E))."""

    def __init__(self, cfg, rng, ablation=False):
        d, eps = cfg.d_model, cfg.ln_eps
        self.ablation = ablation
        self.self_attn = keras_attention(cfg, rng) if cfg.symbol_self_attention else None
        self.self_norm = LayerNorm(d, eps) if cfg.symbol_self_attention else None
        if ablation:
            self.rca = keras_attention(cfg, rng)
        else:
            self.rca = RelationalCrossAttention(d, cfg.n_head, cfg.d_head or d, d, cfg.activation,
                                                cfg.symmetric,
                                                cfg.rca_scale, cfg.attention_dropout, rng, cfg.init)
        self.rca_norm = LayerNorm(d, eps) if cfg.rca_residual else None
        self.ffn = FeedForwardBlock(cfg, rng)

    def forward(self, A, E, key_mask=None):
        """A (B, T, d) symbols / abstract states; E (B, T, d) objects. Returns the new A."""
        if self.self_attn is not None:
            A = self.self_norm(A + self.self_attn(A, key_mask=key_mask))
        rel = (self.rca(A, context=E, key_mask=key_mask) if self.ablation
               else self.rca(E, A, key_mask=key_mask))
        A = self.rca_norm(A + rel) if self.rca_norm is not None else rel
        return self.ffn(A)


class Abstractor(Module):
    """Symbols A^(0) (§2), then ``n_abstractor_layers`` Abstractor layers reading the objects E."""

    def __init__(self, cfg, rng, ablation=False):
        if cfg.symbols not in SYMBOLS:
            raise ValueError(f"unknown symbols {cfg.symbols!r}; use one of {', '.join(SYMBOLS)}")
        self.cfg = cfg
        if cfg.symbols == "symbolic":
            self.symbols = SymbolicAttention(cfg.d_model, cfg.n_library, cfg.n_head, rng=rng)
        else:
            self.symbols = PositionalSymbols(cfg.max_len, cfg.d_model, cfg.symbols, rng)
        self.pe = sinusoidal_positions(cfg.max_len, cfg.d_model, "concat") if cfg.add_pe else None
        self.dropout = Dropout(cfg.dropout)
        self.layers = [AbstractorLayer(cfg, rng, ablation) for _ in range(cfg.n_abstractor_layers)]

    def forward(self, E, key_mask=None):
        A = self.symbols(E)
        if self.pe is not None:
            T = E.shape[1]
            if T > len(self.pe):
                pe = sinusoidal_positions(T, self.cfg.d_model, "concat")
                self.pe = backend.to_device(pe, backend.device_of(E.data))
            A = self.dropout(A * math.sqrt(self.cfg.d_model) + self.pe[:T])
        for layer in self.layers:
            A = layer(A, E, key_mask)
        return A


class AbstractorSeq2Seq(Seq2SeqTransformer):
    """Encoder–decoder with Abstractors (§4): the decoder attends to the contexts of the
    architecture, (a)/(b) [A], (d) [E, A], (e) [E, A2] or [E, A1, A2], where A = Abstractor(E) and
    A2 = Abstractor(A1)."""

    def __init__(self, n_tgt_tokens, n_classes, cfg, d_src=None, n_src_tokens=None, seed=0,
                 ablation=False):
        contexts = {"a": 1, "b": 1, "d": 2, "e": 3 if cfg.attend_a1 else 2}
        if cfg.architecture not in contexts:
            raise ValueError(f"unknown architecture {cfg.architecture!r}; use one of a, b, d, e")
        if not ablation and cfg.activation not in ACTIVATIONS:
            raise ValueError(f"unknown activation {cfg.activation!r}; use one of "
                             f"{', '.join(ACTIVATIONS)}")
        if cfg.architecture == "a":
            cfg = dataclasses.replace(cfg, n_encoder_layers=0)   # (a) has no encoder
        super().__init__(n_tgt_tokens, n_classes, cfg, d_src, n_src_tokens, seed,
                         contexts[cfg.architecture])
        rng = np.random.default_rng([seed, 1])
        n_abstractors = 2 if cfg.architecture == "e" else 1
        self.abstractors = [Abstractor(cfg, rng, ablation) for _ in range(n_abstractors)]

    def encode(self, src, src_mask=None):
        E = super().encode(src, src_mask)[0]
        A = [self.abstractors[0](E, src_mask)]
        if self.cfg.architecture == "e":
            A.append(self.abstractors[1](A[0], src_mask))                 # relations of relations
            A = A if self.cfg.attend_a1 else A[1:]
        return A if self.cfg.architecture in ("a", "b") else [E] + A


def _transformer_seq2seq(n_tgt_tokens, n_classes, cfg, d_src=None, n_src_tokens=None, seed=0):
    """The baseline: the encoder–decoder of models/seq2seq.py, from the config's
    EncoderDecoderConfig fields."""
    base = EncoderDecoderConfig(**{f.name: getattr(cfg, f.name)
                                   for f in dataclasses.fields(EncoderDecoderConfig)})
    return Seq2SeqTransformer(n_tgt_tokens, n_classes, base, d_src, n_src_tokens, seed)


# The sorting models by name: the class (or function) that builds each from (n_tgt_tokens,
# n_classes, cfg, ...).
SEQ2SEQ_MODELS = {
    "abstractor": dict(build=AbstractorSeq2Seq),
    # the ablation's relational cross-attention is plain cross-attention: no σ_rel, no W_q = W_k, no
    # RCA scale
    "abstractor-ablation": dict(build=functools.partial(AbstractorSeq2Seq, ablation=True)),
    # the Transformer reads the EncoderDecoderConfig fields only (_transformer_seq2seq)
    "transformer-seq2seq": dict(build=_transformer_seq2seq),
}


def build_seq2seq(name, n_tgt_tokens, n_classes, cfg, d_src=None, n_src_tokens=None, seed=0):
    """The sorting model ``name`` (a row of ``SEQ2SEQ_MODELS``)."""
    if name not in SEQ2SEQ_MODELS:
        raise ValueError(f"unknown model {name!r}; valid models: {', '.join(SEQ2SEQ_MODELS)}")
    return SEQ2SEQ_MODELS[name]["build"](n_tgt_tokens, n_classes, cfg, d_src=d_src,
                                         n_src_tokens=n_src_tokens,
                                         seed=seed)


# ---------------------------------------------------------------------------------------------------------
# The simplified Abstractor and the discriminative models (§1.3, §6.2–6.3)
# ---------------------------------------------------------------------------------------------------------

@dataclass
class SimplifiedConfig:
    """The discriminative models (defaults: pairwise order, §6.2)."""
    d_model: int = 64            # object embedding size = symbol size d_s
    n_relations: int = 4         # d_r
    d_key: int = 16              # d_k, the query/key size per relation
    d_ff: int = 64
    n_layers: int = 1
    activation: str = "sigmoid"  # σ_rel
    symmetric: bool = False      # W_q = W_k
    rel_bias: bool = False       # biases on W_q/W_k
    dropout: float = 0.1
    ln_eps: float = 1e-3
    head_hidden: int = 32        # hidden ReLU layer of the head; 0 = none (SET)
    # "keras": W_q/W_k and biases as the reference code (docs/abstractor.md §5.1)
    init: str = "default"


class SimplifiedAbstractorLayer(Module):
    """A ← SimplifiedRCA(X, A); A ← LN(A + Drop(FF(A))); A ← Drop(A) (§1.3; no residual or LN around
    RCA)."""

    def __init__(self, cfg, rng):
        self.rca = SimplifiedRCA(cfg.d_model, cfg.n_relations, cfg.d_key, cfg.d_model,
                                 cfg.activation, cfg.symmetric,
                                 cfg.rel_bias, rng, cfg.init)
        self.ffn = FeedForwardBlock(cfg, rng)
        self.dropout = Dropout(cfg.dropout)

    def forward(self, A, X, key_mask=None):
        return self.dropout(self.ffn(self.rca(X, A, key_mask)))


class RelationalClassifier(Module):
    """Dense(d_in → d) per object → simplified Abstractor (learned symbols, A^(0) = S) → flatten →
    [Dense(head_hidden, ReLU)] → Dense(n_out) logits (§6.2: 1 logit for a sigmoid; §6.3: 2 for a
    softmax)."""

    def __init__(self, d_in, n_objects, n_out, cfg, seed=0):
        check_init(cfg.init)
        rng = np.random.default_rng(seed)
        self.embed = dense(d_in, cfg.d_model, rng)
        self.symbols = PositionalSymbols(n_objects, cfg.d_model, "learned", rng)
        self.layers = [SimplifiedAbstractorLayer(cfg, rng) for _ in range(cfg.n_layers)]
        width = n_objects * cfg.d_model
        self.hidden = dense(width, cfg.head_hidden, rng) if cfg.head_hidden else None
        self.out = dense(cfg.head_hidden or width, n_out, rng)

    def forward(self, x):
        """x (B, n_objects, d_in) floats → logits (B, n_out)."""
        X = self.embed(x)
        A = self.symbols(X)
        for layer in self.layers:
            # the values change from layer to layer; X stays the same
            A = layer(A, X)
        h = A.reshape(A.shape[0], -1)
        if self.hidden is not None:
            h = F.relu(self.hidden(h))
        return self.out(h)


# The discriminative models by name (pairwise order, SET).
CLASSIFIER_MODELS = {"abstractor-simplified": dict(build=RelationalClassifier)}
