"""`make demo` (the README's first command), shortened: the same Makefile target, run as a newcomer runs it,
with DEMO_ARGS making the model tiny and the run 20 steps (the real one: 23,200 steps, ~4 min on 2 cores).
It must train, draw the pictures and say where they are; run again, it redraws without retraining; without
matplotlib it says so in one line, still trains and skips the pictures."""
import json
import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TINY = "--steps 20 --eval-every 10 --no-progress --set d_embedding=8 --set d_hidden=8"
LOOKUP_SPLITS = ("train", "validation", "heldout_inputs", "heldout_compositions", "heldout_tables",
                 "new_compositions")

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="needs make")


def make_demo(out, env=None):
    """`make demo` with this Python (PY=: no venv is built) into ``out``; returns (stdout, stderr)."""
    done = subprocess.run(["make", "-s", "-C", ROOT, "demo", f"PY={sys.executable}", f"DEMO={out}",
                           f"DEMO_ARGS={TINY}"], capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, **(env or {})))
    assert done.returncode == 0, done.stderr
    return done.stdout, done.stderr


def test_demo_trains_draws_and_says_where(tmp_path):
    pytest.importorskip("matplotlib")
    out = str(tmp_path / "demo")
    stdout, stderr = make_demo(out)
    assert "training lookup / seq2attn" in stderr
    with open(os.path.join(out, "results.json")) as f:
        results = json.load(f)
    assert (results["task"], results["model"], results["steps"]) == ("lookup", "seq2attn", 20)
    assert set(LOOKUP_SPLITS) <= set(results["metrics"])
    assert all(0 <= results["metrics"][k] <= 1 for k in LOOKUP_SPLITS)       # fractions of examples
    with open(os.path.join(out, "metrics.jsonl")) as f:
        assert [json.loads(line)["step"] for line in f] == [10, 20]
    plots = os.path.join(out, "plots")
    pngs = sorted(os.listdir(plots))
    assert "learning-curves.png" in pngs and sum(p.endswith("-attention.png") for p in pngs) == 3
    for name in pngs:
        with open(os.path.join(plots, name), "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n" and os.path.getsize(os.path.join(plots, name)) > 1000
        assert f"wrote {os.path.join(plots, name)}" in stdout                 # every picture is named
    assert f"open {plots}/learning-curves.png first" in stdout
    # again: the finished run is not retrained, only redrawn
    stdout, stderr = make_demo(out)
    assert f"resuming lookup / seq2attn (cpu preset, seed 0) on cpu in {out}: step 20 of 20" in stderr
    assert f"wrote {plots}/learning-curves.png" in stdout


def test_demo_without_matplotlib_says_so_once_and_still_trains(tmp_path):
    hide = tmp_path / "hide"                     # a matplotlib that cannot be imported, first on the path
    (hide / "matplotlib").mkdir(parents=True)
    (hide / "matplotlib" / "__init__.py").write_text("raise ImportError('hidden by test_demo')\n")
    out = str(tmp_path / "demo")
    stdout, _ = make_demo(out, {"PYTHONPATH": f"{hide}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"})
    assert stdout.startswith("matplotlib is not installed: training anyway")
    assert stdout.count("matplotlib is not installed: training") == 1 and "open " not in stdout
    assert os.path.exists(os.path.join(out, "results.json"))
    assert not os.path.exists(os.path.join(out, "plots"))
    assert "-- train_loss --" not in stdout and "== learning curves" not in stdout   # not drawn, not as text
    assert f"its evaluations are the lines of {out}/metrics.jsonl" in stdout
