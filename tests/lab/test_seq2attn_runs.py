"""seq2attn's runs through train.py: the training command line's metrics and refusals, and --analyze."""
import json

import numpy as np
import pytest

import train
from minattn import backend
from minattn.data import get_task
from minattn.models.seq2attn import Seq2Attn


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
    # 1/τ_max overflows float32: refused, not trained into a "diverged, lower --lr" verdict
    (["--task", "lookup", "--model", "seq2attn", "--set", "tau_max=1e-300"], "positive normal numbers"),
    (["--task", "lookup", "--model", "seq2attn", "--set", "tau_init=0"], "positive normal numbers"),
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
