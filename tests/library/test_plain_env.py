"""The path is decided per device (engine.is_plain): the textbook path on NumPy arrays, the annex on the
other devices (here the strict test device, which stands in for CuPy); MINATTN_PLAIN=1 or 0 in the
environment of a fresh process forces either path everywhere (README, minattn/fast/).

The other tests switch paths with ``engine.plain()`` inside one process, so a library that stopped reading
the variable would pass them all. Here a new Python imports minattn under each value and reports, on each
device, what ran: the accumulation ``Tensor.backward`` built, the op a slice recorded, the optimizer's
update."""
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

PROBE = """
import json
import numpy as np
from minattn import backend, engine, optim
from minattn.nn import Parameter
from minattn.tools import strict  # noqa: F401  (registers the strict device)

built = []
faster = engine.faster
def watching(plain_form, like=None):            # what the engine asks the seam for, and gets
    form = faster(plain_form, like)
    built.append(form.__name__)
    return form
engine.faster = watching                        # backward() looks its `faster` up in engine at each call

ran = {}
for device in ("cpu", "strict"):
    built.clear()
    w = Parameter(backend.to_device(np.ones((3, 2), np.float32), device))
    y = w[:, :1]
    cut = type(y.creator).__name__              # (backward frees the graph)
    y.sum().backward()
    ran[device] = {"plain": engine.is_plain(device), "accumulation": built[:], "getitem": cut,
                   "update": faster(optim.Optimizer.update_each, w).__name__}
print(json.dumps(ran))
"""

TEXTBOOK = {"accumulation": ["Accumulation"], "getitem": "GetItem", "update": "update_each"}
ANNEX = {"accumulation": ["GroupedAccumulation"], "getitem": "SlicingGetItem", "update": "update_flat"}


def probe(value):
    env = {k: v for k, v in os.environ.items() if k != "MINATTN_PLAIN"}
    if value is not None:
        env["MINATTN_PLAIN"] = value
    done = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_minattn_plain_1_runs_the_textbook_path_everywhere_in_a_fresh_process():
    ran = probe("1")
    assert ran == {"cpu": {"plain": True, **TEXTBOOK}, "strict": {"plain": True, **TEXTBOOK}}


def test_minattn_plain_0_runs_the_annex_everywhere():
    ran = probe("0")
    assert ran == {"cpu": {"plain": False, **ANNEX}, "strict": {"plain": False, **ANNEX}}


@pytest.mark.parametrize("value", [None, ""])
def test_without_it_numpy_runs_the_textbook_path_and_other_devices_the_annex(value):
    ran = probe(value)
    assert ran == {"cpu": {"plain": True, **TEXTBOOK}, "strict": {"plain": False, **ANNEX}}
