"""The Abstractor's runs through train.py: epochs, refusals, a pairwise run end to end, the sorting metrics and stopping rules."""
import json

import pytest

import tasks
import train
from minattn.lab import recipes
from minattn.lab.recipes.base import schedule


# --- the training recipes ------------------------------------------------------------------------------------

def test_steps_and_evaluations_count_epochs():
    cfg = train.make_config("sort", "abstractor", "cpu", train_size=2000, eval_epochs=10)
    assert (cfg.steps, cfg.eval_every) == (None, None)          # the preset counts in epochs ...
    run = schedule(cfg)                                         # ... resolved before the recipe is built
    assert (run.steps, run.eval_every, run.batch_size, run.grad_clip, run.weight_decay) == (1600, 40, 512, 0.0, 0.0)
    run = schedule(train.make_config("sort", "abstractor", "paper", train_size=500, steps=7))
    assert (run.steps, run.eval_every) == (7, 1)
    # the preset's rule is the one behind the paper's Fig. 4 (the training loss); the released code's on request
    assert recipes.recipe_for("sort")(run).selection.metric == "train_loss"
    run = schedule(train.make_config("sort", "abstractor", "cpu", stop_on="valid_tf"))
    assert recipes.recipe_for("sort")(run).selection.metric == "valid_tf"
    cfg = schedule(train.make_config("set", "abstractor-simplified"))
    assert (cfg.steps, cfg.model_config.activation, cfg.model_config.symmetric) == (200 * 32, "linear", True)


@pytest.mark.parametrize("argv,message", [
    (["--task", "sort", "--model", "abstractor-simplified"], "valid models: abstractor, abstractor-ablation"),
    (["--task", "sort", "--model", "abstractor", "--train-size", "80000"], "train size 80000 is out of range"),
    (["--task", "sort", "--model", "abstractor", "--set", "architecture=c"], "unknown architecture"),
    (["--task", "set", "--model", "abstractor-simplified", "--set", "cards=images"], "unknown card encoding"),
    (["--task", "ctl", "--model", "ndr", "--train-size", "5"], "task ctl has no --train-size"),
])
def test_bad_settings_exit_2_with_one_line(argv, message, tmp_path, capsys):
    assert train.main(argv + ["--out", str(tmp_path / "run"), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_pairwise_run_end_to_end(tmp_path, capsys):
    out = tmp_path / "run"
    argv = ["--task", "pairwise", "--model", "abstractor-simplified", "--train-size", "100", "--out", str(out),
            "--no-progress", "--set", "epochs=3"]
    assert train.main(argv) == 0
    res = json.loads((out / "results.json").read_text())
    assert res["steps"] == 6 and set(res["metrics"]) == {"train", "valid", "valid_loss", "test"}
    assert res["config"]["options"]["train_size"] == 100
    log = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [e["step"] for e in log] == [2, 4, 6]
    best = min(log, key=lambda e: (e["valid_loss"], -e["step"]))
    assert res["metrics"]["test"] == best["test"] and res["best_step"] == best["step"]


def test_sort_greedy_metrics_use_the_selected_parameters(tmp_path, monkeypatch):
    """A tiny sort run (a small data set and model) through the real recipe, with the selection metric
    forced to peak at the first evaluation (step 2 of 6): the greedy metrics are computed once, at the end,
    with exactly the step-2 parameters, also when the run was interrupted and resumed after the peak."""
    monkeypatch.setattr(recipes.abstractor.Sort, "make_task", lambda self: tasks.SortTask(n_sequences=400))
    evaluate, evaluate_selected = recipes.abstractor.Sort.evaluate, recipes.abstractor.Sort.evaluate_selected
    calls, used = [], {}

    def peaked(self, model):
        calls.append(1)
        return dict(evaluate(self, model), valid_tf=0.9 if len(calls) == 1 else 0.5)

    def spy(self, model):
        used.clear()
        used.update(model.state_dict())
        return evaluate_selected(self, model)
    monkeypatch.setattr(recipes.abstractor.Sort, "evaluate", peaked)
    monkeypatch.setattr(recipes.abstractor.Sort, "evaluate_selected", spy)

    def run(out, steps, resume=False):
        cfg = train.make_config("sort", "abstractor", "cpu", train_size=64, batch_size=32, steps=steps, eval_every=2,
                                d_model=8, d_ff=8, eval_batch_size=50, stop_on="valid_tf", patience=50)
        return train.train(cfg, str(tmp_path / out), resume=resume, progress=False)

    res = run("full", 6)
    assert res["best_step"] == 2 and res["steps"] == 6
    assert set(res["metrics"]) == {"valid_tf", "train", "valid", "test", "test_elem"}
    assert 0 <= res["metrics"]["test"] <= res["metrics"]["test_elem"] <= 1
    log = [json.loads(line) for line in (tmp_path / "full" / "metrics.jsonl").read_text().splitlines()]
    assert [e["step"] for e in log] == [2, 4, 6] and all("test" not in e for e in log)
    used_full = dict(used)
    final = train.load_checkpoint(str(tmp_path / "full" / "checkpoint.npz"))["model"]
    assert any((final[k] != used_full[k]).any() for k in final)       # step 6 is not what was evaluated

    calls.clear()
    short = run("short", 2)                                          # the step-2 model, by itself
    step2 = train.load_checkpoint(str(tmp_path / "short" / "checkpoint.npz"))["model"]
    assert all((step2[k] == used_full[k]).all() for k in step2)
    assert short["metrics"]["test"] == res["metrics"]["test"]

    calls.clear()
    run("resumed", 4)
    resumed = run("resumed", 6, resume=True)
    assert all((step2[k] == used[k]).all() for k in step2)
    assert resumed["metrics"] == res["metrics"] and resumed["best_step"] == 2


def test_early_stopping_after_patience_epochs(tmp_path):
    """patience 2 epochs of 2 steps: training ends at the first evaluation 4 steps after the first best one
    (a tie is no improvement, as in Keras' EarlyStopping)."""
    cfg = train.make_config("pairwise", "abstractor-simplified", train_size=100, epochs=50, patience=2)
    res = train.train(cfg, str(tmp_path / "run"), progress=False)
    log = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    first_best = [min(log[:i + 1], key=lambda e: (e["valid_loss"], e["step"]))["step"] for i in range(len(log))]
    gaps = [e["step"] - b for e, b in zip(log, first_best)]
    assert res["steps"] == log[-1]["step"] < 100 and gaps[-1] >= 4 and all(g < 4 for g in gaps[:-1])
    assert res["metrics"]["valid_loss"] == min(e["valid_loss"] for e in log)


def test_sort_stop_on_train_loss(tmp_path, monkeypatch):
    """``stop_on=train_loss`` (the figure-era rule of the authors' sorting script): nothing but the training
    loss is logged, the run stops ``patience`` epochs after the lowest training loss and reports valid and test
    decoded with that epoch's parameters; an unknown rule is a UsageError."""
    monkeypatch.setattr(recipes.abstractor.Sort, "make_task", lambda self: tasks.SortTask(n_sequences=400))
    cfg = train.make_config("sort", "abstractor", "cpu", train_size=64, batch_size=32, d_model=8, d_ff=8,
                            eval_batch_size=50, stop_on="train_loss", patience=1, eval_epochs=1, epochs=40, lr=0.3)
    res = train.train(cfg, str(tmp_path / "run"), progress=False)
    log = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert all(set(e) == {"step", "train_loss", "train_tf_acc", "wall_s"} for e in log)
    best = min(log, key=lambda e: (e["train_loss"], e["step"]))
    assert res["best_step"] == best["step"] and res["steps"] == log[-1]["step"] < 80
    assert log[-1]["step"] - best["step"] >= 2 and all(e["train_loss"] > best["train_loss"] for e in log
                                                        if e["step"] > best["step"])
    assert set(res["metrics"]) == {"valid", "test", "test_elem"}
    with pytest.raises(train.UsageError, match="stop_on"):
        train.train(train.make_config("sort", "abstractor", "cpu", stop_on="valid_loss"), str(tmp_path / "bad"),
                    progress=False)
