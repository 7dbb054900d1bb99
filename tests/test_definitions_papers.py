"""Every definition pinned by the paper's equation (issue 31 item 1), continued: CoDA, the Abstractor
architectures, seq2attn and compositional attention. As in tests/test_definitions.py: random float64
parameters, small random inputs, the equation in plain NumPy (tests/defs_reference.py), loops where clearer.
"""
import dataclasses
import math

import numpy as np
import pytest

from minattn.attention.additive import AdditiveAttention
from minattn.attention.coda import COMPOSITIONS, CoDAConfig, CoDAttention, PairwiseCoDA
from minattn.attention.compositional import CompositionalAttention
from minattn.attention.relational import RelationalCrossAttention
from minattn.backend import RNG
from minattn.engine import Tensor, eval_mode
from minattn.models.abstractor import (Abstractor, AbstractorConfig, AbstractorLayer, AbstractorSeq2Seq,
                                       RelationalClassifier, SimplifiedConfig)
from minattn.models.compositional import CRTConfig, CRTModel
from minattn.models.seq2attn import Seq2Attn, model_config
from minattn.models.seq2seq import CoDASeq2SeqTransformer, EncoderDecoderConfig

from . import defs_reference as ref
from .defs_reference import arr
from .test_definitions import TOL, X, out, randomize

MASK5 = np.array([[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]], bool)

# --- CoDA (Tay et al. 2019) ---------------------------------------------------------------------------------

F_E = {"tanh": np.tanh, "sigmoid": ref.sigmoid}
F_N = {"sigmoid": ref.sigmoid, "tanh": np.tanh, "arctan": lambda n: np.arctan(n) * 2 / math.pi,
       "algebraic": lambda n: n / np.sqrt(1 + n * n)}


def quasi_reference(E, N, ok, stats, gate, center_e, composition, row_mean):
    """CoDA Eqs. 3-6 and Table 9 for one (sample, head) matrix: M = F_X(E) ⊙ gate(N) on the allowed entries,
    0 elsewhere. Eq. 5 ("scaled"): 2σ(N) (the 2 undoes σ(0) = ½; a Table 9 F_Y other than σ is used as it is);
    Eq. 4 ("centered"): F_Y(N − Mean(N)); Eq. 6: E − Mean(E). Mean(·) over the entries in ``stats``: of the
    matrix, or of each query row."""
    f_e, f_n = (fns[name] for fns, name in zip((F_E, F_N), composition.split("-")))

    def centred(Z):
        Z = Z.copy()
        rows = [np.arange(Z.shape[0])] if not row_mean else [[i] for i in range(Z.shape[0])]
        for r in rows:
            sel = stats[r]
            mean = Z[r][sel].mean() if sel.any() else 0.0
            Z[r] = Z[r] - mean
        return Z

    if center_e:
        E = centred(E)
    if gate == "centered":
        g = f_n(centred(N))
    else:
        g = 2 * ref.sigmoid(N) if f_n is ref.sigmoid else f_n(N)
    return np.where(ok, f_e(E) * g, 0.0)


def coda_reference(m, x, key_mask, causal, alpha, beta, gate, center_e, composition, row_mean, scale=True):
    """CoDA in the Transformer (Eq. 10), head by head: E = α Q Kᵀ/√d_k, N = −β ‖q_i − k_j‖₁/√d_k,
    Out = Concat_h(M_h V_h) W_o with M from ``quasi_reference``; Mean(·) counts real keys and real queries."""
    B, T, _ = x.shape
    H, dh = m.n_head, m.d_head
    inner = H * dh
    q = x @ arr(m.w_q) + (0 if m.b_q is None else arr(m.b_q))
    kv = x @ arr(m.w_kv) + (0 if m.b_kv is None else arr(m.b_kv))
    k, v = kv[..., :inner], kv[..., inner:]
    s = 1 / math.sqrt(dh) if scale else 1.0
    ok = ref.allowed(B, T, T, key_mask, causal)
    heads = np.zeros((B, T, inner))
    for b in range(B):
        stats = ok[b] & (key_mask[b][:, None] if key_mask is not None else True)
        for h in range(H):
            sl = slice(h * dh, (h + 1) * dh)
            E = np.array([[alpha * s * (q[b, i, sl] @ k[b, j, sl]) for j in range(T)] for i in range(T)])
            N = np.array([[-beta * s * np.abs(q[b, i, sl] - k[b, j, sl]).sum() for j in range(T)] for i in range(T)])
            M = quasi_reference(E, N, ok[b], stats, gate, center_e, composition, row_mean)
            heads[b, :, sl] = M @ v[b, :, sl]
    return ref.linear(m.out, heads)


@pytest.mark.parametrize("composition", COMPOSITIONS)
@pytest.mark.parametrize("gate,center_e,row_mean", [("scaled", False, False), ("centered", False, False),
                                                    ("centered", True, False), ("centered", True, True)])
def test_coda_is_eq_10_with_every_table_9_composition(composition, gate, center_e, row_mean):
    m = randomize(CoDAttention(6, 2, alpha=0.7, beta=0.4, gate=gate, center_e=center_e, composition=composition,
                               row_mean=row_mean, bias=True))
    x = X(2, 5, 6)
    want = coda_reference(m, x, MASK5, False, 0.7, 0.4, gate, center_e, composition, row_mean)
    np.testing.assert_allclose(out(m(Tensor(x), key_mask=MASK5)), want, **TOL)


@pytest.mark.parametrize("gate", ["scaled", "centered"])
def test_coda_causal_and_unscaled(gate):
    """The decoder's causal CoDA (future keys weight 0, Mean per row) and footnote 3's unscaled form."""
    m = randomize(CoDAttention(6, 2, gate=gate, center_e=True, row_mean=True, scale=False))
    x = X(2, 4, 6)
    want = coda_reference(m, x, None, True, 1.0, 1.0, gate, True, "tanh-sigmoid", True, scale=False)
    np.testing.assert_allclose(out(m(Tensor(x), causal=True)), want, **TOL)


def test_coda_centred_gate_subtracts_the_mean():
    """Eq. 4's sign: σ(N − Mean N) opens the gate for pairs closer than average (N above its mean): the gate
    of the nearest key (largest N) is above ½ and that of the farthest below ½."""
    m = randomize(CoDAttention(4, 1, gate="centered", bias=False))
    m.record = True
    x = X(1, 5, 4)
    m(Tensor(x))
    g = out(m.last_gate)[0, 0]
    q, k = x @ arr(m.w_q), (x @ arr(m.w_kv))[..., :4]
    N = -np.abs(q[0, :, None] - k[0, None]).sum(-1)
    i = 2
    assert g[i, N[i].argmax()] > 0.5 > g[i, N[i].argmin()]


def test_coda_seq2seq_centres_decoder_rows_on_their_own_keys():
    """transformer-seq2seq-coda (docs/coda.md §6): every attention is CoDA; the decoder's causal self- and
    cross-attention take Mean(·) per query row (a matrix-wide mean would let a position see later ones), the
    encoder's per matrix. Cross-attention centres over the real source keys of each row."""
    @dataclasses.dataclass
    class Cfg(CoDAConfig, EncoderDecoderConfig):
        pass

    cfg = Cfg(d_model=4, n_head=2, d_head=3, d_ff=5, n_encoder_layers=1, n_decoder_layers=1, dropout=0.0,
              attention_dropout=0.0, coda_gate="centered", coda_center_e=True)
    model = randomize(CoDASeq2SeqTransformer(5, 5, cfg, d_src=3))
    assert [a.row_mean for a in (model.encoder[0].attn, model.decoder[0].self_attn, model.decoder[0].cross[0])] == \
        [False, True, True]
    att = model.decoder[0].cross[0]
    y, c = X(2, 3, 4), X(2, 5, 4, seed=1)
    B, T, S, H, dh = 2, 3, 5, 2, 3
    q = y @ arr(att.w_q) + arr(att.b_q)
    kv = c @ arr(att.w_kv) + arr(att.b_kv)
    k, v = kv[..., :H * dh], kv[..., H * dh:]
    heads = np.zeros((B, T, H * dh))
    for b in range(B):
        ok = np.broadcast_to(MASK5[b][None, :], (T, S))
        for h in range(H):
            sl = slice(h * dh, (h + 1) * dh)
            E = (q[b, :, sl] @ k[b, :, sl].T) / math.sqrt(dh)
            N = -np.abs(q[b, :, None, sl] - k[b, None, :, sl]).sum(-1) / math.sqrt(dh)
            heads[b, :, sl] = quasi_reference(E, N, ok, ok, "centered", True, "tanh-sigmoid", True) @ v[b, :, sl]
    np.testing.assert_allclose(out(att(Tensor(y), context=Tensor(c), key_mask=MASK5)), ref.linear(att.out, heads), **TOL)


@pytest.mark.parametrize("gate,shared", [("scaled", False), ("centered", True)])
def test_pairwise_coda_is_eqs_1_to_7(gate, shared):
    """Pairwise CoDA (Eqs. 1-7): E = α F_E(A) F_E(B)ᵀ, N_ij = −β ‖F_N(a_i) − F_N(b_j)‖₁, M as Eqs. 3-6,
    A′ = M B and B′ = Mᵀ A (raw sequences pooled, no 1/√d)."""
    m = randomize(PairwiseCoDA(4, 3, alpha=0.6, beta=0.8, gate=gate, center_e=True, shared=shared))
    a, b = X(2, 5, 4), X(2, 3, 4, seed=1)
    am, bm = MASK5, np.array([[1, 1, 0], [1, 1, 1]], bool)
    a2, b2 = m(Tensor(a), Tensor(b), am, bm)
    for s in range(2):
        ea, eb = a[s] @ arr(m.f_e.weight), b[s] @ arr(m.f_e.weight)
        na, nb = a[s] @ arr(m.f_n.weight), b[s] @ arr(m.f_n.weight)
        E = 0.6 * ea @ eb.T
        N = -0.8 * np.abs(na[:, None] - nb[None]).sum(-1)
        ok = am[s][:, None] & bm[s][None, :]
        M = quasi_reference(E, N, ok, ok, gate, True, "tanh-sigmoid", False)
        np.testing.assert_allclose(out(a2)[s], M @ b[s], **TOL)
        np.testing.assert_allclose(out(b2)[s], M.T @ a[s], **TOL)


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


# --- seq2attn (Korrel et al. 2019) -------------------------------------------------------------------------


def _additive(temperature, activation="gumbel"):
    m = randomize(AdditiveAttention(3, 4, 5, activation, temperature, tau_init=2.0, tau_max=3.0))
    if temperature == "latent" and activation != "softmax":
        m.log_tau.data = np.array([0.4])    # θ; τ = exp θ ≈ 1.49 (θ itself would be 0.4)
    return m


def additive_scores(m, q, keys, mask):
    """Eq. 5: e_j = w2 · ReLU(W1 [k_j ; q] + b1) + b2, padding keys excluded."""
    e = np.zeros(keys.shape[:2])
    for b in range(keys.shape[0]):
        for j in range(keys.shape[1]):
            hidden = ref.relu(keys[b, j] @ arr(m.w1_key) + q[b] @ arr(m.w1_query) + arr(m.b1))
            e[b, j] = hidden @ arr(m.w2.weight)[:, 0] + arr(m.w2.bias)[0]
    return np.where(mask, e, -np.inf)


def tau_reference(m, q, temperature):
    """The temperatures: fixed τ; latent τ = exp(θ); conditioned τ = 1 / (softplus(w_τ·s_t + b_τ) + 1/τ_max)."""
    if temperature == "fixed":
        return 2.0
    if temperature == "latent":
        return math.exp(0.4)
    return 1.0 / (ref.softplus(q @ arr(m.w_tau.weight) + arr(m.w_tau.bias)) + 1 / 3.0)


@pytest.mark.parametrize("temperature", ["fixed", "latent", "conditioned"])
def test_gumbel_attention_is_eqs_5_to_8_with_each_temperature(temperature):
    """Eqs. 5-8: the soft sample y = softmax((e + g)/τ); straight-through: one_hot(argmax y) forward; at
    evaluation one_hot(argmax e) without noise; the baseline's softmax(e)."""
    m = _additive(temperature)
    q, keys = X(2, 4), X(2, 4, 3, seed=1)
    mask = np.array([[1, 1, 1, 1], [1, 1, 1, 0]], bool)
    g = X(2, 4, seed=2)
    e = additive_scores(m, q, keys, mask)
    y = ref.softmax((e + g) / tau_reference(m, q, temperature))
    prepared = m.prepare(Tensor(keys), mask)
    np.testing.assert_allclose(out(m(Tensor(q), prepared, noise=g)), y, **TOL)
    m.activation = "gumbel_st"
    np.testing.assert_array_equal(out(m(Tensor(q), prepared, noise=g)), np.eye(4)[y.argmax(-1)])
    with eval_mode():
        np.testing.assert_array_equal(out(m(Tensor(q), prepared, noise=g)), np.eye(4)[e.argmax(-1)])
    soft = _additive(temperature, "softmax")
    np.testing.assert_allclose(out(soft(Tensor(q), soft.prepare(Tensor(keys), mask))),
                               ref.softmax(additive_scores(soft, q, keys, mask)), **TOL)


def rnn_step(rnn, x, state):
    """A stack of GRU/LSTM cells, one step (no dropout at evaluation): each layer reads the one below."""
    new = []
    for cell, st in zip(rnn.cells, state):
        st = ref.lstm(cell, x, *st) if rnn.lstm else ref.gru(cell, x, st)
        new.append(st)
        x = st[0] if rnn.lstm else st
    return x, new


def seq2attn_reference(model, src, lengths, steps, tgt=None):
    """One greedy/teacher-forced unroll in the reference code's order (§3, Eqs. 1-12; eval: argmax attention):
    x_t = E_out[y_{t−1}]; s_t = RNN_trans(x_t, s_{t−1}) (s_0 = the encoder's final state at each row's length);
    α_t = one_hot(argmax_j e_tj); c_t = Σ_j α_tj E_in[x_j] (Eq. 9); h_t = RNN_dec([c_t ; x_t], h_{t−1} ⊙ c_t)
    (full focus, Eq. 12, on every state tensor; h_0 learned); logits W_out h_t + b. Without T the query is the
    top decoder state h_{t−1} and h_0 the encoder's final state; without E the values are the encoder states;
    without G the attention is softmax(e). Returns logits (B, steps, V)."""
    cfg = model.cfg
    B, n = src.shape
    emb = arr(model.embed_in.weight)[src]
    zero = np.zeros((B, cfg.d_hidden))
    state = [(zero, zero) if model.encoder.lstm else zero for _ in model.encoder.cells]
    enc, states = [], []
    for j in range(n):
        h, state = rnn_step(model.encoder, emb[:, j], state)
        enc.append(h)
        states.append(state)
    enc = np.stack(enc, 1)
    rows = np.arange(B)
    final = [tuple(np.stack([st[layer][k] for st in states], 1)[rows, lengths - 1] for k in range(2))
             if model.encoder.lstm else np.stack([st[layer] for st in states], 1)[rows, lengths - 1]
             for layer in range(len(model.encoder.cells))]
    mask = np.arange(n)[None, :] < lengths[:, None]
    values = emb if cfg.embedding_values else enc
    trans, dec = final, final
    if cfg.transcoder:
        p = [np.broadcast_to(arr(t), (B, cfg.d_hidden)) for t in model.decoder_init]
        dec = [(p[2 * i], p[2 * i + 1]) for i in range(len(p) // 2)] if model.decoder.lstm else p
    prev = np.full(B, model.sos_id)
    logits = []
    for t in range(steps):
        x = arr(model.embed_out.weight)[prev]
        if cfg.transcoder:
            query, trans = rnn_step(model.transcoder, x, trans)
        else:
            query = dec[-1][0] if model.decoder.lstm else dec[-1]
        e = additive_scores(model.attention, query, enc, mask)
        alpha = np.eye(n)[e.argmax(-1)] if cfg.gumbel else ref.softmax(e)
        c = np.einsum("bj,bjd->bd", alpha, values)
        if cfg.full_focus:
            dec = [tuple(v * c for v in st) if model.decoder.lstm else st * c for st in dec]
        top, dec = rnn_step(model.decoder, np.concatenate([c, x], -1), dec)
        logits.append(ref.linear(model.out, top))
        prev = logits[-1].argmax(-1) if tgt is None else tgt[:, t]
    return np.stack(logits, 1)


SRC, SRC_LEN = np.array([[2, 3, 4, 5], [6, 2, 3, 1]]), np.array([4, 3])
TGT, TGT_LEN = np.array([[4, 5, 3], [5, 3, 1]]), np.array([3, 2])


S2A_VARIANTS = {"seq2attn": ("seq2attn", {}), "seq2seq": ("seq2seq", {}),
                "seq2attn_lstm_2layer": ("seq2attn", dict(cell="lstm", n_layers=2, dropout=0.3)),
                "seq2seq_lstm_2layer": ("seq2seq", dict(cell="lstm", n_layers=2)),
                "GF_without_ET": ("seq2attn", dict(embedding_values=False, transcoder=False)),
                "T_only": ("seq2seq", dict(transcoder=True)), "E_only": ("seq2seq", dict(embedding_values=True))}


@pytest.mark.parametrize("variant", list(S2A_VARIANTS))
def test_seq2attn_decode_step_is_eqs_1_to_12(variant):
    name, options = S2A_VARIANTS[variant]
    model = randomize(Seq2Attn(model_config(name, d_embedding=4, d_hidden=4, **options), 7, 6, sos_id=2)).eval()
    with eval_mode():
        forced, _ = model.decode(SRC, SRC_LEN, 3, TGT, teacher_forcing=1.0)
        free, _ = model.decode(SRC, SRC_LEN, 3)
    np.testing.assert_allclose(out(forced), seq2attn_reference(model, SRC, SRC_LEN, 3, TGT), **TOL)
    np.testing.assert_allclose(out(free), seq2attn_reference(model, SRC, SRC_LEN, 3), **TOL)


@pytest.mark.parametrize("name", ["seq2attn", "seq2seq", "seq2attn_lstm_2layer"])
def test_seq2attn_evaluation_loss_feeds_back_its_own_predictions(name):
    """The loss (docs/seq2attn.md §1.6; the reference's validation loss): Σ_t −log p(y_t) over each sequence's real targets,
    averaged over the batch; at evaluation the model feeds back its own argmax, never the gold prefix."""
    name, options = S2A_VARIANTS[name]
    model = randomize(Seq2Attn(model_config(name, d_embedding=4, d_hidden=4, teacher_forcing=1.0, **options), 7, 6,
                               sos_id=2)).eval()
    logits = seq2attn_reference(model, SRC, SRC_LEN, 3)
    logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    want = -sum(logp[b, t, TGT[b, t]] for b in range(2) for t in range(TGT_LEN[b])) / 2
    np.testing.assert_allclose(float(out(model.loss(SRC, SRC_LEN, TGT, TGT_LEN))), want, **TOL)


def test_seq2seq_training_loss_with_teacher_forcing_feeds_the_gold_prefix():
    """In training with teacher-forcing probability 1 every step reads the gold y_{t−1} (docs/seq2attn.md §1.6)."""
    model = randomize(Seq2Attn(model_config("seq2seq", d_embedding=4, d_hidden=4, teacher_forcing=1.0), 7, 6,
                               sos_id=2))
    logits = seq2attn_reference(model, SRC, SRC_LEN, 3, TGT)
    logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    want = -sum(logp[b, t, TGT[b, t]] for b in range(2) for t in range(TGT_LEN[b])) / 2
    model.set_rng(RNG(0))
    np.testing.assert_allclose(float(out(model.loss(SRC, SRC_LEN, TGT, TGT_LEN))), want, **TOL)


# --- compositional attention (Mittal et al. 2022) -----------------------------------------------------------


def compositional_reference(m, x, mask, S, R, score="dot", separate=False, concat=False, mask_diagonal=False):
    """Eqs. 7-14, search by search and token by token: A_s = softmax(Q_s K_sᵀ/√d_s) over the allowed keys;
    O_sr = A_s V_r; c_sr = softmax_r(Q̄_s · K̄_sr/√d_s) with K̄_sr = O_sr W̄_k + b̄_k (one W̄_k, or W̄_k^r per
    retrieval with ``separate``), or Appendix B.7's linear score w·[Q̄_s; O_sr] + b (unscaled); out =
    Concat_s(Σ_r c_sr O_sr) [| x W_c] W_o + b_o."""
    B, T, _ = x.shape
    ds, dv = m.d_s, m.d_v
    q, k, qb = ref.linear(m.query, x), ref.linear(m.key_search, x), ref.linear(m.retrieval_query, x)
    v = ref.linear(m.value, x)
    heads = np.zeros((B, T, S * dv))
    for b in range(B):
        for s in range(S):
            ss = slice(s * ds, (s + 1) * ds)
            for i in range(T):
                ok = (np.ones(T, bool) if mask is None else mask[b].copy())
                if mask_diagonal:
                    ok[i] = False
                A = ref.masked_softmax_row(np.array([q[b, i, ss] @ k[b, j, ss] for j in range(T)]) / math.sqrt(ds),
                                           ok)
                O = [A @ v[b, :, r * dv:(r + 1) * dv] for r in range(R)]
                if score == "mlp":
                    w, bias = arr(m.score_net.weight)[:, 0], arr(m.score_net.bias)[0]
                    logits = np.array([w[:ds] @ qb[b, i, ss] + w[ds:] @ O[r] + bias for r in range(R)])
                else:
                    keys = [O[r] @ arr(m.w_key)[r] + arr(m.b_key)[r, 0] if separate
                            else ref.linear(m.retrieval_key, O[r]) for r in range(R)]
                    logits = np.array([qb[b, i, ss] @ keys[r] for r in range(R)]) / math.sqrt(ds)
                c = ref.softmax(logits)
                heads[b, i, s * dv:(s + 1) * dv] = sum(c[r] * O[r] for r in range(R))
    if concat:
        heads = np.concatenate([heads, ref.linear(m.own, x)], axis=-1)
    return ref.linear(m.out, heads)


@pytest.mark.parametrize("options", [{}, dict(concat=True, mask_diagonal=True), dict(separate=True),
                                     dict(score="mlp", concat=True)], ids=["plain", "concat_diag", "separate", "mlp"])
def test_compositional_attention_is_eqs_7_to_14(options):
    m = randomize(CompositionalAttention(6, 2, 3, search_dim=8, value_dim=15, **options))
    x, mask = X(2, 4, 6), np.array([[1, 1, 1, 0], [1, 1, 1, 1]], bool)
    np.testing.assert_allclose(out(m(Tensor(x), key_mask=mask)), compositional_reference(m, x, mask, 2, 3, **options),
                               **TOL)


@pytest.mark.parametrize("name", ["mha", "compositional", "compositional-mlp"])
def test_crt_models_are_mlp_attention_mlp(name):
    """The CRT models (Mittal et al. 2022, App. C.1): x → Linear → ReLU → Linear → attention with the diagonal
    masked and the token's own projection appended (no residual, no LayerNorm) → Linear → ReLU → Linear. The
    ``mha`` baseline: h heads, softmax(Q Kᵀ/√d_s) V per head, [| x W_c] W_o."""
    model = randomize(CRTModel(name, 5, CRTConfig(searches=2, retrievals=3, d_model=6)))
    x = X(2, 4, 5)
    h = ref.linear(model.enc2, ref.relu(ref.linear(model.enc1, x)))
    attn = model.attn
    if name == "mha":
        H, ds, dv = attn.n_head, attn.d_s, attn.d_v
        q, k, v = ref.linear(attn.query, h), ref.linear(attn.key, h), ref.linear(attn.value, h)
        heads = np.zeros((2, 4, H * dv))
        for b in range(2):
            for hh in range(H):
                for i in range(4):
                    ok = np.arange(4) != i
                    A = ref.masked_softmax_row(np.array([q[b, i, hh * ds:(hh + 1) * ds] @ k[b, j, hh * ds:(hh + 1) * ds]
                                                         for j in range(4)]) / math.sqrt(ds), ok)
                    heads[b, i, hh * dv:(hh + 1) * dv] = A @ v[b, :, hh * dv:(hh + 1) * dv]
        a = ref.linear(attn.out, np.concatenate([heads, ref.linear(attn.own, h)], -1))
    else:
        a = compositional_reference(attn, h, None, 2, 3, score="dot" if name == "compositional" else "mlp",
                                    concat=True, mask_diagonal=True)
    want = ref.linear(model.dec2, ref.relu(ref.linear(model.dec1, a)))[..., 0]
    np.testing.assert_allclose(out(model(Tensor(x))), want, **TOL)
