"""Safety nets for changes that should not change behaviour.

Two snapshots under ``tests/golden/``:

- ``configs.json``: the resolved configuration (``train.make_config``) of every (task, model, preset)
  that train.py accepts, SCAN once per split. Compared exactly: a refactoring must not move a number.
- ``runs.json``: a 3-step golden run per experiment (one task of each kind × every model it trains),
  through ``train.train`` at batch 4, seed 0, on the cpu: the training loss of every step and, per
  parameter, its sum and L2 norm afterwards. Compared with rtol 1e-4, not bit for bit, so that a fused op
  that sums in another order passes while a changed initialisation, batch, dropout mask or update fails.
  Evaluation is replaced by an empty one (it does not feed back into training, and it would take minutes).

Regenerate after an intended change of behaviour, and say why in the commit:

    make golden        (MINATTN_UPDATE_GOLDEN=1 on these tests, then a plain run that must pass)

With MINATTN_UPDATE_GOLDEN=1 each test writes its file and then FAILS: a run that rewrote the snapshots
never counts as a passing run (issue 31 item 4).
"""
import dataclasses
import json
import os

import numpy as np
import pytest

import tasks
import train
from minattn.engine import is_plain
from minattn.lab.rundir import settings

GOLDEN = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "golden")
UPDATE = os.environ.get("MINATTN_UPDATE_GOLDEN") == "1"
RTOL = 1e-4

# SCAN's configuration depends on its split (the number of steps is counted in epochs of its train set)
SCAN_SPLITS = [s for s in tasks.SCAN_SPLITS if s != "length_cutoff_K"] + ["length_cutoff_26"]
# One task per kind of task (ctl for the NDR paper's classifiers: arith and listops take seconds to minutes
# to generate); every model each kind trains.
RUN_TASKS = ("ctl", "retrieval", "lookup", "scan", "sort", "pairwise", "set", "mlu")
RUN_SETTINGS = {"scan": {"split": "simple"}, "mlu": {"train_size": 1000}}


def _compare_or_update(name, actual, compare):
    path = os.path.join(GOLDEN, name)
    if UPDATE:
        os.makedirs(GOLDEN, exist_ok=True)
        with open(path, "w") as f:
            json.dump(actual, f, indent=1, sort_keys=True)
            f.write("\n")
        pytest.fail(f"MINATTN_UPDATE_GOLDEN=1: rewrote tests/golden/{name} instead of comparing; review its diff "
                    "and run the tests without it", pytrace=False)
    with open(path) as f:
        compare(json.load(f), json.loads(json.dumps(actual)))   # through JSON: tuples become lists


# Issue 29 split the hybrid config classes: the model config holds the model alone, and the task options and
# the schedule moved to the run's (RunConfig.options, RunConfig). The snapshot keeps its layout; both sides
# are compared setting by setting (rundir.settings, which reads every layout), with the model config's class
# under its new name.
CLASS_NAMES = {"SortConfig": "AbstractorConfig", "RelationalConfig": "SimplifiedConfig", "RetrievalConfig": "CRTConfig",
               "Seq2SeqConfig": "Seq2AttnConfig", "MLUConfig": "CoDAEncoderDecoderConfig"}


def _by_name(config):
    return {**settings({k: v for k, v in config.items() if k != "class"}),
            "class": CLASS_NAMES.get(config["class"], config["class"])}


def resolved_configs():
    out = {}
    for recipe in train.RECIPES:
        for task in recipe.tasks:
            for model in recipe.models:
                for preset in ("cpu", "paper"):
                    for split in (SCAN_SPLITS if task == "scan" else [None]):
                        cfg = train.make_config(task, model, preset, split=split)
                        key = "/".join([task, model, preset] + ([split] if split else []))
                        out[key] = {"class": type(cfg.model_config).__name__, **dataclasses.asdict(cfg)}
    return out


def test_resolved_configurations_are_unchanged():
    def compare(expected, actual):
        assert sorted(actual) == sorted(expected), "the set of (task, model, preset) combinations changed"
        expected, actual = ({k: _by_name(v) for k, v in d.items()} for d in (expected, actual))
        changed = [k for k in expected if expected[k] != actual[k]]
        assert not changed, (f"configurations changed: {changed[:5]}; "
                             f"first: {expected[changed[0]]} → {actual[changed[0]]}")
    _compare_or_update("configs.json", resolved_configs(), compare)


def golden_run(task, model, tmp_path, monkeypatch):
    """(losses of 3 steps, {parameter: [sum, L2 norm]}) of train.train on a tiny batch."""
    recipe = train.recipe_for(task)
    losses, models = [], []
    real_loss, real_build = recipe.loss, recipe.build_model

    def loss(self, m, batch):
        out = real_loss(self, m, batch)
        losses.append(float(out[0].data))
        return out

    def build_model(self):
        models.append(real_build(self))
        return models[-1]

    monkeypatch.setattr(recipe, "loss", loss)
    monkeypatch.setattr(recipe, "build_model", build_model)
    monkeypatch.setattr(recipe, "evaluate", lambda self, m: {})
    monkeypatch.setattr(recipe, "evaluate_selected", lambda self, m: {})   # (sort's greedy decoding: 30 s)
    cfg = train.make_config(task, model, "cpu", seed=0, steps=3, batch_size=4, eval_every=3,
                            **RUN_SETTINGS.get(task, {}))
    train.train(cfg, str(tmp_path / f"{task}-{model}"), progress=False)
    params = {k: [float(np.sum(v, dtype=np.float64)), float(np.linalg.norm(v.astype(np.float64)))]
              for k, v in models[0].state_dict().items()}
    return losses, params


# Biases whose exact gradient is 0, in whole or in part, because a softmax ignores a shift of all its
# scores: a key bias adds q·b to every score of a query (key.bias, the key halves of the fused b_kv and
# b_qk), the additive attention's output bias adds b2 to every score (attention.w2.bias). In float32 that
# gradient is rounding noise that depends on the machine's BLAS kernels, and Adam normalises the noise into
# lr-sized steps, so their values after 3 steps say nothing about the code: on two x86 machines with the
# same NumPy they differed by up to 2,000x RTOL. Their other halves still shape the losses compared below.
SHIFT_INVARIANT = ("key.bias", "key_search.bias", "b_kv", "b_qk", "attention.w2.bias")
# A parameter's sum can cancel to ~0, and entries with a nearly shift-invariant gradient (e.g. the columns
# of Transformer-XL's W_r that meet the slowest sinusoids, nearly constant over positions) move by rounding
# noise too: sums get an absolute tolerance of SUM_ATOL x the parameter's norm.
SUM_ATOL = 1e-3
# The goldens pin the CPU's default path, the textbook one. On the annex (MINATTN_PLAIN=0) the same algebra
# is rounded differently in float32 (fused forms, regrouped sums), and that can flip a kink:
# in ctl/ndr one ReLU input of ~130,000 at step 1 sits at 4e-7 on one path and -1e-7 on the other, which
# moves the fc1 gradient by 3% and, through Adam, parameter norms by 0.5% after 3 steps. There the losses
# are held to RTOL and the parameters to 1% (sums to 10% of the norm); tests/library/test_plain_vs_fast.py holds
# the two paths to 1e-6 in float64, where no kink flips.
ANNEX_RTOL, ANNEX_SUM_ATOL = 1e-2, 0.1


def test_golden_runs_are_unchanged(tmp_path, monkeypatch):
    assert not (UPDATE and not is_plain()), "regenerate the goldens on the CPU's default path, not with MINATTN_PLAIN=0"
    rtol, sum_atol = (RTOL, SUM_ATOL) if is_plain() else (ANNEX_RTOL, ANNEX_SUM_ATOL)
    runs = {}
    for task in RUN_TASKS:
        for model in train.recipe_for(task).models:
            with monkeypatch.context() as m:
                losses, params = golden_run(task, model, tmp_path, m)
            runs[f"{task}/{model}"] = {"losses": losses, "params": params}

    def compare(expected, actual):
        assert sorted(actual) == sorted(expected)
        for key, exp in expected.items():
            act = actual[key]
            np.testing.assert_allclose(act["losses"], exp["losses"], rtol=RTOL, err_msg=f"{key}: losses")
            assert sorted(act["params"]) == sorted(exp["params"]), f"{key}: parameter names changed"
            for name, values in exp["params"].items():
                if name.endswith(SHIFT_INVARIANT):
                    continue
                np.testing.assert_allclose(act["params"][name][0], values[0], rtol=rtol, atol=sum_atol * values[1],
                                           err_msg=f"{key}: sum of {name}")
                np.testing.assert_allclose(act["params"][name][1], values[1], rtol=rtol,
                                           err_msg=f"{key}: norm of {name}")
    _compare_or_update("runs.json", runs, compare)

