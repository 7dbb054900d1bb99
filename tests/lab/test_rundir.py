"""The run directory: one writer at a time, a resume that keeps its budget, a log
that survives a kill, a report that cannot miscount, a divergence guard, one-line errors, safe checkpoints."""
import json
import os
import pickle
import shutil
import subprocess
import sys

import numpy as np
import pytest

import tasks
import train
from minattn.lab import cli, rundir
from minattn.lab.recipes.base import example_name, sample_name

from tests.lab.test_train import ROOT, TINY, ctl_generated, run  # noqa: F401 (ctl_generated: an autouse fixture)

_at = TINY.index("--eval-every")
TINY_NO_EVAL = TINY[:_at] + TINY[_at + 2:]     # TINY without its --eval-every 2


def strict_json_lines(path):
    """Every line parsed as strict JSON (a bare NaN or Infinity raises)."""
    def refuse(name):
        raise ValueError(f"non-finite {name} in {path}")
    return [json.loads(line, parse_constant=refuse) for line in open(path)]


def one_line_error(code, err, expected_code=2, started=False):
    """Exit code and one line "error: ..." on stderr (after the start line, for errors during training)."""
    assert code == expected_code, err
    lines = err.splitlines()
    if started:
        assert lines[0].startswith("training ")
        lines = lines[1:]
    assert len(lines) == 1 and lines[0].startswith("error: ") and err.endswith("\n"), err


# --- 1. one writer per run directory ---------------------------------------------------------------------------

def test_a_second_writer_is_refused_and_a_dead_writers_lock_is_taken_over(tmp_path, capsys):
    out = str(tmp_path / "run")
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time, train\nwith train.locked(sys.argv[1]):\n"
                               "    print('locked', flush=True)\n    time.sleep(60)", out],
                              cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        code, err = run(TINY + ["--steps", "2", "--out", out], capsys)
        one_line_error(code, err)
        assert f"in use by another run (pid {holder.pid})" in err
        code, err = run(TINY + ["--steps", "2", "--out", out, "--resume"], capsys)   # --resume too
        assert code == 2 and f"pid {holder.pid}" in err
    finally:
        holder.kill()                 # as kill -9: the kernel releases the lock, the stale pid stays in the file
        holder.wait()
    assert open(os.path.join(out, "lock")).read().strip() == str(holder.pid)
    assert run(TINY + ["--steps", "2", "--out", out], capsys)[0] == 0
    assert open(os.path.join(out, "lock")).read().strip() == str(os.getpid())


def test_a_refused_start_leaves_no_directory_behind(tmp_path, capsys):
    out = tmp_path / "new"
    code, err = run(TINY + ["--steps", "2", "--batch-size", "60000", "--set", "batching=bucketed", "--out", str(out)],
                    capsys)
    one_line_error(code, err)
    assert not out.exists()


# --- 2. --resume keeps the run's budget ------------------------------------------------------------------------

def test_resume_keeps_the_runs_steps_and_evaluation_interval(tmp_path, capsys):
    out = str(tmp_path)
    assert run(TINY_NO_EVAL + ["--steps", "3", "--eval-every", "3", "--out", out], capsys)[0] == 0
    assert run(TINY_NO_EVAL + ["--out", out, "--resume"], capsys)[0] == 0              # a finished run stays so
    assert json.load(open(tmp_path / "results.json"))["steps"] == 3
    assert run(TINY_NO_EVAL + ["--steps", "9", "--out", out, "--resume"], capsys)[0] == 0
    assert [e["step"] for e in strict_json_lines(tmp_path / "metrics.jsonl")] == [3, 6, 9]   # every 3, not 500
    code, err = run(TINY_NO_EVAL + ["--steps", "6", "--out", out, "--resume"], capsys)
    one_line_error(code, err)
    assert "--steps 6 is below step 9" in err
    assert json.load(open(tmp_path / "results.json"))["steps"] == 9


# --- 3. the log survives a kill; results.json never loses what it had ---------------------------------------

def test_a_torn_log_line_is_dropped_on_resume_and_the_rest_kept(tmp_path, capsys):
    out, log = str(tmp_path), tmp_path / "metrics.jsonl"
    assert run(TINY + ["--steps", "4", "--out", out], capsys)[0] == 0
    kept = log.read_text()
    with open(log, "a") as f:
        f.write('{"step": 6, "train_lo')                              # a kill in the middle of a line
    code, err = run(TINY + ["--steps", "6", "--out", out, "--resume"], capsys)
    assert code == 0 and "warning:" in err and "dropped 1" in err
    assert log.read_text().startswith(kept)
    assert [e["step"] for e in strict_json_lines(log)] == [2, 4, 6]


def test_resume_without_a_log_keeps_the_results_and_restores_the_log(tmp_path, capsys):
    out, log = str(tmp_path), tmp_path / "metrics.jsonl"
    assert run(TINY + ["--steps", "4", "--out", out], capsys)[0] == 0
    before, lines = json.load(open(tmp_path / "results.json")), log.read_text()
    log.unlink()
    code, err = run(TINY + ["--steps", "4", "--out", out, "--resume"], capsys)
    assert code == 0 and "restored 2" in err
    after = json.load(open(tmp_path / "results.json"))
    assert after["metrics"] == before["metrics"] and after["metrics"]      # not {}
    assert log.read_text() == lines


# --- 4. --report ---------------------------------------------------------------------------------------------

def test_report_skips_what_is_not_a_finished_run_and_counts_a_run_once(tmp_path, capsys):
    argv = ["--task", "pairwise", "--model", "abstractor-simplified", "--train-size", "20", "--steps", "2",
            "--eval-every", "2", "--no-progress"]
    a, b = str(tmp_path / "s0"), str(tmp_path / "s1")
    assert run(argv + ["--out", a], capsys)[0] == 0
    assert run(argv + ["--seed", "1", "--out", b], capsys)[0] == 0
    copy, empty = str(tmp_path / "copy-of-s0"), tmp_path / "empty"
    shutil.copytree(a, copy)
    empty.mkdir()
    assert train.main(["--report", a, str(empty), copy, b, a]) == 0
    captured = capsys.readouterr()
    rows = [line for line in captured.out.split("Over seeds")[0].splitlines() if line.startswith("| pairwise")]
    assert len(rows) == 2 and rows[0].endswith(f"| {a} |") and rows[1].endswith(f"| {b} |")
    assert "| 0, 1 |" in captured.out                                     # seeds 0, 1 — not 0, 0, 1, 0
    assert f"{empty} has no results.json" in captured.err
    assert f"skipped {copy}: the same run as {a}" in captured.err


# --- 5. divergence -------------------------------------------------------------------------------------------

def test_a_diverging_run_stops_with_exit_3_and_valid_json(tmp_path, capsys):
    out = str(tmp_path)
    code, err = run(TINY + ["--steps", "8", "--lr", "1e30", "--out", out], capsys)   # inf: refused up front
    one_line_error(code, err, expected_code=3, started=True)
    assert "not finite at step 2" in err
    log = strict_json_lines(tmp_path / "metrics.jsonl")
    assert [e["step"] for e in log] == [2] and log[0]["train_loss"] is None
    results = json.loads(open(tmp_path / "results.json").read(), parse_constant=lambda c: 1 / 0)   # strict too
    assert results["diverged_at"] == 2 and results["steps"] == 2
    assert not os.path.exists(tmp_path / "checkpoint.npz") and "no checkpoint was written" in err


# --- 6. one line, exit 2, before training ----------------------------------------------------------------------

@pytest.mark.parametrize("args,message", [
    (["--task", "scan", "--model", "seq2attn", "--split", "length_cutoff_1"], "leaves no iid examples"),
    (["--task", "scan", "--model", "seq2attn", "--split", "length_cutoff_49"], "leaves no test examples"),
    (TINY + ["--set", "task=arith"], "use --task arith instead"),
    (TINY + ["--set", "model=transformer"], "use --model transformer instead"),
    (TINY + ["--set", "preset=paper"], "use --preset paper instead"),
])
def test_bad_input_is_one_line_before_training(args, message, tmp_path, capsys):
    code, err = run(args + ["--no-progress", "--out", str(tmp_path / "run")], capsys)
    one_line_error(code, err)
    assert message in err and not (tmp_path / "run").exists()


def test_out_naming_a_file_and_a_full_disk_are_one_line(tmp_path, capsys, monkeypatch):
    (tmp_path / "file").write_text("")
    code, err = run(TINY + ["--out", str(tmp_path / "file")], capsys)
    one_line_error(code, err)
    assert "is a file" in err

    def full(*args, **kwargs):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(train.np, "savez", full)
    code, err = run(TINY + ["--steps", "2", "--out", str(tmp_path / "run")], capsys)
    one_line_error(code, err, started=True)
    assert "No space left on device" in err
    assert sorted(os.listdir(tmp_path / "run")) == ["lock", "metrics.jsonl"]   # no half-written file


def _rewrite(path, drop):
    with np.load(path, allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files if k != drop}
    if drop.startswith("metadata/"):
        meta = json.loads(arrays["metadata"].item())
        del meta[drop.split("/")[1]]
        arrays["metadata"] = np.array(json.dumps(meta))
    np.savez(path, **arrays)


@pytest.mark.parametrize("drop,message", [("model/head.bias", "missing keys ['head.bias']"),
                                          ("metadata/step", "lacks step"),
                                          ("metadata", "corrupted or unreadable")])
def test_a_checkpoint_missing_a_key_is_one_line(drop, message, tmp_path, capsys):
    out = str(tmp_path)
    assert run(TINY + ["--steps", "2", "--out", out], capsys)[0] == 0
    _rewrite(str(tmp_path / "checkpoint.npz"), drop)
    code, err = run(TINY + ["--steps", "4", "--out", out, "--resume"], capsys)
    one_line_error(code, err)
    assert message in err


# --- 7. what a newcomer sees ---------------------------------------------------------------------------------

def test_a_run_says_where_it_goes_and_where_its_results_are(tmp_path, capsys):
    out = str(tmp_path)
    assert train.main(TINY + ["--steps", "2", "--out", out]) == 0
    captured = capsys.readouterr()
    assert f"training ctl / ndr (cpu preset, seed 0) on cpu in {out}: step 0 of 2, batch 16" in captured.err
    assert "done: ctl / ndr, 2 steps" in captured.out and "valid " in captured.out
    for name in ("results.json", "metrics.jsonl", "checkpoint.npz"):
        assert os.path.join(out, name) in captured.out
    assert f"python train.py --plot --out {out}" in captured.out


def test_ctrl_c_before_the_first_checkpoint_does_not_promise_one(tmp_path, capsys, monkeypatch):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt
    monkeypatch.setattr(train, "train", interrupted)
    code, err = run(TINY + ["--out", str(tmp_path)], capsys)
    assert code == 130 and "nothing to resume" in err and "intact" not in err
    monkeypatch.setattr(cli, "_load_run", interrupted)                # not training: no word on checkpoints
    code, err = run(["--evaluate", "--out", str(tmp_path)], capsys)
    assert code == 130 and err == "interrupted\n"


def test_generating_a_task_says_so_on_stderr(tmp_path, capsys):
    tasks.get_task("arith", cache_dir=str(tmp_path), n_train=40, n_iid=4, n_valid=2, n_test=2)
    assert "generating arith" in capsys.readouterr().err
    tasks.get_task("arith", cache_dir=str(tmp_path), n_train=40, n_iid=4, n_valid=2, n_test=2)
    assert "generating" not in capsys.readouterr().err                  # cached: silent


def test_png_names_are_zero_padded_and_each_example_has_its_own():
    split = list(range(5000))
    assert [sample_name("test", i, split) for i in (7, 4999)] == ["test0007", "test4999"]
    names = {example_name(t) for t in ("x=1,y=2,x+y", "x=1,y=2,x*y", "101 d a b", "jump")}
    assert len(names) == 4 and "example-jump" in names
    assert all(n == n.strip() and "/" not in n and " " not in n for n in names)


# --- 8. safe checkpoints ---------------------------------------------------------------------------------------

class Payload:
    """Unpickling this creates a file: the proof that a checkpoint.pkl was (not) unpickled."""
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_a_checkpoint_loads_without_pickle(tmp_path, capsys):
    assert run(TINY + ["--steps", "2", "--out", str(tmp_path)], capsys)[0] == 0
    with np.load(tmp_path / "checkpoint.npz", allow_pickle=False) as z:
        meta = json.loads(z["metadata"].item())
        assert {k.split("/")[0] for k in z.files} == {"model", "optimizer", "metadata"}
        assert [k[len("model/"):] for k in z.files if k.startswith("model/")] == meta["parameters"]
    assert meta["step"] == 2 and meta["config"]["task"] == "ctl" and len(meta["history"]) == 1


def test_an_older_minattns_run_directory_is_one_line_and_nothing_is_unpickled(tmp_path, capsys):
    """A checkpoint.pkl (a pickle: loading it would run the code it carries) or a checkpoint.npz of an
    older format: one line saying so and what to do, exit 2, in every mode that reads or writes the run."""
    out, marker = tmp_path / "run", tmp_path / "unpickled"
    assert run(TINY + ["--steps", "2", "--out", str(out)], capsys)[0] == 0
    path = out / "checkpoint.npz"
    with np.load(path, allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    meta = json.loads(arrays["metadata"].item())
    assert meta["version"] == rundir.CHECKPOINT_VERSION
    arrays["metadata"] = np.array(json.dumps(dict(meta, version=rundir.CHECKPOINT_VERSION - 1)))
    np.savez(path, **arrays)
    modes = [TINY + ["--steps", "4", "--out", str(out), "--resume"], ["--resume", str(out)],
             ["--evaluate", "--out", str(out)], ["--plot", "--out", str(out)], ["--show-config", "--resume", str(out)]]
    for argv in modes:
        code, err = run(argv, capsys)
        one_line_error(code, err)
        assert f"{out} is a run of an older minattn (checkpoint.npz of format {rundir.CHECKPOINT_VERSION - 1}" in err
        assert "start a new run" in err
    path.unlink()
    with open(out / "checkpoint.pkl", "wb") as f:
        pickle.dump({"version": 1, "payload": Payload(str(marker))}, f)
    for argv in modes + [TINY + ["--steps", "2", "--out", str(out)]]:   # a new run there too
        code, err = run(argv, capsys)
        one_line_error(code, err)
        assert f"{out} is a run of an older minattn (it holds checkpoint.pkl)" in err and "start a new run" in err
    (out / "results.json").unlink()                                      # --report says so in its warning
    assert train.main(["--report", str(out)]) == 2
    assert f"{out} is a run of an older minattn (it holds checkpoint.pkl)" in capsys.readouterr().err
    assert not marker.exists()


def test_a_sigterm_held_back_by_an_earlier_block_is_not_carried_into_the_next(tmp_path):
    """handling_signals starts clean: a block that raised while SIGTERM was deferred (a step that failed)
    must not leave the next block deferring it, or a SIGTERM in its write would be swallowed."""
    import signal
    rundir._sigterm.update(deferred=True, pending=True)     # as a block left it
    with pytest.raises(rundir.Terminated):
        with rundir.handling_signals():
            rundir.write_atomic(str(tmp_path / "f"), lambda f: os.kill(os.getpid(), signal.SIGTERM))
    assert not os.listdir(tmp_path)                          # and the write left nothing behind
