"""The recipes: how each paper's experiments train, one file per paper or kind of task, behind the hook
interface of ``base.Recipe`` (its module docstring lists the hooks). ``RECIPES`` is the one table
train.py reads: a new task or model of an existing kind is a row in its recipe (its ``tasks`` or
``models`` and a preset); a new kind of experiment is one new file here plus its row below.

    ndr.py          NDR paper: ctl, ctl-backward, arith, listops with NDR, its baselines and the
                    attention drop-ins (transformer-compositional, transformer-coda)
    retrieval.py    Compositional Attention: the Contextual Retrieval Task
    seq2attn.py     seq2attn: lookup tables and SCAN
    abstractor.py   Abstractor: object sorting, pairwise order, SET
    mlu.py          CoDA: Mathematical Language Understanding
"""
from .abstractor import PairwiseSet, Sort
from .base import PLOT_EXAMPLES, Recipe, RunConfig, UsageError
from .mlu import MLU
from .ndr import Classification
from .retrieval import Retrieval
from .seq2attn import Seq2Seq

__all__ = ["RECIPES", "recipe_for", "Recipe", "RunConfig", "UsageError", "PLOT_EXAMPLES"]

RECIPES = [Classification, Retrieval, Seq2Seq, Sort, PairwiseSet, MLU]


def recipe_for(task):
    """The recipe class that trains ``task``."""
    for recipe in RECIPES:
        if task in recipe.tasks:
            return recipe
    raise UsageError(f"unknown task {task!r}; valid tasks: {', '.join(t for r in RECIPES for t in r.tasks)}")
