"""Compositional Attention's Contextual Retrieval Task (Mittal et al. 2022, paper Appendix C.1) with
the CRT models: multi-head (``mha``) or compositional attention. Section numbers (§) without "paper"
are those of docs/compositional.md.
"""
import dataclasses

import numpy as np

from minattn import functional as F
from minattn.data import RetrievalTask
from minattn.engine import eval_mode, no_grad
from minattn.models import compositional

from .. import viz
from .base import Recipe, Selection, fraction


@dataclasses.dataclass
class RetrievalOptions:
    """The task's options (its S_gt and R_gt are the model's searches and retrievals)."""
    n_objects: int = 10            # N objects per sample (the code's seq_len)
    ood: bool = False              # train on the train combinations of retrieval choices only (§8)
    eval_batches: int = 100        # an evaluation: mean L1 over this many fresh batches (§9)


# "paper": the CRT code's training (§9), the same for every model: Adam (AdamW without decay), lr
# 1e-4, batch 256, no clipping, an evaluation every 5,000 of 100,000 steps.
PAPER = {
    ("retrieval", "mha"): dict(steps=100_000, batch_size=256, eval_every=5000, lr=1e-4,
                               weight_decay=0.0, grad_clip=0.0),
}
# "cpu": 30,000 steps, an evaluation every 2,500 (RESULTS.md has the step times behind them)
CPU = {"*": dict(steps=30_000, eval_every=2500)}


class Compositional(Recipe):
    """Contextual retrieval with the CRT models: a fresh batch every step, L1 loss (lower is
    better). ``iid_l1``: on the training distribution (all combinations of retrieval choices; in OOD
    mode the train combinations). ``ood_l1``: on the held-out test combinations (only out of
    distribution in OOD mode). Both are reported at the end of training (§9)."""
    tasks = ("retrieval",)
    models = compositional.MODELS
    PAPER, CPU = PAPER, CPU
    ROW_OF_ANY_MODEL = "mha"
    ModelConfig, Options = compositional.CRTConfig, RetrievalOptions
    selection = Selection(metric="iid_l1", higher=False, final=("iid_l1", "ood_l1"))

    def load_task(self):
        mc, options = self.cfg.model_config, self.cfg.options
        self.task = RetrievalTask(mc.searches, mc.retrievals, options.n_objects)
        self.task.combinations("test")  # fails early if no combination is left out
        self.train_pool = "train" if options.ood else "all"

    def build_model(self):
        return compositional.CRTModel(self.cfg.model, self.task.in_dim, self.cfg.model_config,
                                      seed=self.cfg.seed)

    def batches(self, rng):
        return self.task.batches(self.cfg.batch_size, rng, self.train_pool)

    def loss(self, model, batch):
        x, y = self.to_device(batch[:2])
        return F.abs(model(x) - y).mean(), {}, len(y)

    def evaluate(self, model):
        """Mean L1 over ``eval_batches`` fresh batches per pool, the same at every evaluation."""
        result, n = {}, self.cfg.options.eval_batches
        with no_grad(), eval_mode():
            for i, (name, pool) in enumerate([("iid_l1", self.train_pool), ("ood_l1", "test")]):
                rng, total = np.random.default_rng([self.cfg.seed, 2, i]), 0
                for _ in range(n):
                    x, y = self.to_device(self.task.batch(self.cfg.batch_size, rng, pool)[:2])
                    total = total + (model(x) - y).abs().mean().data
                result[name] = fraction(total, n)
        return result

    def analyze(self, model):
        """Paper Fig. 5: mean value score of each model (search, retrieval) per true choice."""
        # In OOD mode also on the held-out combinations: do the choices compose?
        pools = [self.train_pool] + (["test"] if self.train_pool == "train" else [])
        out = []
        for pool in pools:
            x, _, prefs = self.task.batch(2048, np.random.default_rng([self.cfg.seed, 3]), pool)
            with no_grad(), eval_mode():
                _, _, c = model(self.to_device([x])[0], return_weights=True)
            if c is None:
                raise ValueError("the analysis shows value scores, which only the compositional "
                                 "models have")
            scores = compositional.specialisation(c.data, prefs, self.task.retrievals)
            table = compositional.format_specialisation(scores)
            name = "held-out (ood)" if pool == "test" else pool
            out.append(f"mean value scores on 2048 fresh samples ({name} combinations):\n{table}")
        return "\n\n".join(out)

    def plot_examples(self, model, texts):
        """Paper Figs. 4–5: search maps, and value scores per search and per ground-truth retrieval,
        on the fresh samples --analyze uses (the inputs are random vectors: no --example)."""
        if texts:
            raise ValueError("retrieval inputs are random vectors: --example is not available for "
                             "this task")
        x, _, prefs = self.task.batch(2048, np.random.default_rng([self.cfg.seed, 3]),
                                      self.train_pool)
        return viz.retrieval_pictures(model, self.to_device([x])[0], prefs,
                                      f"retrieval / {self.cfg.model} ({self.train_pool} "
                                      "combinations)")
