"""Which Python `make` runs: one that already has what the goals need (NumPy 2 and tqdm; pytest for the tests;
a CuPy that sees a GPU for DEVICE=gpu) runs as it is, with no venv and no pip, so a cluster or a lent GPU
machine without network runs the README's commands; one that lacks any of it gets .venv, installed as before;
without the NVIDIA driver, DEVICE=gpu stops with one line before anything is built. Most cases read the
commands `make -n` would run; one trains for real with pip's index shut off."""
import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PY = sys.executable      # has numpy, tqdm and pytest: it runs these tests

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="needs make")


def make(tmp_path, *args, hide=(), gpus=None, dry=True):
    """`make [-n] ARGS` with PYTHON=this Python and a venv path that does not exist yet; ``hide``: modules
    that cannot be imported; ``gpus``: a stand-in CuPy that sees that many GPUs (None: the real one, if any)."""
    fake = tmp_path / f"path-{'-'.join(hide)}-{gpus}"       # first on the Python path
    for name in hide:
        (fake / name).mkdir(parents=True, exist_ok=True)
        (fake / name / "__init__.py").write_text("raise ImportError('hidden by test_makefile')\n")
    if gpus is not None:
        (fake / "cupy").mkdir(parents=True, exist_ok=True)
        (fake / "cupy" / "__init__.py").write_text(
            f"class cuda:\n    class runtime:\n        getDeviceCount = staticmethod(lambda: {gpus})\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("MAKE") and k not in ("PY", "DEVICE")}
    env.update(PYTHONPATH=str(fake), PIP_NO_INDEX="1")
    return subprocess.run(["make", *(["-n"] if dry else []), "--no-print-directory", f"PYTHON={PY}",
                           f"VENV={tmp_path / 'venv'}", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)


def builds_venv(done):
    return "-m venv" in done.stdout and "pip install" in done.stdout


@pytest.mark.parametrize("goal,runs", [("train", f"{PY} train.py"),
                                       ("test", f"MINATTN_REQUIRE_GPU=0 {PY} -m pytest -q"),
                                       ("demo", f"{PY} train.py --task lookup")])
def test_a_python_that_has_what_a_goal_needs_runs_it_as_it_is(tmp_path, goal, runs):
    done = make(tmp_path, goal)
    assert done.returncode == 0, done.stderr
    assert not builds_venv(done) and "pip install -q" not in done.stdout
    assert any(line.startswith(runs) for line in done.stdout.splitlines()), done.stdout
    assert f"make: {PY} has numpy tqdm" in done.stdout                     # says which Python, once


def test_a_python_without_tqdm_gets_the_venv_and_without_pytest_only_for_the_tests(tmp_path):
    done = make(tmp_path, "train", hide=["tqdm"])
    assert builds_venv(done) and f"{tmp_path / 'venv'}/bin/python train.py" in done.stdout
    assert not builds_venv(make(tmp_path, "train", hide=["pytest"]))
    assert builds_venv(make(tmp_path, "test", hide=["pytest"]))


def test_device_gpu_needs_a_cupy_that_sees_a_gpu_and_checks_the_driver_before_the_venv(tmp_path):
    done = make(tmp_path, "train", "DEVICE=gpu", gpus=1)
    assert not builds_venv(done) and f"{PY} train.py   --device gpu" in done.stdout
    done = make(tmp_path, "train", "DEVICE=gpu", gpus=0)
    lines = done.stdout.splitlines()
    assert builds_venv(done) and "install -q 'cupy-cuda12x[ctk]'" in done.stdout
    assert "nvidia-smi" in lines[0] and "-m venv" in lines[1]                 # the driver first
    assert not builds_venv(make(tmp_path, "gpu-check", gpus=1))
    assert builds_venv(make(tmp_path, "gpu-check", hide=["cupy"]))


def test_without_the_driver_device_gpu_is_one_line_before_anything_is_built(tmp_path):
    if shutil.which("nvidia-smi") or os.path.exists("/proc/driver/nvidia/version"):
        pytest.skip("this machine has the NVIDIA driver")
    done = make(tmp_path, "train", "DEVICE=gpu", gpus=0, dry=False)
    assert done.returncode == 2 and not (tmp_path / "venv").exists()
    assert done.stderr.startswith("error: DEVICE=gpu needs the NVIDIA driver, and this machine has none")
    assert done.stderr.count("error:") == 1


def test_make_train_runs_offline_with_a_python_that_has_numpy_and_tqdm(tmp_path):
    """The real command, pip's index shut off (PIP_NO_INDEX=1): nothing is installed, the run is written."""
    out = tmp_path / "run"
    tiny = (f"--steps 2 --eval-every 2 --no-progress --out {out} --batch-size 16 --set d_model=16 --set d_ff=16 "
            "--set n_steps=2 --set eval_batch_size=2048")
    done = make(tmp_path, "train", "TASK=ctl", "DEVICE=cpu", f"ARGS={tiny}", dry=False)
    assert done.returncode == 0, done.stderr
    assert not (tmp_path / "venv").exists() and (out / "results.json").exists()
    assert f"make: {PY} has numpy tqdm: running it as it is" in done.stderr
