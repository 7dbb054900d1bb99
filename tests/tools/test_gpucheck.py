"""`make gpu-check` (minattn.tools.gpucheck): what can be checked without a GPU — the resume comparison on the CPU,
its power to find a difference, the one-line refusal without a GPU, the Makefile wiring, and every part (the GPU
window, `--window`) end to end on the CPU."""
import json
import os
import subprocess

import numpy as np
import pytest

from minattn import backend
from minattn.tools import gpucheck

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TINY = ["--batch-size", "16", "--eval-every", "2", "--set", "d_model=16", "--set", "d_ff=16",
        "--set", "n_steps=2", "--set", "eval_batch_size=2048"]


def test_resume_check_passes_on_the_cpu_and_would_see_one_changed_bit(monkeypatch, capsys):
    seen = []
    read = gpucheck.checkpoint_arrays
    monkeypatch.setattr(gpucheck, "checkpoint_arrays", lambda d: seen.append(read(d)) or seen[-1])
    assert gpucheck.main(["--device", "cpu", "--only", "resume", "--steps", "4", "--presets", "cpu", "--", *TINY]) == 0
    out = capsys.readouterr().out
    assert "d-resume  PASS  4 steps straight == 2 + resume to 4" in out and "gpu-check: all passed" in out
    straight, split = seen
    assert len(straight) > 10 and gpucheck.compare_arrays(straight, split) is None
    name = next(k for k in sorted(split) if split[k].dtype == np.float32)
    flipped = split[name].copy()
    flipped.view(np.uint32).flat[0] ^= 1                 # one bit of one parameter
    assert name in gpucheck.compare_arrays(straight, {**split, name: flipped})


def test_a_failed_part_is_reported_and_exits_1(monkeypatch, capsys):
    monkeypatch.setattr(gpucheck, "PARTS", (("e-suite", lambda device, opts: (False, "exit status 3")),))
    assert gpucheck.main(["--device", "cpu", "--only", "suite"]) == 1
    assert "e-suite   FAIL  exit status 3" in capsys.readouterr().out


def test_without_a_gpu_it_is_one_line_and_exit_2(capsys):
    if backend.gpu_available():
        pytest.skip("a GPU is present")
    assert gpucheck.main([]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "cupy" in err.lower()


def _make_n(*args):
    env = {k: v for k, v in os.environ.items() if not k.startswith("MAKE")}   # also when run by `make test`
    return subprocess.run(["make", "-n", "--no-print-directory", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True)


def test_make_gpu_check_with_a_given_python_builds_no_venv_and_the_venv_gets_cupy_with_ctk():
    p = _make_n("gpu-check", "PY=python3")
    assert p.returncode == 0 and p.stdout.split() == ["python3", "-m", "minattn.tools.gpucheck"]
    p = _make_n("gpu-check", "PYTHON=false")               # a Python without CuPy: the venv gets it
    assert "install -q 'cupy-cuda12x[ctk]'" in p.stdout and "-m minattn.tools.gpucheck" in p.stdout
    p = _make_n("venv", "DEVICE=gpu", "CUPY=cupy-cuda13x", "PYTHON=false")
    assert "uninstall -q -y cupy-cuda12x" in p.stdout and "install -q 'cupy-cuda13x[ctk]'" in p.stdout


def test_the_steps_part_skips_the_twin_without_torch_and_fails_on_a_mismatch(monkeypatch, capsys):
    args = ["--device", "cpu", "--only", "steps", "--presets", "cpu", "--batch", "4", "--rounds", "1",
            "--min-time", "0.01"]
    monkeypatch.setattr(gpucheck, "have_torch", lambda: False)
    assert gpucheck.main(args) == 0
    out = capsys.readouterr().out
    assert "torch eager: skipped (PyTorch is not installed)" in out and "b-steps   PASS  cpu: on/off " in out
    monkeypatch.setattr(gpucheck, "have_torch", lambda: True)      # "installed"
    monkeypatch.setattr(gpucheck, "_run", lambda argv, env=None: (1, ["1 failed"]))
    assert gpucheck.main(args) == 1
    assert "the torch twin does not match minattn: 1 failed" in capsys.readouterr().out


def test_the_kernels_part_runs_the_kernel_tests_a_line_each_and_fails_with_them(monkeypatch, capsys):
    """On the CPU the kernels' launch code runs on NumPy transcriptions of their CUDA (test_gpu_kernels.py)."""
    assert gpucheck.main(["--device", "cpu", "--only", "kernels"]) == 0
    out = capsys.readouterr().out
    assert out.count("equals_its_definition[") == 4 and out.count("equals_its_definition_on_the_gpu[") == 4
    assert "a-kernels PASS  4 passed, 4 skipped" in out
    monkeypatch.setattr(gpucheck, "_run", lambda argv, env=None: (1, ["== 1 failed, 3 passed in 2.0s =="]))
    assert gpucheck.main(["--device", "cpu", "--only", "kernels"]) == 1
    assert "a-kernels FAIL  1 failed, 3 passed in 2.0s" in capsys.readouterr().out


WINDOW_SMALL = ["--device", "cpu", "--presets", "cpu", "--batch", "8", "--rounds", "1", "--min-time", "0.01",
                "--block", "2", "--steps", "4", "--budget", "1"]


def test_the_window_runs_every_part_on_the_cpu_one_file_each_and_a_later_window_continues_the_card(
        tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(gpucheck, "MIN_CARD_S", 8)          # the card's run: 8 s, then SIGTERM
    out = tmp_path / "window"
    assert gpucheck.main(["--window", "--out", str(out), *WINDOW_SMALL, "--", *TINY]) == 0
    parts = [name for name, _ in gpucheck.PARTS]
    assert sorted(os.listdir(out)) == sorted([f"{p}.txt" for p in parts] + ["f-card-run", "summary.txt"])
    text = {p: (out / f"{p}.txt").read_text() for p in parts}
    for p in parts:
        assert text[p].startswith(f"=== gpu-check: {p} (")
        assert text[p].splitlines()[-1].startswith(f"{p} PASS")
    assert "4 passed, 4 skipped" in text["a-kernels"] and "MINATTN_REQUIRE_GPU=0" in text["a-kernels"]
    assert all(f"  {what} " in text["b-steps"] for what in ("kernels off", "kernels on", "on/off"))
    assert "device operations counted" in text["c-why"] and "batch-1 step" in text["c-why"]
    assert all(what in text["c-why"] for what in ("host ms per phase", "optimizer", "cumtime"))
    assert "$ MINATTN_KERNELS=1 " in text["d-resume"]                     # the kernels on
    assert "4 steps straight == 2 + resume to 4" in text["d-resume"]
    assert "MINATTN_KERNELS=1" in text["e-suite"] and "-m gpu" in text["e-suite"]
    assert "stopped (SIGTERM) at step" in text["f-card"] and "--card-run" in text["f-card"]
    assert (out / "summary.txt").read_text().count(" PASS ") == len(parts)
    step = json.loads(open(out / "f-card-run" / "metrics.jsonl").readlines()[-1])["step"]
    capsys.readouterr()
    # the next window: only its card's run, which continues the first one's (here to a nearby end, so that
    # it finishes rather than waiting for its own SIGTERM)
    assert gpucheck.main(["--window", "--only", "card", "--out", str(tmp_path / "next"), "--card-run",
                          str(out / "f-card-run"), *WINDOW_SMALL, "--", *TINY, "--steps", str(step + 2)]) == 0
    said = capsys.readouterr().out
    assert "resuming ctl / ndr" in said and f"finished: {step + 2} steps" in said
    assert json.loads(open(tmp_path / "next" / "f-card-run" / "metrics.jsonl").readlines()[-1])["step"] > step


def test_the_window_turns_the_kernels_on_for_the_card_only_if_they_passed(monkeypatch, tmp_path):
    seen = []
    monkeypatch.setattr(gpucheck, "_run",
                        lambda argv, env=None, stop_after=None: seen.append(env) or (1, ["?"]))
    for kernels_ok in (True, False):
        monkeypatch.setattr(gpucheck, "PARTS", (("a-kernels", lambda device, opts: (kernels_ok, "")),
                                                ("f-card", gpucheck.check_card)))
        assert gpucheck.main(["--window", "--out", str(tmp_path), "--device", "cpu"]) == 1
    assert [env["MINATTN_KERNELS"] for env in seen] == ["1", "0"]


def test_the_window_refuses_bad_flags_in_one_line(capsys):
    for args in (["--window"], ["--only", "card"], ["--only", "bench"], ["--window", "--out", "x", "--presets", "huge"],
                 ["--rounds", "0"]):
        assert gpucheck.main(["--device", "cpu", *args]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("error: ")


def test_the_gpu_busy_time_is_the_step_s_own_time_behind_the_blocker():
    """gpu_busy_ms on a stand-in device whose 'GPU' runs each call at once and whose events read the clock."""
    import time

    class Clock:
        def record(self):
            self.t = time.perf_counter()

        def synchronize(self):
            pass

    class Device:
        ones, empty_like = np.ones, np.empty_like
        matmul = staticmethod(lambda a, b, out: time.sleep(0.001))      # the blocker: 1 ms a product

        class cuda:
            Event = Clock
            get_elapsed_time = staticmethod(lambda start, end: (end.t - start.t) * 1e3)

    busy, ahead = gpucheck.gpu_busy_ms(lambda: time.sleep(0.02), Device, host_ms=20, n=64)
    assert 19 < busy < 60 and ahead          # ms, the step's own; the blocker lasted longer than its queueing
    busy, ahead = gpucheck.gpu_busy_ms(lambda: time.sleep(0.02), Device, host_ms=0.001, n=64)
    assert not ahead                         # a blocker shorter than the host's queueing is flagged
