"""Compositional Attention's Contextual Retrieval Task (Mittal et al. 2022, paper Appendix C.1) with the CRT
models: multi-head (``mha``) or compositional attention. Section numbers (§) without "paper" are those of
docs/compositional.md.
"""
import dataclasses

import numpy as np

from .. import backend, viz
from .. import functional as F
from ..data import RetrievalTask
from ..engine import eval_mode, no_grad
from ..models import crt
from .base import Recipe, RunConfig, UsageError


@dataclasses.dataclass
class RetrievalConfig(crt.CRTConfig):
    """The CRT model's settings (CRTConfig: searches, retrievals, n_head, d_model, ...) plus the task's."""
    n_objects: int = 10            # N objects per sample (the code's seq_len)
    ood: bool = False              # train on the train combinations of retrieval choices only (§8)
    eval_batches: int = 100        # an evaluation: mean L1 over this many fresh batches (§9)


def retrieval_config(task, model, preset):
    """The CRT code's training (§9): Adam (AdamW without decay), lr 1e-4, batch 256, no clipping, an
    evaluation every 5,000 of 100,000 steps. "cpu" changes only the number of steps (timings: see Retrieval)."""
    cfg = RunConfig(task=task, model=model, preset=preset, steps=100_000, batch_size=256, lr=1e-4, weight_decay=0.0,
                    grad_clip=0.0, eval_every=5000, model_config=RetrievalConfig())
    if preset == "cpu":
        cfg.steps, cfg.eval_every = 30_000, 2500
    return cfg


class Retrieval(Recipe):
    """Contextual retrieval with the CRT models: a fresh batch every step, L1 loss (lower is better).
    ``iid_l1``: on the training distribution (all combinations of retrieval choices; in OOD mode the
    train combinations). ``ood_l1``: on the held-out test combinations (only out of distribution in
    OOD mode). Both are reported at the end of training (§9). cpu preset: a step took ~50 ms
    (compositional) and ~35 ms (mha) on the 2-core machine beside one other training job, so 30,000
    steps and 12 evaluations take ≤ ~27 min."""
    tasks = ("retrieval",)
    models = crt.MODELS
    select_split = "iid_l1"
    report_final = ("iid_l1", "ood_l1")
    metric_higher_is_better = False
    config = staticmethod(retrieval_config)

    def load_task(self):
        c = self.cfg.model_config
        try:
            self.task = RetrievalTask(c.searches, c.retrievals, c.n_objects)
            self.task.combinations("test")  # fails early if no combination is left out
        except ValueError as e:
            raise UsageError(str(e)) from None
        self.train_pool = "train" if c.ood else "all"
        return self.task

    def build_model(self):
        try:
            return crt.CRTModel(self.cfg.model, self.task.in_dim, self.cfg.model_config, seed=self.cfg.seed)
        except ValueError as e:
            raise UsageError(str(e)) from None

    def batches(self, rng):
        while True:
            yield self.task.batch(self.cfg.batch_size, rng, self.train_pool)

    def loss(self, model, batch):
        x, y = self.to_device(batch[:2])
        return F.abs(model(x) - y).mean(), {}, len(y)

    def evaluate(self, model):
        """Mean L1 over ``eval_batches`` fresh batches per pool: the same batches at every evaluation."""
        result = {}
        with no_grad(), eval_mode():
            for i, (name, pool) in enumerate([("iid_l1", self.train_pool), ("ood_l1", "test")]):
                rng, total = np.random.default_rng([self.cfg.seed, 2, i]), 0
                for _ in range(self.cfg.model_config.eval_batches):
                    x, y, _ = self.task.batch(self.cfg.batch_size, rng, pool)
                    x, y = self.to_device((x, y))
                    total = total + (model(x) - y).abs().mean().data
                result[name] = round(float(backend.to_numpy(total)) / self.cfg.model_config.eval_batches, 5)
        return result

    def analyze(self, model):
        """Paper Fig. 5: mean value score of each model (search, retrieval) per ground-truth choice."""
        if self.cfg.model == "mha":
            raise UsageError("the analysis shows value scores, which only the compositional models have")
        # In OOD mode also on the held-out combinations: there the choices show whether they compose.
        pools = [self.train_pool] + (["test"] if self.train_pool == "train" else [])
        out = []
        for pool in pools:
            x, _, prefs = self.task.batch(2048, np.random.default_rng([self.cfg.seed, 3]), pool)
            with no_grad(), eval_mode():
                _, _, c = model(backend.to_device(x, self.cfg.device), return_weights=True)
            table = crt.format_specialisation(crt.specialisation(c.data, prefs, self.task.retrievals))
            name = "held-out (ood)" if pool == "test" else pool
            out.append(f"mean value scores on 2048 fresh samples ({name} combinations):\n{table}")
        return "\n\n".join(out)

    def plot_examples(self, model, texts):
        """Paper Figs. 4–5: search maps, and value scores per search and per ground-truth retrieval, on the
        fresh samples --analyze uses (inputs are random vectors: there is no text to give)."""
        if texts:
            raise UsageError("retrieval inputs are random vectors: --example is not available for this task")
        x, _, prefs = self.task.batch(2048, np.random.default_rng([self.cfg.seed, 3]), self.train_pool)
        return viz.retrieval_pictures(model, backend.to_device(x, self.cfg.device), prefs,
                                      f"retrieval / {self.cfg.model} ({self.train_pool} combinations)")
