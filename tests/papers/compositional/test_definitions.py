"""Compositional attention's definitions (Mittal et al. 2022; docs/compositional.md), each pinned by a test
that names its row of docs/compositional.md's table "Definitions and the tests that pin them": Eqs. 7-14 with
their options, the CRT models and the optimizer each preset builds. Random float64 parameters, small random
inputs, the equation in plain NumPy (tests/defs_reference.py), loops where clearer.
"""
import math

import numpy as np
import pytest

from minattn import nn, optim
from minattn.attention.compositional import CompositionalAttention
from minattn.engine import Tensor
from minattn.lab.recipes import Compositional
from minattn.lab.recipes.base import optimizer, schedule
from minattn.lab.settings import make_config
from minattn.models.compositional import CRTConfig, CRTModel
from tests import defs_reference as ref
from tests.defs_reference import TOL, X, arr, out, randomize


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
    """docs/compositional.md Eqs. 7-14: compositional attention, with its options."""
    m = randomize(CompositionalAttention(6, 2, 3, search_dim=8, value_dim=15, **options))
    x, mask = X(2, 4, 6), np.array([[1, 1, 1, 0], [1, 1, 1, 1]], bool)
    np.testing.assert_allclose(out(m(Tensor(x), key_mask=mask)), compositional_reference(m, x, mask, 2, 3, **options),
                               **TOL)


@pytest.mark.parametrize("name", ["mha", "compositional", "compositional-mlp"])
def test_crt_models_are_mlp_attention_mlp(name):
    """docs/compositional.md App. C.1 CRT models:
    The CRT models (Mittal et al. 2022, App. C.1): x → Linear → ReLU → Linear → attention with the diagonal
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


# --- initial values and what a run builds (docs/compositional.md §3.4, §7) ---------------------------------


def test_separate_retrieval_keys_start_as_the_codes_group_linear():
    """docs/compositional.md GroupLinear init: with ``separate`` each retrieval's W̄_k^r ~ U(±√(6/(d_v +
    d_r))) (d_r = d_s) and b̄_k^r = 0; every other layer PyTorch's Linear default U(±1/√fan_in)."""
    m = CompositionalAttention(64, 2, 4, search_dim=64, value_dim=128, separate=True)
    bound = math.sqrt(6 / (32 + 32))
    w = arr(m.w_key)
    assert np.abs(w).max() <= bound and np.abs(w).max() > 0.95 * bound and not arr(m.b_key).any()
    q = arr(m.query.weight)
    assert np.abs(q).max() <= 1 / math.sqrt(64) and np.abs(q).max() > 0.95 / math.sqrt(64)


@pytest.mark.parametrize("model", list(Compositional.models))
def test_each_preset_builds_adam_at_1e_4_without_decay_clipping_or_schedule(model):
    """docs/compositional.md Optimizer: Adam lr 1e-4, β (0.9, 0.999), ε 1e-8, no weight decay (AdamW at 0: the
    same update), no clipping, no schedule; the optimizer follows the run's own lr and weight decay, given
    or preset."""
    params = [nn.Parameter(np.full(3, 2.0))]
    for preset in ("paper", "cpu"):
        for given in ({}, dict(lr=2.5e-3, weight_decay=0.0375)):
            cfg = schedule(make_config("retrieval", model, preset, **given))
            want = (given.get("lr", 1e-4), given.get("weight_decay", 0.0), 0.0)
            assert (cfg.lr, cfg.weight_decay, cfg.grad_clip) == want
            ref.check_optimizer(optimizer(cfg, params), cfg, optim.AdamW, (0.9, 0.999), 1e-8,
                                lambda t: cfg.lr, steps=(1, 2, 1000))


@pytest.mark.parametrize("model", list(Compositional.models))
def test_the_crt_run_is_l1_over_every_output_at_the_papers_settings(model):
    """docs/compositional.md §9 CRT training: 2 searches, 4 retrievals, D = 64, `concat` on, 10 objects;
    batch 256, 100,000 steps (each a fresh batch), an evaluation every 5,000; the loss is the mean absolute
    error over every object's output, L = mean_{b,i} |ŷ_bi − y_bi|."""
    cfg = make_config("retrieval", model, "paper")
    e = cfg.model_config
    assert (e.searches, e.retrievals, e.d_model, e.concat, cfg.options.n_objects) == (2, 4, 64, True, 10)
    assert (cfg.batch_size, cfg.steps, cfg.eval_every) == (256, 100_000, 5000)
    recipe = Compositional(make_config("retrieval", model, "cpu", batch_size=4))
    recipe.load_task()
    net = randomize(recipe.build_model())
    x, y = next(recipe.batches(np.random.default_rng(0)))[:2]
    loss, _, n = recipe.loss(net, (x.astype(np.float64), y.astype(np.float64)))
    assert n == 4 and y.shape == (4, 10)
    np.testing.assert_allclose(float(out(loss)), np.abs(out(net(Tensor(x.astype(np.float64)))) - y).mean(), **TOL)


@pytest.mark.parametrize("model", list(Compositional.models))
def test_crt_models_apply_no_dropout(model):
    """docs/compositional.md No dropout: the CRT models (the paper's App. C.1, the CRT code) have no dropout
    anywhere, so training and evaluation compute the same function."""
    net = randomize(CRTModel(model, 5, CRTConfig(searches=2, retrievals=3, d_model=6))).train()
    x = X(2, 4, 5)
    with ref.recorded_masks(nn.Dropout) as masks:
        y = out(net(Tensor(x)))
    assert masks == []
    np.testing.assert_array_equal(out(net.eval()(Tensor(x))), y)
