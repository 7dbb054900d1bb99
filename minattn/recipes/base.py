"""The recipe interface: what train.py's loop asks of every kind of experiment.

A recipe is one paper's (or one kind of task's) way to train: how it builds its model, draws batches,
computes the loss, evaluates and selects, and draws pictures. train.py runs the same loop for all of
them; ``minattn/recipes/__init__.py`` lists them in one table (``RECIPES``). A recipe is a subclass of
``Recipe`` with these class attributes and hooks:

    tasks, models                  the --task and --model names it trains
    config(task, model, preset)    the preset's RunConfig (a classmethod/staticmethod; before --set)
    load_task()                    generate (or load) the data; keep it on self
    build_model()                  the network (a minattn.nn.Module)
    batches(rng)                   an endless stream of host-side training batches, a pure function of rng
    loss(model, batch)             (loss Tensor, {name: device scalar summed over the batch}, batch size)
    evaluate(model)                {metric name: number} of every split, under no_grad()/eval_mode()
    evaluate_selected(model)       metrics computed once, at the end, with the selected parameters
    log_extra(model)               extra numbers for the metrics log (e.g. a mean gate)
    optimizer(params)              default: AdamW at the run's constant lr and weight decay
    stop_early(step, history)      default: never (early stopping)
    analyze(model)                 text about a trained model (train.py --analyze)
    plot_examples(model, texts)    viz pictures of a trained model (train.py --plot)

and the selection attributes below (which split selects the reported evaluation, which way is better,
which splits are reported at the end instead). Only the first six hooks have no default.
"""
import dataclasses
import re
import zlib

import numpy as np

from .. import backend, optim
from ..errors import UsageError  # noqa: F401  (re-exported: recipes raise it)


@dataclasses.dataclass
class RunConfig:
    task: str = "ctl"
    model: str = "ndr"
    preset: str = "cpu"
    device: str = "cpu"
    seed: int = 0
    steps: int = 3000              # optimizer steps
    batch_size: int = 128
    lr: float = 3e-4               # constant, no warm-up or decay (docs/ndr.md §6)
    weight_decay: float = 0.01     # AdamW, on all parameters (docs/ndr.md §6)
    grad_clip: float = 5.0         # global L2 norm (0: no clipping)
    batching: str = "bucketed"     # "bucketed" (length-sorted batches), "random" (with replacement),
                                   # "balanced" / "stratified" (depths drawn uniformly per batch / per
                                   # sample) or, for seq2seq tasks, "shuffled" (a new permutation each epoch)
    eval_every: int = 500
    eval_batch_size: int = 1024
    model_config: object = None    # the recipe's model dataclass (e.g. EncoderConfig)


class Recipe:
    """The interface train() relies on (see the module docstring)."""
    tasks = ()                       # task names this recipe trains
    models = ()                      # model names it builds
    select_split = "valid"           # the metric that selects the reported evaluation (None: the last one)
    report_final = ("iid",)          # metrics reported at the end of training rather than at selection
    selected_only = ()               # metrics computed once, at the end, by evaluate_selected()
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

    def to_device(self, arrays):
        """Host arrays → the run's device."""
        return [backend.to_device(a, self.cfg.device) for a in arrays]


# --- what --plot shows: the same few test examples for every run of a task, files named after them --------

PLOT_EXAMPLES = 3   # test examples --plot shows, drawn with a fixed seed: the same ones for every run of a task


def plot_sample(n):
    return np.sort(np.random.default_rng(0).choice(n, min(PLOT_EXAMPLES, n), replace=False))


def sample_name(split_name, i, split):
    """test00042: zero-padded to the split's size, so the PNGs of one task sort in sample order."""
    return f"{split_name}{i:0{len(str(len(split) - 1))}d}"


def example_name(text):
    """A file name of its own for each --example input: the text made file-safe, plus a hash of the text
    when that changed it (so "x+y" and "x*y" do not share a file)."""
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", text.strip())[:40]
    return f"example-{safe}" + (f"-{zlib.crc32(text.encode()):08x}" if safe != text else "")
