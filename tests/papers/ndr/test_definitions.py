"""The NDR paper's definitions (Csordás, Irie & Schmidhuber 2022; docs/ndr.md), each pinned by a test that
names its row of docs/ndr.md's table "Definitions and the tests that pin them": geometric attention, the copy
gate, Transformer-XL's relative attention and the post-LN layer of the baselines, the models, their initial
values and dropout sites, and the optimizer each NDR preset builds.

Each equation test builds a module with random (float64) parameters, runs it on small random inputs and
compares the output with the equation written out in plain NumPy (tests/defs_reference.py, loops where
clearer). The golden runs (tests/test_golden.py) stay a regression net; no definition here rests on them.
"""

import numpy as np
import pytest

from minattn import functional as F, nn
from minattn.attention.coda import CoDAttention
from minattn.attention.compositional import CompositionalAttention
from minattn.attention.geometric import GeometricAttention
from minattn.attention.multihead import MultiHeadAttention
from minattn.attention.relative import RelativeMultiHeadAttention
from minattn.backend import RNG
from minattn.engine import Tensor, eval_mode
from minattn.lab.settings import make_config
from minattn.models.encoder import ARCHITECTURES, Classifier, CopyGateLayer, EncoderConfig, PostLNLayer
from tests import defs_reference as ref
from tests.defs_reference import TOL, X, arr, out, randomize


class LinearStub(nn.Module):
    """A stand-in attention tanh(x M): isolates a layer's wiring from its attention's definition."""

    def __init__(self, d, seed=5):
        self.m = nn.Parameter(np.random.default_rng(seed).standard_normal((d, d)) * 0.5)

    def forward(self, x, key_mask=None):
        return F.tanh(x @ self.m)

    @staticmethod
    def ref(stub, x):
        return np.tanh(x @ arr(stub.m))


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
        assert make_config("listops", model, preset).model_config.readout == "sos"
        assert make_config("ctl", model, preset).model_config.readout == "eos"

