"""The Abstractor's definitions (Altabaa et al. 2024; docs/abstractor.md), each pinned by a test that names
its row of docs/abstractor.md's table "Definitions and the tests that pin them": relational cross-attention,
the Abstractor layer and its variants, the architectures' wiring, the simplified relational classifier, their
dropout sites and the optimizer each preset builds. Random float64 parameters, small random inputs, the
equation in plain NumPy (tests/defs_reference.py), loops where clearer.
"""
import math

import numpy as np
import pytest

from minattn.attention.relational import RelationalCrossAttention
from minattn.engine import Tensor
from minattn.models.abstractor import (Abstractor, AbstractorConfig, AbstractorLayer, AbstractorSeq2Seq,
                                       RelationalClassifier, SimplifiedConfig)
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
    """Relational cross-attention (§2.2, Eq. 6): queries and keys from the objects, values from the symbols."""
    m = randomize(RelationalCrossAttention(4, 2, d_head=3, scale=scale))
    x, s = X(2, 5, 4), X(2, 5, 4, seed=1)
    want = ref.rca(m, x, s, 1 / math.sqrt(3) if scale == "sqrt" else 1.0, MASK5)
    np.testing.assert_allclose(out(m(Tensor(x), Tensor(s), key_mask=MASK5)), want, **TOL)


@pytest.mark.parametrize("ablation", [False, True])
def test_abstractor_layer_is_algorithm_1(ablation):
    """Algorithm 1 with the code's symbol self-attention (§3): A ← LN(A + MHA(A)); A ← LN(A + RCA(X = E, S = A))
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
    """The pre-training "SimpleAbstractor" (docs/abstractor.md §3, its variant): no symbol self-attention, A ← RCA(E, A), FFN block."""
    cfg = AbstractorConfig(**ABS, symbol_self_attention=False, rca_residual=False)
    layer = randomize(AbstractorLayer(cfg, np.random.default_rng(0)))
    A, E = X(2, 5, 4), X(2, 5, 4, seed=1)
    want = ffn_block(layer.ffn, ref.rca(layer.rca, E, A, 1 / math.sqrt(3), MASK5))
    np.testing.assert_allclose(out(layer(Tensor(A), Tensor(E), MASK5)), want, **TOL)


def test_abstractor_starts_from_sqrt_d_symbols_plus_pe_and_every_layer_reads_e():
    """A⁽⁰⁾ = √d · S_{1:m} + PE (the code; docs/abstractor.md §2.1), then each layer l: A ← Layer_l(A, E) with the same objects E."""
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
    """§3, Fig. 2: (a) the decoder reads A = Abstractor(embedded X) (no encoder); (b) A = Abstractor(Encoder(X));
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
    """docs/abstractor.md §1.3 / the discriminative models: X = Dense(x); A⁰ = S (learned symbols, no √d, no PE); per layer
    A ← Drop(LN(R + FFN(R))), R = SimplifiedRCA(X, A) with the same X every layer; flatten; ReLU hidden; logits.
    SimplifiedRCA per relation r: R^r = ⟨W_q^r x_i, W_k^r x_j⟩ (unscaled), Ã^r = σ(R^r) S, A = concat_r P^r Ã^r."""
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
