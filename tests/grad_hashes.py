"""One training step of every model: a sha256 of all its parameter gradients, to compare two versions of the
code bit for bit (e.g. an engine change that must not change any gradient).

    python -m tests.grad_hashes [--dropout] > after.txt      # in each checkout, then: diff before.txt after.txt

Each (task, model) pair of the recipes' first task takes its cpu preset with batch 16, seed 0 and the first
training batch. Dropout is off unless ``--dropout`` is given: the order in which masks are drawn is not part of
the math being compared. Not a test: it prints, the comparison is yours.
"""
import dataclasses
import hashlib
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import train  # noqa: E402
from minattn import backend  # noqa: E402


def main(dropout=False):
    for recipe_cls in train.RECIPES:
        task = recipe_cls.tasks[0]
        for model_name in recipe_cls.models:
            cfg = train.make_config(task, model_name, "cpu", batch_size=16)
            if not dropout:
                mc = cfg.model_config
                cfg.model_config = dataclasses.replace(
                    mc, **{f.name: 0.0 for f in dataclasses.fields(mc) if "dropout" in f.name})
            recipe = recipe_cls(cfg)
            recipe.load_task()
            model = recipe.build_model()
            batch = next(recipe.batches(np.random.default_rng([cfg.seed, 1])))
            model.train()
            model.set_rng(backend.RNG(cfg.seed, "cpu").reseed(0))
            loss, _, _ = recipe.loss(model, batch)
            loss.backward()
            h = hashlib.sha256()
            for name, p in model.named_parameters():
                h.update(name.encode())
                h.update(np.ascontiguousarray(p.grad if p.grad is not None else np.zeros(0)).tobytes())
            print(f"{task:10s} {model_name:28s} loss {float(loss.data):.9g}  grads {h.hexdigest()[:16]}", flush=True)


if __name__ == "__main__":
    main(dropout="--dropout" in sys.argv[1:])
