"""Issue 30: nothing a user types, a signal or a shared disk does goes unanswered. One test per finding of the
second fault campaign (docs: the review's N1-N20 and its still-there rows); each failed before the fix.
The long harness (kills at random moments, every crafted checkpoint in every mode) is tests/lab/test_kill_and_resume_harness.py,
marked slow."""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import zipfile

import numpy as np
import pytest

import tasks
import train
from minattn import backend, nn
from minattn.lab import rundir, viz

from tests.lab.test_rundir import one_line_error
from tests.lab.test_train import ROOT, TINY, ctl_generated, run  # noqa: F401 (ctl_generated: an autouse fixture)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A finished 2-step TINY run (checkpoint at step 2), copied afresh by ``fresh``."""
    out = str(tmp_path_factory.mktemp("trained") / "run")
    assert train.main(TINY + ["--steps", "2", "--out", out]) == 0
    return out


@pytest.fixture
def fresh(trained, tmp_path, capsys):
    out = str(tmp_path / "run")
    shutil.copytree(trained, out)
    capsys.readouterr()
    return out


def _arrays(path):
    with np.load(path, allow_pickle=False) as z:
        return {k: z[k] for k in z.files}


def _rewrite(path, edit_arrays=None, edit_meta=None):
    arrays = _arrays(path)
    meta = json.loads(arrays["metadata"].item())
    if edit_meta:
        edit_meta(meta)
    if edit_arrays:
        edit_arrays(arrays)
    arrays["metadata"] = np.array(json.dumps(meta))
    with open(path, "wb") as f:
        np.savez(f, **arrays)


# --- 2. locks and every write in a run directory: never through a link --------------------------------------

@pytest.mark.parametrize("name", ["lock", "metrics.jsonl"])
def test_a_symlinked_lock_or_log_is_never_written_through(name, fresh, tmp_path, capsys):
    """A symbolic lock is refused (it is never replaced: see rundir.locked); a symbolic log is replaced by a file
    of the run's own (--resume rewrites the log whole). Either way the link's target is untouched."""
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    os.remove(os.path.join(fresh, name))
    os.symlink(victim, os.path.join(fresh, name))
    if name == "metrics.jsonl":   # the log is checked against the checkpoint first: make it agree, then append
        shutil.copy(os.path.join(fresh, "checkpoint.npz"), tmp_path / "ckpt")
        history = train.load_checkpoint(str(tmp_path / "ckpt"))["history"]
        victim.write_text("".join(json.dumps(h) + "\n" for h in history))
    before = victim.read_text()
    code, err = run(TINY + ["--steps", "4", "--out", fresh, "--resume"], capsys)
    if name == "lock":
        one_line_error(code, err)
        assert "symbolic link" in err
    else:
        assert code == 0 and not os.path.islink(os.path.join(fresh, name)), err
        assert [json.loads(line)["step"] for line in open(os.path.join(fresh, name))] == [2, 4]
        os.remove(os.path.join(fresh, name))
        os.symlink(victim, os.path.join(fresh, name))       # a link made while a run appends to its log
        with pytest.raises(train.UsageError, match="symbolic link"):
            rundir.append_line(os.path.join(fresh, name), "{}\n")
    assert victim.read_text() == before


def test_a_lock_that_is_a_fifo_is_refused_without_hanging(tmp_path, capsys):
    out = tmp_path / "run"
    out.mkdir()
    os.mkfifo(out / "lock")
    code, err = run(TINY + ["--steps", "2", "--out", str(out)], capsys)
    one_line_error(code, err)
    assert "special file" in err or "not a regular file" in err


def test_pictures_are_not_written_through_a_link(fresh, tmp_path, capsys):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    os.symlink(elsewhere, os.path.join(fresh, "plots"))
    code, err = run(["--plot", "--out", fresh], capsys)
    one_line_error(code, err)
    assert "--plot-dir" in err and not os.listdir(elsewhere)
    png = tmp_path / "p.png"
    victim = tmp_path / "victim"
    victim.write_text("precious")
    os.symlink(victim, png)
    pytest.importorskip("matplotlib")
    picture = viz.Picture("x", "t", [viz.Panel(np.eye(2), "m", rows=["a", "b"], cols=["a", "b"])])
    viz.save_png(picture, str(png))
    assert victim.read_text() == "precious" and not png.is_symlink()
    os.remove(png)                                    # a hard link (a cp -al copy's picture): a new file too
    os.link(victim, png)
    viz.save_png(picture, str(png))
    assert victim.read_text() == "precious" and os.stat(png).st_nlink == 1


def test_the_lock_message_does_not_name_a_dead_pid(tmp_path, capsys):
    out = tmp_path / "run"
    holder = subprocess.Popen([sys.executable, "-c", "import fcntl, sys, time\nf = open(sys.argv[1], 'a+')\n"
                               "fcntl.flock(f, fcntl.LOCK_EX)\nprint('locked', flush=True)\ntime.sleep(60)",
                               str(out / "lock")], stdout=subprocess.PIPE, text=True)
    out.mkdir()
    try:
        (out / "lock").write_text("999999999\n")   # the pid of a minattn run that has long exited
        assert holder.stdout.readline().strip() == "locked"
        code, err = run(TINY + ["--steps", "2", "--out", str(out)], capsys)
        one_line_error(code, err)
        assert "(pid unknown)" in err
    finally:
        holder.kill()
        holder.wait()


# --- 1. signals and temp files --------------------------------------------------------------------------------

def test_stale_temp_files_are_swept_when_a_run_takes_the_directory(fresh, capsys):
    for i in range(3):
        with open(os.path.join(fresh, f".tmp-killed{i}"), "wb") as f:
            f.write(b"\0" * 1000)
    assert run(TINY + ["--steps", "4", "--out", fresh, "--resume"], capsys)[0] == 0
    assert not [n for n in os.listdir(fresh) if n.startswith(".tmp-")]


@pytest.mark.parametrize("signum,exc", [(signal.SIGINT, KeyboardInterrupt), (signal.SIGTERM, rundir.Terminated)])
def test_a_signal_during_a_write_leaves_the_old_file_whole_and_no_temp_file(signum, exc, tmp_path):
    """Ctrl-C or SIGTERM in the middle of an atomic write: the run stops, the file keeps its old content whole
    and the temporary file is gone (a kill -9 leaves it, for the lock's next holder to sweep)."""
    path = tmp_path / "results.json"
    path.write_text("old")

    def write(f):
        f.write("new, ")
        os.kill(os.getpid(), signum)
        f.write("whole")
    with pytest.raises(exc), rundir.handling_signals():
        rundir.write_atomic(str(path), write)
    assert path.read_text() == "old" and os.listdir(tmp_path) == ["results.json"]


def _start(out, steps, *extra):
    return subprocess.Popen([sys.executable, "train.py", *TINY, "--steps", str(steps), "--out", out, *extra],
                            cwd=ROOT, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)


def test_sigterm_stops_a_run_cleanly_with_exit_143(tmp_path):
    out = str(tmp_path / "run")
    p = _start(out, 100000)
    deadline = time.time() + 60
    while not os.path.exists(os.path.join(out, "checkpoint.npz")) and time.time() < deadline:
        time.sleep(0.05)
    p.send_signal(signal.SIGTERM)
    err = p.communicate(timeout=60)[1]
    assert p.returncode == 143, err
    assert err.splitlines()[-1] == "terminated: the last checkpoint is intact; continue with --resume", err
    assert "Traceback" not in err and not [n for n in os.listdir(out) if n.startswith(".tmp-")]
    assert train.load_checkpoint(os.path.join(out, "checkpoint.npz"))["step"] >= 2


def test_sigterm_saves_the_step_it_came_in_and_the_resume_is_exact(tmp_path, capsys, monkeypatch):
    """SIGTERM between two evaluations: the step it arrives in is saved (with the interval's running sums),
    exit 143; the resume then logs and ends exactly as an uninterrupted run."""
    straight, stopped = str(tmp_path / "straight"), str(tmp_path / "stopped")
    argv = TINY[:TINY.index("--eval-every")] + TINY[TINY.index("--eval-every") + 2:] + ["--eval-every", "4"]
    assert train.main(argv + ["--steps", "8", "--out", straight]) == 0
    calls, clip = [], train.optim.clip_grad_norm

    def clip_then_term(*args, **kwargs):
        calls.append(1)
        if len(calls) == 6:                                   # in step 6, between the evaluations of 4 and 8
            os.kill(os.getpid(), signal.SIGTERM)
        return clip(*args, **kwargs)
    monkeypatch.setattr(train.optim, "clip_grad_norm", clip_then_term)
    capsys.readouterr()
    assert train.main(argv + ["--steps", "8", "--out", stopped]) == 143
    assert capsys.readouterr().err.endswith("terminated: the last checkpoint is intact; continue with --resume\n")
    assert train.load_checkpoint(os.path.join(stopped, "checkpoint.npz"))["step"] == 6     # not 4: nothing lost
    monkeypatch.setattr(train.optim, "clip_grad_norm", clip)
    assert train.main(["--resume", stopped, "--no-progress"]) == 0
    a, b = (train.load_checkpoint(os.path.join(d, "checkpoint.npz")) for d in (straight, stopped))
    assert a["step"] == b["step"] == 8 and not b["running_sums"]
    for k in a["model"]:
        np.testing.assert_array_equal(a["model"][k], b["model"][k])
    logs = [[{k: v for k, v in json.loads(line).items() if k != "wall_s"}
             for line in open(os.path.join(d, "metrics.jsonl"))] for d in (straight, stopped)]
    assert logs[0] == logs[1] and [e["step"] for e in logs[1]] == [4, 8]   # train_loss of 5-8 as if never stopped


# --- 1. crafted checkpoints: one line, exit 2, no traceback, no hang ------------------------------------------

def _set(path, value):
    def edit(meta):
        *keys, last = path.split(".")
        d = meta
        for k in keys:
            d = d[k]
        d[last] = value
    return edit


def _param(arrays):
    return next(k for k in arrays if k.startswith("model/"))


def _retype(dtype):
    def edit(arrays):
        k = _param(arrays)
        arrays[k] = arrays[k].astype(dtype)
    return edit


def _fill(value):
    def edit(arrays):
        k = _param(arrays)
        arrays[k] = np.full_like(arrays[k], value)
    return edit


CRAFTED = {   # name: (edit of the metadata, edit of the arrays, what the one line says)
    "config.lr a string": (_set("config.lr", "fast"), None, "config.lr: expected a number"),
    "model_config a list": (_set("config.model_config", [1]), None, "config: expected"),
    "config a string": (_set("config", "x"), None, "config: expected"),
    "history of strings": (_set("history", ["a", "b"]), None, "history: expected"),
    "history an int": (_set("history", 5), None, "history: expected"),
    "best a list": (_set("best", [1]), None, "best: expected"),
    "step negative": (_set("step", -3), None, "step: expected"),
    "step a string": (_set("step", "200"), None, "step: expected"),
    "train_time a string": (_set("train_time", "x"), None, "train_time: expected"),
    "config edited: d_model": (_set("config.model_config.d_model", 32), None, "does not fit the model"),
    "float64 weights": (None, _retype(np.float64), "expected float32"),
    "float16 weights": (None, _retype(np.float16), "expected float32"),
    "int32 weights": (None, _retype(np.int32), "expected float32"),
    "complex weights": (None, _retype(np.complex64), "expected float32"),
    "NaN weights": (None, _fill(np.nan), "is not finite"),
    "inf weights": (None, _fill(np.inf), "is not finite"),
    "an array of no parameter": (None, lambda a: a.update({"model/evil": np.zeros(3, np.float32)}), "of no parameter"),
    # the layout of issue 29: task options beside model_config, the last evaluation's metrics kept apart
    "options a list": (_set("config.options", [1]), None, "config: expected"),
    "an option ctl does not take": (_set("config.options", {"train_size": 5}), None, "config.train_size: no such setting"),
    "device not cpu or gpu": (_set("config.device", "tpu"), None, "config.device: 'tpu', not cpu or gpu"),
    "last a list": (_set("last", [1]), None, "last: expected"),
    "last with a string metric": (_set("last", {"valid": "x"}), None, "last: expected"),
    # json reads NaN and Infinity, which minattn never writes (a NaN in history crashed repair_log)
    "NaN in the history": (_set("history", [{"step": 1, "iid": float("nan")}]), None, "corrupted or unreadable"),
    "Infinity as the train time": (_set("train_time", float("inf")), None, "corrupted or unreadable"),
    "a newer minattn's format": (_set("version", 3), None, "is a newer minattn's (format 3): update minattn"),
}


@pytest.mark.parametrize("mode", ["--resume", "--evaluate"])
@pytest.mark.parametrize("case", list(CRAFTED))
def test_a_crafted_checkpoint_is_one_line(case, mode, fresh, capsys):
    edit_meta, edit_arrays, message = CRAFTED[case]
    _rewrite(os.path.join(fresh, "checkpoint.npz"), edit_arrays, edit_meta)
    argv = (["--resume", fresh, "--steps", "4", "--no-progress"] if mode == "--resume"
            else ["--evaluate", "--out", fresh])
    code, err = run(argv, capsys)
    one_line_error(code, err)
    assert message in err


def test_a_fifo_named_checkpoint_is_refused_without_hanging(fresh, capsys):
    os.remove(os.path.join(fresh, "checkpoint.npz"))
    os.mkfifo(os.path.join(fresh, "checkpoint.npz"))
    for argv in (["--evaluate", "--out", fresh], ["--resume", fresh, "--no-progress"]):
        code, err = run(argv, capsys)
        one_line_error(code, err)
        assert "not a regular file" in err


@pytest.mark.parametrize("name", ["metrics.jsonl", "results.json"])
def test_a_fifo_log_or_results_is_refused_without_hanging(name, fresh, capsys):
    path = os.path.join(fresh, name)
    os.remove(path)
    os.mkfifo(path)
    assert train.main(["--report", fresh]) in (0, 2)                  # a warning, or the row without a curve
    assert "Traceback" not in capsys.readouterr().err
    code, err = run(["--resume", fresh, "--steps", "4", "--no-progress"], capsys)
    if name == "metrics.jsonl":   # read on --resume: refused
        assert code == 2 and err.splitlines()[-1] == f"error: not a regular file: {path}", err
    else:                         # only written: replaced whole, as a link would be
        assert code == 0 and os.path.isfile(path) and json.load(open(path))["steps"] == 4


def test_a_zip_bomb_is_refused_before_it_is_inflated(fresh, capsys):
    path = os.path.join(fresh, "checkpoint.npz")
    arrays = _arrays(path)
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:   # 64 MiB of zeros in ~64 KiB
        for k, v in arrays.items():
            with z.open(k + ".npy", "w") as f:
                np.lib.format.write_array(f, v)
        with z.open("model/bomb.npy", "w", force_zip64=True) as f:
            np.lib.format.write_array(f, np.zeros(1 << 24, np.float32))
    assert os.path.getsize(path) < 4 << 20
    code, err = run(["--evaluate", "--out", fresh], capsys)
    one_line_error(code, err)
    assert "declare" in err


def test_an_array_declaring_more_than_its_member_holds_is_refused(fresh, capsys):
    path = os.path.join(fresh, "checkpoint.npz")
    arrays = _arrays(path)
    with zipfile.ZipFile(path, "w") as z:
        for k, v in arrays.items():
            with z.open(k + ".npy", "w") as f:
                np.lib.format.write_array(f, v)
        header = {"descr": "<f4", "fortran_order": False, "shape": (10 ** 12,)}
        with z.open("model/huge.npy", "w") as f:
            np.lib.format.write_array_header_1_0(f, header)
    start = time.time()
    code, err = run(["--evaluate", "--out", fresh], capsys)
    one_line_error(code, err)
    assert "checkpoint" in err and "is corrupted" in err and time.time() - start < 10   # nothing allocated


@pytest.mark.parametrize("strip", ["every parameter", "one parameter"])
def test_a_checkpoint_without_its_optimizer_state_is_refused_on_resume(strip, fresh, capsys):
    path = os.path.join(fresh, "checkpoint.npz")
    first = [None]

    def drop(arrays):
        names = sorted(k for k in arrays if k.startswith("optimizer/"))
        first[0] = names[0].rpartition("/")[0]
        for k in names if strip == "every parameter" else [k for k in names if k.startswith(first[0] + "/")]:
            del arrays[k]
    _rewrite(path, drop)
    code, err = run(["--resume", fresh, "--steps", "4", "--no-progress"], capsys)
    one_line_error(code, err)
    assert "lacks the optimizer state" in err and "could not continue exactly" in err
    assert run(["--evaluate", "--out", fresh], capsys)[0] == 0      # the weights alone still evaluate


# --- 1. bad command lines ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("args,message", [
    (["--evaluate", "--plot"], "--evaluate and --plot are separate modes"),
    (["--analyze", "--evaluate"], "--analyze and --evaluate are separate modes"),
    (["--report", "x", "--plot"], "--report and --plot are separate modes"),
    (["--show-config", "--evaluate"], "--evaluate and --show-config are separate modes"),
])
def test_two_modes_at_once_are_refused(args, message, fresh, capsys):
    code, err = run(args + ["--out", fresh], capsys)
    one_line_error(code, err)
    assert message in err


@pytest.mark.parametrize("flag", ["--task", "--out", "--model", "--preset", "--resume"])
def test_an_empty_flag_is_refused_not_taken_as_the_default(flag, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, err = run([flag, "", "--steps", "1", "--no-progress"], capsys)
    one_line_error(code, err)
    assert f"{flag} is empty" in err and not os.path.exists(tmp_path / "runs")


def test_an_empty_device_is_refused_not_taken_as_the_cpu(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, err = run(["--device", "", "--steps", "1", "--no-progress"], capsys)
    one_line_error(code, err)
    assert "unknown device ''" in err and not os.path.exists(tmp_path / "runs")


def test_resume_with_another_preset_task_or_model_says_so(fresh, capsys):
    for flag, value in (("--preset", "paper"), ("--task", "lookup"), ("--model", "transformer")):
        code, err = run(["--resume", fresh, flag, value, "--no-progress"], capsys)
        one_line_error(code, err)
        assert f"holds a ctl / ndr run (cpu preset), not {flag} {value}" in err
    code, err = run(["--resume", fresh, "--task", "ctl", "--steps", "4", "--no-progress"], capsys)   # its own task
    assert code == 0, err
    # both given (make train's long form), the run's own: it continues; a mismatch names the run, not settings
    code, err = run(["--resume", fresh, "--task", "ctl", "--model", "ndr", "--steps", "6", "--no-progress"],
                    capsys)
    assert code == 0, err
    code, err = run(["--resume", fresh, "--task", "lookup", "--model", "ndr", "--no-progress"], capsys)
    one_line_error(code, err)
    assert "holds a ctl / ndr run (cpu preset), not --task lookup" in err and "differs in" not in err


def test_resume_continues_on_the_runs_device_unless_device_is_given(fresh, capsys, monkeypatch):
    _rewrite(os.path.join(fresh, "checkpoint.npz"), edit_meta=_set("config.device", "gpu"))  # as a GPU run's
    devices = []

    def gpu_found(device):
        devices.append(("checked", device))

    def stop(cfg, out, resume, progress):
        devices.append(cfg.device)
        raise train.UsageError("stopped before training")
    monkeypatch.setattr(train, "train", stop)
    monkeypatch.setattr(train.backend, "get_xp", gpu_found)
    for extra in ([], ["--device", "cpu"], ["--device", "gpu"]):
        assert run(["--resume", fresh, "--no-progress", *extra], capsys)[0] == 2
    assert run(TINY + ["--resume", fresh, "--steps", "4"], capsys)[0] == 2    # the long form (make train's) too
    assert devices == [("checked", "gpu"), "gpu", "cpu", "gpu", ("checked", "gpu"), "gpu"]

    def no_gpu(device):
        raise train.backend.DeviceError("device 'gpu' needs CuPy")
    monkeypatch.setattr(train.backend, "get_xp", no_gpu)   # the run moved to a machine without one
    code, err = run(["--resume", fresh, "--no-progress"], capsys)
    one_line_error(code, err)
    assert "was trained on the GPU: --device cpu continues it on the CPU" in err
    _rewrite(os.path.join(fresh, "checkpoint.npz"), edit_meta=_set("config.device", None))   # hand-made: the CPU
    assert run(["--resume", fresh, "--no-progress"], capsys)[0] == 2 and devices[-1] == "cpu"


def test_set_device_is_refused_for_the_flag(capsys):
    code, err = run(["--set", "device=gpu", "--show-config"], capsys)
    one_line_error(code, err)
    assert "--set device=gpu: use --device gpu instead" in err


def test_show_config_with_resume_shows_what_the_resume_runs(fresh, capsys):
    assert train.main(["--show-config", "--resume", fresh]) == 0
    shown = capsys.readouterr().out
    assert "* steps = 2" in shown and "d_model = 16" in shown
    assert train.main(["--show-config", "--resume", fresh, "--task", "ctl", "--model", "ndr"]) == 0
    assert "d_model = 16" in capsys.readouterr().out   # the run's own task and model: its settings, as above


def test_an_unused_set_field_on_a_trained_run_names_only_what_it_takes(tmp_path, capsys):
    out = str(tmp_path / "pair")
    assert run(["--task", "pairwise", "--model", "abstractor-simplified", "--train-size", "20", "--steps", "2",
                "--eval-every", "2", "--no-progress", "--out", out], capsys)[0] == 0
    code, err = run(["--evaluate", "--out", out, "--set", "n_steps_eval=3"], capsys)
    one_line_error(code, err)
    assert err == ("error: pairwise / abstractor-simplified has no n_steps_eval; a trained run of it takes: "
                   "eval_batch_size\n")


def test_a_run_with_task_options_resumes_by_its_settings(tmp_path, capsys):
    """The task options (RunConfig.options, issue 29) are settings of the run like the model's: a resume, its
    --show-config and its identity check read them by name from the checked checkpoint."""
    out = str(tmp_path / "pair")
    assert run(["--task", "pairwise", "--model", "abstractor-simplified", "--train-size", "20", "--steps", "2",
                "--eval-every", "2", "--no-progress", "--out", out], capsys)[0] == 0
    assert train.main(["--show-config", "--resume", out, "--steps", "4"]) == 0
    assert "* train_size = 20   [2015]" in capsys.readouterr().out
    code, err = run(["--resume", out, "--steps", "4", "--set", "train_size=30", "--no-progress"], capsys)
    one_line_error(code, err)
    assert "different run (differs in: train_size)" in err
    code, err = run(["--resume", out, "--steps", "4", "--no-progress"], capsys)
    assert code == 0 and json.load(open(os.path.join(out, "results.json")))["steps"] == 4, err


def test_an_empty_example_is_refused(fresh, capsys):
    for text in ("", "   "):
        code, err = run(["--plot", "--out", fresh, "--example", text], capsys)
        one_line_error(code, err)
        assert "--example is empty" in err


def test_huge_sizes_are_one_line_and_leave_nothing_behind(tmp_path, capsys):
    out = tmp_path / "run"
    code, err = run(TINY + ["--steps", "1", "--set", "d_model=1000000", "--set", "d_ff=1000000", "--out", str(out)],
                    capsys)
    one_line_error(code, err)
    assert "not enough memory" in err and "Unable to allocate" in err and not out.exists()
    code, err = run(TINY + ["--steps", "1", "--batch-size", "100000000", "--out", str(out)], capsys)
    one_line_error(code, err)                 # at once, before a gigabyte is allocated
    assert "batch sizes above 1,048,576 are refused" in err and not out.exists()


def test_a_refused_start_leaves_no_directory_it_created(tmp_path, capsys):
    out = tmp_path / "a" / "b" / "run"
    for bad in (["--set", "n_head=3"], ["--seed", "-1"]):
        code, err = run(TINY + ["--steps", "1", "--out", str(out)] + bad, capsys)
        one_line_error(code, err)
        assert not (tmp_path / "a").exists()
    assert "--seed must be ≥ 0, got -1" in err


def test_a_full_disk_names_the_file_and_the_hint_is_shell_quoted(tmp_path, capsys, monkeypatch):
    out = str(tmp_path / "my run")
    assert train.main(TINY + ["--steps", "2", "--out", out]) == 0
    assert f"pictures: python train.py --plot --out '{out}'" in capsys.readouterr().out

    def full(*args, **kwargs):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(train.np, "savez", full)
    code, err = run(TINY + ["--steps", "4", "--out", out, "--resume"], capsys)
    assert code == 2 and len(err.splitlines()) == 2 and err.startswith("resuming "), err
    assert err.splitlines()[-1] == f"error: No space left on device: {os.path.join(out, 'checkpoint.npz')}"


def test_plot_of_a_read_only_run_can_write_elsewhere(fresh, tmp_path, capsys, monkeypatch):
    written = []
    monkeypatch.setattr(viz, "require_matplotlib", lambda flag: None)
    monkeypatch.setattr(viz, "write_pictures", lambda pictures, d: written.append(d) or [])
    monkeypatch.setattr(train.os, "access", lambda path, mode: not str(path).startswith(fresh))   # read-only run
    code, err = run(["--plot", "--out", fresh], capsys)
    one_line_error(code, err)
    assert "choose --plot-dir" in err and not written
    assert run(["--plot", "--out", fresh, "--plot-dir", str(tmp_path / "pictures")], capsys)[0] == 0
    assert written == [str(tmp_path / "pictures")]


def test_tasks_export_refuses_to_overwrite_without_force(tmp_path, capsys):
    mine = tmp_path / "valid.tsv"
    mine.write_text("my notes\n")
    assert tasks.main(["export", "--task", "ctl", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "already holds valid.tsv" in err and "--force" in err and err.count("\n") == 1
    assert mine.read_text() == "my notes\n" and os.listdir(tmp_path) == ["valid.tsv"]   # nothing written
    assert tasks.main(["export", "--task", "ctl", "--out", str(tmp_path), "--force"]) == 0
    assert mine.read_text() != "my notes\n"


# --- 3. --report ------------------------------------------------------------------------------------------------

def _results(d, seed, test, steps=30, **extra):
    os.makedirs(d, exist_ok=True)
    config = {"task": "pairwise", "model": "abstractor-simplified", "preset": "cpu", "seed": seed, "steps": 60,
              "model_config": {"train_size": 2015}}
    r = {"task": "pairwise", "model": "abstractor-simplified", "preset": "cpu", "seed": seed, "steps": steps,
         "metrics": {"valid": test, "test": test}, "best_step": steps, "wall_s": 6.0, "ms_per_step": 100.0,
         "config": config, **extra}
    with open(os.path.join(d, "results.json"), "w") as f:
        json.dump(r, f)
    with open(os.path.join(d, "metrics.jsonl"), "w") as f:
        f.write(json.dumps({"step": steps, "train_loss": 0.5, "valid": test, "test": test}) + "\n")
    return d


def test_report_marks_diverged_and_unfinished_runs_and_leaves_them_out_of_the_means(fresh, tmp_path, capsys):
    ok = [_results(str(tmp_path / f"s{s}"), s, t, steps=60) for s, t in ((1, 0.6), (2, 0.8))]
    bad = _results(str(tmp_path / "s0"), 0, 0.5, steps=30, diverged_at=30)
    shutil.copy(os.path.join(fresh, "checkpoint.npz"), tmp_path / "ckpt.npz")
    unfinished = str(tmp_path / "unfinished")
    shutil.copytree(fresh, unfinished)
    os.remove(os.path.join(unfinished, "results.json"))
    assert train.main(["--report", bad, *ok, unfinished]) == 0
    out = capsys.readouterr().out
    assert re.search(r"\| 0 \| 30 \(diverged at step 30\) \|", out)
    assert re.search(r"\| ctl \| ndr \| cpu \| 0 \| 2 \(unfinished: step 2 of 2\) \|", out)
    seeds = [line for line in out.split("Over seeds")[1].splitlines() if line.startswith("| pairwise")]
    assert len(seeds) == 1 and "| 1, 2 (seed 0 left out: diverged at step 30) |" in seeds[0]
    assert "test 0.700 ± 0.141" in seeds[0]                           # 0.6 and 0.8 only


def test_report_of_a_run_that_diverged_after_evaluations_keeps_its_metric_columns(tmp_path, capsys):
    d = _results(str(tmp_path / "run"), 0, 0.5, steps=30, diverged_at=30)
    with open(os.path.join(d, "metrics.jsonl"), "a") as f:   # the divergence line: the train loss alone
        f.write(json.dumps({"step": 31, "train_loss": None, "train_correct": 3}) + "\n")
    assert train.main(["--report", d]) == 0
    out = capsys.readouterr().out
    assert "| step | train_loss | valid | test | train_correct |" in out
    assert "| 30 | 0.5000 | 0.5000 | 0.5000 |  |" in out and "| 31 |  |  |  | 3 |" in out


def test_report_shows_a_long_curve_in_twenty_rows_and_a_huge_loss_in_four_digits(tmp_path, capsys):
    d = _results(str(tmp_path / "run"), 0, 0.5, steps=200)
    with open(os.path.join(d, "metrics.jsonl"), "w") as f:
        for step in range(1, 233):   # the demo's 232 evaluations
            f.write(json.dumps({"step": step, "train_loss": 1e308 if step == 1 else 0.5, "valid": 0.5}) + "\n")
    assert train.main(["--report", d]) == 0
    out = capsys.readouterr().out
    rows = [line for line in out.split("(20 of its 232 evaluations; all in metrics.jsonl)")[1].splitlines()
            if re.match(r"\| \d+ \|", line)]
    steps = [int(line.split("|")[1]) for line in rows]
    assert len(rows) == 20 and steps[0] == 1 and steps[-1] == 232 and 200 in steps   # first, last, selected
    assert steps == sorted(steps) and max(np.diff(steps)) <= 14                      # evenly spread
    assert "| 1 | 1e+308 | 0.5000 |" in out and "0" * 20 not in out


def test_report_plot_dir_that_is_a_file_is_refused_before_the_report(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    d = _results(str(tmp_path / "run"), 0, 0.5)
    (tmp_path / "file").write_text("")
    code = train.main(["--report", d, "--plot-dir", str(tmp_path / "file")])
    out, err = capsys.readouterr()
    one_line_error(code, err)
    assert "is a file, not a directory for the pictures" in err and out == ""   # no report printed first


@pytest.mark.parametrize("broken", [{"config": []}, {"config": {"model_config": "x"}}, {"metrics": [1, 2]},
                                    {"config": {"model_config": {}, "options": "x"}},
                                    {"wall_s": None}, {"seed": "0", "steps": "x"}])
def test_report_skips_a_malformed_results_json_and_shows_the_rest(broken, tmp_path, capsys):
    good = _results(str(tmp_path / "good"), 1, 0.7, steps=60)
    bad = _results(str(tmp_path / "bad"), 2, 0.7, steps=60)
    r = json.load(open(os.path.join(bad, "results.json")))
    r.update(broken)
    json.dump(r, open(os.path.join(bad, "results.json"), "w"))
    assert train.main(["--report", bad, good]) == 0
    captured = capsys.readouterr()
    assert f"| {good} |" in captured.out and f"| {bad} |" not in captured.out
    assert "warning: skipped" in captured.err and bad in captured.err and "Traceback" not in captured.err


def test_report_warns_only_about_a_table_it_prints(tmp_path, capsys):
    dirs = [_results(str(tmp_path / f"s{s}"), s, 0.7, steps=steps) for s, steps in ((0, 30), (1, 60))]
    assert train.main(["--report", *dirs]) == 0
    captured = capsys.readouterr()
    assert "training-set size" not in captured.out and "learning curve of" not in captured.err


def test_report_into_a_closed_pipe_exits_quietly(tmp_path):
    dirs = [_results(str(tmp_path / f"s{s}"), s, 0.7, steps=60) for s in range(3)]
    p = subprocess.Popen([sys.executable, "train.py", "--report", *dirs], cwd=ROOT, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE)
    p.stdout.close()                  # as `| head` does once it has its lines
    err = p.stderr.read().decode()
    assert p.wait() == 0 and err == "", err


# --- 4. the GPU install ---------------------------------------------------------------------------------------

def test_make_venv_for_the_gpu_checks_the_driver_before_downloading(tmp_path):
    if shutil.which("nvidia-smi") or os.path.exists("/proc/driver/nvidia/version"):
        pytest.skip("this machine has an NVIDIA driver")
    installed = os.path.join(ROOT, ".venv", ".installed")
    if not shutil.which("make") or not os.path.exists(installed) or \
            os.path.getmtime(installed) < os.path.getmtime(os.path.join(ROOT, "pyproject.toml")):
        pytest.skip("needs the Makefile's .venv, up to date")
    start = time.time()
    p = subprocess.run(["make", "-s", "venv", "DEVICE=gpu", "CUPY_EXTRA=[driver-check-test]"], cwd=ROOT,
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and time.time() - start < 10
    assert p.stderr.startswith("error: DEVICE=gpu needs the NVIDIA driver") and "not downloaded" in p.stderr


# --- 5. from Python -----------------------------------------------------------------------------------------------

def test_the_readme_python_example_runs_as_written(tmp_path):
    readme = open(os.path.join(ROOT, "README.md")).read()
    code = readme.split("## Use it from Python")[1].split("```python\n")[1].split("```")[0]
    assert len(code.splitlines()) <= 20
    p = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, PYTHONPATH=ROOT))
    assert p.returncode == 0, p.stderr
    assert re.fullmatch(r"(step \d: loss \d+\.\d{3}\n){3}", p.stdout), p.stdout


def test_a_model_trains_without_set_rng_and_reproducibly():
    class Net(nn.Module):
        def __init__(self):
            self.fc, self.drop = nn.Linear(4, 4), nn.Dropout(0.5)

        def forward(self, x):
            return self.drop(self.fc(x))
    x = backend.to_device(np.ones((8, 4), np.float32), "cpu")
    from minattn.engine import Tensor
    out = Net()(Tensor(x)).data                                   # no set_rng: the seeded default stream
    assert (out == 0).any() and (out != 0).any()
    code = ("import numpy as np\nfrom minattn import nn\nfrom minattn.engine import Tensor\n"
            "print(nn.Dropout(0.5)(Tensor(np.ones(16, np.float32))).data.tolist())")
    outs = [subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True).stdout
            for _ in range(2)]
    assert outs[0] == outs[1] and "0.0" in outs[0]                # the same numbers in every process
