"""The NDR paper's definitions (Csordás, Irie & Schmidhuber 2022; docs/ndr.md), each pinned by a test that
names its row of docs/ndr.md's table "Definitions and the tests that pin them": geometric attention, the copy
gate, Transformer-XL's relative attention and the post-LN layer of the baselines, the models, their initial
values and dropout sites, and the optimizer each NDR preset builds.

Each equation test builds a module with random (float64) parameters, runs it on small random inputs and
compares the output with the equation written out in plain NumPy (tests/defs_reference.py, loops where
clearer). The golden runs (tests/lab/test_golden_runs.py) stay a regression net; no definition here rests on them.
"""

import numpy as np
import pytest

from minattn import functional as F, nn, optim
from minattn.attention.coda import CoDAttention
from minattn.attention.compositional import CompositionalAttention
from minattn.attention.geometric import GeometricAttention
from minattn.attention.multihead import MultiHeadAttention
from minattn.attention.relative import RelativeMultiHeadAttention
from minattn.backend import RNG
from minattn.engine import Tensor, eval_mode
from minattn.lab.recipes import NDR
from minattn.lab.recipes.base import optimizer, schedule
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


def heads_last(mask):
    """A per-head mask (B, H, T, d_h) laid out as the (B, T, H·d_h) projections of the references."""
    B, H, T, dh = mask.shape
    return mask.transpose(0, 2, 1, 3).reshape(B, T, H * dh)


def geometric_reference(m, x, key_mask, key_drop=None):
    """NDR §3, Eqs. 7, 9 and 10, head by head, query by query, key by key:
    z_ij = α q_i·k̃_j + β D_ij + γ with D_ij = s→_i for j > i and s←_i for j < i, (s←, s→) = W_s x_i + b_s;
    A_ij = σ(z_ij) Π_{k ∈ S_ij} (1 − σ(z_ik)), S_ij the keys closer to i than j (at equal distance the right
    one is closer); the diagonal and padding never match; y = Concat_h(A_h V_h) W_o. k̃ = k ⊙ ``key_drop``
    (B, H, T, d_h), the attention dropout's mask on the keys (docs/ndr.md §3.7), or k."""
    B, T, C = x.shape
    H, dh = m.n_head, m.d_head
    W = arr(m.w_qkv)
    q = (x @ W[:, :C]) + arr(m.b_q).reshape(-1)
    k, v = x @ W[:, C:2 * C], x @ W[:, 2 * C:]
    if key_drop is not None:
        k = k * heads_last(key_drop)
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
    """docs/ndr.md Eqs. 7, 9, 10: geometric attention, key by key."""
    m = randomize(GeometricAttention(8, 2))
    x, mask = X(2, 5, 8), np.array([[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]], bool)
    np.testing.assert_allclose(out(m(Tensor(x), key_mask=mask)), geometric_reference(m, x, mask), **TOL)


def test_geometric_attention_normalized_divides_by_the_row_sum():
    """docs/ndr.md §3.6 normalisation:
    The "+ geom. att." baseline (NDR paper §4): A_ij / Σ_j A_ij."""
    m = randomize(GeometricAttention(4, 1, normalize=True))
    x, mask = X(1, 4, 4), np.ones((1, 4), bool)
    plain = GeometricAttention(4, 1)
    plain.double().load_state_dict(m.state_dict())
    plain.double()
    _, A = plain(Tensor(x), key_mask=mask, return_weights=True)
    _, An = m(Tensor(x), key_mask=mask, return_weights=True)
    A = out(A)
    np.testing.assert_allclose(out(An), A / A.sum(-1, keepdims=True), **TOL)


def relative_reference(m, x, key_mask, abs_gate=False, key_drop=None, pos_drop=None):
    """Transformer-XL §3.3, terms (a)-(d), with the NDR paper's gated variant (its Appendix A, term (e)):
    logit_ij = α [(q_i + u)·k_j + (q_i + v)·r_{j−i}],  r_m = W_R PE(m) at the signed offset m = j − i;
    gated: (q_i + v)·[g_i r_{j−i} + (1 − g_i) r_j] with g_i = σ(W_abs x_i + b) per head; softmax over
    the real keys; y = Concat_h(A_h V_h) W_o. ``key_drop`` (B, H, T, d_h) and ``pos_drop`` (H, 2T − 1, d_h,
    offsets −(T−1)..T−1): the attention dropout's masks on k and on r (docs/ndr.md §4.2), giving k̃ and r̃."""
    B, T, C = x.shape
    H, dh = m.n_head, m.d_head
    q = x @ arr(m.w_q)
    k, v = (x @ arr(m.w_kv))[..., :C], (x @ arr(m.w_kv))[..., C:]
    if key_drop is not None:
        k = k * heads_last(key_drop)
    pe = {o: ref.sinusoid([o], C)[0] @ arr(m.w_r) for o in range(-(T - 1), T)}
    if pos_drop is not None:
        pe = {o: r * heads_last(pos_drop[None, :, o + T - 1:o + T])[0, 0] for o, r in pe.items()}
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
    """docs/ndr.md §4.2-4.3 relative attention: Transformer-XL's terms (a)-(d), and (e) with the abs gate."""
    m = randomize(RelativeMultiHeadAttention(8, 2, abs_gate=abs_gate))
    x, mask = X(2, 5, 8), np.array([[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]], bool)
    np.testing.assert_allclose(out(m(Tensor(x), key_mask=mask)), relative_reference(m, x, mask, abs_gate), **TOL)


TINY = dict(d_model=4, n_head=1, d_ff=6, n_steps=2, dropout=0.0, attention_dropout=0.0, gate_dropout=0.0)


def test_post_ln_layer_is_add_then_norm():
    """docs/ndr.md §4.1 post-LN layer:
    Vaswani et al. 2017 §3.1 / NDR §4.1: x ← LN(x + Attn(x)); x ← LN(x + FFN(x)) (post-LN)."""
    cfg = EncoderConfig(**TINY)
    layer = randomize(PostLNLayer(LinearStub(4), cfg, np.random.default_rng(0)))
    x = X(2, 3, 4)
    a = ref.layer_norm(x + LinearStub.ref(layer.attn, x), arr(layer.norm1.weight), arr(layer.norm1.bias), 1e-5)
    want = ref.layer_norm(a + ref.feed_forward(layer.ff, a), arr(layer.norm2.weight), arr(layer.norm2.bias), 1e-5)
    np.testing.assert_allclose(out(layer(Tensor(x))), want, **TOL)


@pytest.mark.parametrize("tanh_out", [False, True])
def test_copy_gate_layer_is_ndr_eqs_5_6(tanh_out):
    """docs/ndr.md Eqs. 5-6:
    NDR §3 Eqs. 5-6 (the copy gate): a = LN(h + Attn(h)); u = LN(FFN_data(a)) (NDR) or tanh(FFN_data(a))
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
    """docs/ndr.md Gate dropout: a column's whole gate closed, unscaled.
    The NDR code's gate dropout: with probability p a column's gate is 0 for a step, so h' = h there; the
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
    """docs/ndr.md Models:
    A model added to the registry (models/encoder.py ARCHITECTURES) must get its row in MODELS above."""
    assert sorted(MODELS) == sorted(ARCHITECTURES)


@pytest.mark.parametrize("name", list(MODELS))
def test_each_model_has_its_layer_attention_and_positions(name):
    """docs/ndr.md Model parts: each model's layer, attention, abs gate and input PE."""
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
    """docs/ndr.md §1 classifier:
    NDR paper §2 and Vaswani et al. 2017 §3.4-3.5: h⁰ = Embed(x) (+ PE for the plain Transformer, no √d); the
    ONE shared layer applied n_steps times (a Universal Transformer); logits = W h^n at the EOS (length − 1)
    or SOS (0) column."""
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
    """docs/ndr.md ListOps 24 steps: n_steps_eval applies at evaluation only."""
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
    """docs/ndr.md §1 readout:
    docs/ndr.md §1 / the official code: ListOps classifies from the SOS column (every model, every preset);
    CTL from EOS."""
    for preset in ("cpu", "paper"):
        assert make_config("listops", model, preset).model_config.readout == "sos"
        assert make_config("ctl", model, preset).model_config.readout == "eos"



# --- initial values (docs/ndr.md §3.2, §2; the official code) --------------------------------------------


@pytest.mark.parametrize("d_model,n_head", [(8, 2), (16, 4), (32, 1)])
def test_geometric_attention_starts_at_alpha_one_over_sqrt_d_head(d_model, n_head):
    """docs/ndr.md α, β, γ, b_q init: α = 1/√d_head, β = 1, γ = 0 (one scalar each, shared by the heads),
    b_q = 0 — in the module and in the model every NDR preset builds."""
    m = GeometricAttention(d_model, n_head)
    got = np.concatenate([arr(p) for p in (m.alpha, m.beta, m.gamma)])
    np.testing.assert_allclose(got, [1 / np.sqrt(d_model // n_head), 1.0, 0.0], rtol=1e-7, atol=0)   # float32
    assert not arr(m.b_q).any()
    for task in ("ctl", "listops"):
        for preset in ("paper", "cpu"):
            cfg = make_config(task, "ndr", preset).model_config
            attn = Classifier("ndr", 5, 3, cfg).encoder.layer.attn
            assert np.isclose(arr(attn.alpha)[0], 1 / np.sqrt(cfg.d_model / cfg.n_head), rtol=1e-7, atol=0)


@pytest.mark.parametrize("model", ["ndr", "transformer-rel-gate", "transformer-absrel-gate"])
def test_copy_gate_starts_close_to_copy(model):
    """docs/ndr.md Gate bias init: the gate's output bias c2 = −3 (NDR and the gated baselines), so
    σ(−3) ≈ 0.047 and each layer starts close to copying its input."""
    layer = Classifier(model, 5, 3, EncoderConfig(**{**TINY, "d_model": 16, "d_ff": 32})).encoder.layer
    assert np.all(arr(layer.gate.fc2.bias) == -3.0)


def test_relative_attention_starts_at_alpha_one_over_sqrt_d_head_and_zero_u_v():
    """docs/ndr.md + rel init: α = 1/√d_head (learned), the content and position biases u = v = 0."""
    m = RelativeMultiHeadAttention(16, 4)
    assert arr(m.alpha).tolist() == [0.5] and not arr(m.u).any() and not arr(m.v).any()
    assert np.isclose(arr(RelativeMultiHeadAttention(24, 2).alpha)[0], 1 / np.sqrt(12), rtol=1e-7, atol=0)


# --- where each attention applies dropout (docs/ndr.md §3.7, §4.1, §4.2; the official code) ---------------


def test_geometric_attention_drops_out_the_keys():
    """docs/ndr.md §3.7 attention dropout: one inverted-dropout mask on the keys k before q·k (the code's
    site; not on A, q or v), so z_ij = α q_i·k̃_j + β D_ij + γ; none at evaluation."""
    m = randomize(GeometricAttention(8, 2, attention_dropout=0.4))
    m.set_rng(RNG(3))
    x, mask = X(2, 5, 8), np.array([[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]], bool)
    with ref.recorded_masks(nn.Dropout) as masks:
        y = out(m(Tensor(x), key_mask=mask))
    assert [d.shape for d in masks] == [(2, 2, 5, 4)], "one mask, on the keys (B, H, T, d_h)"
    np.testing.assert_allclose(y, geometric_reference(m, x, mask, key_drop=masks[0]), **TOL)
    with eval_mode():
        np.testing.assert_allclose(out(m(Tensor(x), key_mask=mask)), geometric_reference(m, x, mask), **TOL)


@pytest.mark.parametrize("abs_gate", [False, True])
def test_relative_attention_drops_out_keys_and_positions(abs_gate):
    """docs/ndr.md §4.2 attention dropout: one mask on the keys k and one on the projected positions r
    (giving k̃ and r̃; the absolute r^abs_j of the gated form are r̃'s rows at offsets 0..T−1), none on the
    weights or values."""
    m = randomize(RelativeMultiHeadAttention(8, 2, attention_dropout=0.4, abs_gate=abs_gate))
    m.set_rng(RNG(3))
    x, mask = X(2, 5, 8), np.array([[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]], bool)
    with ref.recorded_masks(nn.Dropout) as masks:
        y = out(m(Tensor(x), key_mask=mask))
    assert [d.shape for d in masks] == [(2, 2, 5, 4), (2, 9, 4)], "a mask on k (B, H, T, d_h), one on r"
    want = relative_reference(m, x, mask, abs_gate, key_drop=masks[0], pos_drop=masks[1])
    np.testing.assert_allclose(y, want, **TOL)


def test_plain_transformer_applies_no_attention_dropout():
    """docs/ndr.md §4.1 no attention dropout: the code's plain softmax MHA applies none even where the run
    sets ``attention_dropout``; its layer drops out the attention output and the FF hidden layer only."""
    cfg = EncoderConfig(**{**TINY, "attention_dropout": 0.5})
    attn = randomize(Classifier("transformer", 5, 3, cfg)).encoder.layer.attn
    attn.set_rng(RNG(3))
    x = X(2, 5, 4)
    with ref.recorded_masks(nn.Dropout) as masks:
        y = out(attn(Tensor(x)))
    assert masks == []
    np.testing.assert_allclose(y, ref.mha(attn, x), **TOL)


# --- what a run builds: the optimizer and clipping (docs/ndr.md §6, Tables 4-6) -------------------------


@pytest.mark.parametrize("task", NDR.tasks)
@pytest.mark.parametrize("model", list(NDR.models))
def test_each_preset_builds_adamw_from_the_runs_settings(task, model):
    """docs/ndr.md Optimizer: AdamW, β (0.9, 0.999), ε 1e-8, decoupled weight decay p ← p − lr·wd·p on every
    parameter, a constant rate (no warm-up, no decay), at the run's own lr and weight decay, for both
    presets and for values given on the command line."""
    params = [nn.Parameter(np.full(3, 2.0)), nn.Parameter(np.full((2, 2), -1.0))]
    for preset in ("paper", "cpu"):
        for given in ({}, dict(lr=2.5e-3, weight_decay=0.0375)):
            cfg = schedule(make_config(task, model, preset, **given))
            assert all(getattr(cfg, key) == value for key, value in given.items())
            ref.check_optimizer(optimizer(cfg, params), cfg, optim.AdamW, (0.9, 0.999), 1e-8,
                                lambda t: cfg.lr, steps=(1, 2, 1000))


# The paper's rows (its Tables 4-6, the official sweeps; docs/ndr.md §6): lr, weight decay, clipping norm.
PAPER_TRAINING = {
    ("ctl", "transformer"): (1.5e-4, 0.0025, 5.0), ("ctl", "transformer-rel"): (1.5e-4, 0.0025, 5.0),
    ("ctl", "transformer-rel-gate"): (2e-4, 0.01, 5.0), ("ctl", "transformer-absrel-gate"): (2e-4, 0.01, 5.0),
    ("ctl", "transformer-geom"): (1.5e-4, 0.0025, 5.0), ("ctl", "ndr"): (1.5e-4, 0.01, 5.0),
    ("arith", "transformer"): (1.5e-4, 0.0025, 1.0), ("arith", "transformer-rel"): (1.5e-4, 0.0025, 1.0),
    ("arith", "transformer-absrel-gate"): (1.5e-4, 0.01, 1.0), ("arith", "ndr"): (1.5e-4, 0.01, 1.0),
    ("listops", "transformer"): (4e-4, 0.05, 1.0), ("listops", "transformer-rel"): (4e-4, 0.05, 1.0),
    ("listops", "transformer-absrel-gate"): (2e-4, 0.09, 1.0), ("listops", "ndr"): (2e-4, 0.09, 1.0),
}


@pytest.mark.parametrize("task,model", list(PAPER_TRAINING))
def test_paper_presets_train_at_the_papers_rate_decay_and_clipping(task, model):
    """docs/ndr.md Tables 4-6 lr, wd, clipping: the paper preset's learning rate, weight decay and global
    gradient-norm clip are the paper's (clip 5 on CTL, 1 on arithmetic and ListOps; ctl-backward as ctl);
    the cpu preset keeps the decay and the clip (it shrinks the model, batch and steps, and may raise lr);
    and clipping at the run's ``grad_clip`` scales the gradients to that global L2 norm."""
    lr, wd, clip = PAPER_TRAINING[task, model]
    for t in (task, "ctl-backward") if task == "ctl" else (task,):
        paper, cpu = make_config(t, model, "paper"), make_config(t, model, "cpu")
        assert (paper.lr, paper.weight_decay, paper.grad_clip) == (lr, wd, clip)
        assert (cpu.weight_decay, cpu.grad_clip) == (wd, clip)
    params = [nn.Parameter(np.ones(3)), nn.Parameter(np.ones(4))]
    for p, g in zip(params, (X(3), X(4, seed=1))):
        p.grad = g * 10
    total = float(out(optim.clip_grad_norm(params, paper.grad_clip)))
    assert total > clip
    np.testing.assert_allclose(np.sqrt(sum((out(p.grad) ** 2).sum() for p in params)), clip, rtol=1e-5)


def spans(w, bound):
    """The entries of ``w`` lie in ±bound and reach near it: a U(±bound) draw (for a few hundred entries)."""
    w = np.abs(arr(w))
    return w.max() <= bound * (1 + 1e-6) and w.max() > 0.9 * bound


def test_ndr_layers_start_at_the_codes_bounds():
    """docs/ndr.md §5 init: geometric attention's W_q, W_k, W_v, W_o ~ U(±√(6/(d + d_head))); W_s, b_s
    PyTorch's Linear default U(±1/√d); NDR's FF Xavier-uniform with gains √2 (W1) and 5/3 (W2), the gate's
    with √2 (G1) and 1 (G2); the "+ gate" baselines' W2 the default; the post-LN FF gains √2 and 1;
    relative attention Xavier-uniform (W_q, W_R over (d, d), the fused [W_k | W_v] over (d, 2d));
    LayerNorm gain 1, bias 0."""
    d, H, d_ff = 64, 4, 128
    cfg = EncoderConfig(**{**TINY, "d_model": d, "n_head": H, "d_ff": d_ff})
    ndr = Classifier("ndr", 5, 3, cfg).encoder.layer
    attn = ndr.attn
    assert spans(attn.w_qkv, np.sqrt(6 / (d + d // H))) and spans(attn.w_o, np.sqrt(6 / (d + d // H)))
    assert spans(attn.direction.weight, 1 / np.sqrt(d))
    assert np.abs(arr(attn.direction.bias)).max() <= 1 / np.sqrt(d)
    xavier = lambda fan_in, fan_out, gain=1.0: gain * np.sqrt(6 / (fan_in + fan_out))  # noqa: E731
    assert spans(ndr.ff.fc1.weight, xavier(d, d_ff, np.sqrt(2)))
    assert spans(ndr.ff.fc2.weight, xavier(d_ff, d, 5 / 3))
    assert spans(ndr.gate.fc1.weight, xavier(d, d, np.sqrt(2))) and spans(ndr.gate.fc2.weight, xavier(d, d))
    for norm in (ndr.norm_merge, ndr.norm_out):
        assert np.all(arr(norm.weight) == 1) and not arr(norm.bias).any()
    gated = Classifier("transformer-rel-gate", 5, 3, cfg).encoder.layer
    assert spans(gated.ff.fc1.weight, xavier(d, d_ff, np.sqrt(2)))
    assert spans(gated.ff.fc2.weight, 1 / np.sqrt(d_ff))
    rel = Classifier("transformer-rel", 5, 3, cfg).encoder.layer
    assert spans(rel.ff.fc1.weight, xavier(d, d_ff, np.sqrt(2))) and spans(rel.ff.fc2.weight, xavier(d_ff, d))
    assert spans(rel.attn.w_q, xavier(d, d)) and spans(rel.attn.w_r, xavier(d, d))
    assert spans(rel.attn.w_kv, xavier(d, 2 * d))


# The paper preset's embedding init (docs/ndr.md §5, recipes/ndr.py): N(0, 1), Kaiming-normal N(0, 2/d) or
# Xavier-uniform.
EMBEDDING_INIT = {
    ("ctl", "ndr"): "normal", ("ctl", "transformer-rel-gate"): "normal", ("ctl", "transformer"): "normal",
    ("ctl", "transformer-rel"): "kaiming", ("ctl", "transformer-geom"): "kaiming",
    ("arith", "transformer"): "normal", ("arith", "transformer-rel"): "kaiming",
    ("arith", "transformer-absrel-gate"): "normal", ("listops", "transformer"): "normal",
    ("listops", "transformer-rel"): "xavier", ("listops", "ndr"): "normal",
}


@pytest.mark.parametrize("task,model", list(EMBEDDING_INIT))
def test_embeddings_start_as_the_code_draws_them(task, model):
    """docs/ndr.md §5 embedding init: N(0, 1) for NDR, the gated models and the plain "Transformer" (the
    code builds that variant without the sweep's init); Kaiming-normal, std √(2/d), for "+ rel" on CTL and
    arithmetic and for "+ geom. att."; Xavier-uniform for ListOps "+ rel". No √d scaling at the input."""
    cfg = make_config(task, model, "paper").model_config
    V, d = 200, cfg.d_model
    w = arr(Classifier(model, V - 2, 3, cfg).encoder.embedding.weight)
    kind = EMBEDDING_INIT[task, model]
    assert cfg.embedding_init == kind
    std = {"normal": 1.0, "kaiming": np.sqrt(2 / d), "xavier": np.sqrt(6 / (V + d)) / np.sqrt(3)}[kind]
    assert abs(w.std() / std - 1) < 0.03 and abs(w.mean()) < 0.03 * std
    if kind == "xavier":
        assert spans(w, np.sqrt(6 / (V + d)))


def test_plain_transformer_drops_out_its_input_at_0_1():
    """docs/ndr.md §4.1 input dropout: the plain "Transformer" adds PE to the embedding and applies a fixed
    dropout of 0.1 to the sum, h⁰ = Drop_0.1(E[x] + PE), whatever the run's ``dropout``; the models without
    input PE apply none."""
    model = randomize(Classifier("transformer", 5, 3, EncoderConfig(**{**TINY, "n_steps": 1})))
    model.set_rng(RNG(3))
    ids, lengths = np.array([[6, 1, 2, 5, 0], [6, 3, 4, 0, 5]]), np.array([4, 5])
    with ref.recorded_masks(nn.Dropout) as masks:
        y = out(model(ids, lengths))
    assert [d.shape for d in masks] == [(2, 5, 4)] and set(np.unique(masks[0])) <= {0.0, 1 / 0.9}
    h = (arr(model.encoder.embedding.weight)[ids] + ref.sinusoid(range(5), 4).astype(np.float32)) * masks[0]
    mask = np.arange(5)[None, :] < lengths[:, None]
    h = out(model.encoder.layer(Tensor(h), key_mask=mask))
    np.testing.assert_allclose(y, ref.linear(model.head, h[np.arange(2), lengths - 1]), **TOL)
    ndr = Classifier("ndr", 5, 3, EncoderConfig(**{**TINY, "dropout": 0.3})).encoder
    assert ndr.input_dropout.p == 0.0


def hidden_masks(masks, rows, widths):
    """The masks of hidden layers of ``widths`` columns side by side, drawn as one mask over all the columns
    or as one mask each (a fused form draws one), as (rows, width) arrays in that order."""
    if len(masks) == 1:
        joint = masks[0].reshape(rows, sum(widths))
        return np.split(joint, np.cumsum(widths)[:-1], axis=1)
    assert [m.size for m in masks] == [rows * w for w in widths]
    return [m.reshape(rows, w) for m, w in zip(masks, widths)]


@pytest.mark.parametrize("tanh_out", [False, True])
def test_copy_gate_layer_drops_out_where_the_code_does(tanh_out):
    """docs/ndr.md §2 dropout sites: a = LN(h + Drop(Attn(h))); u = LN(W2 Drop(ReLU(W1 a + b1)) + b2) (tanh
    for "+ gate"); g = σ(G2 Drop(ReLU(G1 a + c1)) + c2), then the gate dropout closes whole columns
    (g ← 0, no rescaling); h' = g ⊙ u + (1 − g) ⊙ h. Nowhere else: not on u, g's logits or h'."""
    cfg = EncoderConfig(**{**TINY, "dropout": 0.4, "gate_dropout": 0.3})
    layer = randomize(CopyGateLayer(LinearStub(4), cfg, np.random.default_rng(0), tanh_out=tanh_out))
    layer.set_rng(RNG(3))
    h = X(2, 6, 4)
    with ref.recorded_masks(nn.Dropout) as masks:
        y = out(layer(Tensor(h)))
    att, *hidden, gate = masks
    assert att.size == 2 * 6 * 4 and gate.size == 2 * 6, [m.shape for m in masks]
    m_ff, m_gate = hidden_masks(hidden, 12, (6, 4))
    a = ref.layer_norm(h + LinearStub.ref(layer.attn, h) * att.reshape(h.shape), arr(layer.norm_merge.weight),
                       arr(layer.norm_merge.bias), 1e-5).reshape(12, 4)
    f = ref.linear(layer.ff.fc2, ref.relu(ref.linear(layer.ff.fc1, a)) * m_ff)
    u = np.tanh(f) if tanh_out else ref.layer_norm(f, arr(layer.norm_out.weight), arr(layer.norm_out.bias), 1e-5)
    g = ref.sigmoid(ref.linear(layer.gate.fc2, ref.relu(ref.linear(layer.gate.fc1, a)) * m_gate))
    g = g * gate.reshape(12, 1)
    assert set(np.unique(gate)) <= {0.0, 1.0}, "the gate dropout closes the gate, unscaled"
    np.testing.assert_allclose(y, (g * u + (1 - g) * h.reshape(12, 4)).reshape(h.shape), **TOL)


def test_post_ln_layer_drops_out_the_attention_and_ff_outputs_and_the_ff_hidden_layer():
    """docs/ndr.md §4.1 dropout sites: x ← LN1(x + Drop(Attn(x))), then x ← LN2(x + Drop(W2 Drop(ReLU(W1 x +
    b1)) + b2)), each an inverted dropout at the run's ``dropout``."""
    layer = randomize(PostLNLayer(LinearStub(4), EncoderConfig(**{**TINY, "dropout": 0.4}),
                                  np.random.default_rng(0)))
    layer.set_rng(RNG(3))
    x = X(2, 6, 4)
    with ref.recorded_masks(nn.Dropout) as masks:
        y = out(layer(Tensor(x)))
    assert [m.size for m in masks] == [48, 72, 48], [m.shape for m in masks]
    a = ref.layer_norm(x + LinearStub.ref(layer.attn, x) * masks[0].reshape(x.shape), arr(layer.norm1.weight),
                       arr(layer.norm1.bias), 1e-5)
    f = ref.linear(layer.ff.fc2, ref.relu(ref.linear(layer.ff.fc1, a)) * masks[1].reshape(2, 6, 6))
    want = ref.layer_norm(a + f * masks[2].reshape(x.shape), arr(layer.norm2.weight), arr(layer.norm2.bias),
                          1e-5)
    np.testing.assert_allclose(y, want, **TOL)


# The paper's rows (Tables 4-6, the official sweeps; docs/ndr.md §8): d_model, d_ff, heads, steps (eval steps),
# dropout, attention dropout, gate dropout (None: the model has no gate), iterations; batch 512 throughout.
PAPER_SIZES = {
    ("ctl", "transformer"): (128, 256, 4, 11, 0, 0.1, 0.0, None, 30_000),
    ("ctl", "transformer-rel"): (128, 256, 4, 11, 0, 0.1, 0.0, None, 30_000),
    ("ctl", "transformer-rel-gate"): (256, 1024, 1, 14, 0, 0.5, 0.1, 0.0, 30_000),
    ("ctl", "transformer-absrel-gate"): (256, 1024, 1, 14, 0, 0.5, 0.1, 0.0, 30_000),
    ("ctl", "transformer-geom"): (128, 256, 4, 11, 0, 0.1, 0.0, None, 30_000),
    ("ctl", "ndr"): (256, 512, 1, 14, 0, 0.5, 0.1, 0.1, 30_000),
    ("arith", "transformer"): (128, 256, 4, 11, 0, 0.5, 0.1, None, 200_000),
    ("arith", "transformer-rel"): (128, 256, 4, 11, 0, 0.5, 0.1, None, 200_000),
    ("arith", "transformer-absrel-gate"): (256, 1024, 4, 15, 0, 0.5, 0.1, 0.1, 100_000),
    ("arith", "ndr"): (256, 1024, 4, 15, 0, 0.5, 0.1, 0.1, 100_000),
    ("listops", "transformer"): (256, 1024, 16, 6, 0, 0.015, 0.05, None, 200_000),
    ("listops", "transformer-rel"): (256, 1024, 16, 6, 0, 0.015, 0.05, None, 200_000),
    ("listops", "transformer-absrel-gate"): (512, 2048, 16, 20, 0, 0.1, 0.1, 0.05, 100_000),
    ("listops", "ndr"): (512, 1024, 16, 20, 24, 0.1, 0.1, 0.05, 100_000),
}


@pytest.mark.parametrize("task,model", list(PAPER_SIZES))
def test_paper_presets_have_the_papers_sizes_and_dropout_rates(task, model):
    """docs/ndr.md Tables 4-6 sizes and dropouts: the paper preset's d_model, d_ff, heads, shared-layer steps
    (ListOps NDR 20, 24 at evaluation), dropout, attention dropout, gate dropout (0.1 on CTL and arithmetic,
    0.05 on ListOps, 0 for the CTL "+ gate" baselines), iterations and batch 512; ctl-backward as ctl."""
    d, d_ff, H, steps, steps_eval, drop, att, gate, iters = PAPER_SIZES[task, model]
    for t in (task, "ctl-backward") if task == "ctl" else (task,):
        cfg = make_config(t, model, "paper")
        e = cfg.model_config
        assert (e.d_model, e.d_ff, e.n_head, e.n_steps, e.n_steps_eval) == (d, d_ff, H, steps, steps_eval)
        assert (e.dropout, e.attention_dropout, cfg.steps, cfg.batch_size) == (drop, att, iters, 512)
        assert gate is None or e.gate_dropout == gate


def test_the_loss_is_cross_entropy_averaged_over_the_batch():
    """docs/ndr.md §1 loss: the classifiers train on the cross-entropy of the one readout column, averaged
    over the batch, L = −(1/B) Σ_b log softmax(logits_b)[y_b]; no label smoothing."""
    model = randomize(Classifier("ndr", 5, 3, EncoderConfig(**TINY)))
    ids, lengths = np.array([[6, 1, 2, 5, 0], [6, 3, 4, 0, 5], [6, 2, 5, 0, 0]]), np.array([4, 5, 3])
    y = np.array([2, 0, 1])
    loss, _, n = NDR(make_config("ctl", "ndr", "cpu")).loss(model, (ids, lengths, y))
    logits = out(model(ids, lengths))
    logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    assert n == 3
    np.testing.assert_allclose(float(out(loss)), -logp[np.arange(3), y].mean(), **TOL)
