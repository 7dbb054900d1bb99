"""Compositional attention's runs through train.py: the CRT's L1 metrics, its flags, the paper preset."""
import json

import train
from minattn.lab import recipes
from minattn.models.compositional import CRTConfig


# --- training command line ----------------------------------------------------------------------------------

TINY = ["--task", "retrieval", "--model", "compositional", "--searches", "2", "--retrievals", "4", "--ood",
        "--batch-size", "16", "--eval-every", "2", "--no-progress", "--set", "d_model=16", "--set", "eval_batches=2"]


def test_training_reports_l1_metrics_and_the_analysis(tmp_path, capsys):
    out = str(tmp_path / "run")
    assert train.main(TINY + ["--steps", "4", "--out", out]) == 0
    res = json.load(open(tmp_path / "run" / "results.json"))
    assert set(res["metrics"]) == {"iid_l1", "ood_l1"} and all(0 < v < 3 for v in res["metrics"].values())
    assert res["config"]["options"]["ood"] is True and res["config"]["grad_clip"] == 0
    capsys.readouterr()
    assert train.main(["--analyze", "--out", out]) == 0
    table = capsys.readouterr().out
    assert "g1 r3" in table and "s1 r3" in table
    train_part, ood_part = table.split("held-out (ood) combinations")
    # the held-out combinations (§8) have g0 ∈ {r2, r3} and g1 ∈ {r1, r3}: only those rows, no NaN
    rows = [line.split("|")[0].strip() for line in ood_part.splitlines() if line.strip()[:1] == "g" and line.strip()[1].isdigit()]
    assert rows == ["g0 r2", "g0 r3", "g1 r1", "g1 r3"] and "nan" not in ood_part
    assert "g0 r0" in train_part


def test_retrieval_flags_are_checked(tmp_path, capsys):
    assert train.main(["--task", "ctl", "--searches", "2", "--out", str(tmp_path)]) == 2
    assert "task ctl has no --searches (the tasks with one: retrieval)" in capsys.readouterr().err
    assert train.main(TINY + ["--set", "ood=maybe", "--out", str(tmp_path)]) == 2
    assert "expected" in capsys.readouterr().err
    assert train.main(TINY + ["--set", "d_model=10", "--out", str(tmp_path)]) == 2     # 10 is not a multiple of 4
    assert "multiple of n_retrieval" in capsys.readouterr().err
    assert train.main(TINY[:3] + ["mha", "--steps", "2"] + TINY[4:] + ["--out", str(tmp_path / "m")]) == 0
    capsys.readouterr()
    assert train.main(["--analyze", "--out", str(tmp_path / "m")]) == 2
    assert "only the compositional models" in capsys.readouterr().err


def test_paper_preset_follows_the_paper():
    cfg = train.make_config("retrieval", "compositional", "paper")
    assert (cfg.steps, cfg.batch_size, cfg.lr, cfg.weight_decay, cfg.grad_clip, cfg.eval_every) == \
        (100_000, 256, 1e-4, 0.0, 0.0, 5000)
    c, o = cfg.model_config, cfg.options
    assert (c.searches, c.retrievals, c.d_model, o.n_objects, c.concat, c.separate, o.ood, o.eval_batches) == \
        (2, 4, 64, 10, True, False, False, 100)
    cpu = train.make_config("retrieval", "mha", "cpu", searches=4, retrievals=8, ood=True)
    assert cpu.model_config == CRTConfig(searches=4, retrievals=8) and cpu.lr == 1e-4
    assert cpu.options == recipes.compositional.RetrievalOptions(ood=True)
