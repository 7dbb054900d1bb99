"""The Abstractor's definitions (Altabaa et al. 2024; docs/abstractor.md), each pinned by a test that names
its row of docs/abstractor.md's table "Definitions and the tests that pin them": relational cross-attention,
the Abstractor layer and its variants, the architectures' wiring, the simplified relational classifier, their
dropout sites and the optimizer each preset builds. Random float64 parameters, small random inputs, the
equation in plain NumPy (tests/defs_reference.py), loops where clearer.
"""
import math

import numpy as np
import pytest

from minattn import nn, optim
from minattn.attention.multihead import MultiHeadAttention
from minattn.attention.relational import PositionRelativeRCA, RelationalCrossAttention
from minattn.backend import RNG
from minattn.engine import Tensor, eval_mode
from minattn.lab.recipes import RelationalTasks, Sort
from minattn.lab.recipes.base import optimizer, schedule
from minattn.lab.settings import make_config
from minattn.models.abstractor import (Abstractor, AbstractorConfig, AbstractorLayer, AbstractorSeq2Seq,
                                       PositionalSymbols, RelationalClassifier, SimplifiedConfig,
                                       SymbolicAttention)
from tests import defs_reference as ref
from tests.defs_reference import TOL, X, arr, out, randomize

MASK5 = np.array([[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]], bool)


# --- the Abstractor (Altabaa et al. 2024) -------------------------------------------------------------------

ABS = dict(d_model=4, n_head=2, d_head=3, d_ff=5, n_encoder_layers=1, n_decoder_layers=1, dropout=0.0,
           attention_dropout=0.0, n_abstractor_layers=2, max_len=6)


def ffn_block(block, x):
    return ref.layer_norm(x + ref.feed_forward(block.ff, x), arr(block.norm.weight), arr(block.norm.bias), 1e-3)


@pytest.mark.parametrize("scale", ["sqrt", "none"])
def test_rca_is_eq_6(scale):
    """docs/abstractor.md Eq. 6: relational cross-attention, with and without the √d scaling.
    Relational cross-attention (§2.2, Eq. 6): queries and keys from the objects, values from the symbols."""
    m = randomize(RelationalCrossAttention(4, 2, d_head=3, scale=scale))
    x, s = X(2, 5, 4), X(2, 5, 4, seed=1)
    want = ref.rca(m, x, s, 1 / math.sqrt(3) if scale == "sqrt" else 1.0, MASK5)
    np.testing.assert_allclose(out(m(Tensor(x), Tensor(s), key_mask=MASK5)), want, **TOL)


@pytest.mark.parametrize("activation", ["softmax", "sigmoid", "tanh", "linear"])
@pytest.mark.parametrize("symmetric", [False, True])
def test_rca_relation_activations_and_the_symmetric_projection(activation, symmetric):
    """docs/abstractor.md §1.2 σ_rel, symmetric, causal: σ_rel is softmax over the keys or sigmoid, tanh or
    the identity entry by entry (padded keys 0); ``symmetric`` uses one projection for queries and keys
    (W_k = W_q, b_k = b_q); causal masks only with softmax (future keys weight 0), refused otherwise."""
    m = randomize(RelationalCrossAttention(4, 2, d_head=3, activation=activation, symmetric=symmetric))
    x, s = X(2, 5, 4), X(2, 5, 4, seed=1)
    np.testing.assert_allclose(out(m(Tensor(x), Tensor(s), key_mask=MASK5)),
                               ref.rca(m, x, s, 1 / math.sqrt(3), MASK5), **TOL)
    if activation == "softmax":
        np.testing.assert_allclose(out(m(Tensor(x), Tensor(s), causal=True)),
                                   ref.rca(m, x, s, 1 / math.sqrt(3), causal=True), **TOL)
    else:
        with pytest.raises(ValueError, match="causal"):
            m(Tensor(x), Tensor(s), causal=True)


def test_position_relative_rca_reads_symbols_by_offset():
    """docs/abstractor.md §2.2 position-relative symbols: A_i = Σ_j σ_rel(R)_ij V[i, j] per head, V[i, j] =
    P[clip(j − i, −R_max, R_max) + R_max] W_v + b_v from a table P of 2·R_max + 1 learned symbols."""
    m = randomize(PositionRelativeRCA(4, 2, 2, d_head=3))
    x = X(2, 5, 4)
    B, T, H, dh = 2, 5, 2, 3
    qk = x @ arr(m.w_qk) + arr(m.b_qk)
    q, k = qk[..., :H * dh], qk[..., H * dh:]
    table = arr(m.table) @ arr(m.w_v) + arr(m.b_v)                                  # (2·R_max + 1, H·dh)
    heads = np.zeros((B, T, H * dh))
    for b in range(B):
        for h in range(H):
            sl = slice(h * dh, (h + 1) * dh)
            for i in range(T):
                a = ref.masked_softmax_row(np.array([q[b, i, sl] @ k[b, j, sl] for j in range(T)]) / math.sqrt(dh),
                                           MASK5[b])
                heads[b, i, sl] = sum(a[j] * table[min(max(j - i, -2), 2) + 2, sl] for j in range(T))
    np.testing.assert_allclose(out(m(Tensor(x), key_mask=MASK5)), ref.linear(m.out, heads), **TOL)


def test_symbolic_attention_retrieves_symbols_from_a_library():
    """docs/abstractor.md §2.3 symbolic attention: per head S^h = softmax_j(scale · (X W_q^h) B^hᵀ) S_lib^h,
    with the library split along features into one chunk per head and scale 1/√d_b; S = concat_h S^h. (And
    §2.1's sinusoidal symbols: sin | cos halves, not interleaved.)"""
    m = randomize(SymbolicAttention(6, 5, 2))
    x = X(2, 4, 6)
    q, lib, bind = x @ arr(m.w_q), arr(m.library), arr(m.binding)
    want = np.zeros((2, 4, 6))
    for h in range(2):
        w = ref.softmax(q[..., h * 3:(h + 1) * 3] @ bind[h].T / math.sqrt(3))
        want[..., h * 3:(h + 1) * 3] = w @ lib[:, h * 3:(h + 1) * 3]
    np.testing.assert_allclose(out(m(Tensor(x))), want, **TOL)
    np.testing.assert_allclose(arr(PositionalSymbols(5, 4, "sinusoidal").symbols), ref.sinusoid(range(5), 4, "concat"),
                               rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("ablation", [False, True])
def test_abstractor_layer_is_algorithm_1(ablation):
    """docs/abstractor.md Algorithm 1:
    Algorithm 1 with the code's symbol self-attention (§3): A ← LN(A + MHA(A)); A ← LN(A + RCA(X = E, S = A))
    — the residual onto the symbols; A ← LN(A + FFN(A)). The Ablation: A ← LN(A + MHA(Q = A, K = V = E))."""
    cfg = AbstractorConfig(**ABS)
    layer = randomize(AbstractorLayer(cfg, np.random.default_rng(0), ablation=ablation))
    A, E = X(2, 5, 4), X(2, 5, 4, seed=1)
    a = ref.layer_norm(A + ref.mha(layer.self_attn, A, key_mask=MASK5), arr(layer.self_norm.weight),
                       arr(layer.self_norm.bias), 1e-3)
    rel = ref.mha(layer.rca, a, E, key_mask=MASK5) if ablation else ref.rca(layer.rca, E, a, 1 / math.sqrt(3), MASK5)
    a = ref.layer_norm(a + rel, arr(layer.rca_norm.weight), arr(layer.rca_norm.bias), 1e-3)
    np.testing.assert_allclose(out(layer(Tensor(A), Tensor(E), MASK5)), ffn_block(layer.ffn, a), **TOL)


def test_simple_abstractor_layer_has_no_residual_around_rca():
    """docs/abstractor.md SimpleAbstractor:
    The pre-training "SimpleAbstractor" (docs/abstractor.md §3, its variant): no symbol self-attention, A ←
    RCA(E, A), FFN block."""
    cfg = AbstractorConfig(**ABS, symbol_self_attention=False, rca_residual=False)
    layer = randomize(AbstractorLayer(cfg, np.random.default_rng(0)))
    A, E = X(2, 5, 4), X(2, 5, 4, seed=1)
    want = ffn_block(layer.ffn, ref.rca(layer.rca, E, A, 1 / math.sqrt(3), MASK5))
    np.testing.assert_allclose(out(layer(Tensor(A), Tensor(E), MASK5)), want, **TOL)


def test_abstractor_starts_from_sqrt_d_symbols_plus_pe_and_every_layer_reads_e():
    """docs/abstractor.md A⁽⁰⁾:
    A⁽⁰⁾ = √d · S_{1:m} + PE (the code; docs/abstractor.md §2.1), then each layer l: A ← Layer_l(A, E) with
    the same objects E."""
    cfg = AbstractorConfig(**ABS)
    abstractor = randomize(Abstractor(cfg, np.random.default_rng(0)))
    E = X(2, 5, 4)
    pe = ref.sinusoid(range(5), 4, "concat").astype(np.float32).astype(np.float64)
    A = Tensor(np.broadcast_to(arr(abstractor.symbols.symbols)[:5] * 2.0 + pe, (2, 5, 4)).copy())
    for layer in abstractor.layers:
        A = layer(A, Tensor(E), MASK5)
    np.testing.assert_allclose(out(abstractor(Tensor(E), MASK5)), out(A), **TOL)


@pytest.mark.parametrize("architecture,attend_a1,form", [("a", False, "paper"), ("b", False, "paper"),
                                                          ("d", False, "paper"), ("e", False, "paper"),
                                                          ("e", True, "paper"), ("d", False, "code")])
def test_abstractor_architectures_wire_their_contexts(architecture, attend_a1, form):
    """docs/abstractor.md Fig. 2, Algorithm 2:
    §3, Fig. 2: (a) the decoder reads A = Abstractor(embedded X) (no encoder); (b) A = Abstractor(Encoder(X));
    (d) [E, A] with A = Abstractor(E); (e) [E, A2] with A2 = Abstractor2(A1), A1 = Abstractor1(E) (+ A1 between
    them with ``attend_a1``). The multi-attention decoder (Algorithm 2) reads the contexts in that order; the
    code form stacks one full decoder layer per context."""
    cfg = AbstractorConfig(**ABS, architecture=architecture, attend_a1=attend_a1, decoder_form=form)
    model = randomize(AbstractorSeq2Seq(5, 5, cfg, d_src=3))
    src, tgt = X(2, 5, 3), np.array([[4, 1, 2], [4, 0, 3]])
    E = Tensor(out(model.src_embed(Tensor(src))) * 2.0
               + ref.sinusoid(range(5), 4, "concat").astype(np.float32).astype(np.float64))
    assert len(model.encoder) == (0 if architecture == "a" else 1)
    for layer in model.encoder:
        E = layer(E, key_mask=MASK5)
    A1 = model.abstractors[0](E, MASK5)
    want = {"a": [A1], "b": [A1], "d": [E, A1]}.get(architecture)
    if architecture == "e":
        A2 = model.abstractors[1](A1, MASK5)
        want = [E, A1, A2] if attend_a1 else [E, A2]
    got = model.encode(Tensor(src), MASK5)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        np.testing.assert_allclose(out(g), out(w), **TOL)
    n = len(want)
    assert [layer.context_ids for layer in model.decoder] == ([tuple(range(n))] if form == "paper" else
                                                               [(i,) for i in range(n)])
    y = Tensor(arr(model.tgt_embed.weight)[tgt] * 2.0
               + ref.sinusoid(range(3), 4, "concat").astype(np.float32).astype(np.float64))
    for layer in model.decoder:
        y = layer(y, want, MASK5)
    np.testing.assert_allclose(out(model(Tensor(src), tgt, MASK5)), ref.linear(model.head, out(y)), **TOL)


@pytest.mark.parametrize("task", ["pairwise", "set"])
def test_relational_classifier_is_the_simplified_abstractor_and_a_flat_mlp(task):
    """docs/abstractor.md §1.3 simplified Abstractor: the discriminative models. X = Dense(x); A⁰ = S (learned
    symbols, no √d, no PE); per layer A ← Drop(LN(R + FFN(R))), R = SimplifiedRCA(X, A) with the same X every
    layer; flatten; [ReLU hidden]; logits. SimplifiedRCA per relation r: R^r = ⟨W_q^r x_i + b_q^r, W_k^r x_j +
    b_k^r⟩ (unscaled), Ã^r = σ_rel(R^r) S, A = concat_r P^r Ã^r. Pairwise order: sigmoid, asymmetric, no
    biases, a hidden layer; SET: the identity, symmetric (W_k = W_q), biases, no hidden layer."""
    options = dict(activation="linear", symmetric=True, rel_bias=True, head_hidden=0) if task == "set" else {}
    cfg = SimplifiedConfig(d_model=4, n_relations=2, d_key=3, d_ff=5, n_layers=2, dropout=0.0, **options)
    model = randomize(RelationalClassifier(3, 3, 2, cfg))
    x = X(2, 3, 3)
    Xe = ref.linear(model.embed, x)
    A = np.broadcast_to(arr(model.symbols.symbols)[:3], (2, 3, 4))
    sigma = ref.sigmoid if task == "pairwise" else (lambda r: r)
    for layer in model.layers:
        rca = layer.rca
        qk = Xe @ arr(rca.w_qk) + (0 if rca.b_qk is None else arr(rca.b_qk))    # [W_q^1 W_q^2 | W_k^1 W_k^2]
        R = np.zeros((2, 3, 4))
        for r in range(2):
            q = qk[..., r * 3:(r + 1) * 3]
            k = q if task == "set" else qk[..., 6 + r * 3:6 + (r + 1) * 3]
            rel = sigma(q @ k.transpose(0, 2, 1))
            R[..., r * 2:(r + 1) * 2] = (rel @ A) @ arr(rca.w_p)[r] + arr(rca.b_p)[r]
        A = ffn_block(layer.ffn, R)
    h = A.reshape(2, -1) if task == "set" else ref.relu(ref.linear(model.hidden, A.reshape(2, -1)))
    np.testing.assert_allclose(out(model(Tensor(x))), ref.linear(model.out, h), **TOL)


# --- initial values, dropout sites and what a run builds (docs/abstractor.md §2-§3, §6) ---------------------


def test_learned_symbols_start_standard_normal_and_the_library_at_0_05():
    """docs/abstractor.md Symbols init: learned positional symbols s_i ~ N(0, 1) (the code's); symbolic
    attention's library S_lib and bindings B ~ N(0, 0.05²)."""
    s = arr(PositionalSymbols(64, 64).symbols)
    assert abs(s.mean()) < 0.05 and abs(s.std() - 1) < 0.03
    lib = SymbolicAttention(64, 64, 4)
    for p in (lib.library, lib.binding):
        assert abs(arr(p).mean()) < 0.005 and abs(arr(p).std() - 0.05) < 0.003


def test_rca_drops_out_the_relation_weights():
    """docs/abstractor.md RCA dropout: dropout (0.1 in the code) on the attention weights α_h = σ_rel(R_h),
    before they pool the symbols: A = concat_h(Drop(α_h) S W_v^h) W_o; none at evaluation."""
    m = randomize(RelationalCrossAttention(4, 2, d_head=3, attention_dropout=0.4))
    m.set_rng(RNG(3))
    x, s = X(2, 5, 4), X(2, 5, 4, seed=1)
    with ref.recorded_masks(nn.Dropout) as masks:
        y = out(m(Tensor(x), Tensor(s), key_mask=MASK5))
    assert [d.shape for d in masks] == [(2, 2, 5, 5)], "one mask, on α (B, H, T, T)"
    np.testing.assert_allclose(y, ref.rca(m, x, s, 1 / math.sqrt(3), MASK5, drop=masks[0]), **TOL)
    with eval_mode():
        np.testing.assert_allclose(out(m(Tensor(x), Tensor(s), key_mask=MASK5)),
                                   ref.rca(m, x, s, 1 / math.sqrt(3), MASK5), **TOL)


def test_keras_attention_drops_out_its_weights():
    """docs/abstractor.md MHA dropout: the Keras MultiHeadAttention of the code (and of the encoder–decoder
    baselines) drops out the softmax weights: head_h = Drop(softmax(Q_h K_hᵀ/√d_k)) V_h."""
    m = randomize(MultiHeadAttention(6, 2, attention_dropout=0.4, d_head=4, bias=True))
    m.set_rng(RNG(3))
    x, c = X(2, 3, 6), X(2, 5, 6, seed=1)
    with ref.recorded_masks(nn.Dropout) as masks:
        y = out(m(Tensor(x), context=Tensor(c), key_mask=MASK5))
    assert [d.shape for d in masks] == [(2, 2, 3, 5)], "one mask, on the weights (B, H, T, S)"
    np.testing.assert_allclose(y, ref.mha(m, x, c, key_mask=MASK5, drop=masks[0]), **TOL)


ABSTRACTOR_PRESETS = [(t, m) for r in (Sort, RelationalTasks) for t in r.tasks for m in r.models]


@pytest.mark.parametrize("task,model", ABSTRACTOR_PRESETS)
def test_each_preset_builds_adam_at_1e_3_from_the_runs_settings(task, model):
    """docs/abstractor.md Optimizer: Adam lr 1e-3, β (0.9, 0.999), no decay (AdamW at weight decay 0: the
    same update), a constant rate, no gradient clipping; ε 1e-8 where Keras has 1e-7 (a documented choice,
    minattn/lab/recipes/abstractor.py). The optimizer follows the run's own lr and weight decay, given or
    preset."""
    params = [nn.Parameter(np.full(3, 2.0))]
    for preset in ("paper", "cpu"):
        for given in ({}, dict(lr=2.5e-3, weight_decay=0.0375)):
            cfg = schedule(make_config(task, model, preset, **given))
            want = (given.get("lr", 1e-3), given.get("weight_decay", 0.0), 0.0)
            assert (cfg.lr, cfg.weight_decay, cfg.grad_clip) == want
            ref.check_optimizer(optimizer(cfg, params), cfg, optim.AdamW, (0.9, 0.999), 1e-8,
                                lambda t: cfg.lr, steps=(1, 2, 1000))


def test_abstractor_drops_out_its_start_and_each_ff_output():
    """docs/abstractor.md §3 dropout sites: A⁽⁰⁾ = Drop(√d · S + PE); in each layer the FF block is
    A ← LN(A + Drop(W_2 ReLU(W_1 A + b_1) + b_2)) (no dropout on the hidden layer, as Keras' Dense); the
    attention dropout acts on the weights (rows "RCA dropout", "MHA dropout")."""
    cfg = AbstractorConfig(**{**ABS, "dropout": 0.4})
    abstractor = randomize(Abstractor(cfg, np.random.default_rng(0)))
    abstractor.set_rng(RNG(3))
    E = X(2, 5, 4)
    with ref.recorded_masks(nn.Dropout) as masks:
        got = out(abstractor(Tensor(E), MASK5))
    assert [d.shape for d in masks] == [(2, 5, 4)] * 3, "the start, then each layer's FF output"
    pe = ref.sinusoid(range(5), 4, "concat").astype(np.float32).astype(np.float64)
    A = (arr(abstractor.symbols.symbols)[:5] * 2.0 + pe) * masks[0]
    for layer, drop in zip(abstractor.layers, masks[1:]):
        A = ref.layer_norm(A + ref.mha(layer.self_attn, A, key_mask=MASK5), arr(layer.self_norm.weight),
                           arr(layer.self_norm.bias), 1e-3)
        A = ref.layer_norm(A + ref.rca(layer.rca, E, A, 1 / math.sqrt(3), MASK5), arr(layer.rca_norm.weight),
                           arr(layer.rca_norm.bias), 1e-3)
        f = layer.ffn
        A = ref.layer_norm(A + ref.feed_forward(f.ff, A) * drop, arr(f.norm.weight), arr(f.norm.bias), 1e-3)
    np.testing.assert_allclose(got, A, **TOL)


def test_simplified_abstractor_drops_out_the_ff_output_and_the_layer_output():
    """docs/abstractor.md §1.3 dropout sites: per layer A ← Drop(LN(R + Drop(FFN(R)))), R = SimplifiedRCA(X, A):
    dropout on the FF output before the residual and on the layer's output; none on the relations."""
    cfg = SimplifiedConfig(d_model=4, n_relations=2, d_key=3, d_ff=5, n_layers=1, dropout=0.4)
    model = randomize(RelationalClassifier(3, 3, 2, cfg))
    model.set_rng(RNG(3))
    x = X(2, 3, 3)
    with ref.recorded_masks(nn.Dropout) as masks:
        got = out(model(Tensor(x)))
    assert [d.shape for d in masks] == [(2, 3, 4)] * 2, "the FF output, then the layer's output"
    layer = model.layers[0]
    R = out(layer.rca(Tensor(ref.linear(model.embed, x)), model.symbols(Tensor(x))))
    f = layer.ffn
    A = ref.layer_norm(R + ref.feed_forward(f.ff, R) * masks[0], arr(f.norm.weight), arr(f.norm.bias), 1e-3)
    A = A * masks[1]
    h = ref.relu(ref.linear(model.hidden, A.reshape(2, -1)))
    np.testing.assert_allclose(got, ref.linear(model.out, h), **TOL)
