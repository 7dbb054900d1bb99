"""MINATTN_PLAIN=1 in the environment of a fresh process runs the textbook path (README, minattn/fast/).

The other tests switch paths with ``engine.plain()`` inside one process, so a library that stopped reading
the variable would pass them all. Here a new Python imports minattn under each value and reports what ran:
the accumulation ``Tensor.backward`` built, the op softmax recorded, the optimizer's update."""
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

PROBE = """
import json
import numpy as np
from minattn import engine, optim
from minattn import functional as F
from minattn.nn import Parameter

built = []
faster = engine.faster
def watching(plain_form):                       # what the engine asks the seam for, and gets
    form = faster(plain_form)
    built.append(form.__name__)
    return form
engine.faster = watching                        # backward() looks its `faster` up in engine at each call

w = Parameter(np.ones((3, 2), np.float32))
y = F.softmax(np.ones((4, 3), np.float32) @ w)
softmax = type(y.creator).__name__              # (backward frees the graph)
y.sum().backward()
print(json.dumps({"plain": engine.is_plain(), "accumulation": built, "softmax": softmax,
                  "update": faster(optim.Optimizer.update_each).__name__}))
"""


def probe(value):
    env = {k: v for k, v in os.environ.items() if k != "MINATTN_PLAIN"}
    if value is not None:
        env["MINATTN_PLAIN"] = value
    done = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_minattn_plain_1_runs_the_textbook_path_in_a_fresh_process():
    ran = probe("1")
    assert ran == {"plain": True, "accumulation": ["Accumulation"], "softmax": ran["softmax"],
                   "update": "update_each"}
    assert ran["softmax"] != "Softmax"          # the composed form (exp, sum, divide), not the fused op


@pytest.mark.parametrize("value", [None, "", "0"])
def test_without_it_the_annex_runs(value):
    ran = probe(value)
    assert ran["plain"] is False and ran["softmax"] == "Softmax"
    assert ran["accumulation"] != ["Accumulation"] and ran["update"] != "update_each"
