"""A setting the model never reads is refused by ``--set``, not silently ignored (e.g. ``gate_dropout`` on the plain
Transformer, whose post-LN layer has no gate). The lab's table ``UNREAD`` (minattn/lab/settings.py) declares those
settings by model; the test below checks every declaration against the fields the model's code actually reads while
it is built, trains one step and evaluates one batch."""
import dataclasses
import os
import sys

import numpy as np
import pytest

import train
from minattn.engine import eval_mode
from minattn.lab.recipes import RECIPES
from minattn.lab.settings import CONDITIONAL, UNREAD   # CONDITIONAL: read only under another setting's value


MODEL_CODE = tuple(os.path.join(os.path.dirname(train.__file__), "minattn", d) + os.sep
                   for d in ("models", "attention", os.path.join("lab", "recipes"), "data"))


def recording(cfg, read):
    """A copy of the dataclass ``cfg`` that adds to ``read`` each field the model code (not the config
    machinery in recipes/base.py) reads from it."""
    names = {f.name for f in dataclasses.fields(cfg)}

    def getattribute(self, name):
        if name in names:
            caller = sys._getframe(1).f_code.co_filename
            if caller.startswith(MODEL_CODE) and not caller.endswith(os.path.join("recipes", "base.py")):
                read.add(name)
        return object.__getattribute__(self, name)

    cls = type(type(cfg).__name__, (type(cfg),), {"__getattribute__": getattribute})
    return cls(**{f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)})


def first_task(recipe):
    return {"RelationalTasks": "pairwise", "Seq2Attn": "lookup"}.get(recipe.__name__, recipe.tasks[0])


@pytest.mark.parametrize("recipe,model", [(r, m) for r in RECIPES for m in r.models],
                         ids=lambda x: x if isinstance(x, str) else x.__name__)
def test_unread_are_the_fields_the_model_never_reads(recipe, model):
    cfg = train.make_config(first_task(recipe), model, batch_size=8)
    read = set()
    cfg.model_config = recording(cfg.model_config, read)
    run = recipe(train.schedule(cfg))
    run.load_task()
    net = run.build_model()
    batch = next(run.batches(np.random.default_rng(0)))
    loss = run.loss(net, batch)
    (loss[0] if isinstance(loss, tuple) else loss).backward()
    with eval_mode():
        run.loss(net, batch)
    unread = {f.name for f in dataclasses.fields(cfg.model_config)} - read
    declared = set(UNREAD.get(model, ())) & {f.name for f in dataclasses.fields(cfg.model_config)}
    assert declared <= unread, f"{model} reads settings UNREAD says it does not: {sorted(declared - unread)}"
    assert unread - declared <= set(CONDITIONAL), f"{model} never reads {sorted(unread - declared)}: add to UNREAD"


@pytest.mark.parametrize("task,model,setting,readers", [
    ("ctl", "transformer", "gate_dropout=0.2", "transformer-rel-gate, transformer-absrel-gate, ndr"),
    ("ctl", "transformer", "attention_dropout=0.2", "transformer-rel, "),
    ("sort", "transformer-seq2seq", "symbols=symbolic", "abstractor, abstractor-ablation"),
    ("mlu", "transformer-seq2seq", "coda_beta=1", "transformer-seq2seq-coda"),
    ("retrieval", "compositional", "n_head=4", "mha"),
])
def test_set_refuses_a_setting_the_model_never_reads(task, model, setting, readers, capsys):
    assert train.main(["--task", task, "--model", model, "--set", setting, "--show-config"]) == 2
    err = capsys.readouterr().err
    assert f"{model} does not use {setting.split('=')[0]}" in err and f"the models that do: {readers}" in err


def test_a_setting_read_only_under_another_is_refused_without_it(capsys):
    argv = ["--task", "sort", "--model", "abstractor", "--set", "n_library=64", "--show-config"]
    assert train.main(argv) == 2
    assert ("n_library is read only with symbols=symbolic (this run has symbols=learned), so it would change "
            "nothing") in capsys.readouterr().err
    assert train.main(argv + ["--set", "symbols=symbolic"]) == 0
    assert "* n_library = 64" in capsys.readouterr().out


def test_set_takes_the_same_setting_on_a_model_that_reads_it(capsys):
    assert train.main(["--task", "ctl", "--model", "ndr", "--set", "gate_dropout=0.2", "--show-config"]) == 0
    assert "* gate_dropout = 0.2" in capsys.readouterr().out
