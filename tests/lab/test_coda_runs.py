"""CoDA's runs through train.py: MLU training logs the gate and resumes exactly; transformer-coda."""
import json
import math
import os

import numpy as np
import pytest

import train
from minattn.attention.coda import CoDAttention
from minattn.lab import recipes


# --- training (train.py) ------------------------------------------------------------------------------------

TINY_MLU = ["--task", "mlu", "--model", "transformer-seq2seq-coda", "--train-size", "300", "--batch-size", "16",
            "--eval-every", "2", "--no-progress", "--set", "d_model=16", "--set", "n_head=2", "--set", "d_head=8",
            "--set", "d_ff=16", "--set", "n_encoder_layers=1", "--set", "n_decoder_layers=1", "--set", "eval_train=50",
            "--set", "eval_batch_size=4000", "--set", "warmup=3"]


def test_mlu_training_logs_the_gate_and_resumes_exactly(tmp_path, capsys):
    straight, split = str(tmp_path / "straight"), str(tmp_path / "split")
    assert train.main(TINY_MLU + ["--steps", "4", "--out", straight]) == 0
    assert train.main(TINY_MLU + ["--steps", "2", "--out", split]) == 0
    assert train.main(TINY_MLU + ["--steps", "4", "--out", split, "--resume"]) == 0
    log = [json.loads(line) for line in open(os.path.join(straight, "metrics.jsonl"))]
    assert all(0 < e["gate_mean"] <= 1 for e in log) and {"train", "valid", "test"} <= set(log[-1])
    res = json.load(open(os.path.join(straight, "results.json")))
    assert set(res["metrics"]) == {"train", "valid", "test"}                  # gate_mean is not a split
    a, b = (train.load_checkpoint(os.path.join(d, "checkpoint.npz")) for d in (straight, split))
    for name in a["model"]:
        np.testing.assert_array_equal(a["model"][name], b["model"][name], err_msg=name)
    assert a["optimizer"]["lr"] == b["optimizer"]["lr"] == pytest.approx(1e-3 * math.sqrt(3 / 4))   # warm-up, decay
    capsys.readouterr()
    assert train.main(["--analyze", "--out", straight]) == 0          # the gate per attention of the trained run
    table = capsys.readouterr().out.splitlines()
    assert table[1].split() == ["attention", "mean", "<", "0.1", ">", "0.9"]
    rows = {line.split()[0]: [float(v) for v in line.split()[1:]] for line in table[2:]}
    assert set(rows) == {"encoder.0.attn", "decoder.0.self_attn", "decoder.0.cross.0", "all"}
    assert all(0 < mean <= 1 and 0 <= low <= 1 and 0 <= high <= 1 for mean, low, high in rows.values())


def test_transformer_coda_is_the_transformer_run_with_coda_options(tmp_path, capsys):
    for task in ("ctl", "arith", "listops"):
        base, cd = (train.make_config(task, m, "cpu") for m in ("transformer", "transformer-coda"))
        assert {k: v for k, v in vars(cd.model_config).items() if not k.startswith("coda_")} == vars(base.model_config)
        assert (cd.steps, cd.lr, cd.batch_size, cd.batching) == (base.steps, base.lr, base.batch_size, base.batching)
        assert cd.model_config.coda_beta == pytest.approx((base.model_config.n_head / base.model_config.d_model) ** .5)
    cfg = train.make_config("ctl", "transformer-coda", "cpu", coda_beta=0.25, coda_gate="centered")
    recipe = recipes.ndr.NDR(cfg)
    recipe.load_task()
    attn = recipe.build_model().encoder.layer.attn
    assert isinstance(attn, CoDAttention) and (attn.beta, attn.gate) == (0.25, "centered")
    assert recipe.log_extra(recipe.build_model().eval())["gate_mean"] > 0
    code = train.main(["--task", "ctl", "--model", "transformer-coda", "--set", "coda_gate=open",
                       "--out", str(tmp_path)])
    assert code == 2 and "scaled, centered" in capsys.readouterr().err
    code = train.main(["--task", "mlu", "--model", "transformer-coda", "--out", str(tmp_path)])
    assert code == 2 and "transformer-seq2seq-coda" in capsys.readouterr().err
