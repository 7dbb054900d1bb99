"""Train and evaluate minattn models from the command line.

    python train.py --task ctl --model ndr                 # the cpu preset (fits ~30 min on 2 cores)
    python train.py --task ctl --model ndr --preset paper --device gpu
    python train.py --task arith --model transformer --steps 2000 --set d_model=128 --out runs/arith
    python train.py --resume --out runs/ctl-ndr            # continue an interrupted run exactly

One readable loop: batches → loss → backward → clip → AdamW step; every ``--eval-every`` steps an
evaluation of every split under ``no_grad()``/``eval_mode()``, a line in ``DIR/metrics.jsonl`` and an
atomic ``DIR/checkpoint.npz`` (model, optimizer, step, best result; NumPy arrays and JSON, never a pickle:
docs/checkpoints.md); at the end ``DIR/results.json``. One run holds a directory at a time (``DIR/lock``).
A loss or gradient norm that is not finite stops the run (exit code 3).

Model selection follows the NDR paper (spec ndr.md §6.6): "iid" is the IID accuracy at the end of
training; "test" is the test accuracy at the evaluation with the best "valid" accuracy (ties go to
the later one), reported with that "best_step".

Randomness: parameters are initialised from ``--seed``; the data order comes from a NumPy generator
seeded from it; dropout and gate-dropout masks of step k come from ``RNG(seed).reseed(k)``. So
``--resume`` replays the data stream up to the saved step and continues bit for bit.
"""
import argparse
import contextlib
import dataclasses
import fcntl
import json
import math
import os
import re
import sys
import tempfile
import time
import zlib

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # before NumPy loads BLAS; see README "Speed"

import numpy as np  # noqa: E402
from tqdm import tqdm  # noqa: E402

import tasks  # noqa: E402
from minattn import backend, optim, viz  # noqa: E402
from minattn import functional as F  # noqa: E402
from minattn.engine import eval_mode, no_grad  # noqa: E402
from minattn.models import crt, seq2attn  # noqa: E402
from minattn.models import abstractor  # noqa: E402
from minattn.models.transformer import ARCHITECTURES, Classifier, EncoderConfig  # noqa: E402
from minattn.attention import coda  # noqa: E402
from minattn.models.transformer import CoDASeq2SeqTransformer, Seq2SeqTransformer  # noqa: E402
from minattn.models.transformer import EncoderDecoderConfig  # noqa: E402

CHECKPOINT_VERSION = 2   # 1: checkpoint.pkl (pickle), read only by --convert


class UsageError(Exception):
    """Bad input from the user: printed as one line, exit code 2."""


class Diverged(Exception):
    """The loss or the gradient norm became NaN or infinite: printed as one line, exit code 3."""


@dataclasses.dataclass
class RunConfig:
    task: str = "ctl"
    model: str = "ndr"
    preset: str = "cpu"
    device: str = "cpu"
    seed: int = 0
    steps: int = 3000              # optimizer steps
    batch_size: int = 128
    lr: float = 3e-4               # constant, no warm-up or decay (spec ndr.md §6.2)
    weight_decay: float = 0.01     # AdamW, on all parameters (spec ndr.md §6.1)
    grad_clip: float = 5.0         # global L2 norm (0: no clipping)
    batching: str = "bucketed"     # "bucketed" (length-sorted batches), "random" (with replacement),
                                   # "balanced" / "stratified" (depths drawn uniformly per batch / per
                                   # sample) or, for seq2seq tasks, "shuffled" (a new permutation each epoch)
    eval_every: int = 500
    eval_batch_size: int = 1024
    model_config: object = None    # the family's model dataclass (e.g. EncoderConfig)


# ==========================================================================================================
# Task families: how each kind of task builds its model, draws batches, computes the loss and is evaluated.
# train() below is the same loop for all of them. A new family = a subclass registered in FAMILIES.
# ==========================================================================================================

class Family:
    """The interface train() relies on. ``metric_higher_is_better`` orients model selection."""
    tasks = ()                       # task names (names.md) this family trains
    models = ()                      # model names it builds
    select_split = "valid"           # the split whose metric selects the reported evaluation
    report_final = ("iid",)          # splits reported at the end of training rather than at selection
    selected_only = ()               # splits computed once, at the end, by evaluate_selected()
    metric_higher_is_better = True
    has_split = False                # True: config() takes a split argument (--split, e.g. SCAN's)

    def __init__(self, cfg):
        self.cfg = cfg

    @classmethod
    def config(cls, task, model, preset):
        """The RunConfig of a preset (before command-line overrides)."""
        raise NotImplementedError

    def load_task(self):
        raise NotImplementedError

    def build_model(self):
        raise NotImplementedError

    def batches(self, rng):
        """Endless host-side training batches; a pure function of ``rng`` (so --resume can replay it)."""
        raise NotImplementedError

    def loss(self, model, batch):
        """(loss Tensor, {name: device scalar summed over the batch}, number of samples)."""
        raise NotImplementedError

    def evaluate(self, model):
        """{split: metric} under no_grad/eval_mode."""
        raise NotImplementedError

    def evaluate_selected(self, model):
        """{split: metric} for the ``selected_only`` splits, computed once after training with the parameters
        of the selected evaluation (train() keeps a copy of them, checkpointed): for metrics too slow to
        compute at every evaluation, such as greedy decoding of a large test set."""
        return {}

    def log_extra(self, model):
        """Extra numbers for the metrics log (e.g. the mean gate)."""
        return {}

    def optimizer(self, params):
        """The optimizer (default: AdamW at the run's constant learning rate and weight decay)."""
        return optim.AdamW(params, lr=self.cfg.lr, weight_decay=self.cfg.weight_decay)

    def stop_early(self, step, history):
        """True to end training before ``cfg.steps`` (early stopping); asked before every step with the
        evaluations logged so far (restored on --resume, so a resumed run stops where a straight one does)."""
        return False

    def analyze(self, model):
        """Text describing what a trained model does (``train.py --analyze``)."""
        raise UsageError(f"no analysis for task {self.cfg.task}")

    def plot_examples(self, model, texts):
        """``viz`` pictures of the model on a fixed sample of test examples, or on the inputs ``texts``
        (``train.py --plot --example TEXT``)."""
        raise UsageError(f"no pictures for task {self.cfg.task}")


# --- presets ----------------------------------------------------------------------------------------------
# "paper": spec ndr.md §8 (batch 512, the papers' sizes and iterations) for a GPU.
# (d_model, d_ff, n_head, n_steps, lr, wd, dropout, att-dropout, gate-dropout, iterations)
_PAPER = {
    ("ctl", "transformer"): (128, 256, 4, 11, 1.5e-4, 0.0025, 0.1, 0.0, 0.0, 30_000),
    ("ctl", "transformer-rel"): (128, 256, 4, 11, 1.5e-4, 0.0025, 0.1, 0.0, 0.0, 30_000),
    ("ctl", "transformer-rel-gate"): (256, 1024, 1, 14, 2e-4, 0.01, 0.5, 0.1, 0.0, 30_000),
    ("ctl", "transformer-absrel-gate"): (256, 1024, 1, 14, 2e-4, 0.01, 0.5, 0.1, 0.0, 30_000),
    ("ctl", "transformer-geom"): (128, 256, 4, 11, 1.5e-4, 0.0025, 0.1, 0.0, 0.0, 30_000),
    ("ctl", "ndr"): (256, 512, 1, 14, 1.5e-4, 0.01, 0.5, 0.1, 0.1, 30_000),
    ("arith", "transformer"): (128, 256, 4, 11, 1.5e-4, 0.0025, 0.5, 0.1, 0.0, 200_000),
    ("arith", "transformer-rel"): (128, 256, 4, 11, 1.5e-4, 0.0025, 0.5, 0.1, 0.0, 200_000),
    ("arith", "transformer-absrel-gate"): (256, 1024, 4, 15, 1.5e-4, 0.01, 0.5, 0.1, 0.1, 100_000),
    ("arith", "ndr"): (256, 1024, 4, 15, 1.5e-4, 0.01, 0.5, 0.1, 0.1, 100_000),
    ("listops", "transformer"): (256, 1024, 16, 6, 4e-4, 0.05, 0.015, 0.05, 0.0, 200_000),
    ("listops", "transformer-rel"): (256, 1024, 16, 6, 4e-4, 0.05, 0.015, 0.05, 0.0, 200_000),
    ("listops", "transformer-absrel-gate"): (512, 2048, 16, 20, 2e-4, 0.09, 0.1, 0.1, 0.05, 100_000),
    ("listops", "ndr"): (512, 1024, 16, 20, 2e-4, 0.09, 0.1, 0.1, 0.05, 100_000),
}
# Rows the paper does not have borrow the closest one: "+ rel + gate" is "+ abs/rel + gate" without
# the abs gate; "+ geom. att." was only run on CTL, so elsewhere it takes the Transformer's sizes.
for _t in ("arith", "listops"):
    _PAPER[(_t, "transformer-rel-gate")] = _PAPER[(_t, "transformer-absrel-gate")]
    _PAPER[(_t, "transformer-geom")] = _PAPER[(_t, "transformer")]
for _t in ("ctl", "arith", "listops"):  # compositional attention as a drop-in: the Transformer's sizes
    _PAPER[(_t, "transformer-compositional")] = _PAPER[(_t, "transformer")]

# "cpu": sized for a 2-core machine (~30 min per run). Only the model, batch and number of steps
# shrink; the task is the paper's. NDR settings from the PyTorch calibration run of the NDR issue.
_CPU = {
    "ndr": dict(d_model=128, d_ff=256, n_head=1, dropout=0.3, attention_dropout=0.1, gate_dropout=0.1),
    # d_FF = 4·d, as the official code hard-wires for the "+ gate" layer (spec §4.3)
    "transformer-rel-gate": dict(d_model=128, d_ff=512, n_head=1, dropout=0.3, attention_dropout=0.1),
    "transformer-absrel-gate": dict(d_model=128, d_ff=512, n_head=1, dropout=0.3, attention_dropout=0.1),
}
# Steps (and, for ListOps, sizes) that fit ~30 min of training; ms/step measured next to another training
# job at batch 128: arithmetic (T ≤ ~40) transformer 620, ndr 1,170, abs/rel + gate 1,600; ListOps (T ≤ 50)
# transformer 3,070 at the paper's d = 256 (820 at the d = 128 below), ndr 2,650 (1,240 at batch 64).
# The copy-gated models apply their layer 14–20 times, so they get fewer steps; ListOps' also halve the batch.
_CPU_STEPS = {"ctl": 5000, "arith": 2500, "listops": 2000}
_CPU_STEPS_GATED = {"ctl": 5000, "arith": 1200, "listops": 1200}
_CPU_LISTOPS_TRANSFORMER = dict(d_model=128, d_ff=512, n_head=4)


def _task_family(task):
    return "ctl" if task.startswith("ctl") else task


@dataclasses.dataclass
class CoDAEncoderConfig(coda.CoDAConfig, EncoderConfig):
    """EncoderConfig plus CoDA's options (``coda_*``): the model config of ``transformer-coda``."""


def _classification_config(task, model, preset):
    """Presets of the NDR paper's models on CTL, arithmetic and ListOps (spec ndr.md §8)."""
    if model == "transformer-coda":  # a drop-in (spec coda.md §3): exactly the Transformer's run, CoDA attention
        cfg = _classification_config(task, "transformer", preset)
        # β = 1/√d_k (N = G/d_k, spec §3.11): at β = 1 the mean gate started at 0.006 on CTL and stayed there
        # for 400 steps; at 1/√d_k it starts near 0.5.
        enc = cfg.model_config
        return dataclasses.replace(cfg, model=model, model_config=CoDAEncoderConfig(
            **dataclasses.asdict(enc), coda_beta=(enc.n_head / enc.d_model) ** 0.5))
    family = _task_family(task)
    d, d_ff, H, n_steps, lr, wd, drop, att_drop, gate_drop, iters = _PAPER[(family, model)]
    gated = model in ("ndr", "transformer-rel-gate", "transformer-absrel-gate")
    if family == "listops":
        readout = "sos"
    elif family == "arith" and model in ("transformer", "transformer-rel"):
        readout = "sos"   # the code's default for these two (spec §1.4)
    else:
        readout = "eos"
    # The plain "Transformer" is N(0, 1) everywhere: the official code builds its "universal" variant without
    # passing the sweep's embedding_init (tasks/simple/transformer_classifier_mixin.py), so the model's
    # default "pytorch" init applies. Spec §5 says kaiming for CTL/arithmetic; the code does not.
    if gated or model in ("transformer", "transformer-compositional"):
        emb_init = "normal"
    elif family == "listops" and model == "transformer-rel":
        emb_init = "xavier"
    else:
        emb_init = "kaiming"
    enc = EncoderConfig(d_model=d, n_head=H, d_ff=d_ff, n_steps=n_steps,
                        n_steps_eval=24 if (family == "listops" and model == "ndr") else 0,
                        dropout=drop, attention_dropout=att_drop, gate_dropout=gate_drop,
                        embedding_init=emb_init, readout=readout)
    bucketed = model == "ndr" or family in ("arith", "listops")
    cfg = RunConfig(task=task, model=model, preset=preset, steps=iters, batch_size=512, lr=lr, weight_decay=wd,
                    grad_clip=5.0 if family == "ctl" else 1.0, batching="bucketed" if bucketed else "random",
                    eval_every=1000, model_config=enc)
    if preset == "cpu":
        cfg.batch_size, cfg.steps, cfg.eval_every = 128, (_CPU_STEPS_GATED if gated else _CPU_STEPS)[family], 500
        cfg.lr = 3e-4
        if family == "listops" and gated:
            cfg.batch_size = 64
        elif family == "listops":
            enc = dataclasses.replace(enc, **_CPU_LISTOPS_TRANSFORMER)
        # With 30× fewer samples than the paper, CTL's rare shallow samples (1% of the train split)
        # are learned too late: draw each batch from one depth, uniformly (same train split).
        cfg.batching = "balanced" if family == "ctl" else cfg.batching
        cfg.model_config = dataclasses.replace(enc, **_CPU.get(model, {}))
    return cfg


class ClassificationFamily(Family):
    """Sequence classification with the NDR paper's encoders (ctl, ctl-backward, arith, listops)."""
    tasks = ("ctl", "ctl-backward", "arith", "listops")
    models = tuple(ARCHITECTURES)
    config = staticmethod(_classification_config)

    def load_task(self):
        self.task = tasks.get_task(self.cfg.task, seed=0)
        return self.task

    def build_model(self):
        try:  # e.g. an unknown --set coda_gate
            return Classifier(self.cfg.model, len(self.task.vocab), len(self.task.classes), self.cfg.model_config,
                              seed=self.cfg.seed)
        except ValueError as e:
            raise UsageError(str(e)) from None

    def batches(self, rng):
        try:
            return tasks.batches(self.task.splits["train"], self.cfg.batch_size, rng, self.cfg.batching)
        except ValueError as e:
            raise UsageError(str(e)) from None

    def _to_device(self, batch):
        return [backend.to_device(a, self.cfg.device) for a in batch]

    def loss(self, model, batch):
        x, lengths, y = self._to_device(batch)
        logits = model(x, lengths)
        return F.cross_entropy(logits, y), {"correct": (logits.data.argmax(-1) == y).sum()}, len(y)

    def evaluate(self, model):
        return {s: self._accuracy(model, self.task.splits[s]) for s in ("iid", "valid", "test")
                if s in self.task.splits}

    def _accuracy(self, model, split):
        correct = 0
        with no_grad(), eval_mode():
            for batch in tasks.eval_batches(split, self.cfg.eval_batch_size):
                x, lengths, y = self._to_device(batch)
                correct = correct + (model(x, lengths).data.argmax(-1) == y).sum()
        return float(backend.to_numpy(correct)) / len(split)

    def log_extra(self, model):
        """Mean copy-gate activation on a few IID samples: the spec warns gates can stay shut. For
        transformer-coda, the mean CoDA gate instead (spec coda.md §3.11: it can start almost closed)."""
        if self.cfg.model not in ("ndr", "transformer-rel-gate", "transformer-absrel-gate", "transformer-coda"):
            return {}
        x, lengths, _ = self._to_device(next(tasks.eval_batches(self.task.splits["iid"], 256)))
        if self.cfg.model == "transformer-coda":
            with no_grad(), eval_mode():
                return {"gate_mean": round(coda.mean_gate(model, lambda: model(x, lengths)), 4)}
        trace = []
        with no_grad(), eval_mode():
            model(x, lengths, trace=trace)
        return {"gate_mean": round(float(np.mean([backend.to_numpy(g.data).mean() for _, g in trace])), 4)}

    def plot_examples(self, model, texts):
        """NDR paper Figs. 2–3: copy gates and the attention of every head at every step."""
        split, names = self.task.splits["test"], list(self.task.vocab) + ["<eos>", "<sos>"]
        try:
            examples = [(_example_name(text), self.task.encode(text), None) for text in texts]
        except ValueError as e:
            raise UsageError(f"--example: {e}") from None
        examples = examples or [(_sample_name("test", i, split), split.inputs[i], self.task.classes[split.labels[i]])
                                for i in _plot_sample(len(split))]
        pictures = []
        for name, seq, target in examples:
            ids, lengths = tasks.collate([seq], len(self.task.vocab))
            title = f"{self.cfg.task} / {self.cfg.model}: {self.task.decode(seq)}"
            title += f" (target {target})" if target else ""
            pictures += viz.encoder_pictures(model, *self._to_device((ids, lengths)), [names[i] for i in ids[0]], title,
                                             name, self.task.classes)
        return pictures


# --- the Contextual Retrieval Task (spec compositional.md §7–9) ---------------------------------------------

@dataclasses.dataclass
class RetrievalConfig(crt.CRTConfig):
    """The CRT model's settings (CRTConfig: searches, retrievals, n_head, d_model, ...) plus the task's."""
    n_objects: int = 10            # N objects per sample (the code's seq_len)
    ood: bool = False              # train on the train combinations of retrieval choices only (spec §8)
    eval_batches: int = 100        # an evaluation: mean L1 over this many fresh batches (spec §9.9)


def _retrieval_config(task, model, preset):
    """Spec §9: Adam (AdamW without decay), lr 1e-4, batch 256, no clipping, an evaluation every 5,000
    of 100,000 steps. "cpu" changes only the number of steps (timings: see RetrievalFamily)."""
    cfg = RunConfig(task=task, model=model, preset=preset, steps=100_000, batch_size=256, lr=1e-4, weight_decay=0.0,
                    grad_clip=0.0, eval_every=5000, model_config=RetrievalConfig())
    if preset == "cpu":
        cfg.steps, cfg.eval_every = 30_000, 2500
    return cfg


class RetrievalFamily(Family):
    """Contextual retrieval with the CRT models: a fresh batch every step, L1 loss (lower is better).
    ``iid_l1``: on the training distribution (all combinations of retrieval choices; in OOD mode the
    train combinations). ``ood_l1``: on the held-out test combinations (only out of distribution in
    OOD mode). Both are reported at the end of training (spec §9.9). cpu preset: a step took ~50 ms
    (compositional) and ~35 ms (mha) on the 2-core machine beside one other training job, so 30,000
    steps and 12 evaluations take ≤ ~27 min."""
    tasks = ("retrieval",)
    models = crt.MODELS
    select_split = "iid_l1"
    report_final = ("iid_l1", "ood_l1")
    metric_higher_is_better = False
    config = staticmethod(_retrieval_config)

    def load_task(self):
        c = self.cfg.model_config
        try:
            self.task = tasks.RetrievalTask(c.searches, c.retrievals, c.n_objects)
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
        x, y = (backend.to_device(a, self.cfg.device) for a in batch[:2])
        return F.abs(model(x) - y).mean(), {}, len(y)

    def evaluate(self, model):
        """Mean L1 over ``eval_batches`` fresh batches per pool: the same batches at every evaluation."""
        result = {}
        with no_grad(), eval_mode():
            for i, (name, pool) in enumerate([("iid_l1", self.train_pool), ("ood_l1", "test")]):
                rng, total = np.random.default_rng([self.cfg.seed, 2, i]), 0
                for _ in range(self.cfg.model_config.eval_batches):
                    x, y, _ = self.task.batch(self.cfg.batch_size, rng, pool)
                    x, y = backend.to_device(x, self.cfg.device), backend.to_device(y, self.cfg.device)
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


# --- seq2seq tasks of seq2attn: lookup tables and SCAN (spec seq2attn.md §1.8, §2.5, §3.6) -----------------

@dataclasses.dataclass
class Seq2SeqConfig(seq2attn.Seq2AttnConfig):
    """The seq2attn model's settings (Seq2AttnConfig: sizes, cell, the G/E/F/T switches, τ) plus the task's."""
    split: str = ""                # scan: the split (tasks.SCAN_SPLITS); lookup has one structure (sample1)


# Paper Table 3: (E, H, layers, cell, dropout between layers — a no-op with one layer, spec §1.8.7)
_SEQ2SEQ_SIZES = {
    ("lookup", "seq2attn"): (256, 256, 1, "gru", 0.5), ("lookup", "seq2seq"): (128, 512, 1, "gru", 0.5),
    ("scan", "seq2attn"): (512, 512, 1, "gru", 0.5), ("scan", "seq2seq"): (200, 200, 2, "lstm", 0.5),
}


def _seq2seq_config(task, model, preset, split=""):
    """Spec §1.8: Adam (AdamW without decay) lr 1e-3, gradient clipping at 5, teacher forcing 0.5 per
    sequence. Lookup: batch 1, 100 epochs, an evaluation every 100 updates. SCAN: 50 epochs at batch 64
    (the project's default: the paper's SCAN batch size is unknown), length-bucketed, 10 evaluations.
    "cpu" keeps all of that but shrinks every model to E = H = 64 (lookup; both models, as the paper's
    ablation uses one size for all) or 128 (SCAN, which also trains 30 epochs instead of 50)."""
    E, H, layers, cell, dropout = _SEQ2SEQ_SIZES[task, model]
    if task == "lookup":
        if split:
            raise UsageError("lookup has one split structure (sample1): drop --split")
        n_train, epochs, batch = 232, 100, 1
    else:
        try:  # without a split (only when --set types are looked up) load_task will ask for one
            n_train, epochs, batch = len(tasks.scan_split(split)["train"]) if split else 0, 50, 64
        except ValueError as e:
            raise UsageError(str(e)) from None
    if preset == "cpu":
        E = H = 64 if task == "lookup" else 128
        epochs = 30 if task == "scan" else epochs
    steps = epochs * -(-n_train // batch)
    mc = Seq2SeqConfig(**seq2attn.MODELS[model], d_embedding=E, d_hidden=H, n_layers=layers, cell=cell,
                       dropout=dropout, split=split)
    return RunConfig(task=task, model=model, preset=preset, steps=steps, batch_size=batch, lr=1e-3, weight_decay=0.0,
                     grad_clip=5.0, batching="shuffled" if task == "lookup" else "bucketed",
                     eval_every=100 if task == "lookup" else max(1, steps // 10), model_config=mc)


class Seq2SeqFamily(Family):
    """seq2attn and its baseline on lookup tables and SCAN. The metric is sequence accuracy under greedy
    decoding with argmax attention: every target token, <eos> included, must be right (spec §1.8.8).
    Lookup reports the evaluation with the lowest validation loss (§1.8.9), a loss computed, as the
    reference's evaluator does, while the model feeds back its own predictions. SCAN has no validation
    set and reports the end of training (§3.6); its train split (15–22k commands) is not evaluated.

    Measured on the 2-core machine next to other jobs (ms per update): lookup at batch 1, paper sizes
    seq2attn 33, baseline 91 (3.9M parameters: the AdamW update alone is a large share), so the paper
    preset takes ~17 and ~40 min; cpu preset (64 units) seq2attn 10–14, baseline ~8: ~5–7 min per run.
    SCAN at batch 64: paper seq2attn ~970 (3+ h for 50 epochs: a GPU job), baseline ~340; cpu preset
    seq2attn ~90, baseline ~165: 10–22 min per run."""
    tasks = ("lookup", "scan")
    models = tuple(seq2attn.MODELS)
    report_final = ()
    metric_higher_is_better = False
    has_split = True
    config = staticmethod(_seq2seq_config)

    def __init__(self, cfg):
        super().__init__(cfg)
        self.select_split = "validation_loss" if cfg.task == "lookup" else None

    def load_task(self):
        split = self.cfg.model_config.split
        try:
            self.task = tasks.get_task(self.cfg.task, **({"split": split} if self.cfg.task == "scan" else {}))
        except ValueError as e:
            raise UsageError(f"{e} (choose with --split)") from None
        return self.task

    def build_model(self):
        try:
            return seq2attn.Seq2Attn(self.cfg.model_config, len(self.task.in_vocab), len(self.task.out_vocab),
                                     self.task.sos, seed=self.cfg.seed)
        except ValueError as e:
            raise UsageError(str(e)) from None

    def batches(self, rng):
        try:
            return self.task.splits["train"].batches(self.cfg.batch_size, rng, self.cfg.batching)
        except ValueError as e:
            raise UsageError(str(e)) from None

    def _to_device(self, batch):
        return [backend.to_device(a, self.cfg.device) for a in batch]

    def loss(self, model, batch):
        src, src_lengths, tgt, tgt_lengths = self._to_device(batch)
        return model.loss(src, src_lengths, tgt, tgt_lengths), {}, len(batch[1])

    def evaluate(self, model):
        result = {}
        with no_grad(), eval_mode():
            for name, split in self.task.splits.items():
                if name == "train" and self.cfg.task == "scan":
                    continue
                correct, loss = 0, 0
                for batch in split.eval_batches(self.cfg.eval_batch_size):
                    src, src_lengths, tgt, tgt_lengths = self._to_device(batch)
                    padding = backend.array_module(tgt).arange(tgt.shape[1]) >= tgt_lengths[:, None]
                    pred = model.greedy(src, src_lengths, tgt.shape[1])
                    correct = correct + ((pred == tgt) | padding).all(axis=1).sum()
                    if name == "validation":
                        loss = loss + model.loss(src, src_lengths, tgt, tgt_lengths).data * len(batch[1])
                result[name] = round(float(backend.to_numpy(correct)) / len(split), 5)
                if name == "validation":
                    result["validation_loss"] = round(float(backend.to_numpy(loss)) / len(split), 5)
        return result

    def plot_examples(self, model, texts):
        """The attention trace (one-hot for seq2attn at inference) and the temperature of every step, on
        test examples (lookup: heldout_compositions) or --example inputs ("100 t3 t1 .", "jump twice")."""
        task, index = self.task, {t: i for i, t in enumerate(self.task.in_vocab)}
        split_name = "test" if "test" in task.splits else "heldout_compositions"
        split, examples = task.splits[split_name], []
        for text in texts:
            unknown = [t for t in text.split() if t not in index]
            if unknown or not text.split():
                raise UsageError(f"--example {text!r}: {'unknown ' + ' '.join(unknown) if unknown else 'empty'}; "
                                 f"input tokens: {' '.join(task.in_vocab[2:])}")
            examples.append((_example_name(text), np.array([index[t] for t in text.split()]), None))
        examples = examples or [(_sample_name(split_name, i, split), split.inputs[i], task.decode(split.targets[i]))
                                for i in _plot_sample(len(split))]
        longest = max(int(s.targets.lengths.max()) for s in task.splits.values())
        pictures = []
        for name, src, target in examples:
            tokens = [task.in_vocab[i] for i in src]
            title = f"{self.cfg.task} / {self.cfg.model}: {' '.join(tokens)}"
            title += f" (target {target})" if target else ""
            src, lengths = self._to_device((src[None], np.array([len(src)])))
            pictures += viz.seq2attn_pictures(model, src, lengths, longest + len(tokens), tokens, task.out_vocab,
                                              title, name)
        return pictures


# --- the Abstractor's relational tasks: object sorting, pairwise order, SET (spec abstractor.md §6) ----------

@dataclasses.dataclass
class SortConfig(abstractor.AbstractorConfig):
    """The sorting models' settings (AbstractorConfig; transformer-seq2seq reads only its Seq2SeqConfig
    fields) plus the run's. Unless --steps / --eval-every are given, both are counted in epochs."""
    train_size: int = 500          # training sequences, sampled from the 70,000 pool with the run's seed
    epochs: int = 400
    eval_epochs: int = 1           # evaluate (and select the model) every this many epochs
    patience: int = 50             # stop after this many epochs without a better selection metric (0: never)


@dataclasses.dataclass
class RelationalConfig(abstractor.SimplifiedConfig):
    """The simplified Abstractor's settings (SimplifiedConfig) plus the run's (epochs as SortConfig)."""
    train_size: int = 2015         # training samples drawn from the train pool (of 2,015 pairs; 7,000 triples)
    epochs: int = 100
    eval_epochs: int = 1
    patience: int = 0              # as SortConfig; the spec trains these for all epochs
    cards: str = "onehot"          # SET card vectors: "onehot" (12-d) or "random64" (spec §6.5)


def _sort_config(task, model, preset):
    """Spec §6.1: Adam lr 1e-3 (AdamW without decay; ε 1e-8 where Keras has 1e-7), batch 512, no clipping,
    up to 400 epochs with early stopping on the validation teacher-forcing accuracy (patience 50 epochs),
    the best evaluation reported. "cpu": the same, evaluated every 10 epochs (so patience is 5 evaluations)."""
    mc = SortConfig(eval_epochs=1 if preset == "paper" else 10)
    if model == "transformer-seq2seq":
        mc = dataclasses.replace(mc, n_encoder_layers=4, n_decoder_layers=4)
    return RunConfig(task=task, model=model, preset=preset, steps=None, batch_size=512, lr=1e-3, weight_decay=0.0,
                     grad_clip=0.0, eval_every=None, eval_batch_size=2000, model_config=mc)


def _relational_config(task, model, preset):
    """Spec §6.4–6.5: Adam lr 1e-3, batch 64, no clipping; pairwise 100 epochs (sigmoid, asymmetric, no
    W_q/W_k bias, head Dense(32, ReLU) → 1 logit), SET 200 epochs (linear, symmetric with bias, d_ff 128,
    head → 2 logits, 2,000 training triples by default). Both presets are the paper's: a run takes minutes."""
    if task == "pairwise":
        mc = RelationalConfig()
    else:
        mc = RelationalConfig(activation="linear", symmetric=True, rel_bias=True, d_ff=128, head_hidden=0,
                              train_size=2000, epochs=200)
    return RunConfig(task=task, model=model, preset=preset, steps=None, batch_size=64, lr=1e-3, weight_decay=0.0,
                     grad_clip=0.0, eval_every=None, eval_batch_size=2048, model_config=mc)


class _ObjectTaskFamily(Family):
    """Shared by the Abstractor families: the training set is ``train_size`` samples of the task's train
    pool drawn with the run's seed; Keras-style epochs (a fresh permutation, the last batch partial);
    steps and eval_every default to ``epochs`` and ``eval_epochs`` whole epochs; early stopping after
    ``patience`` epochs without a better selection metric; everything is reported at the selected
    evaluation (the reference restores the best parameters)."""
    report_final = ()

    def __init__(self, cfg):
        super().__init__(cfg)
        mc = cfg.model_config
        self.per_epoch = -(-mc.train_size // cfg.batch_size)
        cfg.steps = mc.epochs * self.per_epoch if cfg.steps is None else cfg.steps
        cfg.eval_every = mc.eval_epochs * self.per_epoch if cfg.eval_every is None else cfg.eval_every

    def stop_early(self, step, history):
        """As Keras' EarlyStopping: right after an evaluation, once ``patience`` epochs have passed since the
        selection metric last strictly improved."""
        patience = self.cfg.model_config.patience * self.per_epoch
        if not patience or not history or step % self.cfg.eval_every:
            return False
        sign = 1 if self.metric_higher_is_better else -1
        first_best = max(history, key=lambda e: (sign * e[self.select_split], -e["step"]))
        return step - first_best["step"] >= patience

    def load_task(self):
        try:
            self.task = self.make_task()
            self.train_set = self.task.splits["train"].sample(self.cfg.model_config.train_size,
                                                              np.random.default_rng([self.cfg.seed, 2]))
        except ValueError as e:
            raise UsageError(str(e)) from None
        return self.task

    def batches(self, rng):
        for idx in tasks.epoch_batches(len(self.train_set), self.cfg.batch_size, rng):
            yield self.train_set.subset(idx)

    def _objects(self, split):
        return backend.to_device(self.task.objects[split.index], self.cfg.device)

    def _plot_samples(self, texts):
        """(name, object indices) of the test samples --plot shows, or of --example texts of indices."""
        split, examples = self.task.splits["test"], []
        n, m = len(self.task.objects), split.index.shape[1]
        for text in texts:
            index = np.array([int(t) for t in text.split() if t.isdigit()])
            if len(text.split()) != m or len(set(index.tolist())) != m or not (index < n).all():
                raise UsageError(f"--example {text!r}: give {m} distinct object indices in 0..{n - 1}")
            examples.append((_example_name(text), index))
        return examples or [(_sample_name("test", i, split), split.index[i]) for i in _plot_sample(len(split))]


class SortFamily(_ObjectTaskFamily):
    """Object sorting with the encoder–decoder models (spec §6.1): cross-entropy over the 10 positions under
    teacher forcing. Model selection on the validation teacher-forcing accuracy ``valid_tf``. The greedy
    metrics — full-sequence accuracy ``valid`` and ``test`` (the reported one), element-wise ``test_elem``
    — decode 30,000 sequences (~20 s here), so they are computed once, after training, with the selected
    evaluation's parameters (``selected_only``); metrics.jsonl has ``valid_tf`` and ``train`` (greedy
    full-sequence accuracy on the training set) at every evaluation. Measured on the 2-core machine (one BLAS
    thread, session 3): ~0.46 s/step (Abstractor) and ~0.54 s/step (Transformer) at batch 500, an evaluation
    a few seconds; early stopping ends most runs before 400 epochs."""
    tasks = ("sort",)
    models = abstractor.SEQ2SEQ_MODELS
    select_split = "valid_tf"
    selected_only = ("valid", "test", "test_elem")
    config = staticmethod(_sort_config)

    def make_task(self):
        return tasks.SortTask()

    def build_model(self):
        try:
            return abstractor.build_seq2seq(self.cfg.model, tasks.SortTask.START + 1, tasks.SortTask.LENGTH,
                                            self.cfg.model_config, d_src=self.task.objects.shape[1], seed=self.cfg.seed)
        except ValueError as e:
            raise UsageError(str(e)) from None

    def _arrays(self, split):
        to = backend.to_device
        return (self._objects(split), to(tasks.SortTask.decoder_inputs(split.labels), self.cfg.device),
                to(split.labels, self.cfg.device))

    def loss(self, model, batch):
        x, tgt_in, y = self._arrays(batch)
        logits = model(x, tgt_in)
        return F.cross_entropy(logits, y), {"tf_acc": (logits.data.argmax(-1) == y).sum()}, y.size

    def _count(self, model, split, greedy):
        """(correct sequences, correct tokens) under greedy decoding or teacher forcing, as device scalars."""
        seqs = tokens = 0
        for chunk in split.chunks(self.cfg.eval_batch_size):
            x, tgt_in, y = self._arrays(chunk)
            pred = model.greedy(x, y.shape[1], tasks.SortTask.START)[0] if greedy else model(x, tgt_in).data.argmax(-1)
            seqs, tokens = seqs + (pred == y).all(axis=1).sum(), tokens + (pred == y).sum()
        return seqs, tokens

    @staticmethod
    def _frac(count, split, per_token=False):
        return round(float(backend.to_numpy(count)) / (split.labels.size if per_token else len(split)), 5)

    def evaluate(self, model):
        valid = self.task.splits["valid"]
        with no_grad(), eval_mode():
            return {"valid_tf": self._frac(self._count(model, valid, False)[1], valid, True),
                    "train": self._frac(self._count(model, self.train_set, True)[0], self.train_set)}

    def evaluate_selected(self, model):
        splits = self.task.splits
        with no_grad(), eval_mode():
            seqs, tokens = self._count(model, splits["test"], True)
            return {"valid": self._frac(self._count(model, splits["valid"], True)[0], splits["valid"]),
                    "test": self._frac(seqs, splits["test"]), "test_elem": self._frac(tokens, splits["test"], True)}

    def plot_examples(self, model, texts):
        """Encoder attention, the Abstractor's relation matrices and its symbols' attention, on test sequences
        or --example object indices ("17 3 40 29 5 11 46 0 33 21": 10 of the 48 objects)."""
        pictures = []
        for name, index in self._plot_samples(texts):
            title = (f"sort / {self.cfg.model}: objects {' '.join(map(str, index))} "
                     f"(target {' '.join(map(str, np.argsort(index)))})")
            pictures += viz.seq2seq_pictures(model, backend.to_device(self.task.objects[index][None], self.cfg.device),
                                             len(index), tasks.SortTask.START, [f"o{i}" for i in index], title, name)
        return pictures


class PairwiseSetFamily(_ObjectTaskFamily):
    """Pairwise order and SET with the simplified Abstractor (spec §6.4–6.5): binary cross-entropy on one
    logit (pairwise) or softmax cross-entropy on two (SET); accuracy on ``train`` (the training set),
    ``valid`` and ``test``, reported at the evaluation with the lowest validation loss ``valid_loss``.
    SET cards are not images (a documented deviation): its numbers are not directly comparable with
    the paper's. About 5 ms/step on the 2-core machine: a pairwise run (3,200 steps) takes ~1 min."""
    tasks = ("pairwise", "set")
    models = abstractor.CLASSIFIER_MODELS
    select_split = "valid_loss"
    metric_higher_is_better = False
    config = staticmethod(_relational_config)

    def make_task(self):
        if self.cfg.task == "pairwise":
            return tasks.PairwiseOrderTask()
        return tasks.SetTask(cards=self.cfg.model_config.cards)

    def build_model(self):
        n_out = 1 if self.cfg.task == "pairwise" else 2
        try:
            return abstractor.RelationalClassifier(self.task.objects.shape[1], self.train_set.index.shape[1], n_out,
                                                   self.cfg.model_config, seed=self.cfg.seed)
        except ValueError as e:
            raise UsageError(str(e)) from None

    def loss(self, model, batch):
        """(mean loss, {"acc": correct}, n) for a split or batch."""
        logits, y = model(self._objects(batch)), backend.to_device(batch.labels, self.cfg.device)
        if self.cfg.task == "pairwise":
            z, t = logits[:, 0], y.astype(logits.dtype)
            loss = -(F.logsigmoid(z) * t + F.logsigmoid(-z) * (1 - t)).mean()
            return loss, {"acc": ((z.data > 0) == (y == 1)).sum()}, len(y)
        return F.cross_entropy(logits, y), {"acc": (logits.data.argmax(-1) == y).sum()}, len(y)

    def evaluate(self, model):
        result = {}
        with no_grad(), eval_mode():
            for name, split in (("train", self.train_set), ("valid", self.task.splits["valid"]),
                                ("test", self.task.splits["test"])):
                loss = correct = 0
                for chunk in split.chunks(self.cfg.eval_batch_size):
                    chunk_loss, stats, n = self.loss(model, chunk)
                    loss, correct = loss + chunk_loss.data * n, correct + stats["acc"]
                result[name] = round(float(backend.to_numpy(correct)) / len(split), 5)
                if name == "valid":
                    result["valid_loss"] = round(float(backend.to_numpy(loss)) / len(split), 5)
        return result

    def plot_examples(self, model, texts):
        """The relation matrices of every layer and relation, on test samples or --example object indices
        (pairwise: "5 41", two of the 64 objects; set: "0 40 80", three of the 81 cards)."""
        pictures = []
        for name, index in self._plot_samples(texts):
            if self.cfg.task == "pairwise":
                tokens, classes = [f"o{i}" for i in index], ("first > second", "first < second")
                target = int(index[0] < index[1])
            else:  # a card is shown with its attribute values (number, colour, pattern, shape)
                attrs = self.task.attributes[index]
                tokens = [f"{i}:{''.join(map(str, a))}" for i, a in zip(index, attrs)]
                classes, target = ("no SET", "SET"), int(tasks.is_set(attrs))
            title = f"{self.cfg.task} / {self.cfg.model}: {' '.join(tokens)} (target {classes[target]})"
            x = backend.to_device(self.task.objects[index][None], self.cfg.device)
            pictures += viz.relational_pictures(model, x, tokens, title, name, classes)
        return pictures


# --- Mathematical Language Understanding with softmax or CoDA attention (spec coda.md §5–6) ------------------

@dataclasses.dataclass
class MLUConfig(coda.CoDAConfig, EncoderDecoderConfig):
    """The encoder–decoder's settings (models/transformer.py Seq2SeqConfig), CoDA's (``coda_*``, read only by
    transformer-seq2seq-coda) and the run's."""
    train_size: int = 200_000      # distinct training pairs (--train-size); valid 2,000 and test 5,000 stay fixed
    warmup: int = 1000             # steps of linear learning-rate warm-up, then lr·√(warmup/step)
    eval_train: int = 2000         # training pairs whose greedy accuracy is reported as "train"


class WarmupAdamW(optim.AdamW):
    """AdamW (β 0.9/0.98, ε 1e-9; spec coda.md §6) whose rate rises linearly to ``lr`` over ``warmup`` steps,
    then decays as lr·√(warmup/t) (Vaswani et al. 2017, §5.3, with the peak given directly). The rate is a
    function of the step count alone, so --resume continues the schedule exactly."""

    def __init__(self, params, lr, warmup, weight_decay=0.0):
        super().__init__(params, lr, betas=(0.9, 0.98), eps=1e-9, weight_decay=weight_decay)
        self.peak, self.warmup = lr, warmup

    def step(self):
        t = self.t + 1
        self.lr = self.peak * min(t / self.warmup, (self.warmup / t) ** 0.5) if self.warmup else self.peak
        super().step()


def _mlu_config(task, model, preset):
    """Spec coda.md §6 (project choices, the paper gives none): a 2+2-layer post-LN encoder–decoder, d 128,
    4 heads of 32, d_ff 512, dropout 0.1 (embeddings, FF outputs, attention weights), LayerNorm ε 1e-5,
    interleaved sinusoidal positions, untied embeddings; AdamW without decay, peak lr 1e-3 after 1,000
    warm-up steps, batch 128, no clipping, 5,000 steps on 200k distinct pairs, evaluated every 500.
    CoDA: β = 1/√d_k (N = G/d_k, spec §3.11). In a 300-step smoke run (seed 0) at β = 1, exactly paper Eq. 10
    (``--set coda_beta=1``), the mean gate started at 0.013 and passed 0.05 only after ~200 steps, with 0%
    validation sequence accuracy at step 200; at 1/√d_k it stayed near 0.55, with 16% (both 17% at step 300).
    "paper": the same model (T2T's "tiny" size), 100,000 steps at batch 512 on 10.8M pairs (the paper's 12M
    split 9:1; generating them takes ~1 min and ~9 GB of host memory), warm-up 4,000, evaluated every 5,000
    steps; the held-out sets stay the fixed 2,000 + 5,000 pairs."""
    mc = MLUConfig(d_model=128, n_head=4, d_head=32, d_ff=512, n_encoder_layers=2, n_decoder_layers=2, dropout=0.1,
                   attention_dropout=0.1, ln_eps=1e-5, pe_layout="interleaved", coda_beta=1 / 32 ** 0.5)
    cfg = RunConfig(task=task, model=model, preset=preset, steps=5000, batch_size=128, lr=1e-3, weight_decay=0.0,
                    grad_clip=0.0, batching="shuffled", eval_every=500, eval_batch_size=1000, model_config=mc)
    if preset == "paper":
        cfg.steps, cfg.batch_size, cfg.eval_every = 100_000, 512, 5000
        cfg.model_config = dataclasses.replace(mc, train_size=10_800_000, warmup=4000)
    return cfg


def _prefix(split, n):
    """The first n examples of a Seq2SeqSplit (generation order is random, so a fair sample)."""
    n = min(n, len(split))
    return tasks.Seq2SeqSplit(tasks.Ragged(split.inputs.tokens, split.inputs.offsets[:n + 1]),
                              tasks.Ragged(split.targets.tokens, split.targets.offsets[:n + 1]), split.lines[:n],
                              split.in_vocab, split.out_vocab)


class MLUFamily(Family):
    """MLU with the character-level encoder–decoder, softmax (``transformer-seq2seq``) or CoDA everywhere
    (``transformer-seq2seq-coda``; spec coda.md §6): cross-entropy under teacher forcing, <pad> ignored.
    The metric is sequence accuracy under greedy decoding: every character and the <eos> must be right
    (spec §5.9), on ``train`` (its first ``eval_train`` pairs), ``valid`` (model selection) and ``test``
    (reported at the selected evaluation). ``gate_mean``: CoDA's mean gate on 256 validation pairs.
    Measured on the 2-core machine next to another training job (one BLAS thread), cpu preset: softmax
    240–345 ms/step, CoDA 300–390 ms/step; an evaluation (9,000 greedy decodes) ~8 s. A run of 5,000 steps
    takes ~21–30 min (softmax) and ~26–34 min (CoDA)."""
    tasks = ("mlu",)
    models = ("transformer-seq2seq", "transformer-seq2seq-coda")
    report_final = ()
    config = staticmethod(_mlu_config)
    PAD = 0                        # <pad> in MLUTask.out_vocab: ignored by the loss and the accuracies

    def load_task(self):
        try:
            self.task = tasks.MLUTask(n_train=self.cfg.model_config.train_size)
        except ValueError as e:
            raise UsageError(str(e)) from None
        self.train_eval = _prefix(self.task.splits["train"], self.cfg.model_config.eval_train)
        return self.task

    def build_model(self):
        cls = CoDASeq2SeqTransformer if self.cfg.model == "transformer-seq2seq-coda" else Seq2SeqTransformer
        n_out = len(self.task.out_vocab)   # output class c is output token c (greedy feeds it back)
        try:
            return cls(n_out, n_out, self.cfg.model_config, n_src_tokens=len(self.task.in_vocab), seed=self.cfg.seed)
        except ValueError as e:
            raise UsageError(str(e)) from None

    def optimizer(self, params):
        return WarmupAdamW(params, self.cfg.lr, self.cfg.model_config.warmup, self.cfg.weight_decay)

    def batches(self, rng):
        return self.task.splits["train"].batches(self.cfg.batch_size, rng, self.cfg.batching)

    def _arrays(self, batch):
        """Device arrays: source ids, source mask, decoder input [<sos>, y_1..y_{T−1}] and targets."""
        src, src_lengths, tgt, _ = batch
        tgt_in = np.concatenate([np.full((len(tgt), 1), self.task.sos, tgt.dtype), tgt[:, :-1]], axis=1)
        src_mask = np.arange(src.shape[1]) < src_lengths[:, None]
        return [backend.to_device(a, self.cfg.device) for a in (src, src_mask, tgt_in, tgt)]

    def loss(self, model, batch):
        src, src_mask, tgt_in, tgt = self._arrays(batch)
        logits = model(src, tgt_in, src_mask)
        correct = ((logits.data.argmax(-1) == tgt) | (tgt == self.PAD)).all(axis=1).sum()   # teacher forcing
        return F.cross_entropy(logits, tgt, ignore_index=self.PAD), {"seq_acc": correct}, len(tgt)

    def evaluate(self, model):
        result = {}
        with no_grad(), eval_mode():
            for name, split in (("train", self.train_eval), ("valid", self.task.splits["valid"]),
                                ("test", self.task.splits["test"])):
                correct = 0
                for batch in split.eval_batches(self.cfg.eval_batch_size):
                    src, src_mask, _, tgt = self._arrays(batch)
                    pred = model.greedy(src, tgt.shape[1], self.task.sos, src_mask)[0]
                    correct = correct + ((pred == tgt) | (tgt == self.PAD)).all(axis=1).sum()
                result[name] = round(float(backend.to_numpy(correct)) / len(split), 5)
        return result

    def log_extra(self, model):
        if self.cfg.model != "transformer-seq2seq-coda":
            return {}
        src, src_mask, tgt_in, _ = self._arrays(next(_prefix(self.task.splits["valid"], 256).eval_batches(256)))
        with no_grad(), eval_mode():
            return {"gate_mean": round(coda.mean_gate(model, lambda: model(src, tgt_in, src_mask)), 4)}

    def plot_examples(self, model, texts):
        """Encoder attention and, for CoDA, tanh(E), the gate and M of every layer and head with their
        histograms, on test pairs or --example inputs ("x=85,y=-523,x*y")."""
        task, index = self.task, {c: i for i, c in enumerate(self.task.in_vocab)}
        split, examples = task.splits["test"], []
        for text in texts:
            if not text or any(c not in index for c in text):
                raise UsageError(f"--example {text!r}: use the characters {''.join(task.in_tokens)}")
            examples.append((_example_name(text), np.array([index[c] for c in text]), None))
        examples = examples or [(_sample_name("test", i, split), split.inputs[i], split.lines[i].split(":")[1])
                                for i in _plot_sample(len(split))]
        longest = max(int(s.targets.lengths.max()) for s in task.splits.values())
        pictures = []
        for name, src, target in examples:
            tokens = [task.in_vocab[i] for i in src]
            title = f"mlu / {self.cfg.model}: {''.join(tokens)}" + (f" (target {target})" if target else "")
            pictures += viz.seq2seq_pictures(model, backend.to_device(src[None], self.cfg.device), longest, task.sos,
                                             tokens, title, name, task.out_vocab)
        return pictures


FAMILIES = [ClassificationFamily, RetrievalFamily, Seq2SeqFamily, SortFamily, PairwiseSetFamily, MLUFamily]


def family_of(task):
    for fam in FAMILIES:
        if task in fam.tasks:
            return fam
    raise UsageError(f"unknown task {task!r}; valid tasks: {', '.join(t for f in FAMILIES for t in f.tasks)}")


def make_config(task, model, preset="cpu", **overrides):
    """The full configuration of a run: the preset for (task, model), then explicit overrides
    (RunConfig fields or fields of the family's model config; None means "keep the preset's")."""
    fam = family_of(task)
    if model not in fam.models:
        raise UsageError(f"unknown model {model!r} for task {task}; valid models: {', '.join(fam.models)}")
    if preset not in ("cpu", "paper"):
        raise UsageError(f"unknown preset {preset!r}; valid presets: cpu, paper")
    split = overrides.pop("split", None)
    if split and not fam.has_split:
        raise UsageError(f"task {task} has no --split")
    cfg = fam.config(task, model, preset, split or "") if fam.has_split else fam.config(task, model, preset)
    model_fields = {f.name for f in dataclasses.fields(cfg.model_config)}
    for key, value in overrides.items():
        if value is None:
            continue
        if key in model_fields:
            cfg.model_config = dataclasses.replace(cfg.model_config, **{key: value})
        elif key in _run_fields():
            setattr(cfg, key, value)
        else:
            raise UsageError(f"unknown setting {key!r}; valid: {', '.join(sorted(model_fields | set(_run_fields())))}")
    for key in ("steps", "batch_size", "lr", "eval_every", "eval_batch_size"):   # a count or a rate: > 0
        value = getattr(cfg, key)
        if value is not None and not value > 0:                                  # None: set from epochs later
            raise UsageError(f"{key} must be positive, got {value}")
    for key in ("weight_decay", "grad_clip"):                                    # 0 switches them off
        value = getattr(cfg, key)
        if value < 0:
            raise UsageError(f"{key} must be ≥ 0, got {value}")
    return cfg


def _run_fields():
    return [f.name for f in dataclasses.fields(RunConfig) if f.name != "model_config"]


def _bool(text):
    if text.lower() not in ("true", "false", "1", "0"):
        raise ValueError(text)
    return text.lower() in ("true", "1")


def _parse_value(key, text, task, model=None):
    """--set values take the type of the field they override (in the model's own config when it is known)."""
    fam = family_of(task)
    model_config = fam.config(task, model if model in fam.models else fam.models[0], "cpu").model_config
    field_types = {f.name: f.type for f in dataclasses.fields(model_config)}
    field_types.update({f.name: f.type for f in dataclasses.fields(RunConfig)})
    kind = field_types.get(key)
    if kind is None:
        raise UsageError(f"unknown setting {key!r} in --set")
    try:
        return {"int": int, "float": float, "str": str, "bool": _bool}.get(getattr(kind, "__name__", kind), str)(text)
    except ValueError:
        raise UsageError(f"--set {key}={text}: expected {kind}") from None


def _parse_settings(items, task, model, allowed=None):
    """--set KEY=VALUE strings → {key: typed value}. ``allowed``: the only keys taken (a trained run's)."""
    settings = {}
    for item in items:
        key, eq, value = item.partition("=")
        if not eq:
            raise UsageError(f"--set expects KEY=VALUE, got {item!r}")
        if key in ("task", "model", "preset"):   # they choose the settings --set changes, so they come first
            raise UsageError(f"--set {item}: use --{key} {value} instead")
        if allowed is not None and key not in allowed:
            raise UsageError(f"--set {item}: a trained run takes only {', '.join(k + '=N' for k in allowed)}")
        settings[key] = _parse_value(key, value, task, model)
    return settings


# --- the run directory: one writer, atomic files, checkpoints as .npz + JSON -------------------------------
# A run directory holds: lock (its writer's pid), checkpoint.npz, metrics.jsonl (one line per evaluation,
# appended) and, at the end, results.json. Every file but the log is replaced whole, atomically.

@contextlib.contextmanager
def locked(out_dir):
    """Hold an exclusive lock on the run directory (created if needed) while the block runs: a second
    writer gets a UsageError naming the holder's pid. ``flock`` is released by the kernel when its process
    dies, so the lock of a killed run is free and simply taken over; the pid inside is only for the message.
    The lock file is left behind: deleting it would let a waiting writer lock an orphaned inode."""
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise UsageError(f"--out {out_dir} is a file, not a run directory")
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "lock"), "a+") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            raise UsageError(f"{out_dir} is in use by another run (pid {f.read().strip() or '?'}); wait for it "
                             "to end or choose another --out") from None
        f.seek(0)
        f.truncate()
        f.write(f"{os.getpid()}\n")
        f.flush()
        yield


def write_atomic(path, write, mode="w"):
    """``write(file)`` into a temporary file beside ``path``, fsync it, rename it over ``path`` and fsync the
    directory: after a crash or a full disk ``path`` holds the old content or the new, never a mix."""
    d = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=d, prefix=".tmp-")
    umask = os.umask(0)
    os.umask(umask)
    try:
        os.fchmod(fd, 0o666 & ~umask)   # mkstemp's 0600 would hide a shared run's files from its readers
        with os.fdopen(fd, mode) as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
    dir_fd = os.open(d, os.O_RDONLY)
    try:
        os.fsync(dir_fd)              # the rename itself survives a power cut
    finally:
        os.close(dir_fd)


def to_json(obj):
    """Strict JSON (no bare NaN/Infinity, which strict readers reject): non-finite numbers become null."""
    if isinstance(obj, dict):
        return {k: to_json(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_json(v) for v in obj]
    if isinstance(obj, float) and not np.isfinite(obj):
        return None
    return obj


# checkpoint.npz, read with NumPy alone (docs/checkpoints.md): "model/NAME" and "selected/NAME" (the
# parameters at the selected evaluation, for tasks that evaluate them once at the end), "optimizer/NAME/KEY"
# (e.g. Adam's m and v) and "metadata", a JSON string. No RNG state is saved: every random stream of a run
# is a function of its seed and the step (see the module docstring).
CHECKPOINT = "checkpoint.npz"
CHECKPOINT_METADATA = ("version", "identity", "config", "step", "best", "train_time", "history", "optimizer",
                       "parameters")


def save_checkpoint(path, metadata, params, opt_state, selected=None):
    """``params``, ``selected``: {name: array} in the model's parameter order; ``opt_state``: the optimizer's
    state_dict, whose per-parameter state is stored under the parameter's name."""
    arrays = {f"model/{k}": v for k, v in params.items()}
    arrays.update({f"selected/{k}": v for k, v in (selected or {}).items()})
    arrays.update({f"optimizer/{name}/{k}": v for name, s in zip(params, opt_state["state"]) for k, v in s.items()})
    meta = dict(metadata, version=CHECKPOINT_VERSION, optimizer={"t": opt_state["t"], "lr": opt_state["lr"]},
                parameters=list(params))
    arrays["metadata"] = np.array(json.dumps(to_json(meta), allow_nan=False))
    write_atomic(path, lambda f: np.savez(f, **arrays), mode="wb")


def load_checkpoint(path):
    """The checkpoint at ``path`` as a dict: its metadata, plus "model" and "selected" ({name: array}) and
    "optimizer" (the optimizer's state_dict). Never unpickles: an old checkpoint.pkl is refused."""
    old = os.path.join(os.path.dirname(path), "checkpoint.pkl")
    if not os.path.exists(path) and os.path.exists(old):
        raise UsageError(f"{os.path.dirname(path) or '.'} holds an old checkpoint.pkl, which is not loaded because "
                         f"unpickling runs any code the file carries; if you trust it, convert it once with: "
                         f"python train.py --convert {os.path.dirname(path) or '.'}")
    try:
        with np.load(path, allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
        ckpt = json.loads(str(arrays.pop("metadata")))
    except FileNotFoundError:
        raise UsageError(f"no checkpoint at {path} to resume from") from None
    except Exception as e:   # not a zip, a truncated file, no "metadata", bad JSON: all the same to the user
        raise UsageError(f"checkpoint {path} is corrupted or unreadable ({e.__class__.__name__})") from None
    missing = [k for k in CHECKPOINT_METADATA if k not in ckpt] if isinstance(ckpt, dict) else ["all"]
    if missing or ckpt["version"] != CHECKPOINT_VERSION:
        raise UsageError(f"checkpoint {path} is not a minattn checkpoint of version {CHECKPOINT_VERSION}"
                         + (f" (it lacks {', '.join(missing)})" if missing else ""))
    part = {kind: {k.split("/", 1)[1]: v for k, v in arrays.items() if k.startswith(kind + "/")}
            for kind in ("model", "selected", "optimizer")}
    state = [{k.rpartition("/")[2]: v for k, v in part["optimizer"].items() if k.rpartition("/")[0] == name}
             for name in ckpt.pop("parameters")]
    return dict(ckpt, model=part["model"], selected=part["selected"] or None,
                optimizer=dict(ckpt["optimizer"], state=state))


def convert(out_dir):
    """Rewrite DIR/checkpoint.pkl (this project's old format) as checkpoint.npz, on explicit request only."""
    import pickle   # only here: the one place that unpickles, and only when the user asks
    path = os.path.join(out_dir, "checkpoint.pkl")
    if not os.path.exists(path):
        raise UsageError(f"{out_dir} holds no checkpoint.pkl to convert")
    print(f"warning: unpickling {path} runs any code it carries; convert only files you trust", file=sys.stderr)
    with locked(out_dir):
        try:
            with open(path, "rb") as f:
                old = pickle.load(f)
            state = old.pop("model"), old.pop("optimizer"), old["best"].pop("state", None)
        except Exception as e:
            raise UsageError(f"{path} is not a readable minattn checkpoint ({e.__class__.__name__})") from None
        # the old format kept the log only in metrics.jsonl: its lines up to the checkpoint's step
        log = os.path.join(out_dir, "metrics.jsonl")
        history = [h for h in _read_log(log) if h["step"] <= old["step"]] if os.path.exists(log) else []
        params, opt_state, selected = state
        metadata = {k: old[k] for k in ("identity", "config", "step", "best", "train_time")}
        save_checkpoint(os.path.join(out_dir, CHECKPOINT), dict(metadata, history=history), params, opt_state, selected)
    print(f"wrote {os.path.join(out_dir, CHECKPOINT)}; {path} is no longer read and may be deleted", file=sys.stderr)


def _identity(cfg):
    """What must match for a checkpoint to belong to this run (the step budget may grow), as JSON has it."""
    d = dataclasses.asdict(cfg)
    for k in ("steps", "device", "eval_every", "eval_batch_size"):
        d.pop(k)
    return json.loads(json.dumps(to_json(d)))


def _read_log(path):
    """The entries of a metrics log, skipping lines that are not JSON objects with a step (a line torn by a
    kill, an edit)."""
    entries = []
    with open(path) as f:
        for line in filter(str.strip, f):
            try:
                entry = json.loads(line)
            except ValueError:
                continue
            if isinstance(entry, dict) and isinstance(entry.get("step"), int):
                entries.append(entry)
    return entries


def _repair_log(path, history, step):
    """On --resume: make metrics.jsonl hold exactly the checkpoint's evaluations. It is only ever appended to,
    so it usually does; a kill can leave lines of evaluations after the checkpoint, or a torn last line, and
    those are dropped with a warning (a missing log is rewritten from the checkpoint)."""
    lines = [json.dumps(h, allow_nan=False) + "\n" for h in history]
    try:
        with open(path) as f:
            old = f.readlines()
    except FileNotFoundError:
        old = []
    if old == lines:
        return
    keep = next((i for i, (a, b) in enumerate(zip(old, lines)) if a != b), min(len(old), len(lines)))
    print(f"warning: {path} did not match the checkpoint of step {step}: kept {keep} lines, dropped "
          f"{len(old) - keep} (written after the checkpoint, or torn by an interruption), restored "
          f"{len(lines) - keep} from the checkpoint", file=sys.stderr)
    write_atomic(path, lambda f: f.writelines(lines))


# --- the loop ---------------------------------------------------------------------------------------------

def _better(new, old, higher_is_better):
    """Model selection: ties go to the later evaluation (spec ndr.md §6.6)."""
    if old is None:
        return True
    return new >= old if higher_is_better else new <= old


def train(cfg, out_dir, resume=False, progress=True):
    """Run (or continue) training as configured, holding the run directory's lock; returns the results dict
    written to results.json. On ``resume``, ``cfg.steps`` and ``cfg.eval_every`` None mean the run's own."""
    backend.get_xp(cfg.device)  # a missing GPU fails here, before any work
    created = not os.path.exists(out_dir)
    with locked(out_dir):
        try:
            with np.errstate(over="ignore", invalid="ignore", divide="ignore"):   # the divergence guard says it once
                return _train(cfg, out_dir, resume, progress)
        except UsageError:      # refused before anything was written: leave no empty run directory behind
            if created and os.listdir(out_dir) == ["lock"]:
                os.remove(os.path.join(out_dir, "lock"))
                os.rmdir(out_dir)
            raise


def _train(cfg, out_dir, resume, progress):
    ckpt_path, log_path = os.path.join(out_dir, CHECKPOINT), os.path.join(out_dir, "metrics.jsonl")
    if resume:
        ckpt = load_checkpoint(ckpt_path)
        cfg.steps = ckpt["config"]["steps"] if cfg.steps is None else cfg.steps
        cfg.eval_every = ckpt["config"]["eval_every"] if cfg.eval_every is None else cfg.eval_every
        if ckpt["identity"] != _identity(cfg):
            diff = sorted(k for k in _identity(cfg) if ckpt["identity"].get(k) != _identity(cfg)[k])
            raise UsageError(f"checkpoint in {out_dir} was written by a different run (differs in: {', '.join(diff)}); "
                             "nothing was overwritten")
        if cfg.steps < ckpt["step"]:
            raise UsageError(f"--steps {cfg.steps} is below step {ckpt['step']}, which {out_dir} has already reached")
    elif os.path.exists(ckpt_path) or os.path.exists(os.path.join(out_dir, "checkpoint.pkl")):
        raise UsageError(f"{out_dir} already holds a checkpoint: pass --resume to continue it, "
                         "or choose another --out")

    fam = family_of(cfg.task)(cfg)
    fam.load_task()
    model = fam.build_model().to(cfg.device)
    opt = fam.optimizer(model.parameters())
    step, train_time, history = 0, 0.0, []
    best, selected = {"metric": None, "metrics": {}, "step": None}, None   # selected: parameters, if selected_only

    if resume:
        try:
            model.load_state_dict(ckpt["model"])
            opt.load_state_dict(ckpt["optimizer"])
        except ValueError as e:
            raise UsageError(f"checkpoint {ckpt_path} does not fit the model: {e}") from None
        step, best, train_time = ckpt["step"], ckpt["best"], ckpt["train_time"]
        history, selected = ckpt["history"], ckpt["selected"]
        _repair_log(log_path, history, step)
    elif os.path.exists(log_path):
        os.remove(log_path)

    # The data stream is a pure function of the seed: replay it up to the current step.
    stream = fam.batches(np.random.default_rng([cfg.seed, 1]))
    for _ in range(step):
        next(stream)
    run_rng = backend.RNG(cfg.seed, cfg.device)

    def checkpoint():
        save_checkpoint(ckpt_path, {"identity": _identity(cfg), "config": dataclasses.asdict(cfg), "step": step,
                                    "best": best, "train_time": train_time, "history": history},
                        model.state_dict(), opt.state_dict(), selected)

    print(f"{'resuming' if step else 'training'} {cfg.task} / {cfg.model} ({cfg.preset} preset, seed {cfg.seed}) on "
          f"{cfg.device} in {out_dir}: step {step} of {cfg.steps}, batch {cfg.batch_size}, lr {cfg.lr:g}, an "
          f"evaluation every {cfg.eval_every} steps", file=sys.stderr)
    bar = tqdm(total=cfg.steps, initial=step, disable=not progress, desc=f"{cfg.task}/{cfg.model}", unit="step")
    start_step, loss_sum, norm_sum, stats, seen, n_batches = step, 0.0, 0.0, {}, 0, 0
    diverged = None
    model.train()
    while step < cfg.steps and not fam.stop_early(step, history):
        t0 = time.perf_counter()
        batch = next(stream)
        model.set_rng(run_rng.reseed(step))   # step k's masks, also after a resume; one generator per run
        loss, batch_stats, n = fam.loss(model, batch)
        opt.zero_grad()
        loss.backward()
        if cfg.grad_clip:
            norm_sum = norm_sum + optim.clip_grad_norm(model.parameters(), cfg.grad_clip)
        opt.step()
        step += 1
        # Running statistics stay on the device; they are read only when logged. The divergence guard reads
        # them there too, rather than syncing every step: a NaN or inf stays in a sum until it is read.
        loss_sum = loss_sum + loss.data
        for k, v in batch_stats.items():
            stats[k] = stats.get(k, 0) + v
        seen, n_batches = seen + n, n_batches + 1
        train_time += time.perf_counter() - t0
        bar.update(1)
        if step % cfg.eval_every == 0 or step == cfg.steps:
            loss_mean = float(backend.to_numpy(loss_sum)) / n_batches
            entry = {"step": step, "train_loss": round(loss_mean, 5)}
            entry.update({f"train_{k}": round(float(backend.to_numpy(v)) / seen, 5) for k, v in stats.items()})
            diverged = next((what for what, value in (("training loss", loss_mean),
                                                      ("gradient norm", float(backend.to_numpy(norm_sum))))
                             if not math.isfinite(value)), None)
            if not diverged:
                bar.set_postfix_str("evaluating…", refresh=True)   # or the bar looks frozen meanwhile
                model.eval()                      # with eval_mode() in the families: dropout off either way
                entry.update(fam.log_extra(model))
                entry.update(fam.evaluate(model))
                model.train()
            entry["wall_s"] = round(train_time, 1)
            selected_metric = entry.get(fam.select_split)
            if selected_metric is not None and _better(selected_metric, best["metric"], fam.metric_higher_is_better):
                best = {"metric": selected_metric, "metrics": {k: v for k, v in entry.items()}, "step": step}
                if fam.selected_only:         # the selected parameters, for evaluate_selected() at the end
                    selected = model.state_dict()
            entry = to_json(entry)
            history.append(entry)
            with open(log_path, "a") as f:    # one write per line; a kill can tear only the last one
                f.write(json.dumps(entry, allow_nan=False) + "\n")
            if diverged:                      # the last checkpoint (finite weights) stays as it is
                break
            bar.set_postfix({k: v for k, v in entry.items() if k not in ("step", "wall_s")})
            loss_sum, norm_sum, stats, seen, n_batches = 0.0, 0.0, {}, 0, 0
            checkpoint()
            bar.unpause()                     # rate and ETA count training, not evaluation and checkpoint
    bar.close()

    final = next((h for h in reversed(history) if h["train_loss"] is not None), {})   # not a diverged one
    split_names = [k for k in final if k not in ("step", "wall_s", "train_loss") and not k.startswith("train_")
                   and not k.startswith("gate")]
    metrics = {k: (final.get(k) if k in fam.report_final else best["metrics"].get(k, final.get(k)))
               for k in split_names}
    if fam.selected_only and selected is not None and not diverged:
        model.load_state_dict(selected)       # training is over and checkpointed: the model is free to reuse
        model.eval()
        metrics.update(fam.evaluate_selected(model))
    results = {
        "task": cfg.task, "model": cfg.model, "preset": cfg.preset, "seed": cfg.seed, "device": cfg.device,
        "steps": step, "wall_s": round(train_time, 2),
        "ms_per_step": round(1000 * train_time / step, 3) if step else None,
        "metrics": metrics, "final_metrics": {k: final.get(k) for k in split_names},
        "best_step": best["step"], "steps_this_invocation": step - start_step,
        "config": dataclasses.asdict(cfg),
    }
    if diverged:
        results["diverged_at"] = step
    write_atomic(os.path.join(out_dir, "results.json"), lambda f: json.dump(to_json(results), f, indent=2,
                                                                             allow_nan=False))
    if diverged:
        last = step - n_batches
        raise Diverged(f"the {diverged} is not finite at step {step}, so training stopped (a lower --lr may help); "
                       f"{log_path} and results.json are written, " +
                       (f"the checkpoint is that of step {last}" if last else "no checkpoint was written"))
    return results


REPORT_FIELDS = ("task", "model", "preset", "seed", "steps", "metrics", "best_step", "wall_s", "ms_per_step", "config")


def _finished_run(d):
    """(results, learning curve) of the finished run in d; a UsageError says why d is not one."""
    try:
        with open(os.path.join(d, "results.json")) as f:
            r = json.load(f)
    except FileNotFoundError:
        raise UsageError(f"{d} has no results.json (not a run directory, or the run is not finished)") from None
    except (OSError, ValueError) as e:
        raise UsageError(f"{d} does not hold a readable run ({e.__class__.__name__}: {e})") from None
    missing = set(REPORT_FIELDS) - set(r if isinstance(r, dict) else ())
    if missing:
        raise UsageError(f"{d}: results.json lacks {', '.join(sorted(missing))}")
    try:
        log = _read_log(os.path.join(d, "metrics.jsonl"))
    except OSError:
        log = []
    return r, log


def report(paths):
    """Markdown table of finished runs (their results.json) and each run's learning curve. Directories that
    hold no finished run are skipped with a warning; a run is counted once, however often it is listed or
    copied: runs with one configuration (seed included; device aside) are one run, as training is deterministic."""
    rows, curves, groups, seen = [], [], {}, {}
    for d in paths:
        try:
            r, log = _finished_run(d)
        except UsageError as e:
            print(f"warning: skipped: {e}", file=sys.stderr)
            continue
        identity = json.dumps({k: v for k, v in r["config"].items() if k != "device"}, sort_keys=True)
        if identity in seen:
            print(f"warning: skipped {d}: the same run as {seen[identity]}", file=sys.stderr)
            continue
        seen[identity] = d
        m = ", ".join(f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}" for k, v in r["metrics"].items())
        mc = r["config"].get("model_config", {})   # the data options that tell runs of one task apart
        data = ", ".join(f"{k} {mc[k]}" for k in ("split", "train_size", "searches", "retrievals") if mc.get(k))
        task = f"{r['task']} ({data}{', ood' if mc.get('ood') else ''})" if data else r["task"]
        rows.append(f"| {task} | {r['model']} | {r['preset']} | {r['seed']} | {r['steps']} | {m} | "
                    f"{r['best_step']} | {r['wall_s'] / 60:.1f} min | {r['ms_per_step'] or 0:.0f} | {d} |")
        # runs that differ only in their seed (and device) are seeds of one experiment
        same = json.dumps({k: v for k, v in r["config"].items() if k not in ("seed", "device")}, sort_keys=True)
        groups.setdefault(same, (task, r, []))[2].append(r)
        if not log:
            print(f"warning: {d} has no readable metrics.jsonl: no learning curve", file=sys.stderr)
            continue
        keys = [k for k in log[-1] if k not in ("step", "wall_s")]
        curves.append(f"\n{r['task']} / {r['model']} (seed {r['seed']}, {d}):\n\n| step | " + " | ".join(keys) +
                      " |\n|" + "---|" * (len(keys) + 1) + "\n" +
                      "\n".join(f"| {e['step']} | " + " | ".join(str(e.get(k, "")) for k in keys) + " |" for e in log))
    if not rows:
        raise UsageError("none of the directories holds a finished run")
    print("| task | model | preset | seed | steps | metrics | best step | train time | ms/step | run directory |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    print("\n".join(rows))
    seeded = [(task, r, runs) for task, r, runs in groups.values() if len(runs) > 1]
    if seeded:   # the papers report mean ± std over seeds; std here is the sample std (n − 1)
        print("\nOver seeds (mean ± sample std):\n\n| task | model | preset | steps | seeds | metrics |\n"
              "|---|---|---|---|---|---|")
        for task, r, runs in seeded:
            values = {k: [x["metrics"].get(k) for x in runs] for k in r["metrics"]}
            m = ", ".join(f"{k} {np.mean(v):.3f} ± {np.std(v, ddof=1):.3f}" for k, v in values.items()
                          if all(isinstance(x, float) for x in v))
            print(f"| {task} | {r['model']} | {r['preset']} | {r['steps']} | "
                  f"{', '.join(str(x['seed']) for x in runs)} | {m} |")
    print("\n".join(curves))


# what `--set` may change in a trained run (--evaluate, --plot, --analyze): evaluation, never the weights
EVAL_SETTINGS = ("n_steps_eval", "eval_batch_size")


def _load_run(out_dir, device, settings=()):
    """The family (its task loaded), the trained model of the checkpoint in out_dir on ``device``, and the
    checkpoint's step. ``settings``: KEY=VALUE strings of EVAL_SETTINGS that override the saved config."""
    if not os.path.isdir(out_dir):
        raise UsageError(f"no run directory {out_dir}")
    path = os.path.join(out_dir, CHECKPOINT)
    if not os.path.exists(path) and not os.path.exists(os.path.join(out_dir, "checkpoint.pkl")):
        raise UsageError(f"{out_dir} holds no {CHECKPOINT} (is it a run directory? train there first)")
    ckpt = load_checkpoint(path)
    saved = dict(ckpt["config"], device=device)
    saved = {**saved.pop("model_config"), **saved}
    saved.update(_parse_settings(settings, saved["task"], saved["model"], allowed=EVAL_SETTINGS))
    cfg = make_config(saved.pop("task"), saved.pop("model"), saved.pop("preset"), **saved)
    fam = family_of(cfg.task)(cfg)
    fam.load_task()
    model = fam.build_model()
    try:
        model.load_state_dict(ckpt["model"])
    except ValueError as e:
        raise UsageError(f"checkpoint {path} does not fit the model: {e}") from None
    return fam, model.to(device).eval(), ckpt["step"]   # eval(): e.g. n_steps_eval applies, as in evaluation


def analyze(out_dir, device="cpu", settings=()):
    """The family's analysis of the checkpoint in out_dir (e.g. the CRT value-score table, paper Fig. 5)."""
    fam, model, _ = _load_run(out_dir, device, settings)
    return fam.analyze(model)


def evaluate_checkpoint(out_dir, device="cpu", settings=()):
    """Every evaluation split's metric for the weights in out_dir's checkpoint: those of its last evaluation,
    which need not be the selected step of results.json. E.g. ``settings=["n_steps_eval=16"]`` applies a
    shared-layer encoder 16 times at evaluation instead of the number it was trained with."""
    fam, model, step = _load_run(out_dir, device, settings)
    return {"step": step, "settings": list(settings), "metrics": fam.evaluate(model)}


PLOT_EXAMPLES = 3   # test examples --plot shows, drawn with a fixed seed: the same ones for every run of a task


def _plot_sample(n):
    return np.sort(np.random.default_rng(0).choice(n, min(PLOT_EXAMPLES, n), replace=False))


def _sample_name(split_name, i, split):
    """test00042: zero-padded to the split's size, so the PNGs of one task sort in sample order."""
    return f"{split_name}{i:0{len(str(len(split) - 1))}d}"


def _example_name(text):
    """A file name of its own for each --example input: the text made file-safe, plus a hash of the text
    when that changed it (so "x+y" and "x*y" do not share a file)."""
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", text.strip())[:40]
    return f"example-{safe}" + (f"-{zlib.crc32(text.encode()):08x}" if safe != text else "")


def plot(out_dir, device="cpu", texts=(), task=None, model=None, settings=()):
    """Pictures of what the checkpoint in out_dir learned (minattn/viz.py) as PNGs in out_dir/plots, or as
    terminal heatmaps without matplotlib; returns the paths written. ``texts``: inputs to show instead of
    the test examples; ``task``/``model``, when given, must be the checkpoint's."""
    fam, net, _ = _load_run(out_dir, device, settings)
    for flag, given, saved in (("--task", task, fam.cfg.task), ("--model", model, fam.cfg.model)):
        if given is not None and given != saved:
            raise UsageError(f"{out_dir} holds a {fam.cfg.task} / {fam.cfg.model} checkpoint, not {flag} {given}")
    paths = viz.write_pictures(fam.plot_examples(net, list(texts)), os.path.join(out_dir, "plots"))
    for path in paths:
        print(f"wrote {path}")
    return paths


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    # --task and --model default to ctl and ndr for training; None tells --plot that none was given
    ap.add_argument("--task", help="one of: " + ", ".join(t for f in FAMILIES for t in f.tasks) + " (default ctl)")
    models = dict.fromkeys(m for f in FAMILIES for m in f.models)  # sort and MLU share transformer-seq2seq
    ap.add_argument("--model", help="one of: " + ", ".join(models) + " (default ndr)")
    ap.add_argument("--split", help="scan: the split, e.g. filler0, length, length_cutoff_26 (see tasks.SCAN_SPLITS)")
    ap.add_argument("--device", default="cpu", help="cpu or gpu (needs CuPy: pip install cupy-cuda12x)")
    ap.add_argument("--preset", default="cpu", help="cpu (default; ~30 min on 2 cores) or paper (the paper's "
                    "hyperparameters, for a GPU)")
    ap.add_argument("--steps", type=int, help="optimizer steps (default: the preset's)")
    ap.add_argument("--batch-size", type=int, help="training batch size (default: the preset's)")
    ap.add_argument("--lr", type=float, help="learning rate (default: the preset's)")
    ap.add_argument("--seed", type=int, default=0, help="seed of initialisation, data order and dropout")
    ap.add_argument("--eval-every", type=int, help="evaluate and checkpoint every N steps")
    ap.add_argument("--out", help="run directory (default: runs/TASK-MODEL-PRESET-sSEED, the task tagged with --split, --train-size, --searches, --retrievals and --ood when given)")
    ap.add_argument("--resume", nargs="?", const=True, default=False, metavar="DIR",
                    help="continue the checkpoint in --out (or DIR) exactly; without --task/--model the run's "
                         "task, model and settings come from the checkpoint (add --steps N to extend it)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="override any setting, e.g. --set d_model=64 --set n_steps=10 --set batching=random")
    ap.add_argument("--no-progress", action="store_true", help="no progress bar")
    ap.add_argument("--report", nargs="+", metavar="DIR",
                    help="print a markdown table of finished runs (and mean ± std over the seeds of one experiment) "
                         "and exit")
    ap.add_argument("--convert", metavar="DIR", help="rewrite DIR/checkpoint.pkl of an older minattn as "
                    "checkpoint.npz and exit (unpickling runs code from the file: only for files you trust)")
    ap.add_argument("--analyze", action="store_true", help="print the analysis of the checkpoint in --out and exit "
                    "(retrieval: the value-score table of paper Fig. 5)")
    ap.add_argument("--evaluate", action="store_true", help="evaluate the checkpoint in --out on every split and "
                    "exit; --set n_steps_eval=N applies a shared-layer encoder N times (also with --plot, --analyze)")
    ap.add_argument("--plot", action="store_true", help="draw what the checkpoint in --out learned (attention maps, "
                    "gates, value scores, relations) into DIR/plots and exit; PNGs need matplotlib (pip install -e "
                    "'.[plot]'), without it the maps are printed as text")
    ap.add_argument("--example", action="append", default=[], metavar="TEXT",
                    help="--plot this input instead of a fixed sample of test examples (repeatable): the task's text, "
                    "e.g. ctl '101 d a b', lookup '100 t3 t1 .', scan 'jump twice'; object indices for sort, "
                    "pairwise, set")
    ap.add_argument("--train-size", type=int, help="sort, pairwise, set: training samples drawn from the train "
                    "pool (default: sort 500, pairwise 2015, set 2000)")
    ap.add_argument("--searches", type=int, help="retrieval: ground-truth searches S (default 2)")
    ap.add_argument("--retrievals", type=int, help="retrieval: ground-truth retrievals R (default 4)")
    ap.add_argument("--ood", action="store_true", help="retrieval: train on 80%% of the combinations of retrieval "
                    "choices; ood_l1 is then out of distribution")
    return ap.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    out = None
    try:
        if isinstance(args.resume, str):  # --resume DIR: the run directory, as --out DIR
            if args.out and args.out != args.resume:
                raise UsageError(f"--resume {args.resume} and --out {args.out} name different run directories")
            args.out, args.resume = args.resume, True
        if args.report:
            report(args.report)
            return 0
        if args.convert:
            convert(args.convert)
            return 0
        inspect = next((flag for flag in ("analyze", "evaluate", "plot") if getattr(args, flag)), None)
        if inspect and not args.out:
            raise UsageError(f"--{inspect} needs --out DIR (or --resume DIR), a run directory with a checkpoint")
        if args.analyze:
            print(analyze(args.out, args.device, args.set))
            return 0
        if args.evaluate:
            print(json.dumps(evaluate_checkpoint(args.out, args.device, args.set)))
            return 0
        if args.plot:
            plot(args.out, args.device, args.example, args.task, args.model, args.set)
            return 0
        if args.example:
            raise UsageError("--example goes with --plot")
        saved = {}
        if args.resume and args.out and args.task is None and args.model is None:
            # `--resume --out DIR` alone continues the run saved there: task, model, preset and every
            # setting come from its checkpoint; flags given now (e.g. --steps) still apply on top.
            saved = dict(load_checkpoint(os.path.join(args.out, CHECKPOINT))["config"])
            args.task, args.model, args.preset = saved.pop("task"), saved.pop("model"), saved.pop("preset")
            saved = {**saved.pop("model_config"), **saved}
            saved.pop("device")
        args.task, args.model = args.task or "ctl", args.model or "ndr"
        family_of(args.task)
        if args.device not in ("cpu", "gpu"):
            raise UsageError(f"unknown device {args.device!r}; valid devices: cpu, gpu")
        overrides = _parse_settings(args.set, args.task, args.model)
        flags = dict(seed=args.seed, device=args.device, steps=args.steps, batch_size=args.batch_size, lr=args.lr,
                     eval_every=args.eval_every, searches=args.searches, retrievals=args.retrievals,
                     ood=args.ood or None, split=args.split, train_size=args.train_size)
        defaults = parse_args([])
        for key, value in overrides.items():   # --set lr=… is the same as --lr …; both at once must agree
            given = flags.get(key)
            if given is not None and given != getattr(defaults, key, None) and given != value:
                raise UsageError(f"--set {key}={value} contradicts --{key.replace('_', '-')} {given}")
            flags[key] = value
        for key, value in saved.items():       # what was not given now keeps the checkpoint's value
            if key not in overrides and flags.get(key) in (None, getattr(defaults, key, None)):
                flags[key] = value
        args.seed = flags["seed"]
        cfg = make_config(args.task, args.model, args.preset, **flags)
        if args.resume:   # the run's own step budget and evaluation interval (train() reads them) unless given
            cfg.steps, cfg.eval_every = flags["steps"], flags["eval_every"]
        # the data options are part of the default name, so runs at different sizes or splits don't collide
        task_name = "-".join([args.task] + [f"{tag}{value}" for tag, value in (
            ("", args.split), ("n", args.train_size), ("S", args.searches), ("R", args.retrievals)) if value]
            + ["ood"] * bool(args.ood))
        out = args.out or os.path.join("runs", f"{task_name}-{args.model}-{args.preset}-s{args.seed}")
        results = train(cfg, out, resume=args.resume, progress=not args.no_progress)
    except (UsageError, backend.DeviceError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except OSError as e:      # a full disk, a read-only directory: the system's one line, not a traceback
        print(f"error: {e.strerror or e}" + (f": {e.filename}" if e.filename else ""), file=sys.stderr)
        return 2
    except Diverged as e:
        print(f"error: {e}", file=sys.stderr)
        return 3
    except KeyboardInterrupt:
        saved = out and os.path.exists(os.path.join(out, CHECKPOINT))
        print("interrupted: " + ("the last checkpoint is intact; continue with --resume" if saved else
                                 "before the first checkpoint, so there is nothing to resume"), file=sys.stderr)
        return 130
    print(summary(results, out))
    return 0


def summary(results, out):
    """The end of a run for a reader: what was selected, and where everything is."""
    metrics = ", ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in results["metrics"].items())
    return (f"done: {results['task']} / {results['model']}, {results['steps']} steps in {results['wall_s']:.0f} s "
            f"({results['ms_per_step'] or 0:.0f} ms/step); {metrics or 'no metrics'} "
            f"(selected at step {results['best_step']})\n"
            f"results: {os.path.join(out, 'results.json')}, learning curve: {os.path.join(out, 'metrics.jsonl')}, "
            f"checkpoint: {os.path.join(out, CHECKPOINT)}\n"
            f"pictures: python train.py --plot --out {out}")


if __name__ == "__main__":
    backend.keep_freed_memory()  # ~10% faster steps here; see its docstring
    try:
        sys.exit(main())
    except BrokenPipeError:   # `train.py --report runs/* | head`: the reader left; not an error of ours
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(0)
