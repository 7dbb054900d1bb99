"""Compositional attention, the Contextual Retrieval Task and its models (docs/compositional.md).

Gradient checks of every variant and option are rows of tests/library/test_gradcheck.py's MODULES table;
here: the reductions to multi-head attention (§5), the parameter counts of Table 6 (§6), the task
generator against a brute-force definition (§7) and its OOD split (§8), the drop-in use inside the
encoder, and the training command line. Section numbers (§) without "paper" are those of docs/compositional.md.
"""

import numpy as np
import pytest

import tasks
from minattn.data import compositional as retrieval  # noqa: E402
from minattn.attention.compositional import CompositionalAttention
from minattn.attention.multihead import MultiHeadAttention
from minattn.engine import Tensor, eval_mode, no_grad
from minattn.gradcheck import check_backward
from minattn.models.compositional import CRTConfig, CRTModel, CRTMultiHeadAttention, format_specialisation, specialisation
from minattn.models.encoder import Classifier, EncoderConfig


def _fixed_scores(ca, P):
    """Force the value scores c[s, r] = P[s, r] for every token (§5: "override c")."""
    def value_scores(q_bar, O_sr):
        B, S, T, R, _ = O_sr.shape
        return Tensor(np.broadcast_to(P[None, :, None, :], (B, S, T, R)).astype(O_sr.dtype))
    ca.value_scores = value_scores


def _zero_biases(module):
    for name, p in module.named_parameters():
        if name.endswith("bias"):
            p.data[...] = 0


# --- §3–4: the forward pass against the note's steps, written independently with einsum -------------------

def _softmax(z):
    e = np.exp(z - z.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def reference_forward(ca, x, key_mask=None):
    """§3.1 steps 1–7 (and §4 for the MLP score) from the module's weights; forbidden logits are −inf."""
    def lin(m, a):
        return a @ m.weight.data + m.bias.data
    B, T, _ = x.shape
    S, R, ds, dv = ca.S, ca.R, ca.d_s, ca.d_v
    Q, K, Q_bar = (lin(m, x).reshape(B, T, S, ds) for m in (ca.query, ca.key_search, ca.retrieval_query))
    V = lin(ca.value, x).reshape(B, T, R, dv)
    logits = np.einsum("bisd,bjsd->bsij", Q, K) / np.sqrt(ds)
    forbid = np.zeros((B, 1, T, T), bool) | (np.eye(T, dtype=bool) if ca.mask_diagonal else False)
    if key_mask is not None:
        forbid = forbid | ~key_mask[:, None, None, :]
    A = _softmax(np.where(forbid, -np.inf, logits))                           # (B, S, T, T)
    O_sr = np.einsum("bsij,bjrd->bisrd", A, V)                                # every search × every retrieval
    if ca.score == "mlp":
        w = ca.score_net.weight.data[:, 0]
        scores = (np.einsum("bisd,d->bis", Q_bar, w[:ds])[..., None] + np.einsum("bisrd,d->bisr", O_sr, w[ds:])
                  + ca.score_net.bias.data)
    else:
        K_bar = (np.einsum("bisrd,rde->bisre", O_sr, ca.w_key.data) + ca.b_key.data[:, 0] if ca.separate
                 else lin(ca.retrieval_key, O_sr))
        scores = np.einsum("bisd,bisrd->bisr", Q_bar, K_bar) / np.sqrt(ds)
    c = _softmax(scores)                                                      # (B, T, S, R)
    H = np.einsum("bisr,bisrd->bisd", c, O_sr).reshape(B, T, S * dv)
    if ca.concat:
        H = np.concatenate([H, lin(ca.own, x)], axis=-1)
    return lin(ca.out, H), A, c


@pytest.mark.parametrize("options", [dict(), dict(concat=True, mask_diagonal=True), dict(separate=True),
                                     dict(score="mlp"), dict(score="mlp", concat=True, mask_diagonal=True)])
def test_forward_matches_the_spec_steps(options):
    rng = np.random.default_rng(4)
    ca = CompositionalAttention(6, 2, 3, search_dim=8, value_dim=15, rng=rng, **options).double()
    for p in ca.parameters():                                                 # no zero biases (separate's b̄_k)
        p.data = p.data + 0.1 * rng.standard_normal(p.shape)
    x = rng.standard_normal((2, 5, 6))
    key_mask = np.array([[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]], bool)
    got = ca(Tensor(x), key_mask=key_mask, return_weights=True)
    for g, want in zip(got, reference_forward(ca, x, key_mask)):
        np.testing.assert_allclose(g.data, want, rtol=1e-10, atol=1e-12)


# --- §5: reductions to multi-head attention ---------------------------------------------------------------

@pytest.mark.parametrize("perm", [[0, 1, 2], [2, 0, 1]])
def test_fixed_permutation_scores_give_multihead_attention(perm):
    """S = R = h with c fixed to a permutation π: search s reads value V_π(s), i.e. MHA whose head s has
    (W_q^s, W_k^s, W_v^π(s)) and the same W_o (§5, paper Appendix B.1)."""
    C, H = 12, 3
    rng = np.random.default_rng(0)
    ca = CompositionalAttention(C, H, H, rng=rng).double()
    mha = MultiHeadAttention(C, H, rng=rng).double()
    _zero_biases(ca)                                   # the library's MHA has no biases
    _fixed_scores(ca, np.eye(H)[perm])
    w_v = np.concatenate([ca.value.weight.data[:, r * 4:(r + 1) * 4] for r in perm], axis=1)
    mha.w_q.data = ca.query.weight.data
    mha.w_kv.data = np.concatenate([ca.key_search.weight.data, w_v], axis=1)
    mha.out.weight.data = ca.out.weight.data
    x = rng.standard_normal((2, 5, C))
    key_mask = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], bool)
    np.testing.assert_allclose(ca(Tensor(x), key_mask=key_mask).data, mha(Tensor(x), key_mask=key_mask).data,
                               rtol=1e-12, atol=1e-12)


def test_one_retrieval_is_multihead_attention_with_one_shared_value():
    """R = 1: c ≡ 1, so the output is concat_s(A_s V) W_o, MHA whose S heads share one W_v (§5)."""
    C, S = 12, 3
    rng = np.random.default_rng(1)
    ca = CompositionalAttention(C, S, 1, value_dim=C // S, rng=rng).double()
    mha = MultiHeadAttention(C, S, rng=rng).double()
    _zero_biases(ca)
    mha.w_q.data = ca.query.weight.data
    mha.w_kv.data = np.concatenate([ca.key_search.weight.data] + [ca.value.weight.data] * S, axis=1)
    mha.out.weight.data = ca.out.weight.data
    x = rng.standard_normal((2, 4, C))
    y, _, c = ca(Tensor(x), return_weights=True)
    np.testing.assert_array_equal(c.data, 1.0)
    np.testing.assert_allclose(y.data, mha(Tensor(x)).data, rtol=1e-12, atol=1e-12)


def test_crt_baseline_is_compositional_attention_with_identity_scores():
    """The CRT form (biases, concat, diagonal mask) of both: copy CA's weights into the baseline, fix c = I."""
    D, h = 8, 2
    rng = np.random.default_rng(2)
    ca = CompositionalAttention(D, h, h, search_dim=12, value_dim=6, concat=True, mask_diagonal=True, rng=rng).double()
    mha = CRTMultiHeadAttention(D, h, search_dim=12, value_dim=6, rng=rng).double()
    for theirs, ours in [(mha.query, ca.query), (mha.key, ca.key_search), (mha.value, ca.value), (mha.own, ca.own),
                         (mha.out, ca.out)]:
        theirs.weight.data, theirs.bias.data = ours.weight.data, ours.bias.data
    _fixed_scores(ca, np.eye(h))
    x = Tensor(rng.standard_normal((3, 5, D)))
    y_ca, A_ca, _ = ca(x, return_weights=True)
    y_mha, A_mha, _ = mha(x, return_weights=True)
    np.testing.assert_allclose(y_ca.data, y_mha.data, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(A_ca.data, A_mha.data, rtol=1e-12, atol=1e-12)
    assert np.all(np.diagonal(A_ca.data, axis1=-2, axis2=-1) == 0)        # nobody finds itself


def test_weights_and_value_scores_are_distributions():
    ca = CompositionalAttention(8, 2, 4, concat=True, mask_diagonal=True)
    key_mask = np.array([[1, 1, 1, 1, 0, 0]], bool)
    y, A, c = ca(Tensor(np.random.default_rng(3).standard_normal((1, 6, 8))), key_mask=key_mask,
                 return_weights=True)
    assert y.shape == (1, 6, 8) and A.shape == (1, 2, 6, 6) and c.shape == (1, 6, 2, 4)
    np.testing.assert_allclose(A.data.sum(-1), 1, rtol=1e-6)
    np.testing.assert_allclose(c.data.sum(-1), 1, rtol=1e-6)
    assert np.all(A.data[..., 4:] == 0) and np.all(np.diagonal(A.data, axis1=-2, axis2=-1) == 0)


@pytest.mark.parametrize("kwargs,message", [
    (dict(d_model=8, n_search=3, n_retrieval=2), "multiple of n_search"),
    (dict(d_model=8, n_search=2, n_retrieval=3), "multiple of n_retrieval"),
    (dict(d_model=8, n_search=2, n_retrieval=2, score="cosine"), "unknown value score"),
    (dict(d_model=8, n_search=2, n_retrieval=2, score="mlp", separate=True), "needs score='dot'"),
])
def test_bad_configurations_are_clear_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        CompositionalAttention(**kwargs)


# --- §6: parameter counts (paper Table 6) -------------------------------------------------------------------

@pytest.mark.parametrize("S,R,D,counts", [
    (2, 4, 64, {2: 30_113, 4: 28_049, 8: 27_017, "ca": 30_705}),
    (2, 4, 128, {2: 117_569, 4: 109_345, 8: 105_233, "ca": 119_777}),
    (4, 8, 256, {4: 439_361, 8: 422_945, 32: 410_633, "ca": 458_081}),
    (4, 16, 256, {4: 449_601, 16: 424_977, 64: 418_821, "ca": 442_705}),
])
def test_parameter_counts_match_table_6(S, R, D, counts):
    in_dim = tasks.RetrievalTask(S, R).in_dim
    for key, expected in counts.items():
        cfg = CRTConfig(searches=S, retrievals=R, d_model=D, n_head=0 if key == "ca" else key)
        model = CRTModel("compositional" if key == "ca" else "mha", in_dim, cfg)
        assert model.num_parameters() == expected, key


# --- §7: the task generator ---------------------------------------------------------------------------------

def brute_force_labels(x, S, R):
    """The definition, object by object, from the model's input alone (Eqs. 15–18)."""
    B, N, _ = x.shape
    y = np.zeros((B, N))
    for b in range(B):
        for i in range(N):
            for s in range(S):
                r = int(np.argmax(x[b, i, S + R + s * R:S + R + (s + 1) * R]))     # one-hot, search-major
                nearest = min((j for j in range(N) if j != i), key=lambda j: abs(float(x[b, j, s]) - float(x[b, i, s])))
                y[b, i] += retrieval.RETRIEVAL_ALPHAS[s] * x[b, nearest, S + r]
    return y


@pytest.mark.parametrize("S,R,pool", [(2, 4, "all"), (2, 4, "train"), (2, 4, "test"), (3, 3, "test"), (1, 2, "all")])
def test_labels_match_the_brute_force_definition(S, R, pool):
    task = tasks.RetrievalTask(S, R, n_objects=7)
    x, y, prefs = task.batch(16, np.random.default_rng(S * 10 + R), pool)
    assert x.shape == (16, 7, S + R + S * R) and x.dtype == np.float32 and y.shape == (16, 7)
    np.testing.assert_array_equal(x[..., S + R:].reshape(16, 7, S, R).argmax(-1), prefs)
    np.testing.assert_array_equal(x[..., S + R:].sum(-1), S)                   # exactly one 1 per search
    np.testing.assert_allclose(y, brute_force_labels(x.astype(np.float64), S, R), rtol=1e-5, atol=1e-5)


def test_the_docstring_example_and_ties_go_to_the_lowest_index():
    task = tasks.RetrievalTask(2, 2, n_objects=3)
    z = np.array([[[0.0, 1.0, 5, 6], [0.3, -2.0, 7, 8], [1.0, 0.8, 9, 10]]])
    prefs = np.array([[[1, 0], [0, 0], [0, 0]]])
    assert task.labels(z, prefs)[0, 0] == pytest.approx(-0.71347752 * 8 - 0.6062312 * 9)
    # object 1 sits between 0 and 2 at equal distances on search 0: it must retrieve from object 0
    z = np.array([[[-1.0, 5, 0, 0], [0.0, 0, 0, 0], [1.0, 7, 0, 0]]])
    task = tasks.RetrievalTask(1, 3, n_objects=3)
    assert task.labels(z, np.zeros((1, 3, 1), int))[0, 1] == pytest.approx(-0.71347752 * 5)


def test_batches_are_a_pure_function_of_the_generator_and_fresh_each_call():
    task = tasks.RetrievalTask()
    a = task.batch(8, np.random.default_rng(5), "train")
    b = task.batch(8, np.random.default_rng(5), "train")
    for u, v in zip(a, b):
        np.testing.assert_array_equal(u, v)
    rng = np.random.default_rng(5)
    assert not np.array_equal(task.batch(8, rng)[0], task.batch(8, rng)[0])


def test_pools_draw_only_their_combinations():
    task = tasks.RetrievalTask(2, 4)
    train_set, test_set = (set(map(tuple, task.combinations(p).tolist())) for p in ("train", "test"))
    for pool, allowed in [("train", train_set), ("test", test_set), ("all", train_set | test_set)]:
        drawn = set(map(tuple, task.batch(512, np.random.default_rng(0), pool)[2].reshape(-1, 2).tolist()))
        assert drawn == allowed, pool                                          # all of them, and only them


@pytest.mark.parametrize("kwargs,message", [
    (dict(searches=9), "searches must be in 1..8"), (dict(retrievals=0), "retrievals ≥ 1"),
    (dict(n_objects=1), "n_objects ≥ 2"),
])
def test_bad_task_settings_are_clear_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        tasks.RetrievalTask(**kwargs)


def test_unknown_pool_and_empty_test_pool_are_clear_errors():
    with pytest.raises(ValueError, match="valid pools: all, train, test"):
        tasks.RetrievalTask().batch(2, np.random.default_rng(0), "valid")
    with pytest.raises(ValueError, match="no held-out combination"):
        tasks.RetrievalTask(1, 1).batch(2, np.random.default_rng(0), "test")


# --- §8: the OOD split --------------------------------------------------------------------------------------

@pytest.mark.parametrize("S,R,n_train,n_test,test", [
    (2, 2, 3, 1, [(1, 1)]),
    (2, 4, 12, 4, [(2, 1), (2, 3), (3, 1), (3, 3)]),                          # paper Table 5
    (3, 3, 21, 6, None), (4, 8, 3_276, 820, None), (4, 16, 52_428, 13_108, None), (1, 2, 1, 1, [(1,)]),
])
def test_ood_split_reproduces_the_worked_examples(S, R, n_train, n_test, test):
    tr, te = retrieval.retrieval_combinations(S, R)
    assert (len(tr), len(te)) == (n_train, n_test)
    if test is not None:
        assert list(map(tuple, te.tolist())) == test
    assert len(set(map(tuple, np.concatenate([tr, te]).tolist()))) == R ** S    # a partition of all tuples
    if S > 1:                                                                  # §8: each single choice
        assert all(set(tr[:, s].tolist()) == set(range(R)) for s in range(S))  # occurs in training
    if (S, R) == (2, 2):
        assert tr.tolist() == [[0, 0], [1, 0], [0, 1]]


# --- §9 and the value-score table (paper Fig. 5) ------------------------------------------------------------

def test_specialisation_table_of_a_perfect_model():
    prefs = np.random.default_rng(0).integers(0, 3, (50, 4, 2))
    c = np.eye(3)[prefs]                                   # model search s = ground-truth search s, exactly
    M = specialisation(c, prefs, 3)
    assert M.shape == (2, 3, 2, 3)
    for g in range(2):
        np.testing.assert_allclose(M[g, :, g, :], np.eye(3))
    text = format_specialisation(M)
    assert len(text.splitlines()) == 2 + 6 and "s1 r2" in text


def test_crt_model_masks_the_diagonal_and_returns_the_scores():
    model = CRTModel("compositional", 14, CRTConfig())
    y, A, c = model(Tensor(np.zeros((2, 10, 14), np.float32)), return_weights=True)
    assert y.shape == (2, 10) and A.shape == (2, 2, 10, 10) and c.shape == (2, 10, 2, 4)
    assert np.all(np.diagonal(A.data, axis1=-2, axis2=-1) == 0)
    with pytest.raises(ValueError, match="valid models: mha, compositional, compositional-mlp"):
        CRTModel("transformer", 14, CRTConfig())


# --- drop-in replacement inside the encoder -----------------------------------------------------------------

def _encoder_cfg(**kw):
    return EncoderConfig(d_model=8, n_head=2, d_ff=12, n_steps=2, dropout=0.0, attention_dropout=0.0,
                         gate_dropout=0.0, **kw)


def test_encoder_drop_in_selects_searches_and_retrievals_and_ignores_padding():
    model = Classifier("transformer-compositional", 20, 4, _encoder_cfg(n_search=2, n_retrieval=4)).eval()
    attn = model.encoder.layer.attn
    assert isinstance(attn, CompositionalAttention) and (attn.S, attn.R) == (2, 4)
    default = Classifier("transformer-compositional", 20, 4, _encoder_cfg()).encoder.layer.attn
    assert (default.S, default.R) == (2, 2)                                  # S = R = n_head by default
    ids, lengths = np.array([[21, 3, 4, 20, 0], [21, 1, 2, 5, 20]]), np.array([4, 5])
    with no_grad(), eval_mode():
        ref = model(ids, lengths).data
        longer = np.concatenate([ids, np.full((2, 3), 7)], axis=1)           # more padding, other pad ids
        longer[0, 4] = 9
        np.testing.assert_allclose(model(longer, lengths).data, ref, rtol=1e-5, atol=1e-6)
        trace = []
        model(ids, lengths, trace=trace)
    assert len(trace) == 2 and trace[0][0].shape == (2, 2, 5, 5)
    assert np.all(trace[0][0].data[0, :, :, 4] < 1e-6)                      # padding receives no attention
    check_backward(lambda i, n: model(i, n), [ids, lengths], params=model)
