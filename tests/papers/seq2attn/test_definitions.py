"""seq2attn's definitions (Korrel et al. 2019; docs/seq2attn.md), each pinned by a test that names its row
of docs/seq2attn.md's table "Definitions and the tests that pin them": the additive attention with Gumbel
straight-through and its temperatures, the decoder's step (Eqs. 1-12), the loss, the initial values and the
optimizer each preset builds. Random float64 parameters, small random inputs, the equation in plain NumPy
(tests/defs_reference.py), loops where clearer.
"""
import math

import numpy as np
import pytest

from minattn import nn, optim
from minattn.attention.additive import AdditiveAttention
from minattn.backend import RNG
from minattn.engine import Tensor, eval_mode
from minattn.lab.recipes import Seq2Attn as Seq2AttnRecipe
from minattn.lab.recipes.base import optimizer, schedule
from minattn.lab.settings import make_config
from minattn.models.seq2attn import Seq2Attn, model_config
from tests import defs_reference as ref
from tests.defs_reference import TOL, X, arr, out, randomize


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
    """docs/seq2attn.md Eqs. 5-8:
    Eqs. 5-8: the soft sample y = softmax((e + g)/τ); straight-through: one_hot(argmax y) forward; at
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
    """docs/seq2attn.md Eqs. 1-12: one decoding step of every variant, teacher-forced and free."""
    name, options = S2A_VARIANTS[variant]
    model = randomize(Seq2Attn(model_config(name, d_embedding=4, d_hidden=4, **options), 7, 6, sos_id=2)).eval()
    with eval_mode():
        forced, _ = model.decode(SRC, SRC_LEN, 3, TGT, teacher_forcing=1.0)
        free, _ = model.decode(SRC, SRC_LEN, 3)
    np.testing.assert_allclose(out(forced), seq2attn_reference(model, SRC, SRC_LEN, 3, TGT), **TOL)
    np.testing.assert_allclose(out(free), seq2attn_reference(model, SRC, SRC_LEN, 3), **TOL)


@pytest.mark.parametrize("name", ["seq2attn", "seq2seq", "seq2attn_lstm_2layer"])
def test_seq2attn_evaluation_loss_feeds_back_its_own_predictions(name):
    """docs/seq2attn.md §1.6 loss:
    The loss (docs/seq2attn.md §1.6; the reference's validation loss): Σ_t −log p(y_t) over each sequence's
    real targets, averaged over the batch; at evaluation the model feeds back its own argmax, never the gold
    prefix."""
    name, options = S2A_VARIANTS[name]
    model = randomize(Seq2Attn(model_config(name, d_embedding=4, d_hidden=4, teacher_forcing=1.0, **options), 7, 6,
                               sos_id=2)).eval()
    logits = seq2attn_reference(model, SRC, SRC_LEN, 3)
    logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    want = -sum(logp[b, t, TGT[b, t]] for b in range(2) for t in range(TGT_LEN[b])) / 2
    np.testing.assert_allclose(float(out(model.loss(SRC, SRC_LEN, TGT, TGT_LEN))), want, **TOL)


def test_seq2seq_training_loss_with_teacher_forcing_feeds_the_gold_prefix():
    """docs/seq2attn.md Teacher forcing:
    In training with teacher-forcing probability 1 every step reads the gold y_{t−1} (docs/seq2attn.md
    §1.6)."""
    model = randomize(Seq2Attn(model_config("seq2seq", d_embedding=4, d_hidden=4, teacher_forcing=1.0), 7, 6,
                               sos_id=2))
    logits = seq2attn_reference(model, SRC, SRC_LEN, 3, TGT)
    logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    want = -sum(logp[b, t, TGT[b, t]] for b in range(2) for t in range(TGT_LEN[b])) / 2
    model.set_rng(RNG(0))
    np.testing.assert_allclose(float(out(model.loss(SRC, SRC_LEN, TGT, TGT_LEN))), want, **TOL)


# --- initial values, dropout and what a run builds (docs/seq2attn.md §1.8; the reference code) -------------


@pytest.mark.parametrize("name,cell", [("seq2attn", "gru"), ("seq2seq", "lstm")])
def test_every_parameter_starts_uniform_0_08_but_the_temperature(name, cell):
    """docs/seq2attn.md Init: every parameter (embeddings, RNN weights and biases, attention MLP, output
    layer, the learned decoder init h_0) U(−0.08, 0.08); the temperature estimator keeps its default
    (w_τ, b_τ ~ U(±1/√H)) and the latent θ = log τ_init."""
    H = 100
    for temperature in ("conditioned", "latent"):
        cfg = model_config(name, d_embedding=H, d_hidden=H, cell=cell, n_layers=2, temperature=temperature,
                           tau_init=3.0)
        model = Seq2Attn(cfg, 30, 20, sos_id=2)
        for key, p in model.named_parameters():
            w = arr(p)
            if key.startswith("attention.log_tau"):
                np.testing.assert_allclose(w, [math.log(3.0)], rtol=1e-7)
            elif key.startswith("attention.w_tau."):
                assert np.abs(w).max() <= 1 / math.sqrt(H) and (w.size < 50 or np.abs(w).max() > 0.09), key
            else:
                assert np.abs(w).max() <= 0.08 and (w.size < 50 or np.abs(w).max() > 0.07), key


def test_stacked_rnns_drop_out_between_layers_only():
    """docs/seq2attn.md Inter-layer dropout: a stack of RNN cells drops out the output of every layer but
    the last, as the next layer's input (PyTorch's ``dropout``): not the input, not the top output, not the
    state; with one layer it is a no-op."""
    model = randomize(Seq2Attn(model_config("seq2seq", d_embedding=4, d_hidden=4, cell="lstm", n_layers=3,
                                            dropout=0.4), 7, 6, sos_id=2))
    model.set_rng(RNG(3))
    rnn, x = model.encoder, X(2, 4)
    state = [(X(2, 4, seed=i), X(2, 4, seed=10 + i)) for i in range(3)]
    with ref.recorded_masks(nn.Dropout) as masks:
        top, new = rnn(Tensor(x), [(Tensor(h), Tensor(c)) for h, c in state])
    assert [d.shape for d in masks] == [(2, 4), (2, 4)], "a mask before layers 2 and 3"
    inp = x
    for i, (cell, (h, c)) in enumerate(zip(rnn.cells, state)):
        want_h, want_c = ref.lstm(cell, inp * masks[i - 1] if i else inp, h, c)
        np.testing.assert_allclose(out(new[i][0]), want_h, **TOL)
        np.testing.assert_allclose(out(new[i][1]), want_c, **TOL)
        inp = want_h
    np.testing.assert_allclose(out(top), inp, **TOL)
    one = Seq2Attn(model_config("seq2attn", d_embedding=4, d_hidden=4, dropout=0.5), 7, 6, sos_id=2).set_rng(RNG(3))
    with ref.recorded_masks(nn.Dropout) as masks:
        one.loss(SRC, SRC_LEN, TGT, TGT_LEN)
    assert masks == [], "one layer: the released config's dropout 0.5 does nothing"


SEQ2ATTN_PRESETS = [(t, m) for t in Seq2AttnRecipe.tasks for m in Seq2AttnRecipe.models]


@pytest.mark.parametrize("task,model", SEQ2ATTN_PRESETS)
def test_each_preset_builds_adam_and_clips_at_5(task, model):
    """docs/seq2attn.md Optimizer: Adam, β (0.9, 0.999), ε 1e-8, no decay (AdamW at weight decay 0: the
    same update), a constant rate (1e-3 in the paper preset; the cpu preset's SCAN seq2attn 3e-4), global
    gradient-norm clipping at 5; the optimizer follows the run's own lr and weight decay, given or preset."""
    options = dict(split="simple") if task == "scan" else {}
    params = [nn.Parameter(np.full(3, 2.0))]
    for preset in ("paper", "cpu"):
        for given in ({}, dict(lr=2.5e-3, weight_decay=0.0375)):
            cfg = schedule(make_config(task, model, preset, **options, **given))
            paper_lr = 3e-4 if (task, model, preset) == ("scan", "seq2attn", "cpu") else 1e-3
            assert (cfg.lr, cfg.weight_decay, cfg.grad_clip) == (given.get("lr", paper_lr),
                                                                 given.get("weight_decay", 0.0), 5.0)
            ref.check_optimizer(optimizer(cfg, params), cfg, optim.AdamW, (0.9, 0.999), 1e-8,
                                lambda t: cfg.lr, steps=(1, 2, 1000))


# Paper Table 3 (E, H, layers, cell, dropout) and the released config's components.
PAPER_MODELS = {
    ("lookup", "seq2attn"): (256, 256, 1, "gru", 0.5, True), ("lookup", "seq2seq"): (128, 512, 1, "gru", 0.5, False),
    ("scan", "seq2attn"): (512, 512, 1, "gru", 0.5, True), ("scan", "seq2seq"): (200, 200, 2, "lstm", 0.5, False),
}


@pytest.mark.parametrize("task,model", list(PAPER_MODELS))
def test_paper_presets_have_table_3s_sizes_and_the_released_components(task, model):
    """docs/seq2attn.md Table 3 and the released config: embedding and RNN sizes, layers, cell and dropout of
    paper Table 3 (dropout 0.5 acts only between stacked layers); seq2attn has all four components (Gumbel
    straight-through G, embedding values E, full focus F, transcoder T), the baseline none; the conditioned
    temperature with τ_max = 5, teacher forcing 0.5."""
    E, H, layers, cell, dropout, full = PAPER_MODELS[task, model]
    cfg = make_config(task, model, "paper", **(dict(split="simple") if task == "scan" else {})).model_config
    assert (cfg.d_embedding, cfg.d_hidden, cfg.n_layers, cfg.cell, cfg.dropout) == (E, H, layers, cell, dropout)
    assert (cfg.gumbel, cfg.embedding_values, cfg.full_focus, cfg.transcoder) == (full,) * 4
    assert (cfg.temperature, cfg.tau_max, cfg.teacher_forcing) == ("conditioned", 5.0, 0.5)
