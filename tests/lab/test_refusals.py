"""Issue 42 item 5: the holes the new-user and fault campaign found (shared/reviews/newcomer-and-faults-2.md,
LM1-LM3, L1-L3, L5, L8, and L4's path switch). One test per hole; each failed before its fix."""
import json
import os
import shutil
import signal
import subprocess

import numpy as np
import pytest

import tasks
import train
from minattn.engine import is_plain, plain
from minattn.lab.recipes import recipe_for

from tests.lab.test_unanswered_input import _rewrite, _set, fresh, trained  # noqa: F401 (fixtures)
from tests.lab.test_rundir import one_line_error
from tests.lab.test_train import ROOT, TINY, ctl_generated, run  # noqa: F401 (ctl_generated: an autouse fixture)


def _log_steps(out):
    return [json.loads(line)["step"] for line in open(os.path.join(out, "metrics.jsonl"))]


# --- LM1: bytes that are not UTF-8 in the log ------------------------------------------------------------

def test_a_log_line_that_is_not_utf8_is_skipped_by_resume_and_report(fresh, capsys):
    with open(os.path.join(fresh, "metrics.jsonl"), "ab") as f:
        f.write(b"\xff\xfe bad\n")
    code, err = run(["--report", fresh], capsys)
    assert code == 0 and "Traceback" not in err and "skipped" not in err.replace("skipped 1 unreadable", "")
    code, err = run(["--resume", fresh, "--steps", "4", "--no-progress"], capsys)
    assert code == 0 and "dropped 1" in err, err                  # with the resume's usual warning
    assert _log_steps(fresh) == [2, 4]


# --- LM2: a hard-linked copy of a run directory -----------------------------------------------------------

def test_a_hard_linked_copy_is_refused_and_never_writes_into_the_original(fresh, tmp_path, capsys):
    copy = str(tmp_path / "copy")
    subprocess.run(["cp", "-al", fresh, copy], check=True)        # a snapshot: every file shared
    before = {n: open(os.path.join(fresh, n), "rb").read() for n in os.listdir(fresh)}
    code, err = run(["--resume", copy, "--steps", "4", "--no-progress"], capsys)
    one_line_error(code, err)
    assert "hard link" in err and os.path.join(copy, "lock") in err
    os.remove(os.path.join(copy, "lock"))                         # as the message says: the log is copied
    code, err = run(["--resume", copy, "--steps", "4", "--no-progress"], capsys)
    assert code == 0, err
    assert {n: open(os.path.join(fresh, n), "rb").read() for n in os.listdir(fresh)} == before
    assert _log_steps(copy) == [2, 4] and _log_steps(fresh) == [2]


# --- LM3: make train passes TASK and MODEL only when given ------------------------------------------------

def _make_train(*args):
    if not shutil.which("make"):
        pytest.skip("no make")
    env = {k: v for k, v in os.environ.items() if k not in ("TASK", "MODEL", "DEVICE", "ARGS", "MAKEFLAGS")}
    p = subprocess.run(["make", "-n", "train", *args], cwd=ROOT, capture_output=True, text=True, env=env)
    assert p.returncode == 0, p.stderr
    return next(line for line in p.stdout.splitlines() if "train.py" in line).split("train.py", 1)[1].split()


def test_make_train_passes_task_and_model_only_when_given():
    assert _make_train("ARGS=--resume runs/pw --steps 20") == ["--resume", "runs/pw", "--steps", "20"]
    assert _make_train() == []                                    # train.py's defaults: ctl / ndr
    assert _make_train("TASK=ctl", "DEVICE=gpu") == ["--task", "ctl", "--device", "gpu"]   # the README's
    assert _make_train("TASK=pairwise", "MODEL=abstractor") == ["--task", "pairwise", "--model", "abstractor"]


# --- L1: SIGTERM during an evaluation ---------------------------------------------------------------------

def test_sigterm_in_an_evaluation_abandons_it_and_the_resume_is_exact(tmp_path, capsys, monkeypatch):
    """The evaluation stops at once (not after it ends: 26 s seen); the step is saved with its interval's sums
    and no log line; the resume evaluates that step first, and logs and ends as an uninterrupted run."""
    straight, stopped = str(tmp_path / "straight"), str(tmp_path / "stopped")
    assert train.main(TINY + ["--steps", "6", "--out", straight]) == 0
    recipe = recipe_for("ctl")
    evaluate, calls = recipe.evaluate, []

    def term_in_the_second(self, model):
        calls.append("started")
        if len(calls) == 2:                                       # the evaluation of step 4
            os.kill(os.getpid(), signal.SIGTERM)
            calls.append("went on")                               # never, if SIGTERM is honoured at once
        return evaluate(self, model)
    monkeypatch.setattr(recipe, "evaluate", term_in_the_second)
    capsys.readouterr()
    assert train.main(TINY + ["--steps", "6", "--out", stopped]) == 143
    assert capsys.readouterr().err.endswith("terminated: the last checkpoint is intact; continue with --resume\n")
    assert calls == ["started", "started"] and _log_steps(stopped) == [2]
    ckpt = train.load_checkpoint(os.path.join(stopped, "checkpoint.npz"))
    assert ckpt["step"] == 4 and ckpt["running"]["n_batches"] == 2
    monkeypatch.setattr(recipe, "evaluate", evaluate)
    assert train.main(["--resume", stopped, "--no-progress"]) == 0
    a, b = (train.load_checkpoint(os.path.join(d, "checkpoint.npz")) for d in (straight, stopped))
    for k in a["model"]:
        np.testing.assert_array_equal(a["model"][k], b["model"][k])
    logs = [[{k: v for k, v in json.loads(line).items() if k != "wall_s"}
             for line in open(os.path.join(d, "metrics.jsonl"))] for d in (straight, stopped)]
    assert logs[0] == logs[1] and [e["step"] for e in logs[1]] == [2, 4, 6]


# --- L2: non-finite settings ------------------------------------------------------------------------------

@pytest.mark.parametrize("setting", ["weight_decay=nan", "weight_decay=inf", "grad_clip=nan", "lr=inf"])
def test_a_non_finite_setting_is_refused_in_one_line(setting, tmp_path, capsys):
    out = tmp_path / "run"
    code, err = run(TINY + ["--steps", "2", "--set", setting, "--out", str(out)], capsys)
    one_line_error(code, err)
    key, value = setting.split("=")
    assert f"{key} must be a finite number" in err and f"got {value}" in err and not out.exists()


# --- L4: the path (MINATTN_PLAIN) of a run ----------------------------------------------------------------

def test_a_resume_that_switches_the_path_is_refused(fresh, capsys):
    saved = train.load_checkpoint(os.path.join(fresh, "checkpoint.npz"))["plain"]
    assert saved is is_plain()
    with plain(not saved):
        code, err = run(["--resume", fresh, "--steps", "4", "--no-progress"], capsys)
    one_line_error(code, err)
    assert f"continue with MINATTN_PLAIN={int(saved)}" in err and "not bit for bit" in err
    _rewrite(os.path.join(fresh, "checkpoint.npz"), edit_meta=lambda meta: meta.pop("plain"))   # not recorded
    with plain(not saved):
        code, err = run(["--resume", fresh, "--steps", "4", "--no-progress"], capsys)
    one_line_error(code, err)
    assert "is a run of an older minattn (its checkpoint.npz lacks plain)" in err


def test_a_gpu_resume_that_switches_the_kernels_is_refused_a_cpu_one_is_not(fresh, capsys):
    """MINATTN_KERNELS=1 changes a GPU run's last bits (the kernels sum in another order), nothing on the
    CPU: a GPU resume on the other setting is refused, naming the variable; a CPU one continues. (Each
    checkpoint is on its device's default path: the annex on the GPU, the textbook one on the CPU.)"""
    from minattn.fast import kernels
    from minattn.lab.settings import make_config, resume_check, saved_settings
    path = os.path.join(fresh, "checkpoint.npz")
    ckpt = train.load_checkpoint(path)
    assert ckpt["kernels"] is False
    with kernels.switched(True):
        for device, refused in (("gpu", True), ("cpu", False)):
            _rewrite(path, edit_meta=_set("plain", device == "cpu"))
            saved = saved_settings(ckpt, path)
            run_cfg = make_config(saved.pop("task"), saved.pop("model"), saved.pop("preset"), **saved)
            run_cfg.device, run_cfg.steps = device, None
            if refused:
                with pytest.raises(train.UsageError, match="continue with MINATTN_KERNELS=0"):
                    resume_check(run_cfg, fresh)
            else:
                resume_check(run_cfg, fresh)


def test_a_checkpoints_path_must_be_true_or_false(fresh, capsys):
    _rewrite(os.path.join(fresh, "checkpoint.npz"), edit_meta=_set("plain", "yes"))
    code, err = run(["--evaluate", "--out", fresh], capsys)
    one_line_error(code, err)
    assert "corrupted (plain" in err


# --- L3: absurd loop counts in a checkpoint ---------------------------------------------------------------

@pytest.mark.parametrize("field", ["n_steps", "n_steps_eval"])
def test_an_absurd_loop_count_in_a_checkpoint_is_refused(field, fresh, capsys):
    _rewrite(os.path.join(fresh, "checkpoint.npz"), edit_meta=_set(f"config.model_config.{field}", 10 ** 9))
    for mode in (["--evaluate", "--out", fresh], ["--resume", fresh, "--steps", "4", "--no-progress"]):
        code, err = run(mode, capsys)
        one_line_error(code, err)
        assert f"corrupted (config.{field}: 1000000000" in err


def test_an_absurd_loop_count_in_set_is_refused(capsys):
    code, err = run(TINY + ["--set", "n_steps_eval=1000000000", "--show-config"], capsys)
    one_line_error(code, err)
    assert "n_steps_eval" in err and "10,000" in err


# --- L5: the Python API's errors ----------------------------------------------------------------------------

@pytest.mark.parametrize("args,message", [
    (("ctl", "ndr", "gpu"), "unknown preset 'gpu'; valid presets: cpu, paper"),
    (("ctl", "nope", "cpu"), "unknown model 'nope' for task ctl; valid models: transformer, "),
])
def test_recipe_config_names_a_bad_name(args, message):
    with pytest.raises(train.UsageError) as e:
        recipe_for("ctl").config(*args)
    assert message in str(e.value)


# --- L8: tasks.py's --set values ----------------------------------------------------------------------------

@pytest.mark.parametrize("setting,message", [
    ("n_train=abc", "--set n_train=abc: expected an integer"),
    ("n_train=1.5", "--set n_train=1.5: expected an integer"),
    ("n_train=-1", "--set n_train=-1: expected an integer from 1 to 10,000,000"),
    ("max_length=0", "--set max_length=0: expected an integer from 1 to 10,000,000"),
    ("n_train=1000000000000", "--set n_train=1000000000000: expected an integer from 1 to 10,000,000"),
])
def test_tasks_set_values_are_typed_and_checked(setting, message, tmp_path, capsys):
    assert tasks.main(["stats", "--task", "arith", "--cache-dir", str(tmp_path), "--set", setting]) == 2
    err = capsys.readouterr().err
    assert err == f"tasks.py: error: {message}\n"


@pytest.mark.parametrize("task,max_length,patch", [
    ("arith", 10, ("minattn.data.ndr", "STALL", 2_000)),      # too short for every depth
    ("arith", 15, ("minattn.data.ndr", "STALL", 2_000)),      # long enough for the shallow depths only
    ("listops", 10, ("minattn.data.listops.ListOpsTask", "IDLE_CHUNKS", 2))])
def test_a_max_length_too_short_for_the_depths_is_refused_not_a_hang(task, max_length, patch, tmp_path,
                                                                     capsys, monkeypatch):
    """arith's test split needs depth 8-9 expressions (about 33 characters at least): max_length=10 made
    the rejection sampler draw forever, and so did 15, which fits the shallow depths (their bins fill, the
    deep ones never do). Now a long enough run of draws without a new example is one line and exit 2."""
    import importlib
    module, _, attr = patch[0].rpartition(".") if task == "listops" else (patch[0], None, None)
    target = getattr(importlib.import_module(module), attr) if attr else importlib.import_module(module)
    monkeypatch.setattr(target, patch[1], patch[2])   # a shorter patience, so the test is quick
    argv = ["stats", "--task", task, "--cache-dir", str(tmp_path), "--set", f"max_length={max_length}"]
    assert tasks.main(argv + ["--set", "n_train=50"]) == 2
    last = capsys.readouterr().err.splitlines()[-1]   # after the "generating ..." line
    assert last.startswith("tasks.py: error: ") and last.endswith("raise max_length")
