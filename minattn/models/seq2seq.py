"""The post-LN encoder–decoder Transformer of the Abstractor paper's Keras code
(docs/abstractor.md §4–5): its Transformer baseline (``transformer-seq2seq``), the frame its
Abstractor models (models/abstractor.py) plug into by overriding ``encode``, and CoDA's variant with
CoDA everywhere (``transformer-seq2seq-coda``, docs/coda.md §6).

It differs from the NDR encoder's PostLNLayer (models/encoder.py): dropout on the FF output only
(none on the attention output or the FF hidden layer), LayerNorm ε 1e-3, and attention heads that
are each d_model wide with biases (docs/abstractor.md §5: the parameter counts need this). Attention
modules come from ``Seq2SeqTransformer.attention``, so a variant (e.g. CoDA) swaps all three kinds
(encoder self, decoder causal self, cross) by overriding one method.
"""
import math
from dataclasses import dataclass

import numpy as np

from .. import backend
from .. import functional as F
from ..attention.coda import CoDAConfig, CoDAttention
from ..attention.multihead import MultiHeadAttention, check_init
from ..nn import (Dropout, Embedding, FeedForward, LayerNorm, Linear, Module, sinusoidal_positions,
                  xavier_uniform)


@dataclass
class EncoderDecoderConfig:
    """Hyperparameters of the encoder–decoder (defaults: the sorting Transformer,
    docs/abstractor.md §6.1)."""
    d_model: int = 64
    n_head: int = 2
    # q/k/v size per head; 0 = d_model (the Abstractor code, docs/abstractor.md §1.2)
    d_head: int = 0
    d_ff: int = 64
    n_encoder_layers: int = 4
    n_decoder_layers: int = 4
    dropout: float = 0.1             # on the embedded inputs and on every FF output
    attention_dropout: float = 0.1   # on the attention weights
    ln_eps: float = 1e-3             # Keras' default
    pe_layout: str = "concat"        # sinusoidal positions: "concat" (sin | cos halves) or "interleaved"
    decoder_form: str = "paper"      # several contexts: "paper" (Alg. 2) or "code" (a full layer per context)
    # "keras": the reference code's kernels and zero biases (docs/abstractor.md §5.1)
    init: str = "default"


def dense(d_in, d_out, rng):
    """Keras' Dense: Glorot-uniform kernel, zero bias."""
    layer = Linear(d_in, d_out, rng=rng, weight=xavier_uniform(rng, d_in, d_out))
    layer.bias.data[:] = 0
    return layer


def keras_attention(cfg, rng):
    """Softmax MHA as in the Keras code: biases on q, k, v, o and heads d_head (default d_model)
    wide; ``cfg.init`` "keras" also draws its kernels as Keras does (docs/abstractor.md §5.1)."""
    return MultiHeadAttention(cfg.d_model, cfg.n_head, cfg.attention_dropout, rng,
                              d_head=cfg.d_head or cfg.d_model, bias=True, init=cfg.init)


class FeedForwardBlock(Module):
    """x ← LN(x + Drop(W2 ReLU(W1 x + b1) + b2)): the FF sub-layer of every block here
    (docs/abstractor.md §3). W1, W2 Glorot-uniform; b1, b2 PyTorch's U(±1/√fan_in), or 0 (Keras'
    Dense) with ``cfg.init`` "keras"."""

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
    multi-attention decoder (paper Algorithm 2). ``context_ids`` say which of the model's contexts
    it reads."""

    def __init__(self, cfg, rng, attention, context_ids=(0,)):
        self.context_ids = tuple(context_ids)
        self.self_attn = attention("decoder")
        self.self_norm = LayerNorm(cfg.d_model, cfg.ln_eps)
        self.cross = [attention("cross") for _ in self.context_ids]
        self.cross_norms = [LayerNorm(cfg.d_model, cfg.ln_eps) for _ in self.context_ids]
        self.ffn = FeedForwardBlock(cfg, rng)

    def forward(self, y, contexts, key_mask=None):
        """Teacher forcing: y (B, T, d); contexts: list of (B, S, d); key_mask (B, S) marks their
        real positions."""
        y = self.self_norm(y + self.self_attn(y, causal=True))
        for i, attn, norm in zip(self.context_ids, self.cross, self.cross_norms):
            y = norm(y + attn(y, context=contexts[i], key_mask=key_mask))
        return self.ffn(y)

    def start(self, contexts):
        """The decoding state of this layer: keys and values of its contexts (projected once) and of
        the positions decoded so far (none yet)."""
        return {"cross": [attn.kv(contexts[i]) for i, attn in zip(self.context_ids, self.cross)],
                "self": None}

    def step(self, y, state, key_mask=None):
        """Greedy decoding: y (B, 1, d) is the newest position; it may attend to every earlier one,
        so no causal mask is needed. Appends its own keys and values to ``state``."""
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
    (docs/abstractor.md §4): source → Dense (vectors of size ``d_src``) or Embedding
    (``n_src_tokens`` ids); targets → Embedding; each ×√d + PE, then Dropout; encoder layers;
    decoder layers that attend to the contexts ``encode`` returns; a Dense head gives the logits (no
    final LayerNorm). ``n_contexts`` > 1 makes the decoder a multi-attention decoder.

    ``forward`` is teacher forcing. ``greedy`` decodes from a start token, feeding back each argmax
    (output class c is target token c): it runs ``encode`` once, projects the contexts' keys and
    values once per layer and keeps those of the decoded positions, so each step computes only the
    newest position (the same result as re-running the decoder on the prefix: causality makes it
    so).
    """

    def __init__(self, n_tgt_tokens, n_classes, cfg, d_src=None, n_src_tokens=None, seed=0,
                 n_contexts=1):
        if (d_src is None) == (n_src_tokens is None):
            raise ValueError("give exactly one of d_src (vector inputs) and n_src_tokens (token "
                             "inputs)")
        if cfg.decoder_form not in ("paper", "code"):
            raise ValueError(f"unknown decoder_form {cfg.decoder_form!r}; use 'paper' or 'code'")
        check_init(cfg.init)
        rng = np.random.default_rng(seed)
        d = cfg.d_model
        self.cfg = cfg

        def attention(role):
            return self.attention(role, rng)
        # Keras' Embedding init
        emb = rng.uniform(-0.05, 0.05, (n_tgt_tokens, d)).astype(backend.DEFAULT_DTYPE)
        if d_src is not None:
            self.src_embed = dense(d_src, d, rng)
        else:
            self.src_embed = Embedding(n_src_tokens, d,
                                       weight=rng.uniform(-0.05, 0.05, (n_src_tokens, d))
                                       .astype(backend.DEFAULT_DTYPE))
        self.tgt_embed = Embedding(n_tgt_tokens, d, weight=emb)
        self.encoder = [EncoderLayer(cfg, rng, attention) for _ in range(cfg.n_encoder_layers)]
        # paper form: each layer reads every context; code form: one full layer per (layer, context)
        groups = ([tuple(range(n_contexts))] if cfg.decoder_form == "paper"
                  else [(i,) for i in range(n_contexts)])
        self.decoder = [DecoderLayer(cfg, rng, attention, ids) for _ in range(cfg.n_decoder_layers)
                        for ids in groups]
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
            self.pe = backend.to_device(sinusoidal_positions(2 * (offset + T), self.cfg.d_model,
                                                             self.cfg.pe_layout),
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
        """src (B, S, d_src) floats or (B, S) ids; tgt_in (B, T) ids [start, y_1..y_{T−1}]; src_mask
        (B, S) True at real positions. Returns logits (B, T, n_classes)."""
        return self.decode(self.encode(src, src_mask), tgt_in, src_mask)

    def greedy(self, src, n_steps, start, src_mask=None):
        """Greedy decoding, for evaluation (model.eval(), under no_grad()). Returns (tokens (B,
        n_steps) int array, logits (B, n_steps, n_classes) Tensor)."""
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
    """``transformer-seq2seq-coda`` (docs/coda.md §6): encoder self-, decoder causal self- and
    cross-attention are all CoDA (attention/coda.py) with the same projections as
    ``keras_attention``; CoDA's options come from the config's ``coda_*`` fields. Decoder roles take
    Mean(·) per query row, so that centring never lets a position see later ones (and greedy
    decoding equals teacher forcing)."""

    def attention(self, role, rng):
        cfg = self.cfg
        return CoDAttention.from_config(cfg, cfg.d_model, cfg.n_head, cfg.attention_dropout, rng,
                                        d_head=cfg.d_head or cfg.d_model, bias=True,
                                        row_mean=role != "encoder",
                                        init=cfg.init)


@dataclass
class CoDAEncoderDecoderConfig(CoDAConfig, EncoderDecoderConfig):
    """EncoderDecoderConfig plus CoDA's options (``coda_*``, read only by
    ``transformer-seq2seq-coda``)."""


# The token-input encoder–decoders by name (MLU): the class that builds each, the gate its training
# log follows (``gate_mean``; as in models/encoder.py ``Architecture``).
MODELS = {
    "transformer-seq2seq": dict(build=Seq2SeqTransformer, gate=None),
    "transformer-seq2seq-coda": dict(build=CoDASeq2SeqTransformer, gate="coda"),
}
