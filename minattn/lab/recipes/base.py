"""The recipe interface: what train.py's loop asks of every kind of experiment.

A recipe is one paper's way to train: its presets, how it builds its model, draws batches, computes
the loss, evaluates and selects, and draws pictures. train.py runs the same loop for all of them;
``minattn/lab/recipes/__init__.py`` lists them in one table (``RECIPES``). A recipe is a subclass of
``Recipe`` with its tables (the class attributes of ``Recipe``: names, presets, config classes, the
selection rule) and these hooks:

    load_task()             generate (or load) the data; keep it on self (``task``: its splits)
    build_model()           the network (a minattn.nn.Module)
    batches(rng)            endless host-side training batches, a pure function of rng (for
                            --resume); default: the train split's, by ``batching``
    loss(model, batch)      (loss Tensor, {name: device scalar summed over the batch}, batch size)
    evaluate(model)         {metric: number} under no_grad()/eval_mode(): what results.json reports
    evaluate_selected(m)    the metrics of ``selection.once``, computed once at the end with the
                            selected parameters (checkpointed): for metrics too slow for every
                            evaluation
    log_extra(model)        numbers for the metrics log that are not metrics (e.g. a mean gate)
    analyze(model)          text about a trained model (train.py --analyze)
    plot_examples(m, texts) viz pictures (train.py --plot) of a fixed sample of test examples or of
                            the inputs ``texts`` (--example TEXT; ``plot_inputs``)

Only load_task, build_model, loss and evaluate have no default. A hook may raise ValueError for a
bad user value (an unknown --set choice, a train size larger than the pool): train.py turns it into
a one-line UsageError.

A run's configuration (``RunConfig``) has three parts that do one thing each: the run's schedule and
optimizer (RunConfig's own fields), the task options (``options``, the recipe's ``Options``: the
data, and the schedule a task counts in, ``EpochSchedule`` or ``WarmupSchedule``) and the model
(``model_config``: the model and nothing else). A preset row names fields of all three;
``Recipe.config`` sorts them by name. The schedule is resolved (``schedule``) before the recipe is
built; a recipe never writes its config.
"""
import dataclasses
import re
import zlib

import numpy as np

from minattn import backend, optim

from ..errors import UsageError  # (re-exported: recipes raise it)


@dataclasses.dataclass
class RunConfig:
    task: str = "ctl"
    model: str = "ndr"
    preset: str = "cpu"
    device: str = "cpu"
    seed: int = 0
    steps: int = 3000              # optimizer steps (None: counted in epochs, ``EpochSchedule``)
    batch_size: int = 128
    lr: float = 3e-4               # AdamW's rate (constant unless the options have a warm-up)
    weight_decay: float = 0.01     # AdamW, on all parameters (docs/ndr.md §6)
    grad_clip: float = 5.0         # global L2 norm (0: no clipping)
    # "bucketed" (length-sorted batches), "random" (with replacement), "balanced" / "stratified"
    # (depths uniform per batch / per sample) or, for seq2seq tasks, "shuffled" (anew each epoch)
    batching: str = "bucketed"
    eval_every: int = 500          # (None: counted in epochs, see ``EpochSchedule``)
    eval_batch_size: int = 1024
    model_config: object = None    # the model's dataclass (e.g. EncoderConfig)
    options: object = None         # the recipe's task options (its ``Options``), or None


@dataclasses.dataclass
class EpochSchedule:
    """Task options of a recipe that trains in Keras-style epochs over a training set of
    ``train_size`` samples: unless --steps / --eval-every are given, the step budget is ``epochs``
    epochs and an evaluation comes every ``eval_epochs`` epochs (``schedule`` resolves both before
    the recipe is built); training stops after ``patience`` epochs (0: never) without a better
    selection metric."""
    train_size: int = 0
    epochs: int = 0
    eval_epochs: int = 1
    patience: int = 0


def schedule(cfg):
    """``cfg`` with its step budget and evaluation interval counted (a copy: the preset keeps its
    Nones). Epoch counts apply to what is None; everything else is the configuration's own."""
    if isinstance(cfg.options, EpochSchedule):
        per_epoch = steps_per_epoch(cfg)
        return dataclasses.replace(
            cfg, steps=cfg.options.epochs * per_epoch if cfg.steps is None else cfg.steps,
            eval_every=cfg.options.eval_epochs * per_epoch if cfg.eval_every is None else cfg.eval_every)
    return cfg


def steps_per_epoch(cfg):
    """Batches of one epoch over the training set (the last one partial, as Keras' fit)."""
    return -(-cfg.options.train_size // cfg.batch_size)


def stop_early(cfg, selection, step, history):
    """Early stopping (``EpochSchedule.patience``), as Keras' EarlyStopping: True right after an
    evaluation, once ``patience`` epochs have passed since the selection metric last strictly
    improved. Asked before every step with the evaluations logged so far (restored on --resume, so a
    resumed run stops where a straight one does)."""
    if not isinstance(cfg.options, EpochSchedule) or not cfg.options.patience:
        return False
    if not history or step % cfg.eval_every:
        return False
    sign = 1 if selection.higher else -1
    first_best = max(history, key=lambda e: (sign * e[selection.metric], -e["step"]))
    return step - first_best["step"] >= cfg.options.patience * steps_per_epoch(cfg)


@dataclasses.dataclass
class WarmupSchedule:
    """Task options of a recipe that trains with the Transformer's schedule (``WarmupAdamW``)."""
    warmup: int = 1000             # steps of linear learning-rate warm-up, then lr·√(warmup/step)


class WarmupAdamW(optim.AdamW):
    """AdamW (β 0.9/0.98, ε 1e-9; docs/coda.md §6) whose rate rises linearly to ``lr`` over
    ``warmup`` steps, then decays as lr·√(warmup/t) (Vaswani et al. 2017, §5.3, with the peak given
    directly). The rate is a function of the step count alone: --resume continues it exactly."""

    def __init__(self, params, lr, warmup, weight_decay=0.0):
        super().__init__(params, lr, betas=(0.9, 0.98), eps=1e-9, weight_decay=weight_decay)
        self.peak, self.warmup = lr, warmup

    def step(self):
        t = self.t + 1
        self.lr = self.peak * min(t / self.warmup, (self.warmup / t) ** 0.5) if self.warmup else self.peak
        super().step()


def optimizer(cfg, params):
    """AdamW at the run's rate and weight decay, constant or warmed up (``WarmupSchedule``)."""
    if isinstance(cfg.options, WarmupSchedule):
        return WarmupAdamW(params, cfg.lr, cfg.options.warmup, cfg.weight_decay)
    return optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)


@dataclasses.dataclass(frozen=True)
class Selection:
    """The model-selection rule of a task, one value: the logged ``metric`` that selects the
    reported evaluation (None: the last evaluation), whether ``higher`` is better (ties go to the
    later evaluation), the metrics reported at the ``final`` evaluation instead of the selected one,
    and those computed ``once``, at the end, with the selected parameters
    (``evaluate_selected``)."""
    metric: str = "valid"
    higher: bool = True
    final: tuple = ()
    once: tuple = ()


def preset_row(recipe, task, model, preset):
    """The preset of (task, model) as one dict of fields by name: the paper's row of
    ``recipe.PAPER`` (a task may share another's rows, ``SAME_ROWS``; a model without a row of its
    own takes ``ROW_OF_ANY_MODEL``'s), and for "cpu" the overrides of ``recipe.CPU`` in this order:
    "*" (every run), the task, the model, (task, model). A missing row: a UsageError naming rows."""
    task = recipe.SAME_ROWS.get(task, task)
    paper, fallback = recipe.PAPER, recipe.ROW_OF_ANY_MODEL
    row = paper.get((task, model), paper.get((task, fallback)))
    if row is None:
        valid = ", ".join(m for t, m in paper if t == task)
        raise UsageError(f"no preset for {task} / {model}; " + (f"models with one: "
                                                                f"{valid}" if valid else
                         f"tasks with one: {', '.join(dict.fromkeys(t for t, _ in paper))}"))
    row = dict(row)
    if preset == "cpu":
        for key in ("*", task, model, (task, model)):
            row.update(recipe.CPU.get(key, {}))
    return row


def fields(cls):
    return [f.name for f in dataclasses.fields(cls)] if cls is not None else []


def field_types(recipe, model):
    """{setting: its type} of a run of ``recipe`` with ``model``: the run's fields, the task
    options' and the model's, from their classes (no preset is built)."""
    classes = [RunConfig, recipe.Options, recipe.model_config_class(model)]
    return {f.name: f.type for cls in classes if cls is not None for f in dataclasses.fields(cls)
            if f.name not in ("model_config", "options")}


class Recipe:
    """The interface train() relies on (see the module docstring)."""
    tasks = ()                       # the --task names this recipe trains
    models = {}                      # --model name → its registry row (models/*.py)
    PAPER, CPU = {}, {}              # presets: the paper's row per (task, model), "cpu"'s overrides
    SAME_ROWS = {}                   # task → the task whose preset rows it uses
    ROW_OF_ANY_MODEL = None          # the model whose rows a model without its own uses
    ModelConfig = None               # the model config class (per model: ``model_config_class``)
    Options = None                   # the task options class, or None
    selection = Selection()          # the model-selection rule (a property when per run)

    def __init__(self, cfg):
        self.cfg = cfg

    # --- configuration: class methods, so train.py resolves a run before it builds the recipe -----

    @classmethod
    def model_config_class(cls, model):
        return cls.ModelConfig

    @classmethod
    def derive(cls, row, task, model):
        """Fields a preset computes from the others (SCAN's steps from its split): none here."""
        return row

    @classmethod
    def check_names(cls, task, model, preset):
        """A model or preset this recipe does not have is a UsageError naming the valid ones."""
        if model not in cls.models:
            raise UsageError(f"unknown model {model!r} for task {task}; valid models: "
                             f"{', '.join(cls.models)}")
        if preset not in ("cpu", "paper"):
            raise UsageError(f"unknown preset {preset!r}; valid presets: cpu, paper")

    @classmethod
    def config(cls, task, model, preset, **options):
        """The RunConfig of a preset (before command-line overrides other than the task ``options``,
        which choose the data a preset may count in)."""
        cls.check_names(task, model, preset)
        row = preset_row(cls, task, model, preset)
        row = cls.derive({**row, **options}, task, model)
        parts = {"run": {}, "model": {}, "options": {}}
        model_fields, option_fields = set(fields(cls.model_config_class(model))), set(fields(cls.Options))
        for key, value in row.items():
            part = "model" if key in model_fields else "options" if key in option_fields else "run"
            parts[part][key] = value
        return RunConfig(task=task, model=model, preset=preset, **parts["run"],
                         model_config=cls.model_config_class(model)(**parts["model"]),
                         options=cls.Options(**parts["options"]) if cls.Options else None)

    # --- the run ----------------------------------------------------------------------------------

    def load_task(self):
        raise NotImplementedError

    def build_model(self):
        raise NotImplementedError

    def batches(self, rng):
        return self.task.splits["train"].batches(self.cfg.batch_size, rng, self.cfg.batching)

    def loss(self, model, batch):
        raise NotImplementedError

    def evaluate(self, model):
        raise NotImplementedError

    def evaluate_selected(self, model):
        return {}

    def log_extra(self, model):
        return {}

    def analyze(self, model):
        raise UsageError(f"no analysis for task {self.cfg.task}")

    def plot_examples(self, model, texts):
        raise UsageError(f"no pictures for task {self.cfg.task}")

    def plot_inputs(self, texts, parse, sample, split_name="test"):
        """(file name, input, target or None) of each --example text (``parse``: text → input) or,
        without texts, of PLOT_EXAMPLES samples of the split drawn with a fixed seed, the same for
        every run of a task (``sample(split, i)``: the i-th sample's (input, target))."""
        if texts:
            return [(example_name(text), parse(text), None) for text in texts]
        split = self.task.splits[split_name]
        n = len(split)
        chosen = np.sort(np.random.default_rng(0).choice(n, min(PLOT_EXAMPLES, n), replace=False))
        return [(sample_name(split_name, i, split), *sample(split, i)) for i in chosen]

    def plot_title(self, text, target=None):
        target = f" (target {target})" if target else ""
        return f"{self.cfg.task} / {self.cfg.model}: {text}{target}"

    def to_device(self, arrays):
        """Host arrays → the run's device."""
        return [backend.to_device(a, self.cfg.device) for a in arrays]


# --- shared bodies: counting correct predictions, --example parsing, --plot's file names ---------

def fraction(count, n):
    """A device count over n, as a rounded host number (one sync per metric)."""
    return round(float(backend.to_numpy(count)) / n, 5)


def parse_tokens(text, vocab, split=str.split):
    """--example TEXT → token ids in ``vocab`` (``split`` cuts the text: words, or characters); a
    ValueError names the unknown tokens and the valid ones."""
    index = {t: i for i, t in enumerate(vocab)}
    tokens = split(text)
    unknown = [t for t in tokens if t not in index]
    if unknown or not tokens:
        valid = " ".join(t for t in vocab if not t.startswith("<"))
        raise ValueError(f"--example {text!r}: "
                         f"{'unknown ' + ' '.join(unknown) if unknown else 'empty'}; "
                         f"input tokens: {valid}")
    return np.array([index[t] for t in tokens])


PLOT_EXAMPLES = 3   # test examples --plot shows (``Recipe.plot_inputs``)


def sample_name(split_name, i, split):
    """test00042: zero-padded to the split's size, so the PNGs of one task sort in sample order."""
    return f"{split_name}{i:0{len(str(len(split) - 1))}d}"


def example_name(text):
    """A file name of its own for each --example input: the text made file-safe, plus a hash of the
    text when that changed it (so "x+y" and "x*y" do not share a file)."""
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", text.strip())[:40]
    return f"example-{safe}" + (f"-{zlib.crc32(text.encode()):08x}" if safe != text else "")
