"""seq2attn and its attention seq2seq baseline (Korrel, Hupkes, Dankers & Bruni 2019, "Transcoding
compositionally", §3, Eqs. 1–12, Table 2; design note docs/seq2attn.md §1).

seq2attn splits the decoder's two jobs. A *transcoder* RNN, started from the encoder's final state,
reads the previous output token and produces the query s_t; MLP attention over the encoder states
picks ONE input position with Gumbel-softmax straight-through (argmax at evaluation); the *decoder*
sees only what was picked — the input token's embedding, not its contextualised state (Eq. 9) —
and its previous state is multiplied by that embedding ("full focus", Eq. 12), so all an output step
takes from the input is the one symbol it attended to. One decoding step t, in the reference code's
order (docs/seq2attn.md §1.3):

    x_t = E_out[y_{t−1}];  s_t = RNN_trans(x_t, s_{t−1});  α_t = attention(keys = h^enc, query = s_t)
    c_t = Σ_j α_tj E_in[x_j];  h^dec_t = RNN_dec([c_t ; x_t], h^dec_{t−1} ⊙ c_t)
    log p(y_t | ...) = log_softmax(W_out h^dec_t + b_out)

The four components of the paper's ablation (Table 2) are independent switches of
``Seq2AttnConfig``: G (Gumbel attention; else softmax), E (embeddings as values; else encoder
states), F (full focus) and T (transcoder + learned decoder initial state h^dec_0; else the query is
h^dec_{t−1} and h^dec_0 = h^enc_n). All four off is the baseline ``seq2seq``
(docs/seq2attn.md §1.7).

Batches are right-padded; padding keys are masked out of the attention, the encoder's final state of
each row is taken at its own length, and padding targets are left out of the loss. A state is a list
with one entry per layer: h for a GRU, (h, c) for an LSTM.
"""
from dataclasses import dataclass

import numpy as np

from .. import backend
from .. import functional as F
from ..attention.additive import AdditiveAttention
from ..engine import Tensor, eval_mode, is_training, no_grad
from ..nn import Dropout, Embedding, GRUCell, Linear, LSTMCell, Module, Parameter


@dataclass
class Seq2AttnConfig:
    """Hyperparameters; the defaults are seq2attn on the lookup tables (docs/seq2attn.md §2.5)."""
    # E, size of the input embeddings (the attention values under E)
    d_embedding: int = 256
    d_hidden: int = 256               # H, every RNN state and the target embeddings
    cell: str = "gru"                 # "gru" or "lstm"
    n_layers: int = 1                 # stacked layers in encoder, transcoder and decoder
    # between stacked layers only (PyTorch's RNN): a no-op with one layer
    dropout: float = 0.0
    # G: Gumbel-ST attention in training, argmax at evaluation; else softmax
    gumbel: bool = True
    embedding_values: bool = True     # E: attend over input embeddings; else over encoder states
    full_focus: bool = True           # F: multiply the decoder's previous state by the context
    transcoder: bool = True           # T: a separate query RNN, and a learned decoder initial state
    # Gumbel τ (G only): "conditioned" on the query, "latent" or "fixed"
    temperature: str = "conditioned"
    tau_init: float = 5.0             # τ of "fixed"; initial τ of "latent"
    tau_max: float = 5.0              # upper bound of the "conditioned" τ
    teacher_forcing: float = 0.5      # probability that a training sequence is fed its gold prefix
    init_range: float = 0.08          # U(±init_range) for every parameter except the temperature's


# Model names (``--model``): seq2attn has all four components, the baseline none.
MODELS = {"seq2attn": {}, "seq2seq": dict(gumbel=False, embedding_values=False, full_focus=False,
                                          transcoder=False)}


def model_config(name, **overrides):
    """The Seq2AttnConfig of model ``name`` ("seq2attn" or "seq2seq") with field overrides."""
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; valid: {', '.join(MODELS)}")
    return Seq2AttnConfig(**{**MODELS[name], **overrides})


def _map(fn, state):
    """Apply fn to every tensor of a state (a list over layers of h or (h, c))."""
    return [tuple(fn(x) for x in s) if isinstance(s, tuple) else fn(s) for s in state]


class RNN(Module):
    """A stack of GRU or LSTM cells advanced one time step per call, with dropout between layers."""

    def __init__(self, cell, d_in, d_hidden, n_layers, dropout, rng):
        Cell = {"gru": GRUCell, "lstm": LSTMCell}[cell]
        self.cells = [Cell(d_in if i == 0 else d_hidden, d_hidden, rng=rng)
                      for i in range(n_layers)]
        self.lstm, self.d_hidden = cell == "lstm", d_hidden
        self.dropout = Dropout(dropout)

    def zero_state(self, B, like):
        xp = backend.array_module(like)
        zero = lambda: Tensor(xp.zeros((B, self.d_hidden), dtype=like.dtype))  # noqa: E731
        return [(zero(), zero()) if self.lstm else zero() for _ in self.cells]

    def forward(self, x, state):
        """One step: (output of the top layer, new state)."""
        new = []
        for i, (cell, s) in enumerate(zip(self.cells, state)):
            if i:
                x = self.dropout(x)
            s = cell(x, s)
            new.append(s)
            x = s[0] if self.lstm else s
        return x, new


class Seq2Attn(Module):
    """seq2attn (default config) or any ablation of it down to the baseline (``model_config``)."""

    def __init__(self, cfg, in_vocab_size, out_vocab_size, sos_id, seed=0):
        E, H = cfg.d_embedding, cfg.d_hidden
        if cfg.cell not in ("gru", "lstm"):
            raise ValueError(f"unknown cell {cfg.cell!r}; valid: gru, lstm")
        if cfg.full_focus and cfg.embedding_values and E != H:
            raise ValueError(f"full focus multiplies the context (size d_embedding={E}) with the "
                             f"decoder state (size d_hidden={H}): they must be equal")
        if cfg.n_layers < 1 or not 0 <= cfg.teacher_forcing <= 1 or not 0 <= cfg.dropout < 1:
            raise ValueError("need n_layers ≥ 1, 0 ≤ teacher_forcing ≤ 1 and 0 ≤ dropout < 1")
        rng = np.random.default_rng(seed)
        self.cfg, self.sos_id = cfg, sos_id
        rnn = lambda d_in: RNN(cfg.cell, d_in, H, cfg.n_layers, cfg.dropout, rng)  # noqa: E731
        # E_in: encoder input, and values under E
        self.embed_in = Embedding(in_vocab_size, E, rng=rng)
        self.encoder = rnn(E)
        # E_out: shared by transcoder and decoder
        self.embed_out = Embedding(out_vocab_size, H, rng=rng)
        self.transcoder = rnn(H) if cfg.transcoder else None
        self.attention = AdditiveAttention(H, H, H, "gumbel_st" if cfg.gumbel else "softmax",
                                           cfg.temperature,
                                           cfg.tau_init, cfg.tau_max, rng=rng)
        self.decoder = rnn((E if cfg.embedding_values else H) + H)
        n_init = cfg.n_layers * (2 if cfg.cell == "lstm" else 1) if cfg.transcoder else 0
        self.decoder_init = [Parameter(np.zeros((1, H), dtype=backend.DEFAULT_DTYPE))
                             for _ in range(n_init)]
        self.out = Linear(H, out_vocab_size, rng=rng)
        self.rng = None  # teacher-forcing draws (Module.set_rng)
        for name, p in self.named_parameters():
            # τ keeps its own init
            if not name.startswith(("attention.w_tau.", "attention.log_tau")):
                p.data = rng.uniform(-cfg.init_range, cfg.init_range, p.shape).astype(p.dtype)

    def encode(self, src, lengths):
        """Embeddings (B, n, E), encoder outputs (B, n, H) and each row's final state (at its
        length)."""
        B, n = src.shape
        emb = self.embed_in(src)
        state, outputs, states = self.encoder.zero_state(B, emb.data), [], []
        for j in range(n):
            out, state = self.encoder(emb[:, j], state)
            outputs.append(out)
            states.append(state)
        rows, last = backend.array_module(src).arange(B), lengths - 1
        final = [tuple(F.stack(xs, axis=1)[rows, last] for xs in zip(*layer)) if self.encoder.lstm
                 else F.stack(layer, axis=1)[rows, last]
                 for layer in zip(*states)]   # one entry per layer
        return emb, F.stack(outputs, axis=1), final

    def decode(self, src, src_lengths, steps, tgt=None, teacher_forcing=0.0):
        """Run ``steps`` decoding steps; returns logits (B, steps, V_out) and the list of α_t (B,
        n).

        With ``tgt`` (B, ≥ steps) each sequence is fed its gold prefix with probability
        ``teacher_forcing`` (one draw per sequence, docs/seq2attn.md §1.6), else its own argmax
        predictions."""
        B, n = src.shape
        if n == 0:
            raise ValueError("decode: empty source sequences")
        xp = backend.array_module(src)
        lengths = backend.to_device(src_lengths, backend.device_of(src))
        emb, keys, state = self.encode(src, lengths)
        prepared = self.attention.prepare(keys, xp.arange(n)[None, :] < lengths[:, None])
        values = emb if self.cfg.embedding_values else keys                      # (B, n, E or H)
        if self.transcoder is not None:
            trans_state, p = state, self.decoder_init
            state = [(p[2 * i], p[2 * i + 1]) for i in range(len(p) // 2)] if self.decoder.lstm else list(p)
        gold = None
        if tgt is not None and teacher_forcing > 0:
            rng = self.rng if self.rng is not None else backend.default_rng(backend.device_of(src))
            gold = rng.uniform((B,)) < teacher_forcing if teacher_forcing < 1 else xp.ones(B, dtype=bool)
        prev = xp.full((B,), self.sos_id, dtype=src.dtype)
        logits, weights = [], []
        for t in range(steps):
            # x_t = E_out[y_{t−1}]
            x = self.embed_out(prev)
            if self.transcoder is not None:
                # s_t has read y_{t−1}
                query, trans_state = self.transcoder(x, trans_state)
            else:
                # h^dec_{t−1} (top layer)
                query = state[-1][0] if self.decoder.lstm else state[-1]
            alpha = self.attention(query, prepared)                               # (B, n)
            # c_t = Σ_j α_tj v_j (Eq. 9)
            context = (alpha.reshape(B, 1, n) @ values).reshape(B, -1)
            if self.cfg.full_focus:
                state = _map(lambda h: h * context, state)                        # Eq. 12
            out, state = self.decoder(F.concat([context, x], axis=-1), state)
            logits.append(self.out(out))
            weights.append(alpha)
            prev = logits[-1].data.argmax(-1)
            if gold is not None:
                prev = xp.where(gold, tgt[:, t], prev)
        return F.stack(logits, axis=1), weights

    def loss(self, src, src_lengths, tgt, tgt_lengths):
        """Σ_t −log p(y_t) per sequence (padding excluded), averaged over the batch
        (docs/seq2attn.md §1.6).

        ``tgt`` (B, m) ends each row with <eos> at position tgt_lengths − 1. In training the
        configured teacher forcing applies; at evaluation (eval_mode() or model.eval()) the model
        feeds back its own predictions, as the reference's validation loss does."""
        B, m = tgt.shape
        training = self.training and is_training()
        logits, _ = self.decode(src, src_lengths, m, tgt,
                                self.cfg.teacher_forcing if training else 0.0)
        xp = backend.array_module(tgt)
        lengths = backend.to_device(tgt_lengths, backend.device_of(tgt))
        valid = xp.arange(m)[None, :] < lengths[:, None]
        # cross_entropy is the mean over valid tokens: rescale it to a per-sequence sum.
        scale = (valid.sum() / B).astype(logits.dtype)
        return F.cross_entropy(logits, xp.where(valid, tgt, -1), ignore_index=-1) * scale

    def greedy(self, src, src_lengths, max_len, return_attention=False):
        """Greedy decoding of ``max_len`` steps with argmax attention: int array (B, max_len), and
        with ``return_attention`` also the attention weights (B, max_len, n) for plots."""
        with no_grad(), eval_mode():
            logits, weights = self.decode(src, src_lengths, max_len)
        tokens = logits.data.argmax(-1)
        if not return_attention:
            return tokens
        return tokens, backend.array_module(tokens).stack([w.data for w in weights], axis=1)
