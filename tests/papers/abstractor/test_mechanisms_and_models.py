"""Relational cross-attention, symbols, the Abstractor and the encoder–decoder (docs/abstractor.md §1–5).

Gradients are checked in test_gradcheck.py; here: the definitions (against naive loops), the parameter
counts of §5, masks, causality and greedy decoding. Section numbers (§) without "paper" are those of
docs/abstractor.md.
"""
import dataclasses
import math

import numpy as np
import pytest

from minattn import backend, optim
from minattn import functional as F
from minattn.attention.multihead import MultiHeadAttention
from minattn.attention.relational import PositionRelativeRCA, RelationalCrossAttention, SimplifiedRCA
from minattn.engine import Tensor, eval_mode, no_grad
from minattn.lab.settings import make_config
from minattn.models.abstractor import (AbstractorConfig, AbstractorLayer, AbstractorSeq2Seq, PositionalSymbols,
                                       RelationalClassifier, SimplifiedConfig, SymbolicAttention, build_seq2seq)
from minattn.models.seq2seq import (DecoderLayer, EncoderDecoderConfig, EncoderLayer, FeedForwardBlock,
                                        Seq2SeqTransformer, keras_attention)
from minattn.nn import LayerNorm, keras_fans, sinusoidal_positions, xavier_uniform


def softmax(r):
    e = np.exp(r - r.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


SIGMA = {"softmax": softmax, "sigmoid": lambda r: 1 / (1 + np.exp(-r)), "tanh": np.tanh, "linear": lambda r: r}
TINY = dict(d_model=8, n_head=2, d_ff=12, n_encoder_layers=1, n_decoder_layers=1, dropout=0.0, attention_dropout=0.0)


def randomize(module, seed=1):
    """Random values for every parameter (the zero-initialised biases would hide mistakes)."""
    rng = np.random.default_rng(seed)
    for p in module.parameters():
        p.data = rng.standard_normal(p.shape).astype(p.dtype) * 0.5
    return module


def x_and_s(B=2, T=5, d=8, seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((B, T, d)), rng.standard_normal((B, T, d))


# --- relational cross-attention -----------------------------------------------------------------------------

def naive_rca(m, x, s):
    """§1.2 per head and batch element, from the module's weights."""
    H, k, n_proj = m.n_head, m.d_head, 1 if m.symmetric else 2
    W, b = m.w_qk.data.reshape(-1, n_proj, H, k), m.b_qk.data.reshape(n_proj, H, k)
    Wv, bv = m.w_v.data.reshape(-1, H, k), m.b_v.data.reshape(H, k)
    out = np.zeros(x.shape[:2] + (H * k,))
    for n in range(len(x)):
        for h in range(H):
            q = x[n] @ W[:, 0, h] + b[0, h]
            kk = x[n] @ W[:, n_proj - 1, h] + b[n_proj - 1, h]
            alpha = SIGMA[m.activation](m.scale * q @ kk.T)
            out[n, :, h * k:(h + 1) * k] = alpha @ (s[n] @ Wv[:, h] + bv[h])
    return out @ m.out.weight.data + m.out.bias.data


@pytest.mark.parametrize("activation", ["softmax", "sigmoid", "tanh", "linear"])
@pytest.mark.parametrize("symmetric", [False, True])
@pytest.mark.parametrize("scale", ["sqrt", "none"])
def test_rca_matches_its_definition(activation, symmetric, scale):
    m = randomize(RelationalCrossAttention(8, 2, d_head=3, activation=activation, symmetric=symmetric, scale=scale))
    x, s = x_and_s()
    np.testing.assert_allclose(m(Tensor(x), Tensor(s)).data, naive_rca(m, x, s), rtol=1e-4, atol=1e-5)


def test_symmetric_relations_are_symmetric_before_the_activation():
    x, _ = x_and_s()
    R = randomize(RelationalCrossAttention(8, 2, symmetric=True)).relations(Tensor(x)).data
    np.testing.assert_allclose(R, R.swapaxes(-1, -2), rtol=1e-6)
    R = randomize(RelationalCrossAttention(8, 2, symmetric=False)).relations(Tensor(x)).data
    assert not np.allclose(R, R.swapaxes(-1, -2))


def test_softmax_rca_with_zero_symbols_ignores_the_objects():
    """The relational bottleneck (§1.1): with S ≡ 0 only b_v, W_o and b_o contribute."""
    m = randomize(RelationalCrossAttention(8, 2))
    x1, x2 = x_and_s(seed=1)[0], x_and_s(seed=2)[0]
    zeros = Tensor(np.zeros((2, 5, 8)))
    y1, y2 = m(Tensor(x1), zeros).data, m(Tensor(x2), zeros).data
    np.testing.assert_allclose(y1, y2, rtol=1e-6)
    assert not np.allclose(m(Tensor(x1), Tensor(x1)).data, m(Tensor(x2), Tensor(x1)).data)  # the relations do act


@pytest.mark.parametrize("activation", ["softmax", "sigmoid", "tanh", "linear"])
def test_rca_key_mask_zeroes_masked_keys(activation):
    m = randomize(RelationalCrossAttention(8, 2, activation=activation))
    x, s = x_and_s()
    key_mask = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], bool)
    y, A = m(Tensor(x), Tensor(s), key_mask=key_mask, return_weights=True)
    assert (A.data[0, :, :, 3:] == 0).all() and (A.data[1] != 0).all()
    x2, s2 = x.copy(), s.copy()
    x2[0, 3:], s2[0, 3:] = 5.0, -5.0                        # change only the masked objects and symbols
    np.testing.assert_allclose(m(Tensor(x2), Tensor(s2), key_mask=key_mask).data[0, :3], y.data[0, :3], rtol=1e-6)


def test_causal_rca_is_softmax_only():
    x, s = x_and_s()
    _, A = RelationalCrossAttention(8, 2)(Tensor(x), Tensor(s), causal=True, return_weights=True)
    assert (np.triu(np.ones((5, 5)), 1)[None, None] * A.data == 0).all()
    for activation in ("sigmoid", "tanh", "linear"):
        with pytest.raises(ValueError, match="causal masking needs activation='softmax'"):
            RelationalCrossAttention(8, 2, activation=activation)(Tensor(x), Tensor(s), causal=True)


@pytest.mark.parametrize("kwargs,match", [(dict(activation="relu"), "unknown relation activation"),
                                          (dict(scale="half"), "unknown scale")])
def test_rca_rejects_bad_options(kwargs, match):
    with pytest.raises(ValueError, match=match):
        RelationalCrossAttention(8, 2, **kwargs)


@pytest.mark.parametrize("max_offset", [1, 4])
def test_position_relative_rca_matches_its_definition(max_offset):
    """§2.2: out_h[i] = Σ_j α_h[i, j] (P[clip(j − i)] W_v^h + b_v^h), clipped at ±max_offset."""
    m = randomize(PositionRelativeRCA(8, 2, max_offset, d_head=3, activation="tanh"))
    x, _ = x_and_s()
    A = m.weights(Tensor(x)).data                                     # (B, H, T, T)
    H, k, T = 2, 3, 5
    V = (m.table.data @ m.w_v.data + m.b_v.data).reshape(-1, H, k)   # per offset
    out = np.zeros((2, T, H * k))
    for i in range(T):
        for j in range(T):
            v = V[np.clip(j - i, -max_offset, max_offset) + max_offset]            # (H, k)
            out[:, i] += (A[:, :, i, j, None] * v[None]).reshape(2, H * k)
    expected = out @ m.out.weight.data + m.out.bias.data
    np.testing.assert_allclose(m(Tensor(x)).data, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("activation,symmetric,bias", [("sigmoid", False, False), ("linear", True, True),
                                                       ("softmax", False, True)])
def test_simplified_rca_matches_its_definition(activation, symmetric, bias):
    """§1.3: A_i = concat_r P^r(Σ_j σ(⟨W_q^r x_i + b_q^r, W_k^r x_j + b_k^r⟩) s_j), no scaling."""
    m = randomize(SimplifiedRCA(8, 4, 3, 8, activation, symmetric, bias))
    x, s = x_and_s()
    n_proj = 1 if symmetric else 2
    W = m.w_qk.data.reshape(8, n_proj, 4, 3)
    b = m.b_qk.data.reshape(n_proj, 4, 3) if bias else np.zeros((n_proj, 4, 3))
    parts = []
    for r in range(4):
        q, k = x @ W[:, 0, r] + b[0, r], x @ W[:, n_proj - 1, r] + b[n_proj - 1, r]
        parts.append(SIGMA[activation](q @ k.swapaxes(-1, -2)) @ s @ m.w_p.data[r] + m.b_p.data[r])
    np.testing.assert_allclose(m(Tensor(x), Tensor(s)).data, np.concatenate(parts, -1), rtol=1e-5, atol=1e-6)


# --- symbols ----------------------------------------------------------------------------------------------

def test_positional_symbols():
    x = Tensor(np.zeros((3, 4, 8)))
    learned = PositionalSymbols(6, 8, "learned")
    S = learned(x).data
    assert S.shape == (3, 4, 8) and np.array_equal(S[2], learned.symbols.data[:4])
    np.testing.assert_array_equal(PositionalSymbols(6, 8, "sinusoidal")(x).data[0],
                                  sinusoidal_positions(4, 8, "concat"))
    with pytest.raises(ValueError, match="at most 6"):
        learned(Tensor(np.zeros((1, 7, 8))))
    with pytest.raises(ValueError, match="unknown positional symbols"):
        PositionalSymbols(6, 8, "random")


def test_symbolic_attention_matches_its_definition():
    """§2.3: S^h = softmax_j(scale · (X W_q^h) B^hᵀ) S_lib^h with the library split along features."""
    m = randomize(SymbolicAttention(8, n_symbols=5, n_head=2, d_binding=3))
    x, _ = x_and_s()
    parts = []
    for h in range(2):
        logits = (x @ m.w_q.data[:, 3 * h:3 * h + 3]) @ m.binding.data[h].T / np.sqrt(3)
        parts.append(SIGMA["softmax"](logits) @ m.library.data[:, 4 * h:4 * h + 4])
    np.testing.assert_allclose(m(Tensor(x)).data, np.concatenate(parts, -1), rtol=1e-5, atol=1e-7)


# --- parameter counts (§5) ----------------------------------------------------------------------------------

def test_block_parameter_counts():
    cfg, rng = AbstractorConfig(), np.random.default_rng(0)

    def attention(role):
        return keras_attention(cfg, rng)
    assert keras_attention(cfg, rng).num_parameters() == 33_216
    assert FeedForwardBlock(cfg, rng).num_parameters() == 8_448
    assert EncoderLayer(cfg, rng, attention).num_parameters() == 41_792
    assert DecoderLayer(cfg, rng, attention).num_parameters() == 75_136
    assert AbstractorLayer(cfg, rng).num_parameters() == 75_136
    assert AbstractorLayer(cfg, rng, ablation=True).num_parameters() == 75_136


@pytest.mark.parametrize("name,count", [("abstractor", 386_954), ("abstractor-ablation", 386_954),
                                        ("transformer-seq2seq", 469_898)])
@pytest.mark.parametrize("preset", ["paper", "cpu"])
def test_sorting_model_parameter_counts(name, count, preset):
    """The models train.py builds for `--task sort` have the paper's sizes."""
    cfg = make_config("sort", name, preset).model_config
    assert build_seq2seq(name, 11, 10, cfg, d_src=12).num_parameters() == count


def test_simple_and_simplified_parameter_counts():
    simple = AbstractorConfig(architecture="a", n_head=4, n_abstractor_layers=1, n_decoder_layers=1,
                              symbol_self_attention=False, rca_residual=False, add_pe=False)
    assert AbstractorSeq2Seq(11, 10, simple, d_src=12).num_parameters() == 219_082
    pairwise = make_config("pairwise", "abstractor-simplified").model_config
    set_cfg = make_config("set", "abstractor-simplified").model_config
    assert RelationalClassifier(32, 2, 1, pairwise).num_parameters() == 27_201
    assert RelationalClassifier(64, 3, 2, set_cfg).num_parameters() == 29_762
    assert RelationalClassifier(12, 3, 2, set_cfg).num_parameters() == 26_434


# --- encoder–decoder: causality, greedy decoding, masks --------------------------------------------------

def tiny_model(name, **changes):
    if name == "transformer-seq2seq":
        return Seq2SeqTransformer(7, 6, EncoderDecoderConfig(**TINY, **changes), d_src=3, seed=0)
    cfg = AbstractorConfig(**TINY, n_abstractor_layers=1, max_len=6, **changes)
    return AbstractorSeq2Seq(7, 6, cfg, d_src=3, seed=0, ablation=name == "ablation")


MODELS = [("transformer-seq2seq", {}), ("abstractor", {}), ("ablation", {}), ("abstractor", dict(architecture="a")),
          ("abstractor", dict(architecture="d")), ("abstractor", dict(architecture="e", decoder_form="code")),
          ("abstractor", dict(architecture="e", attend_a1=True, symbols="symbolic", n_library=5))]
IDS = ["transformer", "abstractor-b", "ablation", "a", "d", "e-code", "e-a1-symbolic"]


def trained(model, steps=30):
    """A few Adam steps of sorting 6 vectors by their first feature: random weights tend to give one
    constant output token, which would make the greedy tests weak."""
    rng = np.random.default_rng(5)
    src = rng.standard_normal((16, 6, 3)).astype(np.float32)
    y = np.argsort(src[..., 0], axis=1)
    opt = optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(steps):
        loss = F.cross_entropy(model(src, np.concatenate([np.full((16, 1), 6), y[:, :-1]], axis=1)), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model


def src_tgt(seed=0, B=3, T=6):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((B, T, 3)).astype(np.float32), rng.integers(0, 6, (B, T))


@pytest.mark.parametrize("name,changes", MODELS, ids=IDS)
def test_future_targets_never_change_earlier_logits(name, changes):
    model = tiny_model(name, **changes)
    src, tgt = src_tgt()
    with eval_mode():
        base = model(src, tgt).data
        for t in range(1, tgt.shape[1]):
            changed = tgt.copy()
            changed[:, t] = (changed[:, t] + 1) % 6
            out = model(src, changed).data
            np.testing.assert_allclose(out[:, :t], base[:, :t], rtol=1e-5, atol=1e-6)
            assert not np.allclose(out[:, t], base[:, t])


@pytest.mark.parametrize("name,changes", MODELS, ids=IDS)
def test_greedy_equals_teacher_forced_argmax(name, changes):
    """In eval mode the model is exact: feeding the greedy tokens back by teacher forcing reproduces them
    and their logits, so the cached step-by-step decoder equals the full one."""
    model = trained(tiny_model(name, **changes))
    src, _ = src_tgt(seed=4)
    with no_grad(), eval_mode():
        tokens, logits = model.greedy(src, 6, start=6)
        tf = model(src, np.concatenate([np.full((3, 1), 6), tokens[:, :-1]], axis=1)).data
    np.testing.assert_allclose(logits.data, tf, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(tf.argmax(-1), tokens)
    assert len(np.unique(tokens)) > 1                     # the test would be weak on a constant output


def test_greedy_encodes_once_and_matches_on_every_device(device):
    model = trained(tiny_model("abstractor"))
    src, _ = src_tgt(seed=4)
    with no_grad(), eval_mode():
        expected = model.greedy(src, 6, start=6)[0]
        calls = []
        encode = model.encode
        model.encode = lambda *a, **k: calls.append(1) or encode(*a, **k)
        model.to(device)
        tokens = model.greedy(backend.to_device(src, device), 6, start=6)[0]
    assert len(calls) == 1
    np.testing.assert_array_equal(backend.to_numpy(tokens), expected)


@pytest.mark.parametrize("name", ["transformer-seq2seq", "abstractor"])
def test_padded_source_positions_are_ignored(name):
    model = randomize(tiny_model(name), seed=2)
    src, tgt = src_tgt()
    mask = np.ones((3, 6), bool)
    mask[0, 4:] = False
    changed = src.copy()
    changed[0, 4:] = 9.0
    with eval_mode():
        np.testing.assert_allclose(model(changed, tgt, mask).data, model(src, tgt, mask).data, rtol=1e-5, atol=1e-6)


def test_token_sources_and_architecture_shapes():
    cfg = EncoderDecoderConfig(**TINY)
    model = Seq2SeqTransformer(7, 6, cfg, n_src_tokens=9)
    assert model(np.array([[1, 8, 2]]), np.array([[6, 0]])).shape == (1, 2, 6)
    assert len(tiny_model("abstractor", architecture="a").encoder) == 0
    assert [len(layer.cross) for layer in tiny_model("abstractor", architecture="d").decoder] == [2]
    code = tiny_model("abstractor", architecture="e", attend_a1=True, decoder_form="code").decoder
    assert [layer.context_ids for layer in code] == [(0,), (1,), (2,)]


@pytest.mark.parametrize("make,match", [
    (lambda: Seq2SeqTransformer(7, 6, EncoderDecoderConfig(), d_src=3, n_src_tokens=4), "exactly one of d_src"),
    (lambda: Seq2SeqTransformer(7, 6, EncoderDecoderConfig(decoder_form="mixed"), d_src=3), "unknown decoder_form"),
    (lambda: tiny_model("abstractor", architecture="c"), "unknown architecture"),
    (lambda: tiny_model("abstractor", symbols="random"), "unknown symbols"),
    (lambda: tiny_model("abstractor", activation="relu"), "unknown activation"),
    (lambda: build_seq2seq("abstracter", 7, 6, AbstractorConfig(), d_src=3), "valid models: abstractor"),
])
def test_bad_configurations_fail_clearly(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_a_decoding_step_takes_one_position():
    layer = tiny_model("transformer-seq2seq").decoder[0]
    y, ctx = Tensor(np.zeros((1, 2, 8))), [Tensor(np.zeros((1, 3, 8)))]
    with pytest.raises(ValueError, match="takes one new position"):
        layer.step(y, layer.start(ctx))


def test_relational_classifier_shapes_and_eval_determinism():
    model = RelationalClassifier(12, 3, 2, dataclasses.replace(SimplifiedConfig(), head_hidden=0))
    model.set_rng(backend.RNG(0))
    x = np.random.default_rng(0).standard_normal((4, 3, 12)).astype(np.float32)
    assert model(x).shape == (4, 2)
    assert not np.array_equal(model(x).data, model(x).data)  # dropout is on in training
    model.eval()  # nn.Dropout follows the module flag (eval_mode() alone leaves it on)
    np.testing.assert_array_equal(model(x).data, model(x).data)


# --- initialisation: "default" and "keras" (§5.1) ----------------------------------------------------------

def _weight_kinds(model):
    """Parameter name → its row in the init table of §5.1, found from the module that owns it."""
    kinds = {}
    for prefix, m in model.named_modules():
        if isinstance(m, MultiHeadAttention):
            kinds.update({prefix + "w_q": "mha.w_q", prefix + "w_kv": "mha.w_kv", prefix + "out.weight": "mha.w_o"})
        elif isinstance(m, RelationalCrossAttention):
            kinds.update({prefix + "w_qk": "rca.w_qk", prefix + "w_v": "rca.w_v", prefix + "out.weight": "rca.w_o"})
        elif isinstance(m, SimplifiedRCA):
            kinds.update({prefix + "w_qk": "srca.w_qk", prefix + "w_p": "srca.w_p"})
        elif isinstance(m, FeedForwardBlock):
            kinds.update({prefix + f"ff.fc{i}.{w}": f"ff.{w}{i}" for i in (1, 2) for w in ("weight", "bias")})
        elif isinstance(m, LayerNorm):
            kinds.update({prefix + "weight": "one", prefix + "bias": "zero"})
        elif isinstance(m, PositionalSymbols):
            kinds[prefix + "symbols"] = "normal"
    for name, _ in model.named_parameters():
        if name not in kinds and (name.endswith(".bias") or name.split(".")[-1].startswith("b_")):
            kinds[name] = "zero"           # the Dense layers' and attention's biases: 0 in both inits
        elif name not in kinds:
            kinds[name] = name             # Dense kernels and embeddings: by name
    return kinds


# (default, keras) bounds of U(±bound) per kind, for the models train.py builds: the table of §5.1.
_SORT = {"mha.w_q": (0.17678, 0.03769), "mha.w_kv": (0.13693, 0.03769), "mha.w_o": (0.08839, 0.15309),
         "rca.w_qk": (0.13693, 0.03769), "rca.w_v": (0.17678, 0.03769), "rca.w_o": (0.17678, 0.15309),
         "ff.weight1": (0.21651, 0.21651), "ff.weight2": (0.21651, 0.21651), "ff.bias1": (0.125, 0),
         "ff.bias2": (0.125, 0), "src_embed.weight": (0.28098, 0.28098), "tgt_embed.weight": (0.05, 0.05),
         "head.weight": (0.28475, 0.28475)}
_PAIRWISE = {"srca.w_qk": (0.17678, 0.27386), "srca.w_p": (0.27386, 0.27386), "ff.weight1": (0.21651, 0.21651),
             "ff.weight2": (0.21651, 0.21651), "ff.bias1": (0.125, 0), "ff.bias2": (0.125, 0),
             "embed.weight": (0.25, 0.25), "hidden.weight": (0.19365, 0.19365), "out.weight": (0.42640, 0.42640)}
_SET = {"srca.w_qk": (0.21651, 0.27386), "srca.w_p": (0.27386, 0.27386), "ff.weight1": (0.17678, 0.17678),
        "ff.weight2": (0.17678, 0.17678), "ff.bias1": (0.125, 0), "ff.bias2": (0.08839, 0),
        "embed.weight": (0.28098, 0.28098), "out.weight": (0.17586, 0.17586)}


def _init_case(case, init):
    task, model = case.split("/")
    cfg = dataclasses.replace(make_config(task, model, "cpu").model_config, init=init)
    if task == "sort":
        return build_seq2seq(model, 11, 10, cfg, d_src=12, seed=3), _SORT
    if task == "pairwise":
        return RelationalClassifier(32, 2, 1, cfg, seed=3), _PAIRWISE
    return RelationalClassifier(12, 3, 2, cfg, seed=3), _SET


@pytest.mark.parametrize("init", ["default", "keras"])
@pytest.mark.parametrize("case", ["sort/abstractor", "sort/abstractor-ablation", "sort/transformer-seq2seq",
                                  "pairwise/abstractor-simplified", "set/abstractor-simplified"])
def test_init_bounds_per_weight(case, init):
    """Each kernel is U(±bound) with the bound of §5.1's table: max |w| ≤ bound, and close to it (of ≥ 640
    draws, one lands within 1% of the bound with probability 1 − 0.99^640 > 0.998); the keras biases are
    exactly 0; LayerNorm γ = 1, β = 0; learned symbols N(0, 1)."""
    model, table = _init_case(case, init)
    column = 0 if init == "default" else 1
    for name, kind in _weight_kinds(model).items():
        w = dict(model.named_parameters())[name].data.astype(np.float64)
        if kind in ("one", "zero"):
            assert np.all(w == (1.0 if kind == "one" else 0.0)), name
        elif kind == "normal":
            assert abs(w.mean()) < 0.15 and 0.85 < w.std() < 1.15, name
        else:
            assert kind in table, f"{name}: no row for {kind!r} in the table of docs/abstractor.md §5.1"
            bound, top = table[kind][column], np.abs(w).max()
            if bound == 0:
                assert np.all(w == 0), f"{name} ({init}): {top}"
            else:
                assert top <= bound * 1.0001 and top >= bound * (0.99 if w.size >= 640 else 0.8), \
                    f"{name} ({init}): max |w| {top:.5f}, bound {bound}"


def test_keras_bounds_are_keras_glorot_fans():
    """The keras column of §5.1 from Keras' rule (keras/initializers ``_compute_fans``), with the kernel shapes
    of its MultiHeadAttention's EinsumDense layers, and the 2-D rule where nothing is folded."""
    def glorot(shape):
        return math.sqrt(6 / sum(keras_fans(shape)))
    assert keras_fans((64, 2, 64)) == (128, 4096) and keras_fans((2, 64, 64)) == (128, 128)
    assert keras_fans((64, 16)) == (64, 16) and keras_fans((5,)) == (5, 5)
    assert glorot((64, 2, 64)) == pytest.approx(_SORT["mha.w_q"][1], abs=1e-5)     # q, k, v
    assert glorot((2, 64, 64)) == pytest.approx(_SORT["mha.w_o"][1], abs=1e-5)     # o
    assert glorot((64, 16)) == pytest.approx(_PAIRWISE["srca.w_qk"][1], abs=1e-5)  # one Dense(d_k) per relation


def test_default_init_is_the_same_draw_as_before():
    """"default" is what the models drew before the option existed: spelling it out changes nothing, and the
    first kernel drawn matches a hand-made draw from the same generator (the golden runs check the rest)."""
    cfg = make_config("sort", "abstractor", "cpu").model_config
    a = build_seq2seq("abstractor", 11, 10, cfg, d_src=12, seed=5).state_dict()
    b = build_seq2seq("abstractor", 11, 10, dataclasses.replace(cfg, init="default"), d_src=12, seed=5).state_dict()
    assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
    rng = np.random.default_rng(0)
    mha = MultiHeadAttention(64, 2, rng=np.random.default_rng(0), d_head=64, bias=True)
    np.testing.assert_array_equal(mha.w_q.data, xavier_uniform(rng, 64, 128))


@pytest.mark.parametrize("make", [
    lambda: build_seq2seq("abstractor", 7, 6, AbstractorConfig(**TINY, init="glorot"), d_src=3),
    lambda: build_seq2seq("transformer-seq2seq", 7, 6, AbstractorConfig(**TINY, init="Keras"), d_src=3),
    lambda: RelationalClassifier(4, 3, 2, SimplifiedConfig(init="torch")),
    lambda: MultiHeadAttention(8, 2, init="xavier"),
])
def test_unknown_init_fails_clearly(make):
    with pytest.raises(ValueError, match="unknown init .*default, keras"):
        make()
