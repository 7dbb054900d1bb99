"""The training command line: bad input, checkpoints, exact resume, results.json."""
import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

import train
import tasks
from minattn import backend
from minattn.lab import cli

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# A tiny NDR that trains a few steps in seconds (the task itself is the real CTL).
TINY = ["--task", "ctl", "--model", "ndr", "--batch-size", "16", "--eval-every", "2", "--no-progress",
        "--set", "d_model=16", "--set", "d_ff=16", "--set", "n_steps=2", "--set", "eval_batch_size=2048"]


@pytest.fixture(autouse=True, scope="module")
def ctl_generated():
    """CTL generated and cached before any test reads stderr, where a first generation announces itself."""
    tasks.get_task("ctl")


def run(argv, capsys):
    code = train.main(argv)
    return code, capsys.readouterr().err


@pytest.mark.parametrize("flag,value,valid", [
    ("--task", "ctl-sideways", "valid tasks: ctl, ctl-backward"),
    ("--model", "lstm", "valid models: transformer, transformer-rel"),
    ("--preset", "huge", "valid presets: cpu, paper"),
    ("--device", "tpu", "valid devices: cpu, gpu"),
])
def test_unknown_names_exit_2_with_the_valid_ones(flag, value, valid, capsys, tmp_path):
    code, err = run([flag, value, "--out", str(tmp_path)], capsys)
    assert code == 2 and valid in err and err.count("\n") == 1


@pytest.mark.parametrize("args,message", [
    (["--batch-size", "-3"], "batch_size must be positive, got -3"),
    (["--steps", "0"], "steps must be positive, got 0"),
    (["--lr", "-1"], "lr must be positive, got -1.0"),
    (["--eval-every", "0"], "eval_every must be positive"),
    (["--set", "grad_clip=-1"], "grad_clip must be ≥ 0"),
    (["--set", "batching=sideways"], "unknown batching mode 'sideways' (valid: bucketed, random"),
    (["--batch-size", "60000", "--set", "batching=bucketed"], "53704 samples is smaller than one batch of 60000"),
    (["--set", "n_head=3"], "d_model 128 must be a positive multiple of n_head 3"),
    (["--set", "n_steps=0"], "n_steps ≥ 1"),
    (["--set", "dropout=1.5"], "dropout probability must be in [0, 1), got 1.5"),
    (["--train-size", "10"], "task ctl has no --train-size (the tasks with one: sort, pairwise, set, mlu)"),
    (["--ood"], "task ctl has no --ood (the tasks with one: retrieval)"),
])
def test_bad_settings_exit_2_before_training(args, message, capsys, tmp_path):
    code, err = run(["--task", "ctl", "--no-progress", "--out", str(tmp_path)] + args, capsys)
    assert code == 2 and message in err and err.count("\n") == 1
    assert not os.path.exists(tmp_path / "checkpoint.npz")


def test_gpu_without_cupy_exits_2_with_the_install_hint(tmp_path):
    if backend.gpu_available():
        pytest.skip("a GPU is present")
    p = subprocess.run([sys.executable, "train.py", "--device", "gpu", "--out", str(tmp_path)], cwd=ROOT,
                       capture_output=True, text=True)
    assert p.returncode == 2
    assert "cupy-cuda12x" in p.stderr and "Traceback" not in p.stderr


def _params(out):
    return train.load_checkpoint(os.path.join(out, "checkpoint.npz"))


def test_resume_continues_exactly(tmp_path, capsys):
    straight, split = str(tmp_path / "straight"), str(tmp_path / "split")
    assert run(TINY + ["--steps", "6", "--out", straight], capsys)[0] == 0
    assert run(TINY + ["--steps", "4", "--out", split], capsys)[0] == 0        # "interrupted" after step 4
    assert run(TINY + ["--steps", "6", "--out", split, "--resume"], capsys)[0] == 0
    a, b = _params(straight), _params(split)
    assert a["step"] == b["step"] == 6
    for k in a["model"]:
        np.testing.assert_array_equal(a["model"][k], b["model"][k], err_msg=k)
    for sa, sb in zip(a["optimizer"]["state"], b["optimizer"]["state"]):
        for k in sa:
            np.testing.assert_array_equal(sa[k], sb[k])
    logs = [[json.loads(line) for line in open(os.path.join(d, "metrics.jsonl"))] for d in (straight, split)]
    assert [e["step"] for e in logs[1]] == [2, 4, 6]
    assert [e["valid"] for e in logs[0]] == [e["valid"] for e in logs[1]]


def test_resume_alone_takes_the_run_from_its_checkpoint(tmp_path, capsys):
    out = str(tmp_path)
    argv = [a if a != "ndr" else "transformer-rel" for a in TINY] + ["--seed", "3", "--set", "lr=1e-3"]
    assert run(argv + ["--steps", "2", "--out", out], capsys)[0] == 0
    assert run(["--resume", out, "--steps", "4", "--no-progress"], capsys)[0] == 0   # no --task, --model, --set
    res = json.load(open(tmp_path / "results.json"))
    assert (res["model"], res["seed"], res["steps"], res["config"]["lr"]) == ("transformer-rel", 3, 4, 1e-3)
    code, err = run(["--resume", out, "--steps", "6", "--lr", "5e-4", "--no-progress"], capsys)
    assert code == 2 and "different run" in err                                    # a changed setting is refused


def test_results_json_has_every_field(tmp_path, capsys):
    assert run(TINY + ["--steps", "2", "--out", str(tmp_path)], capsys)[0] == 0
    res = json.load(open(tmp_path / "results.json"))
    for key in ("task", "model", "preset", "seed", "device", "steps", "wall_s", "ms_per_step", "metrics",
                "best_step", "config"):
        assert key in res
    assert set(res["metrics"]) == {"iid", "valid", "test"}
    assert res["config"]["model_config"]["d_model"] == 16 and res["config"]["lr"] == 3e-4
    assert all(0 <= v <= 1 for v in res["metrics"].values())


def test_checkpoints_are_never_overwritten_by_another_run(tmp_path, capsys):
    out = str(tmp_path)
    assert run(TINY + ["--steps", "2", "--out", out], capsys)[0] == 0
    before = open(tmp_path / "checkpoint.npz", "rb").read()
    code, err = run(TINY + ["--steps", "2", "--out", out], capsys)                 # no --resume
    assert code == 2 and "--resume" in err
    code, err = run(TINY + ["--steps", "4", "--out", out, "--resume", "--set", "d_model=32"], capsys)
    assert code == 2 and "different run" in err and "differs in: d_model)" in err
    assert open(tmp_path / "checkpoint.npz", "rb").read() == before


def test_corrupted_checkpoint_is_a_clear_error(tmp_path, capsys):
    (tmp_path / "checkpoint.npz").write_bytes(b"\x80\x05garbage")
    code, err = run(TINY + ["--steps", "2", "--out", str(tmp_path), "--resume"], capsys)
    assert code == 2 and "corrupted" in err


def test_bad_set_values_are_clear_errors(tmp_path, capsys):
    assert "unknown setting" in run(TINY + ["--set", "colour=red", "--out", str(tmp_path)], capsys)[1]
    assert "expected" in run(TINY + ["--set", "d_model=big", "--out", str(tmp_path)], capsys)[1]
    code, err = run(TINY + ["--lr", "1e-3", "--set", "lr=2e-3", "--out", str(tmp_path)], capsys)
    assert code == 2 and "contradicts --lr" in err


def test_set_reaches_settings_that_also_have_a_flag(tmp_path, capsys):
    assert run(TINY + ["--steps", "2", "--set", "lr=1e-3", "--set", "seed=3", "--out", str(tmp_path)], capsys)[0] == 0
    res = json.load(open(tmp_path / "results.json"))
    assert res["config"]["lr"] == 1e-3 and res["seed"] == 3


def test_evaluate_reruns_a_checkpoint_with_more_encoder_steps(tmp_path, capsys):
    out = str(tmp_path)
    assert run(TINY + ["--steps", "2", "--out", out], capsys)[0] == 0
    logged = json.loads(open(tmp_path / "metrics.jsonl").readlines()[-1])
    assert train.main(["--evaluate", "--out", out]) == 0              # the saved weights, as evaluated in training
    again = json.loads(capsys.readouterr().out)
    assert again["step"] == 2 and again["metrics"] == {k: logged[k] for k in ("iid", "valid", "test")}
    recipe, model, _ = cli._load_run(out, "cpu", ["n_steps_eval=5"])  # TINY trains 2 steps
    x, lengths, _ = recipe.to_device(next(tasks.eval_batches(recipe.task.splits["test"], 8)))
    logits = model(x, lengths).data
    np.testing.assert_array_equal(logits, model(x, lengths, n_steps=5).data)
    assert not np.allclose(logits, model(x, lengths, n_steps=2).data)
    code, err = run(["--evaluate", "--out", out, "--set", "d_model=32"], capsys)
    assert code == 2 and "n_steps_eval" in err and err.count("\n") == 1


def test_paper_preset_matches_the_paper_table():
    cfg = train.make_config("ctl-backward", "ndr", "paper")
    e = cfg.model_config
    assert (e.d_model, e.d_ff, e.n_head, e.n_steps, cfg.lr, cfg.weight_decay) == (256, 512, 1, 14, 1.5e-4, 0.01)
    assert (e.dropout, e.attention_dropout, e.gate_dropout, cfg.steps, cfg.batch_size) == (0.5, 0.1, 0.1, 30000, 512)
    assert cfg.grad_clip == 5 and cfg.batching == "bucketed" and e.readout == "eos"
    lo = train.make_config("listops", "ndr", "paper")
    assert lo.model_config.readout == "sos" and lo.model_config.n_steps_eval == 24 and lo.grad_clip == 1
    assert train.make_config("ctl", "transformer", "paper").batching == "random"
    # embedding inits as the official code builds them (the plain Transformer ignores the sweep's kaiming)
    inits = {(t, m): train.make_config(t, m, "paper").model_config.embedding_init
             for t in ("ctl", "arith", "listops") for m in ("transformer", "transformer-rel", "ndr")}
    assert inits == {("ctl", "transformer"): "normal", ("ctl", "transformer-rel"): "kaiming", ("ctl", "ndr"): "normal",
                     ("arith", "transformer"): "normal", ("arith", "transformer-rel"): "kaiming",
                     ("arith", "ndr"): "normal", ("listops", "transformer"): "normal",
                     ("listops", "transformer-rel"): "xavier", ("listops", "ndr"): "normal"}
    # the "+ gate" baselines' d_FF is 4·d in the official code (hard-wired); every preset says so in its config
    for t in ("ctl", "arith", "listops"):
        for m in ("transformer-rel-gate", "transformer-absrel-gate"):
            for preset in ("paper", "cpu"):
                e = train.make_config(t, m, preset).model_config
                assert e.d_ff == 4 * e.d_model, (t, m, preset)


@pytest.mark.slow
def test_ndr_learns_ctl(tmp_path, capsys):
    """The cpu preset's first 2000 steps (~10 min): the loss falls far below chance (ln 8 ≈ 2.08) and
    IID accuracy jumps (the seed-0 run of RESULTS.md had IID 0.9995 at step 2000)."""
    code, _ = run(["--task", "ctl", "--model", "ndr", "--steps", "2000", "--eval-every", "1000", "--no-progress",
                   "--out", str(tmp_path)], capsys)
    assert code == 0
    log = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
    assert log[-1]["train_loss"] < 1.0
    assert log[-1]["iid"] > 0.9


def test_default_run_directory_names_the_data_options(tmp_path, capsys, monkeypatch):
    """Two training-set sizes of one task must not collide in runs/ (the second was refused before)."""
    monkeypatch.chdir(tmp_path)
    for n in (20, 30):
        argv = ["--task", "pairwise", "--model", "abstractor-simplified", "--train-size", str(n), "--steps", "2",
                "--eval-every", "2", "--no-progress"]
        assert run(argv, capsys)[0] == 0
    assert sorted(os.listdir(tmp_path / "runs")) == ["pairwise-n20-abstractor-simplified-cpu-s0",
                                                     "pairwise-n30-abstractor-simplified-cpu-s0"]
    # --report tells the two apart, and prints each run's learning curve
    assert train.main(["--report"] + [str(tmp_path / "runs" / d) for d in sorted(os.listdir(tmp_path / "runs"))]) == 0
    table = capsys.readouterr().out
    assert "| pairwise (train_size 20) | abstractor-simplified | cpu | 0 | 2 |" in table
    assert "| pairwise (train_size 30) |" in table and table.count("| step |") == 2
    curve_rows = [line for line in table.splitlines() if line.startswith("| 2 |")]   # step 2 of each curve
    assert len(curve_rows) == 2 and all(re.fullmatch(r"\| 2 (\| (\d+\.\d{4})? )+\|", row) for row in curve_rows), curve_rows
    assert "Over seeds" not in table   # two training-set sizes are two experiments, not two seeds of one
    assert train.main(["--report", str(tmp_path)]) == 2 and "no results.json" in capsys.readouterr().err
    run_dir = tmp_path / "runs" / "pairwise-n20-abstractor-simplified-cpu-s0"
    (run_dir / "results.json").write_text("{")                     # a truncated file
    assert train.main(["--report", str(run_dir)]) == 2 and "does not hold a readable run" in capsys.readouterr().err
    (run_dir / "results.json").write_text('{"task": "pairwise"}')  # not a results file of ours
    assert train.main(["--report", str(run_dir)]) == 2 and "results.json lacks best_step" in capsys.readouterr().err


def test_report_gives_mean_and_std_over_the_seeds_of_one_experiment(tmp_path, capsys):
    argv = ["--task", "pairwise", "--model", "abstractor-simplified", "--train-size", "20", "--steps", "2",
            "--eval-every", "2", "--no-progress"]
    dirs = [str(tmp_path / f"s{seed}") for seed in (0, 1, 2)]
    for seed, d in enumerate(dirs):
        assert run(argv + ["--seed", str(seed), "--out", d], capsys)[0] == 0
    other = str(tmp_path / "longer")   # a different number of steps: another experiment, its own row
    assert run(argv + ["--steps", "4", "--out", other], capsys)[0] == 0
    assert train.main(["--report"] + dirs + [other]) == 0
    seeded = [line for line in capsys.readouterr().out.split("Over seeds")[1].splitlines() if "| pairwise" in line]
    test = [json.load(open(os.path.join(d, "results.json")))["metrics"]["test"] for d in dirs]
    assert len(set(test)) > 1   # the seeds differ, so the std below is not trivially 0
    assert len(seeded) == 1 and "| 2 | 0, 1, 2 | " in seeded[0]
    assert (f"test {np.mean(test):.3f} ± {np.std(test, ddof=1):.3f} "
            f"(2 s.e. {2 * np.std(test, ddof=1) / np.sqrt(3):.3f})") in seeded[0]


def test_report_draws_the_learning_curve_over_the_training_set_size(tmp_path, capsys):
    """Runs that differ only in seed and size (the step count follows the size) are one curve, seeds
    averaged per size; another setting (here the initialisation) is another row, named in it."""
    dirs = {}
    for init, size, seed in [("default", 20, 0), ("default", 20, 1), ("default", 40, 0), ("keras", 20, 0),
                             ("default", 60, 0)]:
        d = dirs[init, size, seed] = str(tmp_path / f"{init}-n{size}-s{seed}")
        assert run(["--task", "pairwise", "--model", "abstractor-simplified", "--train-size", str(size),
                    "--steps", str(size), "--eval-every", "10", "--no-progress", "--set", f"init={init}",
                    "--seed", str(seed), "--out", d], capsys)[0] == 0
    assert train.main(["--report", *dirs.values()]) == 0
    table = capsys.readouterr().out.split("Test over the training-set size")[1]
    test = {k: json.load(open(os.path.join(d, "results.json")))["metrics"]["test"] for k, d in dirs.items()}
    assert test["default", 20, 0] != test["default", 20, 1]   # so the mean is not either seed's
    assert "| task | model | preset | settings | 20 | 40 | 60 |" in table
    two = [test["default", 20, 0], test["default", 20, 1]]
    default = f"{np.mean(two):.3f} ± {2 * np.std(two, ddof=1) / np.sqrt(2):.3f}"   # ± 2 s.e. of the mean
    assert (f"| pairwise | abstractor-simplified | cpu | init default | {default} (2) | "
            f"{test['default', 40, 0]:.3f} (1) | {test['default', 60, 0]:.3f} (1) |") in table
    # a one-size twin gets its row too, so that the curve above is not mistaken for the default
    assert f"| pairwise | abstractor-simplified | cpu | init keras | {test['keras', 20, 0]:.3f} (1) |  |  |" in table


def test_report_size_curve_cells_mix_no_budgets_but_early_stops(tmp_path, capsys):
    """Runs that stopped early at different steps are one cell without a warning (early stopping is the
    protocol); runs with another step budget are warned about."""
    base = ["--task", "pairwise", "--model", "abstractor-simplified", "--eval-every", "1", "--no-progress",
            "--set", "patience=2", "--lr", "0.01"]
    dirs = [str(tmp_path / f"n{n}-s{s}") for n in (20, 40) for s in (0, 1)]
    for d in dirs:
        n, s = d.split("/")[-1][1:].split("-s")
        assert run(base + ["--train-size", n, "--seed", s, "--out", d], capsys)[0] == 0
    steps = {json.load(open(os.path.join(d, "results.json")))["steps"] for d in dirs}
    assert len(steps) > 1   # early stopping ended the runs at different steps
    assert train.main(["--report", *dirs]) == 0
    captured = capsys.readouterr()
    assert "Test over the training-set size" in captured.out and "averages runs of" not in captured.err
    other = str(tmp_path / "longer")
    assert run(base + ["--train-size", "20", "--seed", "2", "--steps", "7", "--out", other], capsys)[0] == 0
    assert train.main(["--report", *dirs, other]) == 0
    assert "averages runs of 20 examples with different step budgets ([100, 7])" in capsys.readouterr().err
