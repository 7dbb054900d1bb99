"""The recipe interface from the outside: a new kind of task is one recipe (here defined inside the test,
in a real change one new file in minattn/recipes/) plus its row in ``RECIPES``; an attention drop-in
for the NDR paper's encoder is a row in ``ARCHITECTURES`` plus its preset rows in recipes/ndr.py. Both
then train through train.py's own loop, and --show-config shows what --set changed."""
import dataclasses
import json
import os
import sys

import numpy as np

from minattn import backend, nn, recipes
from minattn import functional as F
from minattn.attention.multihead import MultiHeadAttention
from minattn.engine import eval_mode, no_grad
from minattn.models import transformer
from minattn.recipes import ndr

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import train  # noqa: E402


# --- a new task: "first token" (which of V tokens opens a random sequence?), one attention layer ----------

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
    """The six hooks without a default, and the presets; everything else is the base class's."""
    tasks = ("first-token",)
    models = ("attention",)
    report_final = ()

    @staticmethod
    def config(task, model, preset):
        return recipes.RunConfig(task=task, model=model, preset=preset, steps=100 if preset == "cpu" else 1000,
                                 batch_size=8, lr=1e-2, grad_clip=1.0, eval_every=50, model_config=FirstTokenConfig())

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


def test_an_attention_drop_in_is_table_rows(tmp_path, monkeypatch, capsys):
    # models/transformer.py: the architecture row (layer, attention kind, input positions); a new mechanism
    # would add its kind to _attention() there. Here an existing kind under a new name.
    monkeypatch.setitem(transformer.ARCHITECTURES, "transformer-mine", ("postln", "relative", False))
    monkeypatch.setattr(ndr.Classification, "models", tuple(transformer.ARCHITECTURES))   # follows the table
    # recipes/ndr.py: its preset, here the Transformer's run on CTL
    monkeypatch.setitem(ndr.PAPER, ("ctl", "transformer-mine"), ndr.PAPER["ctl", "transformer"])
    code = train.main(["--task", "ctl", "--model", "transformer-mine", "--steps", "2", "--eval-every", "2",
                       "--batch-size", "8", "--set", "d_model=16", "--set", "d_ff=16", "--set", "n_steps=2",
                       "--no-progress", "--out", str(tmp_path)])
    assert code == 0, capsys.readouterr().err
    assert json.load(open(tmp_path / "results.json"))["steps"] == 2


def test_show_config_marks_what_flags_and_set_changed(capsys):
    assert train.main(["--task", "sort", "--model", "abstractor", "--show-config", "--lr", "0.002",
                       "--set", "d_model=32", "--seed", "3"]) == 0
    out = capsys.readouterr().out.splitlines()
    changed = {line.split()[1] for line in out if line.startswith("  * ")}
    assert changed == {"lr", "d_model", "seed"}
    assert "  * lr = 0.002   [0.001]" in out
    assert "    steps = 400" in out    # resolved from epochs, as training resolves it (500 samples, batch 512)
    assert out[0].startswith("sort / abstractor, cpu preset")
    assert any(line.startswith("model (SortConfig)") for line in out)
