"""Every definition pinned by the paper's equation, not by a snapshot (issue 31 item 1): the building blocks,
the NDR paper's layers and attention, Transformer-XL's relative attention and the encoder–decoder frame.

Each test builds a module with random (float64) parameters, runs it on small random inputs and compares the
output with the equation written out in plain NumPy (tests/defs_reference.py, loops where clearer). The
golden runs (tests/test_golden.py) stay a regression net; no definition here rests on them.
"""

import numpy as np
import pytest

import train
from minattn import functional as F, nn
from minattn.attention.coda import CoDAttention
from minattn.attention.compositional import CompositionalAttention
from minattn.attention.geometric import GeometricAttention
from minattn.attention.multihead import MultiHeadAttention
from minattn.attention.relative import RelativeMultiHeadAttention
from minattn.backend import RNG
from minattn.engine import Tensor, eval_mode
from minattn.models.encoder import ARCHITECTURES, Classifier, CopyGateLayer, EncoderConfig, PostLNLayer
from minattn.models.seq2seq import (DecoderLayer, EncoderDecoderConfig, EncoderLayer, Seq2SeqTransformer,
                                    keras_attention)

from . import defs_reference as ref
from .defs_reference import arr

TOL = dict(rtol=1e-9, atol=1e-11)


def randomize(module, seed=1, scale=0.5):
    """float64 and every parameter redrawn N(0, scale²): a definition must hold for any weights, and
    inits such as a zero u/v or a unit LayerNorm gain would hide a missing term."""
    module.double()
    rng = np.random.default_rng(seed)
    for _, p in module.named_parameters():
        p.data = rng.standard_normal(p.shape) * scale
    return module


def X(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape)


def out(t):
    return arr(t)


class LinearStub(nn.Module):
    """A stand-in attention tanh(x M): isolates a layer's wiring from its attention's definition."""

    def __init__(self, d, seed=5):
        self.m = nn.Parameter(np.random.default_rng(seed).standard_normal((d, d)) * 0.5)

    def forward(self, x, key_mask=None):
        return F.tanh(x @ self.m)

    @staticmethod
    def ref(stub, x):
        return np.tanh(x @ arr(stub.m))


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


# --- the NDR paper (Csordás, Irie & Schmidhuber 2022) -----------------------------------------------------


def geometric_reference(m, x, key_mask):
    """NDR §3, Eqs. 7, 9 and 10, head by head, query by query, key by key:
    z_ij = α q_i·k_j + β D_ij + γ with D_ij = s→_i for j > i and s←_i for j < i, (s←, s→) = W_s x_i + b_s;
    A_ij = σ(z_ij) Π_{k ∈ S_ij} (1 − σ(z_ik)), S_ij the keys closer to i than j (at equal distance the right
    one is closer); the diagonal and padding never match; y = Concat_h(A_h V_h) W_o."""
    B, T, C = x.shape
    H, dh = m.n_head, m.d_head
    W = arr(m.w_qkv)
    q = (x @ W[:, :C]) + arr(m.b_q).reshape(-1)
    k, v = x @ W[:, C:2 * C], x @ W[:, 2 * C:]
    s = (x @ arr(m.direction.weight) + arr(m.direction.bias)).reshape(B, T, H, 2)   # (s←, s→) per head
    alpha, beta, gamma = (float(arr(p)[0]) for p in (m.alpha, m.beta, m.gamma))
    heads = np.zeros((B, T, C))
    for b in range(B):
        for h in range(H):
            sl = slice(h * dh, (h + 1) * dh)
            for i in range(T):
                P = np.zeros(T)
                for j in range(T):
                    if j != i and key_mask[b, j]:
                        D = s[b, i, h, 1] if j > i else s[b, i, h, 0]
                        P[j] = ref.sigmoid(alpha * q[b, i, sl] @ k[b, j, sl] + beta * D + gamma)
                closer = lambda a, c: (abs(a - i), a < i) < (abs(c - i), c < i)  # noqa: E731
                A = [P[j] * np.prod([1 - P[kk] for kk in range(T) if closer(kk, j)]) for j in range(T)]
                heads[b, i, sl] = np.array(A) @ v[b, :, sl]
    return heads @ arr(m.w_o)


def test_geometric_attention_is_ndr_eqs_7_9_10():
    m = randomize(GeometricAttention(8, 2))
    x, mask = X(2, 5, 8), np.array([[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]], bool)
    np.testing.assert_allclose(out(m(Tensor(x), key_mask=mask)), geometric_reference(m, x, mask), **TOL)


def test_geometric_attention_normalized_divides_by_the_row_sum():
    """The "+ geom. att." baseline (NDR paper §4): A_ij / Σ_j A_ij."""
    m = randomize(GeometricAttention(4, 1, normalize=True))
    x, mask = X(1, 4, 4), np.ones((1, 4), bool)
    plain = GeometricAttention(4, 1)
    plain.double().load_state_dict(m.state_dict())
    plain.double()
    _, A = plain(Tensor(x), key_mask=mask, return_weights=True)
    _, An = m(Tensor(x), key_mask=mask, return_weights=True)
    A = out(A)
    np.testing.assert_allclose(out(An), A / A.sum(-1, keepdims=True), **TOL)


def relative_reference(m, x, key_mask, abs_gate=False):
    """Transformer-XL §3.3, terms (a)-(d), with the NDR paper's gated variant (its Appendix A, term (e)):
    logit_ij = α [(q_i + u)·k_j + (q_i + v)·r_{j−i}],  r_m = W_R PE(m) at the signed offset m = j − i;
    gated: (q_i + v)·[g_i r_{j−i} + (1 − g_i) r_j] with g_i = σ(W_abs x_i + b) per head; softmax over
    the real keys; y = Concat_h(A_h V_h) W_o."""
    B, T, C = x.shape
    H, dh = m.n_head, m.d_head
    q = x @ arr(m.w_q)
    k, v = (x @ arr(m.w_kv))[..., :C], (x @ arr(m.w_kv))[..., C:]
    pe = {o: ref.sinusoid([o], C)[0] @ arr(m.w_r) for o in range(-(T - 1), T)}
    u, vv, alpha = arr(m.u).reshape(H, dh), arr(m.v).reshape(H, dh), float(arr(m.alpha)[0])
    g = ref.sigmoid(ref.linear(m.abs_gate, x)) if abs_gate else None                   # (B, T, H)
    heads = np.zeros((B, T, C))
    for b in range(B):
        for h in range(H):
            sl = slice(h * dh, (h + 1) * dh)
            for i in range(T):
                logits = np.zeros(T)
                for j in range(T):
                    content = (q[b, i, sl] + u[h]) @ k[b, j, sl]                          # (a) + (c)
                    rel = pe[j - i][sl]
                    if abs_gate:
                        rel = g[b, i, h] * rel + (1 - g[b, i, h]) * pe[j][sl]              # (e)
                    logits[j] = alpha * (content + (q[b, i, sl] + vv[h]) @ rel)           # (b) + (d)
                heads[b, i, sl] = ref.masked_softmax_row(logits, key_mask[b]) @ v[b, :, sl]
    return ref.linear(m.out, heads)


@pytest.mark.parametrize("abs_gate", [False, True])
def test_relative_attention_is_transformer_xl_four_terms(abs_gate):
    m = randomize(RelativeMultiHeadAttention(8, 2, abs_gate=abs_gate))
    x, mask = X(2, 5, 8), np.array([[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]], bool)
    np.testing.assert_allclose(out(m(Tensor(x), key_mask=mask)), relative_reference(m, x, mask, abs_gate), **TOL)


TINY = dict(d_model=4, n_head=1, d_ff=6, n_steps=2, dropout=0.0, attention_dropout=0.0, gate_dropout=0.0)


def test_post_ln_layer_is_add_then_norm():
    """Vaswani et al. 2017 §3.1 / NDR §4.1: x ← LN(x + Attn(x)); x ← LN(x + FFN(x)) (post-LN)."""
    cfg = EncoderConfig(**TINY)
    layer = randomize(PostLNLayer(LinearStub(4), cfg, np.random.default_rng(0)))
    x = X(2, 3, 4)
    a = ref.layer_norm(x + LinearStub.ref(layer.attn, x), arr(layer.norm1.weight), arr(layer.norm1.bias), 1e-5)
    want = ref.layer_norm(a + ref.feed_forward(layer.ff, a), arr(layer.norm2.weight), arr(layer.norm2.bias), 1e-5)
    np.testing.assert_allclose(out(layer(Tensor(x))), want, **TOL)


@pytest.mark.parametrize("tanh_out", [False, True])
def test_copy_gate_layer_is_ndr_eqs_5_6(tanh_out):
    """NDR §3 Eqs. 5-6 (the copy gate): a = LN(h + Attn(h)); u = LN(FFN_data(a)) (NDR) or tanh(FFN_data(a))
    (the "+ gate" baselines); g = σ(FFN_gate(a)); h' = g ⊙ u + (1 − g) ⊙ h, with the pre-attention h."""
    cfg = EncoderConfig(**TINY)
    layer = randomize(CopyGateLayer(LinearStub(4), cfg, np.random.default_rng(0), tanh_out=tanh_out))
    h = X(2, 3, 4)
    a = ref.layer_norm(h + LinearStub.ref(layer.attn, h), arr(layer.norm_merge.weight), arr(layer.norm_merge.bias),
                       1e-5)
    f = ref.feed_forward(layer.ff, a)
    u = np.tanh(f) if tanh_out else ref.layer_norm(f, arr(layer.norm_out.weight), arr(layer.norm_out.bias), 1e-5)
    g = ref.sigmoid(ref.feed_forward(layer.gate, a))
    np.testing.assert_allclose(out(layer(Tensor(h))), g * u + (1 - g) * h, **TOL)


def test_gate_dropout_closes_the_gate_of_whole_columns():
    """The NDR code's gate dropout: with probability p a column's gate is 0 for a step, so h' = h there; the
    other columns keep their gate as it is (a gate that closes, not a rescaled activation: no 1/(1 − p))."""
    cfg = EncoderConfig(**{**TINY, "gate_dropout": 0.5})
    layer = randomize(CopyGateLayer(LinearStub(4), cfg, np.random.default_rng(0)))
    layer.set_rng(RNG(0))
    h = X(2, 16, 4)
    y = out(layer(Tensor(h)))
    with eval_mode():
        y0 = out(layer(Tensor(h)))
    copied, kept = np.all(y == h, axis=-1), np.all(np.isclose(y, y0, rtol=1e-12, atol=0), axis=-1)
    assert 0.2 < copied.mean() < 0.8 and np.all(copied != kept)


# The NDR paper's models (its Table 1 and §4; compositional attention and CoDA as drop-ins for the Transformer's
# softmax attention): layer kind, attention, abs gate, input PE.
MODELS = {
    "transformer": (PostLNLayer, MultiHeadAttention, None, True),
    "transformer-rel": (PostLNLayer, RelativeMultiHeadAttention, False, False),
    "transformer-rel-gate": ("tanh", RelativeMultiHeadAttention, False, False),
    "transformer-absrel-gate": ("tanh", RelativeMultiHeadAttention, True, False),
    "transformer-geom": (PostLNLayer, GeometricAttention, True, False),        # normalised geometric attention
    "ndr": ("ln", GeometricAttention, False, False),
    "transformer-compositional": (PostLNLayer, CompositionalAttention, None, True),
    "transformer-coda": (PostLNLayer, CoDAttention, None, True),
}


def test_every_architecture_is_pinned():
    """A model added to the registry (models/encoder.py ARCHITECTURES) must get its row in MODELS above."""
    assert sorted(MODELS) == sorted(ARCHITECTURES)


@pytest.mark.parametrize("name", list(MODELS))
def test_each_model_has_its_layer_attention_and_positions(name):
    layer_kind, attention, flag, pe = MODELS[name]
    enc = Classifier(name, 5, 3, EncoderConfig(**TINY)).encoder
    if layer_kind in ("tanh", "ln"):
        assert type(enc.layer) is CopyGateLayer and enc.layer.tanh_out == (layer_kind == "tanh")
    else:
        assert type(enc.layer) is layer_kind
    assert type(enc.layer.attn) is attention
    if attention is RelativeMultiHeadAttention:
        assert (enc.layer.attn.abs_gate is not None) == flag
    if attention is GeometricAttention:
        assert enc.layer.attn.normalize == flag
    assert enc.input_pe == pe


@pytest.mark.parametrize("name,readout", [(n, "eos" if i % 2 else "sos") for i, n in enumerate(MODELS)])
def test_classifier_is_embedding_pe_shared_layer_and_one_column(name, readout):
    """NDR paper §2 and Vaswani et al. 2017 §3.4-3.5: h⁰ = Embed(x) (+ PE for the plain Transformer, no √d); the ONE shared
    layer applied n_steps times (a Universal Transformer); logits = W h^n at the EOS (length − 1) or SOS (0)
    column."""
    cfg = EncoderConfig(**{**TINY, "readout": readout, "n_steps": 3})
    model = randomize(Classifier(name, 5, 3, cfg)).eval()   # the input dropout of the plain Transformer off
    ids, lengths = np.array([[6, 1, 2, 5, 0], [6, 3, 4, 0, 5]]), np.array([4, 5])
    mask = np.arange(5)[None, :] < lengths[:, None]
    h = arr(model.encoder.embedding.weight)[ids]
    if MODELS[name][3]:
        h = h + ref.sinusoid(range(5), 4).astype(np.float32).astype(np.float64)   # the model's float32 table
    h = Tensor(h)
    for _ in range(3):
        h = model.encoder.layer(h, key_mask=mask)
    column = lengths - 1 if readout == "eos" else np.zeros(2, int)
    want = ref.linear(model.head, out(h)[np.arange(2), column])
    np.testing.assert_allclose(out(model(ids, lengths)), want, **TOL)


def test_n_steps_eval_applies_at_evaluation_only():
    cfg = EncoderConfig(**{**TINY, "n_steps": 1, "n_steps_eval": 3})
    model = randomize(Classifier("ndr", 5, 3, cfg))
    ids, lengths = np.array([[6, 1, 2, 5]]), np.array([4])
    three = Classifier("ndr", 5, 3, EncoderConfig(**{**TINY, "n_steps": 3})).double()
    three.load_state_dict(model.state_dict())
    three.double()
    np.testing.assert_allclose(out(model.eval()(ids, lengths)), out(three(ids, lengths)), **TOL)
    assert not np.allclose(out(model.train()(ids, lengths)), out(three(ids, lengths)))


@pytest.mark.parametrize("model", ["transformer", "transformer-rel", "transformer-absrel-gate", "ndr",
                                   "transformer-geom", "transformer-compositional"])
def test_listops_reads_the_sos_column_and_ctl_the_eos_column(model):
    """docs/ndr.md §1 / the official code: ListOps classifies from the SOS column (every model, every preset); CTL
    from EOS."""
    for preset in ("cpu", "paper"):
        assert train.make_config("listops", model, preset).model_config.readout == "sos"
        assert train.make_config("ctl", model, preset).model_config.readout == "eos"


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
