"""CoDA quasi-attention (docs/coda.md): the fused L1 distance against its definition and its memory bound,
Eq. 10 against a direct NumPy computation, masks that give exactly zero weight, stability at huge distances
and with every key masked, the gate at initialisation (§3) and in the training logs, the MLU generator
(§5) and its training recipe (minattn/lab/recipes/coda.py). Gradients are checked in tests/library/test_gradcheck.py.
Section numbers (§) without "paper" are those of docs/coda.md."""
import math
import os
import sys
import tracemalloc

import numpy as np
import pytest

from minattn import backend
from minattn.attention import coda
from minattn.attention.coda import CoDAttention, PairwiseCoDA, l1_distance, l1_distance_reference, quasi_attention
from minattn.attention.multihead import MultiHeadAttention
from minattn.engine import Tensor, eval_mode, no_grad
from minattn.gradcheck import GradcheckError, check_backward
from minattn.models.seq2seq import (CoDAEncoderDecoderConfig, CoDASeq2SeqTransformer, EncoderDecoderConfig,
                                    Seq2SeqTransformer)

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))))
import tasks  # noqa: E402
from minattn.data import coda as mlu_data  # noqa: E402
from minattn.lab import recipes  # noqa: E402


def _normal(*shape, seed=0, scale=1.0):
    return (scale * np.random.default_rng(seed).standard_normal(shape)).astype(np.float32)


# --- the L1 distance ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("block", [None, 1, 7, 60, 500])   # one block; rows of one query; several slabs
def test_fused_l1_equals_the_definition_values_and_gradients(block, device):
    q, k = _normal(3, 2, 5, 4), _normal(3, 2, 6, 4, seed=1)
    g = _normal(3, 2, 5, 6, seed=2)
    results = []
    for fn in (lambda a, b: l1_distance(a, b, block), l1_distance_reference):
        a, b = (Tensor(backend.to_device(x, device), requires_grad=True) for x in (q, k))
        D = fn(a, b)
        D.backward(backend.to_device(g, device))
        results.append([backend.to_numpy(t) for t in (D.data, a.grad, b.grad)])
    for fused, naive in zip(*results):
        np.testing.assert_allclose(fused, naive, rtol=1e-5, atol=1e-5)
    naive_D = np.abs(q[..., :, None, :] - k[..., None, :, :]).sum(-1)
    np.testing.assert_allclose(results[0][0], naive_D, rtol=1e-5)


def test_l1_sign_at_ties_is_zero():
    q = Tensor(np.array([[[1.0, 2.0]]]), requires_grad=True)
    k = Tensor(np.array([[[1.0, 0.0]]]), requires_grad=True)
    l1_distance(q, k).backward(np.ones((1, 1, 1)))
    np.testing.assert_array_equal(q.grad, [[[0.0, 1.0]]])     # sign(0) = 0 (§3.1)
    np.testing.assert_array_equal(k.grad, [[[0.0, -1.0]]])


def test_a_planted_wrong_l1_backward_fails_the_check():
    class ForgetsKeySign(coda.L1Distance):
        def backward(self, gD):
            gq, gk = super().backward(gD)
            return gq, -gk
    q, k = np.random.default_rng(0).standard_normal((2, 3, 4)), np.random.default_rng(1).standard_normal((2, 5, 4))
    with pytest.raises(GradcheckError, match="input1"):
        check_backward(lambda a, b: ForgetsKeySign()(a, b), [q, k])


def _peak_bytes(fn):
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_fused_l1_memory_stays_bounded_where_the_composite_does_not():
    """(8, 4, 64, 64, 32) differences are 16 MiB in float32; the fused op never holds them."""
    q, k, g = _normal(8, 4, 64, 32), _normal(8, 4, 64, 32, seed=1), _normal(8, 4, 64, 64, seed=2)

    def run(fn):
        a, b = Tensor(q, requires_grad=True), Tensor(k, requires_grad=True)
        fn(a, b).backward(g)
    result = 8 * 4 * 64 * 64 * 4                     # bytes of D (and of its gradient)
    fused = _peak_bytes(lambda: run(lambda a, b: l1_distance(a, b, block=1 << 14)))
    naive = _peak_bytes(lambda: run(l1_distance_reference))
    assert naive > 16 * 2 ** 20
    assert fused < 3 * result + 2 * (1 << 14) * 4 + 4 * q.nbytes    # D, gD, gq, gk, q/k copies + 2 blocks


def test_l1_shapes_must_match():
    with pytest.raises(ValueError, match="differ"):
        l1_distance(Tensor(np.ones((2, 3, 4))), Tensor(np.ones((3, 3, 4))))


# --- the Transformer form (paper Eq. 10) --------------------------------------------------------------------

def _qkv(att, x):
    B, T, C = x.shape
    q = (x.reshape(B * T, C) @ att.w_q.data).reshape(B, T, att.n_head, -1).transpose(0, 2, 1, 3)
    k, v = (t.data for t in att.kv(Tensor(x)))
    return q, k, v


def test_weights_follow_eq_10_and_are_not_normalised():
    att = CoDAttention(16, 2, alpha=0.8, beta=0.3)
    x = _normal(2, 6, 16)
    _, M = att(Tensor(x), return_weights=True)
    q, k, v = _qkv(att, x)
    d = q.shape[-1]
    E = 0.8 * q @ k.swapaxes(-1, -2) / math.sqrt(d)
    N = -0.3 * np.abs(q[..., :, None, :] - k[..., None, :, :]).sum(-1) / math.sqrt(d)
    np.testing.assert_allclose(M.data, np.tanh(E) * 2 / (1 + np.exp(-N)), rtol=1e-4, atol=1e-6)
    assert (np.abs(M.data) < 1).all() and (M.data < 0).any() and (M.data > 0).any()   # add and subtract
    assert not np.allclose(M.data.sum(-1), 1)                                          # no normalisation


def test_it_is_a_drop_in_with_the_same_parameters_and_initialisation():
    mha, cd = MultiHeadAttention(16, 4, rng=np.random.default_rng(3)), CoDAttention(16, 4, rng=np.random.default_rng(3))
    for (na, a), (nb, b) in zip(mha.named_parameters(), cd.named_parameters()):
        assert na == nb and np.array_equal(a.data, b.data)
    cfg = EncoderDecoderConfig(d_model=16, n_head=2, d_head=8, n_encoder_layers=2, n_decoder_layers=2)
    soft = Seq2SeqTransformer(9, 9, cfg, n_src_tokens=12, seed=5)
    quasi = CoDASeq2SeqTransformer(9, 9, cfg, n_src_tokens=12, seed=5)
    a, b = soft.state_dict(), quasi.state_dict()
    assert a.keys() == b.keys() and all(np.array_equal(a[n], b[n]) for n in a)
    assert sum(isinstance(m, CoDAttention) for _, m in quasi.named_modules()) == 2 + 2 * 2   # every attention


@pytest.mark.parametrize("options", [{}, dict(gate="centered", center_e=True)])
def test_masked_and_future_keys_get_exactly_zero_weight(options):
    att = CoDAttention(8, 2, **options)
    key_mask = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], bool)
    _, M = att(Tensor(_normal(2, 5, 8)), key_mask=key_mask, causal=True, return_weights=True)
    allowed = key_mask[:, None, None, :] & np.tri(5, dtype=bool)
    assert (M.data[np.broadcast_to(~allowed, M.shape)] == 0).all()
    assert (M.data[np.broadcast_to(allowed, M.shape)] != 0).all()    # nothing else is deleted outright


@pytest.mark.parametrize("options", [{}, dict(gate="centered", center_e=True, row_mean=True)])
def test_causal_outputs_never_see_the_future(options):
    att = CoDAttention(8, 2, **options)
    x = _normal(1, 5, 8)
    y1 = att(Tensor(x), causal=True).data
    x[0, 4] += 1.0
    y2 = att(Tensor(x), causal=True).data
    np.testing.assert_allclose(y1[0, :4], y2[0, :4], rtol=1e-5, atol=1e-6)
    assert not np.allclose(y1[0, 4], y2[0, 4])


@pytest.mark.parametrize("options", [{}, dict(gate="centered", center_e=True)])
def test_padding_never_changes_the_real_positions(options):
    att = CoDAttention(8, 2, **options)
    x = _normal(1, 5, 8)
    padded = np.concatenate([x, _normal(1, 3, 8, seed=4)], axis=1)
    alone = att(Tensor(x)).data
    both = att(Tensor(padded), key_mask=np.arange(8)[None] < 5).data
    np.testing.assert_allclose(both[:, :5], alone, rtol=1e-5, atol=1e-6)


def test_huge_distances_and_fully_masked_rows_stay_finite():
    att = CoDAttention(8, 2, gate="centered", center_e=True)
    x = Tensor(_normal(2, 5, 8, scale=1e4), requires_grad=True)     # distances of order 1e5: σ(N) underflows
    key_mask = np.array([[1, 1, 1, 0, 0], [0, 0, 0, 0, 0]], bool)   # the second sample sees nothing
    y, M = att(x, key_mask=key_mask, return_weights=True)
    y.sum().backward()
    assert np.isfinite(y.data).all() and np.isfinite(x.grad).all()
    assert (M.data[1] == 0).all() and np.allclose(y.data[1], 0)    # no value, no bias: output 0
    for p in att.parameters():
        assert np.isfinite(p.grad).all()
    far = CoDAttention(8, 2)(Tensor(_normal(1, 4, 8, scale=1e4)), return_weights=True)[1]
    assert np.isfinite(far.data).all() and (np.abs(far.data) < 1e-30).mean() > 0.5   # far pairs erased


def test_unknown_options_are_clear_errors():
    with pytest.raises(ValueError, match="scaled, centered"):
        CoDAttention(8, 2, gate="softmax")
    with pytest.raises(ValueError, match="tanh-sigmoid"):
        PairwiseCoDA(8, composition="tanh-softmax")
    with pytest.raises(ValueError, match="≥ 0"):
        CoDAttention(8, 2, beta=-1.0)


# --- the gate (§3) ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("d_k,expected", [(16, 0.02), (64, 2.5e-4)])
def test_the_gate_starts_almost_closed_at_beta_one(d_k, expected):
    """Unit-variance q, k: E|q_c − k_c| = 2/√π ≈ 1.13, so 2σ(−1.13 √d_k) (§3)."""
    q, k = Tensor(_normal(4, 2, 32, d_k).astype(np.float64)), Tensor(_normal(4, 2, 32, d_k, seed=1).astype(np.float64))
    E = (q @ k.swapaxes(-1, -2)) * (1 / math.sqrt(d_k))
    for beta, low, high in [(1.0, expected / 2, expected * 2), (1 / math.sqrt(d_k), 0.3, 0.9)]:
        _, g = quasi_attention(E, -l1_distance(q, k) * (beta / math.sqrt(d_k)))
        assert low < g.data.mean() < high, (beta, g.data.mean())


def test_mean_gate_counts_only_valid_entries_and_leaves_no_log_behind():
    att = CoDAttention(8, 2, beta=0.1)
    x, key_mask = Tensor(_normal(2, 5, 8)), np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], bool)
    with no_grad():
        got = coda.mean_gate(att, lambda: att(x, key_mask=key_mask))
        att.record = True
        att(x, key_mask=key_mask)
    g = att.last_gate.data
    valid = np.broadcast_to(key_mask[:, None, :, None] & key_mask[:, None, None, :], g.shape)
    assert got == pytest.approx(g[valid].mean(), rel=1e-5) and got != pytest.approx(g.mean(), rel=1e-3)
    assert att.gate_log is None


def test_gate_statistics_count_the_valid_entries_that_erase_and_keep():
    x, key_mask = Tensor(_normal(2, 5, 8)), np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], bool)
    closed = CoDAttention(8, 2, beta=50.0)              # far pairs: the gate 2σ(N) is ~0 almost everywhere
    with no_grad():
        mean, low, high = coda.gate_statistics(closed, lambda: closed(x, key_mask=key_mask))["all"]
        assert low > 0.9 and high == 0.0 and mean < 0.1
        att = CoDAttention(8, 2, beta=0.1, gate="centered")
        stats = coda.gate_statistics(att, lambda: (att(x, key_mask=key_mask), att(x, key_mask=key_mask)))
        att.record = True
        att(x, key_mask=key_mask)
    g = att.last_gate.data
    valid = g[np.broadcast_to(key_mask[:, None, :, None] & key_mask[:, None, None, :], g.shape)]
    expected = (valid.mean(), (valid < 0.1).mean(), (valid > 0.9).mean())   # two identical calls: same shares
    assert stats["attention"] == pytest.approx(expected, rel=1e-5) and stats["all"] == stats["attention"]
    assert att.gate_log is None


# --- the pairwise form (paper Eqs. 1–7) ---------------------------------------------------------------------

def test_pairwise_form_pools_the_raw_sequences():
    m = PairwiseCoDA(6, 4, alpha=0.5, beta=0.2)
    a, b = _normal(2, 5, 6), _normal(2, 3, 6, seed=1)
    a_mask = np.array([[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]], bool)
    a2, b2, M = m(Tensor(a), Tensor(b), a_mask=a_mask, return_weights=True)
    fa, fb = a @ m.f_e.weight.data, b @ m.f_e.weight.data
    na, nb = a @ m.f_n.weight.data, b @ m.f_n.weight.data
    E = 0.5 * fa @ fb.swapaxes(-1, -2)
    N = -0.2 * np.abs(na[:, :, None] - nb[:, None]).sum(-1)
    expected = np.tanh(E) * 2 / (1 + np.exp(-N)) * a_mask[:, :, None]
    np.testing.assert_allclose(M.data, expected, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(a2.data, expected @ b, rtol=1e-4, atol=1e-5)                  # A′ = M B
    np.testing.assert_allclose(b2.data, expected.swapaxes(1, 2) @ a, rtol=1e-4, atol=1e-5)   # B′ = Mᵀ A
    assert (a2.data[0, 4] == 0).all()


# --- the encoder–decoder ------------------------------------------------------------------------------------

def test_greedy_decoding_equals_teacher_forcing_with_centring():
    """Row-wise Mean(·) in the decoder keeps CoDA causal, so decoding one position at a time (cached keys)
    gives the logits of the full teacher-forced pass on the decoded prefix."""
    cfg = CoDAEncoderDecoderConfig(d_model=16, n_head=2, d_head=8, d_ff=16, n_encoder_layers=1, n_decoder_layers=2,
                          dropout=0.0, attention_dropout=0.0, coda_gate="centered", coda_center_e=True)
    model = CoDASeq2SeqTransformer(9, 9, cfg, n_src_tokens=12, seed=0).eval()
    src, src_mask = np.random.default_rng(0).integers(1, 12, (3, 6)), np.arange(6) < np.array([[6], [4], [5]])
    with no_grad(), eval_mode():
        tokens, logits = model.greedy(src, 5, 1, src_mask)
        forced = model(src, np.concatenate([np.ones((3, 1), np.int64), tokens[:, :-1]], axis=1), src_mask)
    np.testing.assert_allclose(logits.data, forced.data, rtol=1e-4, atol=1e-5)


# --- the MLU task (§5) --------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def mlu():
    return tasks.MLUTask(n_train=20_000)


def _answer(line):
    """Independent of the generator: parse the assignments and evaluate the question."""
    question, target = line.split(":")
    first, second, expr = question.split(",")
    env = dict(a.split("=") for a in (first, second))
    u, op, w = expr[0], expr[1], expr[2]
    a, b = int(env[u]), int(env[w])
    return {"+": a + b, "-": a - b, "*": a * b}[op], target


def test_mlu_examples_are_correct_and_encoded_character_by_character(mlu):
    keys = np.ravel_multi_index((85 + 1000, -523 + 1000, 0, 1, 2), mlu_data.MLU_SHAPE)
    assert [s[0] for s in mlu_data.mlu_strings(np.array([keys]))] == ["x=85,y=-523,x*y", "-44455"]   # paper's
    assert (len(mlu.in_vocab) - 1, len(mlu.out_vocab) - 3) == (17, 11)
    assert mlu.in_vocab.index("<pad>") == mlu.out_vocab.index("<pad>") == recipes.coda.CoDA.PAD
    for name, split in mlu.splits.items():
        for i in range(0, len(split), 97):
            value, target = _answer(split.lines[i])
            assert str(value) == target
            assert "".join(mlu.in_vocab[t] for t in split.inputs[i]) == split.lines[i].split(":")[0]
            assert [mlu.out_vocab[t] for t in split.targets[i]] == list(target) + ["<eos>"]
    train_split = mlu.splits["train"]
    assert train_split.inputs.lengths.max() <= 19 and train_split.targets.lengths.max() <= 7 + 1
    lines = train_split.lines
    assert {ln[0] for ln in lines} == {"x", "y"} and {ln.split(",")[2][:3] for ln in lines} >= {"x*x", "y-y", "x+y"}


def test_mlu_splits_are_distinct_and_held_out_sets_do_not_depend_on_train_size(mlu):
    inputs = {k: [ln.split(":")[0] for ln in s.lines] for k, s in mlu.splits.items()}
    everything = sum(inputs.values(), [])
    assert len(set(everything)) == len(everything)                       # deduplicated, splits disjoint
    assert [len(v) for v in inputs.values()] == [5000, 2000, 20_000]
    small = tasks.MLUTask(n_train=500)
    for name in ("test", "valid"):
        assert list(small.splits[name].lines) == list(mlu.splits[name].lines)
    assert list(small.splits["train"].lines) == list(mlu.splits["train"].lines[:500])   # a prefix
    assert list(tasks.MLUTask(seed=1, n_train=10).splits["test"].lines[:5]) != list(mlu.splits["test"].lines[:5])
    with pytest.raises(ValueError, match="split sizes"):
        tasks.MLUTask(n_train=0)
