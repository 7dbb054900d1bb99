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
from minattn.attention.relational import RelationalCrossAttention
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


def test_relational_classifier_is_the_simplified_abstractor_and_a_flat_mlp():
    """docs/abstractor.md §1.3 simplified Abstractor:
    docs/abstractor.md §1.3 / the discriminative models: X = Dense(x); A⁰ = S (learned symbols, no √d, no PE);
    per layer A ← Drop(LN(R + FFN(R))), R = SimplifiedRCA(X, A) with the same X every layer; flatten; ReLU
    hidden; logits. SimplifiedRCA per relation r: R^r = ⟨W_q^r x_i, W_k^r x_j⟩ (unscaled), Ã^r = σ(R^r) S, A =
    concat_r P^r Ã^r."""
    cfg = SimplifiedConfig(d_model=4, n_relations=2, d_key=3, d_ff=5, n_layers=2, dropout=0.0)
    model = randomize(RelationalClassifier(3, 3, 2, cfg))
    x = X(2, 3, 3)
    Xe = ref.linear(model.embed, x)
    A = np.broadcast_to(arr(model.symbols.symbols)[:3], (2, 3, 4))
    for layer in model.layers:
        rca = layer.rca
        W = arr(rca.w_qk)
        R = np.zeros((2, 3, 4))
        for r in range(2):
            q, k = Xe @ W[:, r * 3:(r + 1) * 3], Xe @ W[:, 6 + r * 3:6 + (r + 1) * 3]
            rel = ref.sigmoid(q @ k.transpose(0, 2, 1))                                 # σ_rel = sigmoid
            R[..., r * 2:(r + 1) * 2] = (rel @ A) @ arr(rca.w_p)[r] + arr(rca.b_p)[r]
        A = ffn_block(layer.ffn, R)
    h = ref.relu(ref.linear(model.hidden, A.reshape(2, -1)))
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
