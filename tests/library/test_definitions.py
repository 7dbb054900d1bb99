"""Every building block pinned by its defining equation, not by a snapshot (issue 31 item 1): sinusoidal
positions, LayerNorm, linear and feed-forward layers, the embedding, the GRU and LSTM cells, dropout,
multi-head attention and the encoder–decoder frame of the Abstractor code (Vaswani et al. 2017).

Each test builds a module with random (float64) parameters, runs it on small random inputs and compares the
output with the equation written out in plain NumPy (tests/defs_reference.py, loops where clearer). The
papers' own definitions are in tests/papers/<paper>/test_definitions.py, each named in its paper's table
(docs/<paper>.md, "Definitions and the tests that pin them").
"""

import numpy as np
import pytest

from minattn import functional as F, nn
from minattn.attention.multihead import MultiHeadAttention
from minattn.backend import RNG
from minattn.engine import Tensor, eval_mode
from minattn.models.seq2seq import (DecoderLayer, EncoderDecoderConfig, EncoderLayer, Seq2SeqTransformer,
                                    keras_attention)
from tests import defs_reference as ref
from tests.defs_reference import TOL, X, arr, out, randomize


# --- building blocks --------------------------------------------------------------------------------------


@pytest.mark.parametrize("layout", ["interleaved", "concat"])
def test_sinusoidal_positions_are_vaswani_3_5(layout):
    """Vaswani et al. 2017 §3.5: PE(p, 2i) = sin(p/10000^(2i/d)), PE(p, 2i+1) = cos(p/10000^(2i/d));
    ``concat`` (the Abstractor code) puts the d/2 sines before the d/2 cosines. Negative positions too
    (Transformer-XL's offsets)."""
    positions = np.arange(-3, 7)
    got = nn.sinusoidal_positions(positions, 8, layout, dtype=np.float64)
    np.testing.assert_allclose(got, ref.sinusoid(positions, 8, layout), **TOL)
    np.testing.assert_allclose(nn.sinusoidal_positions(5, 6, layout, dtype=np.float64),
                               ref.sinusoid(range(5), 6, layout), **TOL)


def test_layer_norm_is_ba_2016():
    """Ba et al. 2016 Eqs. 3-4: (x − μ)/√(σ² + ε) · g + b over the last axis, σ² the biased variance."""
    ln = randomize(nn.LayerNorm(6, eps=1e-3))
    x = X(2, 3, 6)
    np.testing.assert_allclose(out(ln(Tensor(x))), ref.layer_norm(x, arr(ln.weight), arr(ln.bias), 1e-3), **TOL)
    w, b = X(6, seed=1), X(6, seed=2)
    np.testing.assert_allclose(out(F.layer_norm(Tensor(x), Tensor(w), Tensor(b))), ref.layer_norm(x, w, b, 1e-5),
                               **TOL)


def test_linear_and_feed_forward_are_vaswani_eq_2():
    """Vaswani et al. 2017 Eq. 2: FFN(x) = max(0, x W1 + b1) W2 + b2 (weights stored (in, out))."""
    ff = randomize(nn.FeedForward(4, 7))
    x = X(2, 3, 4)
    np.testing.assert_allclose(out(ff(Tensor(x))), ref.feed_forward(ff, x), **TOL)
    lin = randomize(nn.Linear(4, 3))
    np.testing.assert_allclose(out(lin(Tensor(x))), x @ arr(lin.weight) + arr(lin.bias), **TOL)


def test_embedding_is_a_row_lookup():
    emb = randomize(nn.Embedding(5, 3))
    ids = np.array([[4, 0, 4], [2, 1, 3]])
    np.testing.assert_allclose(out(emb(ids)), arr(emb.weight)[ids], **TOL)


def test_gru_cell_is_cho_2014_in_pytorch_form():
    """Cho et al. 2014 (PyTorch's GRU): r, z = σ(W x + b + U h + c); n = tanh(W_n x + b_n + r ⊙ (U_n h + c_n));
    h' = (1 − z) ⊙ n + z ⊙ h."""
    cell = randomize(nn.GRUCell(4, 3))
    x, h = X(2, 4), X(2, 3, seed=1)
    np.testing.assert_allclose(out(cell(Tensor(x), Tensor(h))), ref.gru(cell, x, h), **TOL)


def test_lstm_cell_is_hochreiter_1997_in_pytorch_form():
    """Hochreiter & Schmidhuber 1997 (PyTorch's LSTM, gates [i | f | g | o]): c' = σ(f) ⊙ c + σ(i) ⊙ tanh(g),
    h' = σ(o) ⊙ tanh(c')."""
    cell = randomize(nn.LSTMCell(4, 3))
    x, h, c = X(2, 4), X(2, 3, seed=1), X(2, 3, seed=2)
    h2, c2 = cell(Tensor(x), (Tensor(h), Tensor(c)))
    want_h, want_c = ref.lstm(cell, x, h, c)
    np.testing.assert_allclose(out(c2), want_c, **TOL)
    np.testing.assert_allclose(out(h2), want_h, **TOL)


def _dropout_check(y, x, p, scale=True):
    kept = y != 0
    np.testing.assert_allclose(y[kept], x[kept] / (1 - p) if scale else x[kept], **TOL)
    assert abs((~kept).mean() - p) < 0.03, f"dropped {(~kept).mean():.3f}, expected {p}"


@pytest.mark.parametrize("p", [0.2, 0.6])
def test_dropout_is_inverted_dropout(p):
    """Srivastava et al. 2014 as inverted dropout: each entry zeroed with probability p, the rest scaled by
    1/(1 − p), so the expectation is unchanged; the identity at evaluation. ``scale=False`` (the NDR gate
    dropout) keeps the kept entries as they are; ``shared_axes`` draws once along those axes."""
    x = np.abs(X(100, 60)) + 0.1
    d = nn.Dropout(p, rng=RNG(4))
    _dropout_check(out(d(Tensor(x))), x, p)
    with eval_mode():
        np.testing.assert_array_equal(out(d(Tensor(x))), x)
    np.testing.assert_array_equal(out(d.eval()(Tensor(x))), x)
    _dropout_check(out(nn.Dropout(p, rng=RNG(5), scale=False)(Tensor(x))), x, p, scale=False)
    y = out(nn.Dropout(p, rng=RNG(6), scale=False, shared_axes=(-1,))(Tensor(x)))
    assert np.all((y == 0).all(axis=1) | (y == x).all(axis=1)), "a shared draw closes whole rows"


# --- multi-head attention (Vaswani et al. 2017) -------------------------------------------------------------


@pytest.mark.parametrize("causal", [False, True])
def test_multihead_attention_is_vaswani_eqs_1_2(causal):
    """Vaswani et al. 2017 Eq. 1 (softmax(Q Kᵀ/√d_k) V) per head and Eq. 2 (heads concatenated, then W_O),
    with padding keys and (causal) future keys given weight 0."""
    m = randomize(MultiHeadAttention(8, 2))
    x, mask = X(2, 5, 8), np.array([[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]], bool)
    np.testing.assert_allclose(out(m(Tensor(x), key_mask=mask, causal=causal)),
                               ref.mha(m, x, key_mask=mask, causal=causal), **TOL)


def test_multihead_cross_attention_with_biases_and_wide_heads():
    """The Keras layer of the Abstractor code: biases on q, k, v, o and heads d_head wide; keys and values
    from the context."""
    m = randomize(MultiHeadAttention(6, 2, d_head=4, bias=True))
    x, c = X(2, 3, 6), X(2, 5, 6, seed=1)
    mask = np.array([[1, 1, 0, 1, 0], [1, 1, 1, 1, 1]], bool)
    np.testing.assert_allclose(out(m(Tensor(x), context=Tensor(c), key_mask=mask)),
                               ref.mha(m, x, c, key_mask=mask), **TOL)
    np.testing.assert_allclose(out(m(Tensor(x), kv=m.kv(Tensor(c)), key_mask=mask)),
                               ref.mha(m, x, c, key_mask=mask), **TOL)


# --- the encoder–decoder Transformer of the Abstractor code (Vaswani et al. 2017 §3.1, §3.4) -------------

ED = dict(d_model=4, n_head=2, d_head=3, d_ff=5, n_encoder_layers=1, n_decoder_layers=1, dropout=0.0,
          attention_dropout=0.0)


def PE32(positions, layout):
    """The models keep their PE table in float32 (built before ``.double()``): the reference, rounded alike."""
    return ref.sinusoid(positions, 4, layout).astype(np.float32).astype(np.float64)


def test_encoder_layer_is_post_ln():
    """x ← LN(x + MHA(x, x, x)); x ← LN(x + FFN(x)) (Vaswani et al. 2017 §3.1; LayerNorm ε 1e-3 as Keras)."""
    cfg = EncoderDecoderConfig(**ED)
    rng = np.random.default_rng(0)
    layer = randomize(EncoderLayer(cfg, rng, lambda role: keras_attention(cfg, rng)))
    x, mask = X(2, 4, 4), np.array([[1, 1, 1, 0], [1, 1, 1, 1]], bool)
    a = ref.layer_norm(x + ref.mha(layer.attn, x, key_mask=mask), arr(layer.norm.weight), arr(layer.norm.bias),
                       1e-3)
    f = layer.ffn
    want = ref.layer_norm(a + ref.feed_forward(f.ff, a), arr(f.norm.weight), arr(f.norm.bias), 1e-3)
    np.testing.assert_allclose(out(layer(Tensor(x), key_mask=mask)), want, **TOL)


def decoder_layer_reference(layer, y, contexts, mask):
    """Altabaa et al. 2024 Algorithm 2 (the multi-attention decoder; one context: Vaswani's decoder layer):
    y ← LN(y + CausalMHA(y)); for each context C_i in order: y ← LN(y + MHA(Q = y, K = V = C_i)); FFN block."""
    y = ref.layer_norm(y + ref.mha(layer.self_attn, y, causal=True), arr(layer.self_norm.weight),
                       arr(layer.self_norm.bias), 1e-3)
    for i, attn, norm in zip(layer.context_ids, layer.cross, layer.cross_norms):
        y = ref.layer_norm(y + ref.mha(attn, y, contexts[i], key_mask=mask), arr(norm.weight), arr(norm.bias), 1e-3)
    f = layer.ffn
    return ref.layer_norm(y + ref.feed_forward(f.ff, y), arr(f.norm.weight), arr(f.norm.bias), 1e-3)


@pytest.mark.parametrize("context_ids", [(0,), (0, 1), (1,)])
def test_decoder_layer_is_causal_self_then_each_context_then_ffn(context_ids):
    cfg = EncoderDecoderConfig(**ED)
    rng = np.random.default_rng(0)
    layer = randomize(DecoderLayer(cfg, rng, lambda role: keras_attention(cfg, rng), context_ids))
    y, c0, c1 = X(2, 3, 4), X(2, 4, 4, seed=1), X(2, 4, 4, seed=2)
    mask = np.array([[1, 1, 1, 0], [1, 1, 1, 1]], bool)
    want = decoder_layer_reference(layer, y, [c0, c1], mask)
    np.testing.assert_allclose(out(layer(Tensor(y), [Tensor(c0), Tensor(c1)], mask)), want, **TOL)


def test_seq2seq_embedding_is_scaled_by_sqrt_d_plus_concat_pe():
    """Vaswani et al. 2017 §3.4: embeddings multiplied by √d_model, then §3.5's PE added (the Abstractor code's sin | cos
    layout); a decoding step at offset t adds PE[t]."""
    cfg = EncoderDecoderConfig(**ED)
    model = randomize(Seq2SeqTransformer(5, 4, cfg, d_src=3))
    h = X(2, 3, 4)
    np.testing.assert_allclose(out(model.embed(Tensor(h))), h * 2.0 + PE32(range(3), "concat"), **TOL)
    np.testing.assert_allclose(out(model.embed(Tensor(h), offset=2)), h * 2.0 + PE32(range(2, 5), "concat"),
                               **TOL)
    cfg2 = EncoderDecoderConfig(**ED, pe_layout="interleaved")
    model2 = randomize(Seq2SeqTransformer(5, 4, cfg2, d_src=3))
    np.testing.assert_allclose(out(model2.embed(Tensor(h))), h * 2.0 + PE32(range(3), "interleaved"), **TOL)


def test_seq2seq_transformer_forward_and_greedy():
    """Source → Dense → √d·x + PE → encoder layers; target ids → Embedding → √d·y + PE → decoder layers reading
    the encoder output → Dense head (no final LayerNorm). Greedy decoding feeds back each argmax and equals
    teacher forcing on its own outputs."""
    cfg = EncoderDecoderConfig(**ED)
    model = randomize(Seq2SeqTransformer(5, 5, cfg, d_src=3))
    src, tgt = X(2, 4, 3), np.array([[4, 1, 2], [4, 0, 3]])
    mask = np.array([[1, 1, 1, 0], [1, 1, 1, 1]], bool)
    s = ref.linear(model.src_embed, src) * 2.0 + PE32(range(4), "concat")
    for layer in model.encoder:
        s = out(layer(Tensor(s), key_mask=mask))
    y = arr(model.tgt_embed.weight)[tgt] * 2.0 + PE32(range(3), "concat")
    for layer in model.decoder:
        y = decoder_layer_reference(layer, y, [s], mask)
    np.testing.assert_allclose(out(model(Tensor(src), tgt, mask)), ref.linear(model.head, y), **TOL)
    model.eval()
    tokens, logits = model.greedy(Tensor(src), 3, start=4, src_mask=mask)
    fed = np.concatenate([np.full((2, 1), 4), tokens[:, :-1]], axis=1)
    np.testing.assert_allclose(out(logits), out(model(Tensor(src), fed, mask)), rtol=1e-9, atol=1e-10)
    np.testing.assert_array_equal(tokens, out(logits).argmax(-1))
