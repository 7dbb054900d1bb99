"""seq2attn (docs/seq2attn.md §1): Gumbel straight-through against its soft sample, argmax attention at
evaluation, padding masks, batched vs per-example gradients, long unrolls, sizes, and the training CLI.
Finite-difference checks of the soft paths are rows of tests/library/test_gradcheck.py."""

import numpy as np
import pytest

from minattn import backend
from minattn.attention.additive import AdditiveAttention
from minattn.engine import Tensor, eval_mode
from minattn.models.seq2attn import Seq2Attn, model_config


MASK = np.array([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]], bool)


def tiny(name="seq2attn", **options):
    return Seq2Attn(model_config(name, d_embedding=8, d_hidden=8, **options), 9, 7, sos_id=2, seed=0)


class ZeroNoise:
    """An RNG stand-in: Gumbel noise 0 (so training attention is deterministic) and no other draws."""

    def gumbel(self, shape, dtype):
        return np.zeros(shape, dtype)


# --- the attention ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("temperature", ["conditioned", "latent", "fixed"])
def test_gumbel_straight_through_is_one_hot_forward_and_soft_backward(temperature):
    rng = np.random.default_rng(0)
    q, k = rng.standard_normal((2, 4)), rng.standard_normal((2, 5, 3))
    noise, upstream = rng.standard_normal((2, 5)), rng.standard_normal((2, 5))
    grads, outputs = [], []
    for activation in ("gumbel_st", "gumbel"):
        attn = AdditiveAttention(3, 4, 6, activation, temperature, rng=np.random.default_rng(1)).double()
        query, keys = Tensor(q, requires_grad=True), Tensor(k, requires_grad=True)
        alpha = attn(query, attn.prepare(keys, MASK), noise=noise)
        alpha.backward(upstream)
        outputs.append(alpha.data)
        grads.append([query.grad, keys.grad] + [p.grad for p in attn.parameters()])
    hard, soft = outputs
    assert set(np.unique(hard)) == {0.0, 1.0} and (hard.sum(axis=1) == 1).all()
    assert (hard.argmax(axis=1) == soft.argmax(axis=1)).all() and (hard[~MASK] == 0).all()
    names = ["query", "keys"] + [n for n, _ in attn.named_parameters()]
    assert any(n.startswith(("w_tau", "log_tau")) for n in names) == (temperature != "fixed")
    for name, g_st, g_soft in zip(names, *grads):
        np.testing.assert_allclose(g_st, g_soft, rtol=1e-12, atol=1e-12, err_msg=name)
        # b2 shifts every score equally, so its gradient is 0 up to rounding; everything else learns
        assert (np.abs(g_soft).sum() < 1e-12) == (name == "w2.bias"), name


def test_evaluation_attention_is_exact_argmax_of_the_scores_without_noise():
    rng = np.random.default_rng(0)
    attn = AdditiveAttention(3, 4, 6, "gumbel_st", rng=rng)
    query, prepared = Tensor(rng.standard_normal((2, 4))), attn.prepare(Tensor(rng.standard_normal((2, 5, 3))), MASK)
    with eval_mode():
        alpha = attn(query, prepared).data      # no rng was set: evaluation must not draw noise
    scores = attn.scores(query, prepared).data
    np.testing.assert_array_equal(alpha, np.eye(5)[scores.argmax(axis=1)])
    assert (scores[~MASK] < -1e8).all()


def test_bad_attention_options_are_rejected():
    with pytest.raises(ValueError, match="activation"):
        AdditiveAttention(3, 4, 6, "sparsemax")
    with pytest.raises(ValueError, match="temperature mode"):
        AdditiveAttention(3, 4, 6, temperature="annealed")


# --- the model ---------------------------------------------------------------------------------------------

def test_parameter_counts_match_the_reference():
    sizes = {(19, 12, "seq2attn", 256, 256): 1_523_982, (19, 12, "seq2seq", 128, 512): 3_888_525,
             (19, 12, "seq2seq", 256, 256): 1_128_717, (15, 10, "seq2attn", 512, 512): 6_058_508}
    for (v_in, v_out, name, E, H), n in sizes.items():
        model = Seq2Attn(model_config(name, d_embedding=E, d_hidden=H), v_in, v_out, sos_id=2)
        assert model.num_parameters() == n, (name, E, H)


def test_initialisation_follows_the_reference():
    model = Seq2Attn(model_config("seq2attn"), 19, 12, sos_id=2)
    for name, p in model.named_parameters():
        bound = 1 / 16 if name.startswith("attention.w_tau") else 0.08      # 1/sqrt(H) for the τ estimator
        assert np.abs(p.data).max() <= bound and (p.size < 100 or np.abs(p.data).max() > 0.9 * bound), name
    latent = Seq2Attn(model_config("seq2attn", temperature="latent", tau_init=2.0), 19, 12, sos_id=2)
    assert latent.attention.log_tau.data == pytest.approx(np.log(2.0))


def test_ablation_switches_change_the_architecture():
    names = lambda m: {n.split(".")[0] + "." + n.split(".")[1] for n, _ in m.named_parameters()}  # noqa: E731
    full, base = names(tiny()), names(tiny("seq2seq"))
    assert {"transcoder.cells", "decoder_init.0", "attention.w_tau"} <= full
    assert not {"transcoder.cells", "decoder_init.0", "attention.w_tau"} & base
    assert tiny(gumbel=False).attention.activation == "softmax" and tiny().attention.activation == "gumbel_st"
    with pytest.raises(ValueError, match="must be equal"):
        Seq2Attn(model_config("seq2attn", d_embedding=4, d_hidden=8), 9, 7, sos_id=2)
    assert Seq2Attn(model_config("seq2attn", d_embedding=4, d_hidden=8, full_focus=False), 9, 7, 2)
    with pytest.raises(ValueError, match="unknown cell"):
        tiny(cell="rnn")
    with pytest.raises(ValueError, match="unknown model"):
        model_config("transformer")


def batch(rng, B=3, n_max=5, m_max=4):
    src_len, tgt_len = rng.integers(1, n_max + 1, B), rng.integers(1, m_max + 1, B)
    src_len[0], tgt_len[0] = n_max, m_max                     # one full row, the others padded
    src = np.where(np.arange(n_max) < src_len[:, None], rng.integers(2, 9, (B, n_max)), 1)
    tgt = np.where(np.arange(m_max) < tgt_len[:, None], rng.integers(3, 7, (B, m_max)), 1)
    tgt[np.arange(B), tgt_len - 1] = 3                        # <eos>
    return src, src_len, tgt, tgt_len


@pytest.mark.parametrize("name,options", [("seq2attn", {}), ("seq2attn", dict(cell="lstm", n_layers=2)),
                                          ("seq2seq", {})])
@pytest.mark.parametrize("teacher_forcing", [0.0, 1.0])
def test_batched_gradients_equal_the_sum_of_per_example_gradients(name, options, teacher_forcing):
    model = tiny(name, teacher_forcing=teacher_forcing, **options).double().set_rng(ZeroNoise())
    src, src_len, tgt, tgt_len = batch(np.random.default_rng(0))
    B = len(src_len)

    def grads(*args):
        model.zero_grad()
        loss = model.loss(*args)
        loss.backward()
        return loss.data, [p.grad.copy() for p in model.parameters()]
    loss, batched = grads(src, src_len, tgt, tgt_len)
    singles = [grads(src[i:i + 1, :src_len[i]], src_len[i:i + 1], tgt[i:i + 1, :tgt_len[i]], tgt_len[i:i + 1])
               for i in range(B)]
    assert B * loss == pytest.approx(sum(s[0] for s in singles), rel=1e-10)   # loss = mean over sequences
    for i, (pname, _) in enumerate(model.named_parameters()):
        np.testing.assert_allclose(B * batched[i], sum(s[1][i] for s in singles), rtol=1e-8, atol=1e-12,
                                   err_msg=pname)


def test_padding_is_invisible_to_the_loss_and_the_attention():
    model = tiny().double().set_rng(backend.RNG(0))
    src, src_len, tgt, tgt_len = batch(np.random.default_rng(1))
    pad_src, pad_tgt = np.arange(src.shape[1]) >= src_len[:, None], np.arange(tgt.shape[1]) >= tgt_len[:, None]
    src2, tgt2 = np.where(pad_src, 7, src), np.where(pad_tgt, 5, tgt)     # garbage in the padding
    losses = [model.set_rng(backend.RNG(0)).loss(s, src_len, t, tgt_len).data for s, t in ((src, tgt), (src2, tgt2))]
    assert losses[0] == losses[1]
    tokens, attention = model.greedy(src2, src_len, 6, return_attention=True)
    assert tokens.shape == (3, 6) and tokens.dtype.kind == "i" and attention.shape == (3, 6, src.shape[1])
    assert (attention.sum(axis=-1) == 1).all() and set(np.unique(attention)) <= {0.0, 1.0}   # exact one-hot
    assert (attention[np.broadcast_to(pad_src[:, None, :], attention.shape)] == 0).all()
    soft = tiny("seq2seq").greedy(src2, src_len, 6, return_attention=True)[1]
    assert (soft[np.broadcast_to(pad_src[:, None, :], soft.shape)] == 0).all() and (soft > 0).sum() > soft.size / 3


def test_teacher_forcing_is_drawn_per_sequence_from_the_default_or_the_set_rng():
    model = tiny(teacher_forcing=0.5)
    src, src_len, tgt, tgt_len = batch(np.random.default_rng(0), B=64)
    assert np.isfinite(model.loss(src, src_len, tgt, tgt_len).data)   # no set_rng: the seeded default stream
    fed = []
    model.embed_out.forward = lambda ids: fed.append(ids) or type(model.embed_out).forward(model.embed_out, ids)
    model.set_rng(backend.RNG(3)).loss(src, src_len, tgt, tgt_len)
    gold = np.all([fed[t + 1] == tgt[:, t] for t in range(tgt.shape[1] - 1)], axis=0)
    rows = backend.RNG(3).uniform((64,)) < 0.5
    assert 10 < rows.sum() < 54 and gold[rows].all() and gold[~rows].mean() < 0.5   # whole rows forced or free


def test_a_200_step_unroll_backpropagates_without_recursion():
    model = tiny(cell="lstm").set_rng(backend.RNG(0))
    src = np.random.default_rng(0).integers(2, 9, (1, 200))
    tgt = np.full((1, 200), 4)
    loss = model.loss(src, np.array([200]), tgt, np.array([200]))
    loss.backward()                                             # ~10,000 graph nodes deep
    assert all(np.isfinite(p.grad).all() for p in model.parameters())


def test_the_model_runs_on_the_strict_device():
    """The strict device refuses implicit host conversion, as CuPy does (minattn/tools/strict.py)."""
    model = tiny(teacher_forcing=0.5).to("strict").set_rng(backend.RNG(0, "strict"))
    src, src_len, tgt, tgt_len = (backend.to_device(a, "strict") for a in batch(np.random.default_rng(0)))
    model.loss(src, src_len, tgt, tgt_len).backward()
    tokens, attention = model.greedy(src, src_len, 4, return_attention=True)
    assert backend.to_numpy(tokens).shape == (3, 4) and backend.to_numpy(attention).shape == (3, 4, 5)
