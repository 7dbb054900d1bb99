"""The recipes: how each paper's experiments train, one file per paper (its docstring names the
tasks and models it trains), behind the hook interface of ``base.Recipe`` (its module docstring
lists the hooks). ``RECIPES`` is the one table train.py reads: a new task of an existing kind is its
generator (minattn/data/) plus its name in the recipe's ``tasks`` and a preset row; a new model of
an existing kind is a row in its registry (minattn/models/); a new kind of experiment is one new
file here plus its row below.
"""
from .abstractor import RelationalTasks, Sort
from .base import PLOT_EXAMPLES, Recipe, RunConfig, Selection, UsageError
from .coda import CoDA
from .compositional import Compositional
from .ndr import NDR
from .seq2attn import Seq2Attn

__all__ = ["RECIPES", "recipe_for", "Recipe", "RunConfig", "Selection", "UsageError",
           "PLOT_EXAMPLES"]

RECIPES = [NDR, Compositional, Seq2Attn, Sort, RelationalTasks, CoDA]


def recipe_for(task):
    """The recipe class that trains ``task``."""
    for recipe in RECIPES:
        if task in recipe.tasks:
            return recipe
    raise UsageError(f"unknown task {task!r}; valid tasks: "
                     f"{', '.join(t for r in RECIPES for t in r.tasks)}")
