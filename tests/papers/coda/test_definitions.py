"""CoDA's definitions (Tay et al. 2019; docs/coda.md), each pinned by a test that names its row of
docs/coda.md's table "Definitions and the tests that pin them": the quasi-attention of Eqs. 1-10 with every
Table 9 composition, its causal and sequence-to-sequence forms, the pairwise form, its dropout site and the
optimizer its presets build. Random float64 parameters, small random inputs, the equation in plain NumPy
(tests/defs_reference.py), loops where clearer.
"""
import dataclasses
import math

import numpy as np
import pytest

from minattn import nn, optim
from minattn.attention.coda import COMPOSITIONS, CoDAConfig, CoDAttention, PairwiseCoDA
from minattn.backend import RNG
from minattn.engine import Tensor, eval_mode
from minattn.lab.recipes import CoDA
from minattn.lab.recipes.base import WarmupAdamW, optimizer, schedule
from minattn.lab.settings import make_config
from minattn.models.seq2seq import CoDASeq2SeqTransformer, EncoderDecoderConfig
from tests import defs_reference as ref
from tests.defs_reference import TOL, X, arr, out, randomize

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


def coda_reference(m, x, key_mask, causal, alpha, beta, gate, center_e, composition, row_mean, scale=True,
                   drop=None):
    """CoDA in the Transformer (Eq. 10), head by head: E = α Q Kᵀ/√d_k, N = −β ‖q_i − k_j‖₁/√d_k,
    Out = Concat_h(M_h V_h) W_o with M from ``quasi_reference``; Mean(·) counts real keys and real queries.
    ``drop`` (B, H, T, T): a dropout mask on M (docs/coda.md §2, the base model's attention dropout)."""
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
            heads[b, :, sl] = (M if drop is None else M * drop[b, h]) @ v[b, :, sl]
    return ref.linear(m.out, heads)


@pytest.mark.parametrize("composition", COMPOSITIONS)
@pytest.mark.parametrize("gate,center_e,row_mean", [("scaled", False, False), ("centered", False, False),
                                                    ("centered", True, False), ("centered", True, True)])
def test_coda_is_eq_10_with_every_table_9_composition(composition, gate, center_e, row_mean):
    """docs/coda.md Eq. 10, Table 9: CoDA in the Transformer, every composition and centring."""
    m = randomize(CoDAttention(6, 2, alpha=0.7, beta=0.4, gate=gate, center_e=center_e, composition=composition,
                               row_mean=row_mean, bias=True))
    x = X(2, 5, 6)
    want = coda_reference(m, x, MASK5, False, 0.7, 0.4, gate, center_e, composition, row_mean)
    np.testing.assert_allclose(out(m(Tensor(x), key_mask=MASK5)), want, **TOL)


@pytest.mark.parametrize("gate", ["scaled", "centered"])
def test_coda_causal_and_unscaled(gate):
    """docs/coda.md Causal, footnote 3:
    The decoder's causal CoDA (future keys weight 0, Mean per row) and footnote 3's unscaled form."""
    m = randomize(CoDAttention(6, 2, gate=gate, center_e=True, row_mean=True, scale=False))
    x = X(2, 4, 6)
    want = coda_reference(m, x, None, True, 1.0, 1.0, gate, True, "tanh-sigmoid", True, scale=False)
    np.testing.assert_allclose(out(m(Tensor(x), causal=True)), want, **TOL)


def test_coda_centred_gate_subtracts_the_mean():
    """docs/coda.md Eq. 4 sign:
    Eq. 4's sign: σ(N − Mean N) opens the gate for pairs closer than average (N above its mean): the gate
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
    """docs/coda.md §6 seq2seq CoDA:
    transformer-seq2seq-coda (docs/coda.md §6): every attention is CoDA; the decoder's causal self- and
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
    """docs/coda.md Eqs. 1-7:
    Pairwise CoDA (Eqs. 1-7): E = α F_E(A) F_E(B)ᵀ, N_ij = −β ‖F_N(a_i) − F_N(b_j)‖₁, M as Eqs. 3-6,
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


# --- dropout and what a run builds (docs/coda.md §2, §6) --------------------------------------------------


def test_coda_drops_out_the_quasi_attention_matrix():
    """docs/coda.md M dropout: the base model's attention dropout acts on M (where softmax attention drops
    its weights), one inverted-dropout mask per call: Out = Concat_h(Drop(M_h) V_h) W_o; none at
    evaluation."""
    m = randomize(CoDAttention(6, 2, attention_dropout=0.4, gate="centered", center_e=True, bias=True))
    m.set_rng(RNG(3))
    x = X(2, 5, 6)
    with ref.recorded_masks(nn.Dropout) as masks:
        y = out(m(Tensor(x), key_mask=MASK5))
    assert [d.shape for d in masks] == [(2, 2, 5, 5)], "one mask, on M (B, H, T, T)"
    args = (m, x, MASK5, False, 1.0, 1.0, "centered", True, "tanh-sigmoid", False)
    np.testing.assert_allclose(y, coda_reference(*args, drop=masks[0]), **TOL)
    with eval_mode():
        np.testing.assert_allclose(out(m(Tensor(x), key_mask=MASK5)), coda_reference(*args), **TOL)


def test_mlu_presets_set_beta_to_one_over_sqrt_d_k():
    """docs/coda.md β = 1/√d_k: both presets set CoDA's β to 1/√d_k (so N = G/d_k with the 1/√d_k
    scaling of §3), α = 1, the centred gate off (Eq. 5's 2σ(N)), and every attention of the CoDA model
    uses them; so does the encoder drop-in ``transformer-coda`` of the NDR tasks."""
    for preset in ("paper", "cpu"):
        cfg = make_config("mlu", "transformer-seq2seq-coda", preset).model_config
        assert math.isclose(cfg.coda_beta, 1 / math.sqrt(cfg.d_head)) and cfg.coda_alpha == 1.0
        small = dataclasses.replace(cfg, d_model=8, n_head=2, d_head=4, d_ff=8)
        model = CoDASeq2SeqTransformer(5, 5, small, d_src=3)
        for a in (model.encoder[0].attn, model.decoder[0].self_attn, model.decoder[0].cross[0]):
            assert (type(a), a.alpha, a.beta, a.gate) == (CoDAttention, 1.0, small.coda_beta, small.coda_gate)
    for task in ("ctl", "arith", "listops"):
        for preset in ("paper", "cpu"):
            cfg = make_config(task, "transformer-coda", preset).model_config
            assert math.isclose(cfg.coda_beta, 1 / math.sqrt(cfg.d_model / cfg.n_head)), (task, preset)


@pytest.mark.parametrize("model", list(CoDA.models))
def test_each_preset_builds_adam_with_the_transformer_warmup(model):
    """docs/coda.md Optimizer: Adam β (0.9, 0.98), ε 1e-9 (AdamW without decay: the same update), the rate
    rising linearly to the run's lr over its ``warmup`` steps, then lr·√(warmup/t) (Vaswani et al. 2017
    §5.3), at the run's lr, decay and warm-up, given or preset; no gradient clipping."""
    params = [nn.Parameter(np.full(3, 2.0))]
    for preset in ("paper", "cpu"):
        for given in ({}, dict(lr=2.5e-3, weight_decay=0.0375, warmup=30)):
            cfg = schedule(make_config("mlu", model, preset, **given))
            w = cfg.options.warmup
            assert (cfg.lr, cfg.weight_decay, cfg.grad_clip, w) == (
                given.get("lr", 1e-3), given.get("weight_decay", 0.0), 0.0,
                given.get("warmup", 4000 if preset == "paper" else 1000))
            rate = lambda t: cfg.lr * min(t / w, math.sqrt(w / t))  # noqa: E731
            ref.check_optimizer(optimizer(cfg, params), cfg, WarmupAdamW, (0.9, 0.98), 1e-9, rate,
                                steps=(1, 2, w // 2, w, 4 * w))
    assert issubclass(WarmupAdamW, optim.AdamW)
