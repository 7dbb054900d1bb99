"""The recipe interface from the outside, as a new contributor meets it. Each change below is made from
inside a test (in a real change: the files named in the comments) and then trains through train.py's own
loop:

- a new kind of task: one recipe (one new file in minattn/lab/recipes/) plus its row in ``RECIPES``;
- a new task of an existing kind: its generator (a class in minattn/data/), its import and row in ``TASKS``
  (minattn/data/__init__.py), its name in the recipe's ``tasks`` and one preset row (minattn/lab/recipes/): 3
  files, 5 places;
- an attention drop-in for the NDR paper's encoder: its file (minattn/attention/) plus one row in
  ``ARCHITECTURES`` and its import (minattn/models/encoder.py): 2 files, 2 places besides the new file; it
  trains the Transformer's preset.

--show-config shows what flags and --set changed; a missing preset is one line naming the valid ones.
"""
import dataclasses
import json
import os
import sys

import numpy as np
import pytest

from minattn import backend, data, nn
from minattn.lab import recipes
from minattn import functional as F
from minattn.attention.multihead import MultiHeadAttention
from minattn.data.classification import ClassificationTask, make_split
from minattn.engine import eval_mode, no_grad
from minattn.models import encoder
from minattn.lab.recipes import ndr

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
import train  # noqa: E402


# --- a new kind of task: "first token" (which of V tokens opens a random sequence?), one attention layer ----

@dataclasses.dataclass
class FirstTokenConfig:
    d_model: int = 16
    n_head: int = 2
    vocab: int = 5
    length: int = 6


class FirstTokenModel(nn.Module):
    def __init__(self, cfg, seed):
        rng = np.random.default_rng(seed)
        self.embedding = nn.Embedding(cfg.vocab, cfg.d_model, rng=rng)
        self.attn = MultiHeadAttention(cfg.d_model, cfg.n_head, rng=rng)
        self.head = nn.Linear(cfg.d_model, cfg.vocab, rng=rng)

    def forward(self, x):
        h = self.embedding(x)                                  # (B, T, C)
        return self.head(self.attn(h)[:, -1])                  # read at the last position: (B, V)


class FirstToken(recipes.Recipe):
    """The presets, the model config and the four hooks without a default, and batches; the rest is the base class's."""
    tasks = ("first-token",)
    models = {"attention": {}}
    PAPER = {("first-token", "attention"): dict(steps=1000, batch_size=8, lr=1e-2, grad_clip=1.0, eval_every=50)}
    CPU = {"*": dict(steps=100)}
    ModelConfig = FirstTokenConfig

    def load_task(self):
        c = self.cfg.model_config
        self.valid = np.random.default_rng([self.cfg.seed, 9]).integers(0, c.vocab, (64, c.length))

    def build_model(self):
        return FirstTokenModel(self.cfg.model_config, self.cfg.seed)

    def batches(self, rng):
        c = self.cfg.model_config
        while True:
            yield rng.integers(0, c.vocab, (self.cfg.batch_size, c.length))

    def loss(self, model, batch):
        x, y = self.to_device((batch, batch[:, 0]))
        logits = model(x)
        return F.cross_entropy(logits, y), {"acc": (logits.data.argmax(-1) == y).sum()}, len(y)

    def evaluate(self, model):
        with no_grad(), eval_mode():
            x, y = self.to_device((self.valid, self.valid[:, 0]))
            return {"valid": float(backend.to_numpy((model(x).data.argmax(-1) == y).mean()))}


def test_a_new_task_is_one_recipe_and_a_table_row(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(recipes, "RECIPES", recipes.RECIPES + [FirstToken])   # the row
    code = train.main(["--task", "first-token", "--model", "attention", "--steps", "2", "--eval-every", "2",
                       "--set", "d_model=8", "--no-progress", "--out", str(tmp_path)])
    assert code == 0, capsys.readouterr().err
    results = json.load(open(tmp_path / "results.json"))
    assert results["steps"] == 2 and set(results["metrics"]) == {"valid"}
    assert results["config"]["model_config"]["d_model"] == 8


# --- a new task of an existing kind: parity of a bit string, trained by the NDR recipe ----------------------

class ParityTask(ClassificationTask):
    """Is the number of 1s odd? "1 0 1" → class "0" (two 1s). In a real change: a class in minattn/data/."""
    name = "parity"
    vocab = ["0", "1"]
    classes = ["0", "1"]

    def _params(self):
        return {"n": 64}

    def _generate(self):
        rng = np.random.default_rng(self.seed)
        splits = {}
        for name, (lo, hi) in {"train": (2, 6), "iid": (2, 6), "valid": (7, 8), "test": (9, 10)}.items():
            seqs = [rng.integers(0, 2, rng.integers(lo, hi + 1)) for _ in range(64)]
            splits[name] = make_split(seqs, [int(s.sum() % 2) for s in seqs], [len(s) for s in seqs])
        return splits


def test_a_new_task_of_an_existing_kind_is_a_generator_and_three_rows(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(data.TASKS, "parity", ParityTask)                                # data/__init__.py
    monkeypatch.setattr(ndr.NDR, "tasks", ndr.NDR.tasks + ("parity",))                  # recipes/ndr.py
    monkeypatch.setitem(ndr.PAPER, ("parity", "transformer"), dict(                     # recipes/ndr.py
        d_model=16, d_ff=32, n_head=2, n_steps=2, embedding_init="normal", readout="eos", dropout=0.1,
        attention_dropout=0.0, gate_dropout=0.0, steps=100, batch_size=16, eval_every=50, lr=1e-3,
        weight_decay=0.01, grad_clip=1.0, batching="random"))
    monkeypatch.setenv("MINATTN_CACHE", str(tmp_path / "cache"))
    for model in ("transformer", "ndr", "transformer-coda"):   # every model takes the Transformer's row
        assert train.main(["--task", "parity", "--model", model, "--show-config"]) == 0
        assert "    batch_size = 128" in capsys.readouterr().out        # the cpu preset's "*" override applies
    code = train.main(["--task", "parity", "--model", "ndr", "--steps", "2", "--eval-every", "2", "--batch-size", "8",
                       "--no-progress", "--out", str(tmp_path / "run")])
    assert code == 0, capsys.readouterr().err
    results = json.load(open(tmp_path / "run" / "results.json"))
    assert results["steps"] == 2 and set(results["metrics"]) == {"iid", "valid", "test"}
    assert set(results["final_metrics"]) == {"iid", "valid", "test"}   # gate_mean is logged, not a metric


# --- an attention drop-in for the NDR encoder: one file and one row -----------------------------------------

class LastTokenAttention(nn.Module):
    """Every position takes the value of the last real token (a mechanism small enough for a test; in a real
    change: a file in minattn/attention/ with its paper's equations)."""

    def __init__(self, d_model, rng):
        self.value = nn.Linear(d_model, d_model, rng=rng)
        self.last_weights = None

    def forward(self, x, key_mask=None):
        B, T, C = x.shape
        xp = backend.array_module(x.data)
        last = key_mask.sum(-1) - 1 if key_mask is not None else xp.full(B, T - 1)
        v = self.value(x)[xp.arange(B), last]                   # (B, C)
        return F.broadcast_to(v.reshape(B, 1, C), (B, T, C))


def test_an_attention_drop_in_is_one_file_and_one_row(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(encoder.ARCHITECTURES, "transformer-last", encoder.Architecture(   # models/encoder.py
        layer="postln", input_pe=True, attention=lambda cfg, rng: LastTokenAttention(cfg.d_model, rng)))
    code = train.main(["--task", "ctl", "--model", "transformer-last", "--steps", "2", "--eval-every", "2",
                       "--batch-size", "8", "--set", "d_model=16", "--set", "d_ff=16", "--set", "n_steps=2",
                       "--no-progress", "--out", str(tmp_path)])
    assert code == 0, capsys.readouterr().err
    results = json.load(open(tmp_path / "results.json"))
    assert results["steps"] == 2 and set(results["metrics"]) == {"iid", "valid", "test"}
    transformer = train.make_config("ctl", "transformer")     # it trains the Transformer's preset
    assert results["config"]["lr"] == transformer.lr and results["config"]["batching"] == transformer.batching


# --- configuration ---------------------------------------------------------------------------------------

def test_show_config_marks_what_flags_and_set_changed(capsys):
    assert train.main(["--task", "sort", "--model", "abstractor", "--show-config", "--lr", "0.002",
                       "--set", "d_model=32", "--seed", "3", "--train-size", "1000"]) == 0
    out = capsys.readouterr().out.splitlines()
    changed = {line.split()[1] for line in out if line.startswith("  * ")}
    assert changed == {"lr", "d_model", "seed", "train_size", "steps", "eval_every"}
    assert "  * lr = 0.002   [0.001]" in out
    assert "  * steps = 800   [400]" in out          # counted in epochs of the training set, as training does
    assert out[0].startswith("sort / abstractor, cpu preset")
    assert any(line.startswith("task options (SortOptions)") for line in out)
    assert any(line.startswith("model (AbstractorConfig)") for line in out)


def test_every_setting_has_one_home():
    """A setting is a field of exactly one of the run, the task options and the model (--set finds it by
    name), and the model configs hold no schedule."""
    schedule = {"steps", "epochs", "eval_epochs", "patience", "warmup", "eval_every", "train_size"}
    for recipe in recipes.RECIPES:
        for model in recipe.models:
            homes = [recipes.RunConfig, recipe.Options, recipe.model_config_class(model)]
            names = [f.name for cls in homes if cls is not None for f in dataclasses.fields(cls)]
            assert len(names) == len(set(names)), (recipe.__name__, model)
            assert not schedule & {f.name for f in dataclasses.fields(recipe.model_config_class(model))}


@pytest.mark.parametrize("task,model,message", [
    ("ctl", "abstractor", "unknown model 'abstractor' for task ctl; valid models: transformer,"),
    ("sort", "ndr", "valid models: abstractor, abstractor-ablation, transformer-seq2seq"),
])
def test_a_wrong_combination_is_one_line(task, model, message, capsys):
    assert train.main(["--task", task, "--model", model, "--show-config"]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


def test_a_missing_preset_row_is_one_line_naming_the_rows(monkeypatch):
    monkeypatch.setattr(ndr.NDR, "tasks", ndr.NDR.tasks + ("parity",))
    with pytest.raises(recipes.UsageError, match="no preset for parity / ndr; tasks with one: ctl, arith, listops"):
        train.make_config("parity", "ndr")
    monkeypatch.setattr(ndr.NDR, "ROW_OF_ANY_MODEL", None)
    with pytest.raises(recipes.UsageError, match="no preset for arith / transformer-coda; models with one: "):
        train.make_config("arith", "transformer-coda")
