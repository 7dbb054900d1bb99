"""The Universal Transformer encoders of the NDR paper (Csordás, Irie & Schmidhuber 2022; design
note docs/ndr.md §1–5) and its classifier, with the attention drop-ins compared on the same runs.

All of them are Universal Transformers: ONE shared layer applied ``n_steps`` times (the number can
differ at test time). Two layer types:

* ``PostLNLayer`` (docs/ndr.md §4.1): x ← LN(x + Drop(Attn(x))); x ← LN(x + Drop(FF(x))).
* ``CopyGateLayer`` (docs/ndr.md §2, the NDR layer; docs/ndr.md §4.3, the "+ gate" baselines): a
  gate per column and channel decides whether the column is updated or simply copies its state to
  the next step:
      a  = LN(h + Drop(Attn(h)))
      u  = LN(W2 Drop(ReLU(W1 a + b1)) + b2)        (NDR)   or  tanh(...) (gated baselines)
      g  = σ(G2 Drop(ReLU(G1 a + c1)) + c2),        c2 initialised to −3: layers start near "copy"
      h' = g ⊙ u + (1 − g) ⊙ h                                                     (Eqs. 5–6)
  Gate dropout (code only) zeroes the whole gate of a column for a step: that column copies.

``Classifier`` embeds [SOS, x…, EOS], runs the encoder and reads one column (EOS or SOS) through a
linear layer. ``ARCHITECTURES`` names the models: one row each (layer, attention, input positions).
An attention drop-in is its file in minattn/attention/ plus one row here: the row's ``attention``
builds it from the config (``(cfg, rng) → module``, with ``forward(x, key_mask=None)`` and a
``record`` flag that keeps ``last_weights``).
"""
import math
from dataclasses import dataclass

import numpy as np

from .. import backend
from .. import functional as F
from ..attention.coda import CoDAConfig, CoDAttention
from ..attention.compositional import CompositionalAttention
from ..attention.geometric import GeometricAttention
from ..attention.multihead import MultiHeadAttention
from ..attention.relative import RelativeMultiHeadAttention
from ..nn import (Dropout, Embedding, FeedForward, LayerNorm, Linear, Module, sinusoidal_positions,
                  xavier_uniform)


@dataclass
class EncoderConfig:
    """Hyperparameters of the encoder models (defaults: NDR on CTL, docs/ndr.md §8)."""
    d_model: int = 256             # state size d
    n_head: int = 1                # attention heads H
    d_ff: int = 512                # feed-forward hidden size (4·d_model in every gated-baseline preset)
    n_steps: int = 14              # applications of the shared layer in training
    n_steps_eval: int = 0          # ... at evaluation (0: same as n_steps; ListOps NDR uses 24)
    dropout: float = 0.5           # attention output, FF hidden and gate hidden dropout
    attention_dropout: float = 0.1  # on keys (geometric/relative attention); plain MHA applies none
    gate_dropout: float = 0.1      # probability of closing a column's gate for a step (NDR)
    embedding_init: str = "normal"  # "normal" N(0,1), "kaiming" N(0, 2/d), or "xavier"
    readout: str = "eos"           # which column the classifier reads: "eos" or "sos"
    n_search: int = 0              # compositional attention: searches S (0: n_head)
    # compositional attention: retrievals R (0: n_head; S = R = H contains MHA)
    n_retrieval: int = 0


class PostLNLayer(Module):
    """The standard post-norm layer (docs/ndr.md §4.1); W1/W2 Xavier-initialised with gains
    sqrt(2)/1."""

    def __init__(self, attention, cfg, rng):
        self.attn = attention
        self.norm1, self.norm2 = LayerNorm(cfg.d_model), LayerNorm(cfg.d_model)
        self.ff = FeedForward(cfg.d_model, cfg.d_ff, cfg.dropout, rng, gain1=math.sqrt(2),
                              xavier=True)
        self.drop1, self.drop2 = Dropout(cfg.dropout), Dropout(cfg.dropout)

    def forward(self, x, key_mask=None):
        x = self.norm1(x + self.drop1(self.attn(x, key_mask=key_mask)))
        return self.norm2(x + self.drop2(self.ff(x)))


class CopyGateLayer(Module):
    """The copy-gated layer: NDR (``tanh_out=False``, LN on the data path) or the "+ gate" baselines
    (``tanh_out=True``: tanh instead of LN, default W2 init). The official code hard-wires the
    baselines' d_ff to 4·d (docs/ndr.md §4.3); here the presets set ``d_ff = 4·d``, so the config
    says what the model uses."""

    def __init__(self, attention, cfg, rng, tanh_out=False):
        d = cfg.d_model
        self.attn = attention
        self.tanh_out = tanh_out
        self.norm_merge = LayerNorm(d)
        self.drop_att = Dropout(cfg.dropout)
        if tanh_out:
            self.ff = FeedForward(d, cfg.d_ff, cfg.dropout, rng)
            self.ff.fc1.weight.data = xavier_uniform(rng, d, cfg.d_ff, math.sqrt(2))
        else:
            self.ff = FeedForward(d, cfg.d_ff, cfg.dropout, rng, gain1=math.sqrt(2), gain2=5 / 3,
                                  xavier=True)
            self.norm_out = LayerNorm(d)
        # The gate's hidden layer is dropped out together with the feed-forward's (self.ff.dropout).
        self.gate = FeedForward(d, d, 0.0, rng, gain1=math.sqrt(2), gain2=1.0, xavier=True)
        self.gate.fc2.bias.data[:] = -3.0   # σ(−3) ≈ 0.047: start close to "copy the state"
        # Gate dropout (the code's): closes a column's whole gate for a step, without rescaling.
        self.gate_dropout = Dropout(cfg.gate_dropout, scale=False, shared_axes=(-1,))
        self.last_gate = None

    def first_layers(self):
        """[W1 of the feed-forward | W1 of the gate] and their biases, side by side."""
        return (F.concat([self.ff.fc1.weight, self.gate.fc1.weight], axis=1),
                F.concat([self.ff.fc1.bias, self.gate.fc1.bias]))

    def forward(self, h, key_mask=None):
        B, T, d = h.shape
        # The GPU tier (fast/kernels_layer.py) runs three chains here as one kernel each: the
        # residual + dropout + LayerNorm (ResidualNorm), the bias + ReLU + dropout (BiasReluDropout),
        # and the gate's bias, σ and dropout with the mix h + g(u − h) (GateMix).
        a = self.norm_merge(h + self.drop_att(self.attn(h, key_mask=key_mask)))
        # FF(a) = W2 Drop(ReLU(W1 a + b1)) + b2 and the gate's FF_g(a) read the same a: their first
        # layers are one matmul, one ReLU and one dropout over d_ff + d columns.
        W1, b1 = self.first_layers()
        hidden = self.ff.dropout(F.relu(F.linear(a.reshape(B * T, d), W1, b1)))   # (B·T, d_ff + d)
        f = self.ff.fc2(hidden[:, :self.ff.fc1.weight.shape[1]])
        u = F.tanh(f) if self.tanh_out else self.norm_out(f)
        g = self.gate_dropout(F.sigmoid(self.gate.fc2(hidden[:, -d:])))
        u, g = u.reshape(B, T, d), g.reshape(B, T, d)
        if self.record:
            self.last_gate = g
        return h + g * (u - h)               # = g ⊙ u + (1 − g) ⊙ h, using the pre-attention h


@dataclass
class CoDAEncoderConfig(CoDAConfig, EncoderConfig):
    """EncoderConfig plus CoDA's options (``coda_*``): the model config of ``transformer-coda``."""


@dataclass(frozen=True)
class Architecture:
    """One encoder model: its layer ("postln", "gate" (NDR) or "gate-tanh" (the "+ gate"
    baselines)), its attention (``(cfg, rng) → module``), sinusoidal input positions or not, the
    gate its training log follows (``gate_mean``: "copy", the layer's; "coda", the attention's;
    None) and its config class."""
    layer: str
    attention: object
    input_pe: bool = False
    gate: str = None
    config: type = EncoderConfig


ARCHITECTURES = {
    "transformer": Architecture(
        layer="postln", input_pe=True,
        # the official plain MHA applies no attention dropout (docs/ndr.md §4.1)
        attention=lambda cfg, rng: MultiHeadAttention(cfg.d_model, cfg.n_head, rng=rng)),
    "transformer-rel": Architecture(
        layer="postln",
        attention=lambda cfg, rng: RelativeMultiHeadAttention(cfg.d_model, cfg.n_head,
                                                              cfg.attention_dropout, rng=rng)),
    "transformer-rel-gate": Architecture(
        layer="gate-tanh", gate="copy",
        attention=lambda cfg, rng: RelativeMultiHeadAttention(cfg.d_model, cfg.n_head,
                                                              cfg.attention_dropout, rng=rng)),
    "transformer-absrel-gate": Architecture(
        layer="gate-tanh", gate="copy",
        attention=lambda cfg, rng: RelativeMultiHeadAttention(cfg.d_model, cfg.n_head,
                                                              cfg.attention_dropout,
                                                              abs_gate=True, rng=rng)),
    "transformer-geom": Architecture(
        layer="postln",
        attention=lambda cfg, rng: GeometricAttention(cfg.d_model, cfg.n_head, cfg.attention_dropout,
                                                      normalize=True, rng=rng)),
    "ndr": Architecture(
        layer="gate", gate="copy",
        attention=lambda cfg, rng: GeometricAttention(cfg.d_model, cfg.n_head, cfg.attention_dropout,
                                                      rng=rng)),
    "transformer-compositional": Architecture(
        layer="postln", input_pe=True,
        attention=lambda cfg, rng: CompositionalAttention(cfg.d_model, cfg.n_search or cfg.n_head,
                                                          cfg.n_retrieval or cfg.n_head, rng=rng)),
    # as the softmax Transformer: no attention dropout; CoDA's options from the coda_* fields
    "transformer-coda": Architecture(
        layer="postln", input_pe=True, gate="coda", config=CoDAEncoderConfig,
        attention=lambda cfg, rng: CoDAttention.from_config(cfg, cfg.d_model, cfg.n_head, rng=rng)),
}


def _embedding_init(cfg, vocab_size, rng):
    """The official code's embedding inits (docs/ndr.md §5): N(0, 1), Kaiming-normal N(0, 2/d), or
    Xavier-uniform."""
    if cfg.embedding_init == "normal":
        w = rng.standard_normal((vocab_size, cfg.d_model))
    elif cfg.embedding_init == "kaiming":
        w = rng.standard_normal((vocab_size, cfg.d_model)) * math.sqrt(2 / cfg.d_model)
    elif cfg.embedding_init == "xavier":
        w = xavier_uniform(rng, vocab_size, cfg.d_model)
    else:
        raise ValueError(f"unknown embedding_init {cfg.embedding_init!r}; use normal, kaiming or "
                         "xavier")
    return w.astype(backend.DEFAULT_DTYPE)


class UniversalEncoder(Module):
    """Embedding (+ sinusoidal PE and dropout 0.1 for the plain Transformer), then one shared layer
    applied ``n_steps`` times. Padding: keys at positions ≥ the true length are masked."""

    def __init__(self, name, vocab_size, cfg, rng):
        arch = ARCHITECTURES[name]
        self.input_pe = arch.input_pe
        if cfg.d_model < 1 or cfg.n_steps < 1 or cfg.n_steps_eval < 0:
            raise ValueError(f"need d_model ≥ 1, n_steps ≥ 1 and n_steps_eval ≥ 0 (0: as n_steps), "
                             f"got {cfg.d_model}, {cfg.n_steps} and {cfg.n_steps_eval}")
        self.cfg = cfg
        self.embedding = Embedding(vocab_size, cfg.d_model,
                                   weight=_embedding_init(cfg, vocab_size, rng))
        attention = arch.attention(cfg, rng)
        if arch.layer == "postln":
            self.layer = PostLNLayer(attention, cfg, rng)
        else:
            self.layer = CopyGateLayer(attention, cfg, rng, tanh_out=arch.layer == "gate-tanh")
        self.input_dropout = Dropout(0.1 if self.input_pe else 0.0)
        self.pe = sinusoidal_positions(64, cfg.d_model) if self.input_pe else None

    def forward(self, ids, key_mask=None, n_steps=None, trace=None):
        """ids (B, T) int; key_mask (B, T) bool (True = real token). ``trace``: a list that receives
        (attention weights, gate or None) per step, for analysis and plots."""
        B, T = ids.shape
        h = self.embedding(ids)
        if self.input_pe:
            if T > len(self.pe):
                self.pe = backend.to_device(sinusoidal_positions(2 * T, self.cfg.d_model),
                                            backend.device_of(ids))
            h = self.input_dropout(h + self.pe[:T])
        evaluating = not self.training and self.cfg.n_steps_eval
        steps = n_steps or (self.cfg.n_steps_eval if evaluating else self.cfg.n_steps)
        self.layer.attn.record = self.layer.record = trace is not None
        # one layer, applied `steps` times: each dropout draws its `steps` masks at once
        with self.layer.repeated(steps):
            for _ in range(steps):
                h = self.layer(h, key_mask=key_mask)
                if trace is not None:
                    trace.append((self.layer.attn.last_weights,
                                  getattr(self.layer, "last_gate", None)))
        self.layer.attn.record = self.layer.record = False
        return h


class Classifier(Module):
    """[SOS, x_1..x_n, EOS] → encoder → the EOS (or SOS) column → Linear(d → n_classes)
    (docs/ndr.md §1)."""

    def __init__(self, name, n_tokens, n_classes, cfg, seed=0):
        if name not in ARCHITECTURES:
            raise ValueError(f"unknown model {name!r}; valid models: {', '.join(ARCHITECTURES)}")
        if cfg.readout not in ("eos", "sos"):
            raise ValueError(f"unknown readout {cfg.readout!r}; use eos or sos")
        rng = np.random.default_rng(seed)
        self.name, self.cfg = name, cfg
        # n_tokens input symbols plus EOS = n_tokens and SOS = n_tokens + 1
        self.encoder = UniversalEncoder(name, n_tokens + 2, cfg, rng)
        self.head = Linear(cfg.d_model, n_classes, rng=rng)

    def forward(self, ids, lengths, n_steps=None, trace=None):
        """ids (B, T) with SOS at 0 and EOS at lengths−1; lengths (B,) int. Returns logits (B,
        n_classes)."""
        xp = backend.array_module(ids)
        B, T = ids.shape
        key_mask = xp.arange(T)[None, :] < lengths[:, None]
        h = self.encoder(ids, key_mask, n_steps=n_steps, trace=trace)
        column = lengths - 1 if self.cfg.readout == "eos" else xp.zeros(B, dtype=lengths.dtype)
        return self.head(h[xp.arange(B), column])
