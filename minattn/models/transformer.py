"""Transformer encoders of the NDR paper (Csordás, Irie & Schmidhuber 2022; design
note docs/ndr.md §1–5).

All of them are Universal Transformers: ONE shared layer applied ``n_steps`` times (the number can
differ at test time). Two layer types:

* ``PostLNLayer`` (docs/ndr.md §4.1): x ← LN(x + Drop(Attn(x))); x ← LN(x + Drop(FF(x))).
* ``CopyGateLayer`` (docs/ndr.md §2, the NDR layer; docs/ndr.md §4.3, the "+ gate" baselines): a gate
  per column and channel decides whether the column is updated or simply copies its state to the next step:
      a  = LN(h + Drop(Attn(h)))
      u  = LN(W2 Drop(ReLU(W1 a)))          (NDR)   or  tanh(...) (gated baselines)
      g  = σ(G2 Drop(ReLU(G1 a)) + c2),     c2 initialised to −3, so layers start near "copy"
      h' = g ⊙ u + (1 − g) ⊙ h                                                     (Eqs. 5–6)
  Gate dropout (code only) zeroes the whole gate of a column for a step: that column copies.

``Classifier`` embeds [SOS, x…, EOS], runs the encoder and reads one column (EOS or SOS) through a
linear layer; ``Classifier(name, ...)`` builds the models of the README's table by name.
"""
import math
from dataclasses import dataclass

import numpy as np

from .. import backend
from .. import functional as F
from ..attention.coda import CoDAttention
from ..attention.compositional import CompositionalAttention
from ..attention.geometric import GeometricAttention
from ..attention.multihead import MultiHeadAttention, check_init
from ..attention.relative import RelativeMultiHeadAttention
from ..nn import Dropout, Embedding, FeedForward, LayerNorm, Linear, Module, sinusoidal_positions, xavier_uniform


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
    n_retrieval: int = 0           # compositional attention: retrievals R (0: n_head; S = R = H contains MHA)


def _attention(kind, cfg, rng):
    if kind == "softmax":
        return MultiHeadAttention(cfg.d_model, cfg.n_head, rng=rng)
    if kind in ("relative", "absrel"):
        return RelativeMultiHeadAttention(cfg.d_model, cfg.n_head, cfg.attention_dropout,
                                          abs_gate=kind == "absrel", rng=rng)
    if kind in ("geometric", "geometric-normalized"):
        return GeometricAttention(cfg.d_model, cfg.n_head, cfg.attention_dropout,
                                  normalize=kind == "geometric-normalized", rng=rng)
    if kind == "coda":   # as the softmax kind: no attention dropout; options from coda_* fields if cfg has them
        return CoDAttention.from_config(cfg, cfg.d_model, cfg.n_head, rng=rng)
    if kind == "compositional":
        return CompositionalAttention(cfg.d_model, cfg.n_search or cfg.n_head, cfg.n_retrieval or cfg.n_head, rng=rng)
    raise ValueError(f"unknown attention kind {kind!r}")


class PostLNLayer(Module):
    """The standard post-norm layer (docs/ndr.md §4.1); W1/W2 Xavier-initialised with gains sqrt(2)/1."""

    def __init__(self, attention, cfg, rng):
        self.attn = attention
        self.norm1, self.norm2 = LayerNorm(cfg.d_model), LayerNorm(cfg.d_model)
        self.ff = FeedForward(cfg.d_model, cfg.d_ff, cfg.dropout, rng, gain1=math.sqrt(2), xavier=True)
        self.drop1, self.drop2 = Dropout(cfg.dropout), Dropout(cfg.dropout)

    def forward(self, x, key_mask=None):
        x = self.norm1(x + self.drop1(self.attn(x, key_mask=key_mask)))
        return self.norm2(x + self.drop2(self.ff(x)))


class CopyGateLayer(Module):
    """The copy-gated layer: NDR (``tanh_out=False``, LN on the data path) or the "+ gate"
    baselines (``tanh_out=True``: tanh instead of LN, default W2 init). The official code hard-wires the
    baselines' d_ff to 4·d (docs/ndr.md §4.3); here the presets set ``d_ff = 4·d``, so the config says
    what the model uses."""

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
            self.ff = FeedForward(d, cfg.d_ff, cfg.dropout, rng, gain1=math.sqrt(2), gain2=5 / 3, xavier=True)
            self.norm_out = LayerNorm(d)
        # The gate's hidden layer is dropped out together with the feed-forward's (self.ff.dropout, below).
        self.gate = FeedForward(d, d, 0.0, rng, gain1=math.sqrt(2), gain2=1.0, xavier=True)
        self.gate.fc2.bias.data[:] = -3.0   # σ(−3) ≈ 0.047: start close to "copy the state"
        # Gate dropout (the code's): closes the whole gate of a column for a step, without rescaling.
        self.gate_dropout = Dropout(cfg.gate_dropout, scale=False, shared_axes=(-1,))
        self.last_gate = None

    def first_layers(self):
        """[W1 of the feed-forward | W1 of the gate] and their biases, side by side."""
        return (F.concat([self.ff.fc1.weight, self.gate.fc1.weight], axis=1),
                F.concat([self.ff.fc1.bias, self.gate.fc1.bias]))

    def forward(self, h, key_mask=None):
        B, T, d = h.shape
        a = self.norm_merge(h + self.drop_att(self.attn(h, key_mask=key_mask)))
        # FF(a) = W2 Drop(ReLU(W1 a + b1)) + b2 and the gate's FF_g(a) read the same a: their first layers
        # are one matmul, one ReLU and one dropout over d_ff + d columns (on a GPU: launches once, not twice).
        W1, b1 = self.once("first_layers", self.first_layers)
        hidden = self.ff.dropout(F.relu(F.linear(a.reshape(B * T, d), W1, b1)))      # (B·T, d_ff + d)
        f = self.ff.fc2(hidden[:, :self.ff.fc1.weight.shape[1]])
        u = F.tanh(f) if self.tanh_out else self.norm_out(f)
        g = self.gate_dropout(F.sigmoid(self.gate.fc2(hidden[:, -d:])))
        u, g = u.reshape(B, T, d), g.reshape(B, T, d)
        if self.record:
            self.last_gate = g
        return h + g * (u - h)               # = g ⊙ u + (1 − g) ⊙ h, using the pre-attention h


# name -> (layer kind, attention kind, input PE?)
ARCHITECTURES = {
    "transformer": ("postln", "softmax", True),
    "transformer-rel": ("postln", "relative", False),
    "transformer-rel-gate": ("gate-tanh", "relative", False),
    "transformer-absrel-gate": ("gate-tanh", "absrel", False),
    "transformer-geom": ("postln", "geometric-normalized", False),
    "ndr": ("gate", "geometric", False),
    "transformer-compositional": ("postln", "compositional", True),
    "transformer-coda": ("postln", "coda", True),
}


def _embedding_init(cfg, vocab_size, rng):
    """The official code's embedding inits (docs/ndr.md §5): N(0, 1), Kaiming-normal N(0, 2/d), or Xavier-uniform."""
    if cfg.embedding_init == "normal":
        w = rng.standard_normal((vocab_size, cfg.d_model))
    elif cfg.embedding_init == "kaiming":
        w = rng.standard_normal((vocab_size, cfg.d_model)) * math.sqrt(2 / cfg.d_model)
    elif cfg.embedding_init == "xavier":
        w = xavier_uniform(rng, vocab_size, cfg.d_model)
    else:
        raise ValueError(f"unknown embedding_init {cfg.embedding_init!r}; use normal, kaiming or xavier")
    return w.astype(backend.DEFAULT_DTYPE)


class UniversalEncoder(Module):
    """Embedding (+ sinusoidal PE and dropout 0.1 for the plain Transformer), then one shared layer
    applied ``n_steps`` times. Padding: keys at positions ≥ the true length are masked."""

    def __init__(self, name, vocab_size, cfg, rng):
        layer_kind, attention_kind, self.input_pe = ARCHITECTURES[name]
        if cfg.d_model < 1 or cfg.n_steps < 1 or cfg.n_steps_eval < 0:
            raise ValueError(f"need d_model ≥ 1, n_steps ≥ 1 and n_steps_eval ≥ 0 (0: as n_steps), got "
                             f"{cfg.d_model}, {cfg.n_steps} and {cfg.n_steps_eval}")
        self.cfg = cfg
        self.embedding = Embedding(vocab_size, cfg.d_model, weight=_embedding_init(cfg, vocab_size, rng))
        attention = _attention(attention_kind, cfg, rng)
        if layer_kind == "postln":
            self.layer = PostLNLayer(attention, cfg, rng)
        else:
            self.layer = CopyGateLayer(attention, cfg, rng, tanh_out=layer_kind == "gate-tanh")
        self.input_dropout = Dropout(0.1 if self.input_pe else 0.0)
        self.pe = sinusoidal_positions(64, cfg.d_model) if self.input_pe else None

    def forward(self, ids, key_mask=None, n_steps=None, trace=None):
        """ids (B, T) int; key_mask (B, T) bool (True = real token). ``trace``: a list that receives
        (attention weights, gate or None) per step, for analysis and plots."""
        B, T = ids.shape
        h = self.embedding(ids)
        if self.input_pe:
            if T > len(self.pe):
                self.pe = backend.to_device(sinusoidal_positions(2 * T, self.cfg.d_model), backend.device_of(ids))
            h = self.input_dropout(h + self.pe[:T])
        steps = n_steps or (self.cfg.n_steps if self.training or not self.cfg.n_steps_eval else self.cfg.n_steps_eval)
        self.layer.attn.record = self.layer.record = trace is not None
        with self.layer.repeated(steps):   # one layer, applied `steps` times (minattn/fast/shared_layer.py)
            for _ in range(steps):
                h = self.layer(h, key_mask=key_mask)
                if trace is not None:
                    trace.append((self.layer.attn.last_weights, getattr(self.layer, "last_gate", None)))
        self.layer.attn.record = self.layer.record = False
        return h


class Classifier(Module):
    """[SOS, x_1..x_n, EOS] → encoder → the EOS (or SOS) column → Linear(d → n_classes) (docs/ndr.md §1)."""

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
        """ids (B, T) with SOS at 0 and EOS at lengths−1; lengths (B,) int. Returns logits (B, n_classes)."""
        xp = backend.array_module(ids)
        B, T = ids.shape
        key_mask = xp.arange(T)[None, :] < lengths[:, None]
        h = self.encoder(ids, key_mask, n_steps=n_steps, trace=trace)
        column = lengths - 1 if self.cfg.readout == "eos" else xp.zeros(B, dtype=lengths.dtype)
        return self.head(h[xp.arange(B), column])


# ==========================================================================================================
# Encoder–decoder Transformer (docs/abstractor.md §4–5; shared with later work, e.g. docs/coda.md §6)
# ==========================================================================================================
#
# The post-LN encoder–decoder of the Abstractor paper's Keras code: its Transformer baseline, and the frame its
# Abstractor models (models/abstractor.py) plug into by overriding ``encode``. It differs from PostLNLayer
# above (the NDR code): dropout on the FF output only (none on the attention output or the FF hidden layer),
# LayerNorm ε 1e-3, and attention heads that are each d_model wide with biases (docs/abstractor.md §5: the
# parameter counts need this). Attention modules come from ``Seq2SeqTransformer.attention``, so a variant
# (e.g. CoDA) can swap all three kinds (encoder self, decoder causal self, cross) by overriding one method.

@dataclass
class EncoderDecoderConfig:
    """Hyperparameters of the encoder–decoder (defaults: the sorting Transformer, docs/abstractor.md §6.1)."""
    d_model: int = 64
    n_head: int = 2
    d_head: int = 0                  # q/k/v size per head; 0 = d_model (the Abstractor code, docs/abstractor.md §1.2)
    d_ff: int = 64
    n_encoder_layers: int = 4
    n_decoder_layers: int = 4
    dropout: float = 0.1             # on the embedded inputs and on every FF output
    attention_dropout: float = 0.1   # on the attention weights
    ln_eps: float = 1e-3             # Keras' default
    pe_layout: str = "concat"        # sinusoidal positions: "concat" (sin | cos halves) or "interleaved"
    decoder_form: str = "paper"      # several contexts: "paper" (Alg. 2) or "code" (a full layer per context)
    init: str = "default"            # "keras": the reference code's kernels and zero biases (docs/abstractor.md §5.1)


def dense(d_in, d_out, rng):
    """Keras' Dense: Glorot-uniform kernel, zero bias."""
    layer = Linear(d_in, d_out, rng=rng, weight=xavier_uniform(rng, d_in, d_out))
    layer.bias.data[:] = 0
    return layer


def keras_attention(cfg, rng):
    """Softmax MHA as in the Keras code: biases on q, k, v, o and heads d_head (default d_model) wide;
    ``cfg.init`` "keras" also draws its kernels as Keras does (docs/abstractor.md §5.1)."""
    return MultiHeadAttention(cfg.d_model, cfg.n_head, cfg.attention_dropout, rng,
                              d_head=cfg.d_head or cfg.d_model, bias=True, init=cfg.init)


class FeedForwardBlock(Module):
    """x ← LN(x + Drop(W2 ReLU(W1 x + b1) + b2)): the FF sub-layer of every block here (docs/abstractor.md §3).
    W1, W2 Glorot-uniform; b1, b2 PyTorch's U(±1/√fan_in), or 0 (Keras' Dense) with ``cfg.init`` "keras"."""

    def __init__(self, cfg, rng):
        self.ff = FeedForward(cfg.d_model, cfg.d_ff, 0.0, rng, xavier=True)
        if cfg.init == "keras":
            self.ff.fc1.bias.data[:] = 0
            self.ff.fc2.bias.data[:] = 0
        self.dropout = Dropout(cfg.dropout)
        self.norm = LayerNorm(cfg.d_model, cfg.ln_eps)

    def forward(self, x):
        return self.norm(x + self.dropout(self.ff(x)))


class EncoderLayer(Module):
    """x ← LN(x + MHA(x, x, x)); x ← FF block (docs/abstractor.md §4)."""

    def __init__(self, cfg, rng, attention):
        self.attn = attention("encoder")
        self.norm = LayerNorm(cfg.d_model, cfg.ln_eps)
        self.ffn = FeedForwardBlock(cfg, rng)

    def forward(self, x, key_mask=None):
        return self.ffn(self.norm(x + self.attn(x, key_mask=key_mask)))


class DecoderLayer(Module):
    """y ← LN(y + CausalMHA(y)); for each of its contexts C_i: y ← LN(y + MHA(Q = y, K = V = C_i));
    y ← FF block. With one context this is the standard decoder layer; with several, a layer of the
    multi-attention decoder (paper Algorithm 2). ``context_ids`` say which of the model's contexts it reads."""

    def __init__(self, cfg, rng, attention, context_ids=(0,)):
        self.context_ids = tuple(context_ids)
        self.self_attn = attention("decoder")
        self.self_norm = LayerNorm(cfg.d_model, cfg.ln_eps)
        self.cross = [attention("cross") for _ in self.context_ids]
        self.cross_norms = [LayerNorm(cfg.d_model, cfg.ln_eps) for _ in self.context_ids]
        self.ffn = FeedForwardBlock(cfg, rng)

    def forward(self, y, contexts, key_mask=None):
        """Teacher forcing: y (B, T, d); contexts: list of (B, S, d); key_mask (B, S) marks their real positions."""
        y = self.self_norm(y + self.self_attn(y, causal=True))
        for i, attn, norm in zip(self.context_ids, self.cross, self.cross_norms):
            y = norm(y + attn(y, context=contexts[i], key_mask=key_mask))
        return self.ffn(y)

    def start(self, contexts):
        """The decoding state of this layer: keys and values of its contexts (projected once) and of the
        positions decoded so far (none yet)."""
        return {"cross": [attn.kv(contexts[i]) for i, attn in zip(self.context_ids, self.cross)], "self": None}

    def step(self, y, state, key_mask=None):
        """Greedy decoding: y (B, 1, d) is the newest position; it may attend to every earlier one, so no
        causal mask is needed. Appends its own keys and values to ``state``."""
        if y.shape[1] != 1:
            raise ValueError(f"a decoding step takes one new position, got {y.shape[1]}")
        k, v = self.self_attn.kv(y)
        if state["self"] is not None:
            k, v = F.concat([state["self"][0], k], axis=2), F.concat([state["self"][1], v], axis=2)
        state["self"] = (k, v)
        y = self.self_norm(y + self.self_attn(y, kv=(k, v)))
        for kv, attn, norm in zip(state["cross"], self.cross, self.cross_norms):
            y = norm(y + attn(y, kv=kv, key_mask=key_mask))
        return self.ffn(y)


class Seq2SeqTransformer(Module):
    """Encoder–decoder Transformer (Vaswani et al. 2017) in the form of the Abstractor code
    (docs/abstractor.md §4): source → Dense (vectors of size ``d_src``) or Embedding (``n_src_tokens`` ids); targets → Embedding;
    each ×√d + PE, then Dropout; encoder layers; decoder layers that attend to the contexts ``encode`` returns;
    a Dense head gives the logits (no final LayerNorm). ``n_contexts`` > 1 makes the decoder a multi-attention
    decoder.

    ``forward`` is teacher forcing. ``greedy`` decodes from a start token, feeding back each argmax (output
    class c is target token c): it runs ``encode`` once, projects the contexts' keys and values once per
    layer and keeps those of the decoded positions, so each step computes only the newest position (the
    same result as re-running the decoder on the prefix: causality makes it so).
    """

    def __init__(self, n_tgt_tokens, n_classes, cfg, d_src=None, n_src_tokens=None, seed=0, n_contexts=1):
        if (d_src is None) == (n_src_tokens is None):
            raise ValueError("give exactly one of d_src (vector inputs) and n_src_tokens (token inputs)")
        if cfg.decoder_form not in ("paper", "code"):
            raise ValueError(f"unknown decoder_form {cfg.decoder_form!r}; use 'paper' or 'code'")
        check_init(cfg.init)
        rng = np.random.default_rng(seed)
        d = cfg.d_model
        self.cfg = cfg

        def attention(role):
            return self.attention(role, rng)
        emb = rng.uniform(-0.05, 0.05, (n_tgt_tokens, d)).astype(backend.DEFAULT_DTYPE)   # Keras' Embedding init
        if d_src is not None:
            self.src_embed = dense(d_src, d, rng)
        else:
            self.src_embed = Embedding(n_src_tokens, d, weight=rng.uniform(-0.05, 0.05, (n_src_tokens, d))
                                       .astype(backend.DEFAULT_DTYPE))
        self.tgt_embed = Embedding(n_tgt_tokens, d, weight=emb)
        self.encoder = [EncoderLayer(cfg, rng, attention) for _ in range(cfg.n_encoder_layers)]
        # paper form: each layer reads every context; code form: one full layer per (layer, context)
        groups = [tuple(range(n_contexts))] if cfg.decoder_form == "paper" else [(i,) for i in range(n_contexts)]
        self.decoder = [DecoderLayer(cfg, rng, attention, ids) for _ in range(cfg.n_decoder_layers) for ids in groups]
        self.head = dense(d, n_classes, rng)
        self.dropout = Dropout(cfg.dropout)
        self.pe = sinusoidal_positions(64, d, cfg.pe_layout)

    def attention(self, role, rng):
        """A new attention module for ``role`` ("encoder", "decoder" (causal self) or "cross")."""
        return keras_attention(self.cfg, rng)

    def embed(self, h, offset=0):
        """Dropout(h·√d + PE[offset : offset + T]) for embedded inputs h (B, T, d)."""
        T = h.shape[1]
        if offset + T > len(self.pe):
            self.pe = backend.to_device(sinusoidal_positions(2 * (offset + T), self.cfg.d_model, self.cfg.pe_layout),
                                        backend.device_of(h.data))
        return self.dropout(h * math.sqrt(self.cfg.d_model) + self.pe[offset:offset + T])

    def encode(self, src, src_mask=None):
        """The contexts the decoder attends to: here [encoder output (B, S, d)]."""
        h = self.embed(self.src_embed(src))
        for layer in self.encoder:
            h = layer(h, key_mask=src_mask)
        return [h]

    def decode(self, contexts, tgt_in, src_mask=None):
        y = self.embed(self.tgt_embed(tgt_in))
        for layer in self.decoder:
            y = layer(y, contexts, src_mask)
        return self.head(y)

    def forward(self, src, tgt_in, src_mask=None):
        """src (B, S, d_src) floats or (B, S) ids; tgt_in (B, T) ids [start, y_1..y_{T−1}]; src_mask (B, S)
        True at real positions. Returns logits (B, T, n_classes)."""
        return self.decode(self.encode(src, src_mask), tgt_in, src_mask)

    def greedy(self, src, n_steps, start, src_mask=None):
        """Greedy decoding, for evaluation (model.eval(), under no_grad()). Returns (tokens (B, n_steps) int
        array, logits (B, n_steps, n_classes) Tensor)."""
        contexts = self.encode(src, src_mask)
        xp = backend.array_module(contexts[0].data)
        tok = xp.full((contexts[0].shape[0], 1), start, dtype=np.int64)
        states, tokens, logits = [layer.start(contexts) for layer in self.decoder], [], []
        for t in range(n_steps):
            y = self.embed(self.tgt_embed(tok), offset=t)
            for layer, state in zip(self.decoder, states):
                y = layer.step(y, state, src_mask)
            logits.append(self.head(y))                       # (B, 1, n_classes)
            tok = logits[-1].data.argmax(-1)                  # (B, 1): the next input token
            tokens.append(tok)
        return xp.concatenate(tokens, axis=1), F.concat(logits, axis=1)


class CoDASeq2SeqTransformer(Seq2SeqTransformer):
    """``transformer-seq2seq-coda`` (docs/coda.md §6): encoder self-, decoder causal self- and cross-attention
    are all CoDA (attention/coda.py) with the same projections as ``keras_attention``; CoDA's options come from
    the config's ``coda_*`` fields. Decoder roles take Mean(·) per query row, so that centring never lets a
    position see later ones (and greedy decoding equals teacher forcing)."""

    def attention(self, role, rng):
        cfg = self.cfg
        return CoDAttention.from_config(cfg, cfg.d_model, cfg.n_head, cfg.attention_dropout, rng,
                                        d_head=cfg.d_head or cfg.d_model, bias=True, row_mean=role != "encoder",
                                        init=cfg.init)
