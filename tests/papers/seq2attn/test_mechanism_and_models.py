"""seq2attn (docs/seq2attn.md §1): Gumbel straight-through against its soft sample, argmax attention at
evaluation, padding masks, batched vs per-example gradients, long unrolls, sizes, and the training CLI.
Finite-difference checks of the soft paths are rows of tests/library/test_gradcheck.py."""
import json
import os
import sys

import numpy as np
import pytest

from minattn import backend
from minattn.attention.additive import AdditiveAttention
from minattn.data import get_task
from minattn.engine import Tensor, eval_mode
from minattn.models.seq2attn import Seq2Attn, model_config

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))))
import train  # noqa: E402

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


# --- training -------------------------------------------------------------------------------------------------

TINY_RUN = ["--no-progress", "--set", "d_hidden=16", "--set", "d_embedding=16", "--eval-every", "3", "--steps", "3"]


def test_training_cli_reports_sequence_accuracy_per_split(tmp_path, capsys):
    assert train.main(["--task", "lookup", "--model", "seq2attn", "--out", str(tmp_path)] + TINY_RUN) == 0
    res = json.load(open(tmp_path / "results.json"))
    assert set(res["metrics"]) == {"train", "validation", "validation_loss", "heldout_inputs", "heldout_compositions",
                                   "heldout_tables", "new_compositions", "longer_compositions_seen",
                                   "longer_compositions_incremental", "longer_compositions_new"}
    assert res["best_step"] == 3 and res["config"]["batch_size"] == 1 and res["config"]["lr"] == 1e-3
    cfg = train.make_config("scan", "seq2seq", "paper", split="filler0")
    assert (cfg.steps, cfg.batch_size, cfg.model_config.cell, cfg.model_config.n_layers) == (50 * 238, 64, "lstm", 2)
    # the cpu preset's SCAN lr: 3e-4 for seq2attn at batch 8 (chosen on its training loss), 1e-3 elsewhere
    lrs = {(t, m, p): train.make_config(t, m, p, split="filler0" if t == "scan" else "").lr
           for t in ("scan", "lookup") for m in ("seq2attn", "seq2seq") for p in ("cpu", "paper")}
    assert lrs == {**{k: 1e-3 for k in lrs}, ("scan", "seq2attn", "cpu"): 3e-4}
    paper = train.make_config("lookup", "seq2attn", "paper")
    assert (paper.steps, paper.eval_every, paper.weight_decay) == (23200, 100, 0)
    assert (paper.model_config.teacher_forcing, paper.model_config.d_hidden, paper.grad_clip) == (0.5, 256, 5)


@pytest.mark.parametrize("args,message", [
    (["--task", "scan", "--model", "seq2attn"], "needs a split"),
    (["--task", "scan", "--model", "seq2attn", "--show-config"], "needs a split"),
    (["--task", "scan", "--model", "seq2attn", "--split", "filler9"], "unknown SCAN split"),
    (["--task", "lookup", "--model", "seq2attn", "--split", "length"], "drop --split"),
    (["--task", "ctl", "--model", "ndr", "--split", "length"], "has no --split"),
    (["--task", "lookup", "--model", "seq2attn", "--set", "batching=random"], "batching mode"),
])
def test_training_cli_errors_are_one_line(tmp_path, capsys, args, message):
    assert train.main(args + ["--out", str(tmp_path)] + (TINY_RUN if args[1] != "ctl" else [])) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_scan_without_a_split_says_so_not_that_steps_are_zero(tmp_path, capsys):
    """Its step count is counted in epochs of the split: without one the error is the missing split."""
    assert train.main(["--task", "scan", "--model", "seq2attn", "--no-progress", "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert "needs a split" in err and "steps" not in err


@pytest.mark.parametrize("temperature", ["conditioned", "latent", "fixed"])
def test_analysis_reports_training_accuracy_and_the_temperature_per_step(tmp_path, capsys, monkeypatch, temperature):
    """--analyze decodes the (at most 2,000) sampled training examples and the whole test split, and gives the
    Gumbel τ of every decoding step up to <eos>: τ_init throughout when fixed, within (0, τ_max] when conditioned.
    Greedy decoding's tokens are replaced by ones that get the rows whose first input token is even right."""
    out = str(tmp_path / "run")
    assert train.main(["--task", "lookup", "--model", "seq2attn", "--out", out, "--set", f"temperature={temperature}"]
                      + TINY_RUN) == 0
    task = get_task("lookup")
    answers = {tuple(x): y for name in ("train", "heldout_compositions")
               for x, y in zip(task.splits[name].inputs, task.splits[name].targets)}

    decode = Seq2Attn.greedy

    def greedy(self, src, src_lengths, max_len):
        decode(self, src, src_lengths, max_len)    # the real decoding, which calls the attention (and τ)
        tokens = np.zeros((len(src), max_len), np.int64)
        for i, (x, n) in enumerate(zip(backend.to_numpy(src), backend.to_numpy(src_lengths))):
            y = answers[tuple(x[:n])]
            tokens[i, :len(y)] = y if x[0] % 2 == 0 else y[::-1] + 1    # wrong in its first token
        return tokens
    monkeypatch.setattr(Seq2Attn, "greedy", greedy)
    capsys.readouterr()
    assert train.main(["--analyze", "--out", out]) == 0
    text = capsys.readouterr().out
    for name in ("train", "heldout_compositions"):
        split = task.splits[name]
        right = np.mean([x[0] % 2 == 0 for x in split.inputs])
        assert 0 < right < 1
        assert f"{name}: greedy sequence accuracy {right:.3f} on {len(split)} of {len(split)} examples" in text
        assert f"({temperature}; {split.targets.lengths.sum():,} steps)" in text    # every step up to <eos>, once
    taus = [[float(v) for v in line.split("percentiles ")[1].split(";")[0].split(" / ")]
            for line in text.splitlines() if "τ per decoding step" in line]
    assert len(taus) == 2 and all(len(t) == 5 for t in taus)
    if temperature == "fixed":
        assert all(v == 5.0 for t in taus for v in t)
    elif temperature == "conditioned":
        assert all(0 < v <= 5.0 for t in taus for v in t) and any(v < 5.0 for t in taus for v in t)
        assert text.count("share ≥ 0.9 τ_max") == 2
    else:
        assert "τ_max" not in text   # exp(θ) has no upper bound


def test_analysis_of_the_baseline_has_no_temperature(tmp_path, capsys):
    out = str(tmp_path / "run")
    assert train.main(["--task", "lookup", "--model", "seq2seq", "--out", out] + TINY_RUN) == 0
    capsys.readouterr()
    assert train.main(["--analyze", "--out", out]) == 0
    text = capsys.readouterr().out
    assert "train: greedy sequence accuracy" in text and "τ" not in text


def test_analysis_is_the_same_on_every_device(tmp_path, capsys, device):
    """No implicit host conversion (the strict device refuses it, as CuPy syncs on it): one transfer at the end."""
    out = str(tmp_path / "run")
    assert train.main(["--task", "lookup", "--model", "seq2attn", "--out", out] + TINY_RUN) == 0
    capsys.readouterr()
    assert train.main(["--analyze", "--out", out]) == 0
    on_cpu = capsys.readouterr().out
    assert train.main(["--analyze", "--out", out, "--device", device]) == 0
    assert capsys.readouterr().out == on_cpu and "τ per decoding step" in on_cpu
