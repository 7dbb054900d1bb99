"""A run's settings by name (the recipes say what a setting is): what ``--set`` may change
(the fields of the run's config, of the task options and of the model's own), what a run refuses,
and a checkpoint's configuration checked against them before ``--resume`` or ``--evaluate`` use it.
"""
import contextlib
import dataclasses
import json
import math
import os

from minattn.engine import is_plain
from minattn.fast import kernels

from .errors import UsageError
from .recipes import RECIPES, recipe_for
from .recipes.base import field_types, fields
from .rundir import CHECKPOINT, _int, _number, corrupted, load_checkpoint, settings, to_json


@contextlib.contextmanager
def user_values():
    """A ValueError (a bad user value, found where it is used: a hook, a model, the data) becomes a
    UsageError, one line for the user, here and only here."""
    try:
        yield
    except ValueError as e:
        raise UsageError(str(e)) from None


# task options with a flag of their own
TASK_FLAGS = ("split", "train_size", "searches", "retrievals", "ood")
# settings that count applications of a layer or layers: bounded, so that no run goes on forever
LOOPS = ("n_steps", "n_steps_eval", "n_layers", "n_encoder_layers", "n_decoder_layers",
         "n_abstractor_layers")
MAX_LOOPS = 10_000
# what a run refuses: (the settings, None for all; the test; what they must be). None (counted in
# epochs) passes; NaN passes every comparison, so it is refused first
RULES = (
    (None, lambda v: not isinstance(v, float) or math.isfinite(v), "a finite number"),
    (("steps", "batch_size", "lr", "eval_every", "eval_batch_size"), lambda v: v > 0, "positive"),
    (("weight_decay", "grad_clip"), lambda v: v >= 0, "≥ 0"),   # 0 switches them off
    (LOOPS, lambda v: v <= MAX_LOOPS, f"{MAX_LOOPS:,} or fewer (applications or layers)"),
)
FREE = ("steps", "device", "eval_every", "eval_batch_size")   # a resume may change these


def refused(flat):
    """The first (setting, what it must be) in ``flat`` that RULES refuse, or None."""
    return next(((k, what) for k, v in flat.items() for keys, ok, what in RULES
                 if v is not None and (keys is None or k in keys) and not ok(v)), None)


def make_config(task, model, preset="cpu", **overrides):
    """The full configuration of a run: the preset for (task, model), given the task options (it may
    count in them, e.g. SCAN's steps in epochs of its split), then the other overrides by name (None
    keeps the preset's)."""
    recipe = recipe_for(task)
    recipe.check_names(task, model, preset)
    types = setting_types(task, model)
    unknown = sorted(k for k, v in overrides.items() if v is not None and k not in types)
    # a task option given as its flag to a task without it
    flags = [k for k in unknown if k in TASK_FLAGS]
    if flags:
        having = [t for r in RECIPES for t in r.tasks if flags[0] in setting_types(t)]
        raise UsageError(f"task {task} has no --{flags[0].replace('_', '-')} (the tasks with one: "
                         f"{', '.join(having)})")
    if unknown:
        raise UsageError(f"unknown setting {unknown[0]!r}; valid: {', '.join(sorted(types))}")
    options = set(fields(recipe.Options))
    with user_values():
        cfg = recipe.config(task, model, preset, **{k: v for k, v in overrides.items()
                                                    if k in options and v is not None})
    for key, value in overrides.items():
        if value is not None and key not in options:
            if key in fields(type(cfg.model_config)):
                cfg.model_config = dataclasses.replace(cfg.model_config, **{key: value})
            else:
                setattr(cfg, key, value)
    flat = settings(dataclasses.asdict(cfg))
    bad = refused(flat)
    if bad:
        raise UsageError(f"{bad[0]} must be {bad[1]}, got {flat[bad[0]]}")
    if cfg.seed < 0:
        raise UsageError(f"--seed must be ≥ 0, got {cfg.seed}")
    if max(cfg.batch_size or 0, cfg.eval_batch_size) > 2 ** 20:   # before gigabytes are allocated
        raise UsageError(f"batch sizes above {2 ** 20:,} are refused (the presets' largest is "
                         "2,048)")
    return cfg


# --- settings by name -----------------------------------------------------------------------------

def setting_types(task, model=None):
    """{setting: int, float, bool or str}: what --set may change in a run of ``task`` with ``model``
    (when known): the fields of the run's config, of the task options and of the model's own."""
    recipe = recipe_for(task)
    types = field_types(recipe, model if model in recipe.models else next(iter(recipe.models)))
    # not --set's: task, model, preset; a type: a class, or its name (postponed annotations)
    return {k: {"int": int, "float": float, "bool": bool, "str": str}.get(getattr(t, "__name__", t), str)
            for k, t in types.items() if k not in ("task", "model", "preset")}


# how --set reads a value of each type, what one looks like, and what a checkpoint may hold
PARSE = {int: int, float: float, str: str,
         bool: lambda text: {"true": True, "1": True, "false": False, "0": False}[text.lower()]}
EXPECTED = {int: "an integer", float: "a number", bool: "true or false", str: "text"}
SAVED = {int: _int, float: _number, bool: lambda v: isinstance(v, bool), str: lambda v: isinstance(v, str)}


def parse_settings(items, task, model, allowed=None):
    """--set KEY=VALUE strings → {key: value of the setting's type}. ``allowed``: the only keys taken
    (a trained run's)."""
    types, values = setting_types(task, model), {}
    for item in items:
        key, eq, text = item.partition("=")
        if not eq:
            raise UsageError(f"--set expects KEY=VALUE, got {item!r}")
        # they choose the settings --set changes, or where
        if key in ("task", "model", "preset", "device"):
            raise UsageError(f"--set {item}: use --{key} {text} instead")
        if allowed is not None and key not in allowed:
            raise UsageError(f"--set {item}: a trained run takes only "
                             f"{', '.join(k + '=N' for k in allowed)}")
        if key not in types and allowed is not None:   # a trained run: name only what it takes
            raise UsageError(f"{task} / {model} has no {key}; a trained run of it takes: "
                             f"{', '.join(k for k in allowed if k in types) or 'no --set'}")
        if key not in types:
            raise UsageError(f"unknown setting {key!r} in --set; valid: {', '.join(sorted(types))}")
        try:
            values[key] = PARSE[types[key]](text)
        except (ValueError, KeyError):   # KeyError: not a bool
            raise UsageError(f"--set {item}: expected {EXPECTED[types[key]]}") from None
    return values


# --- what --set refuses because the model would not read it ---------------------------------------

# The settings of its config that a model never reads, by model: a --set of one would change nothing,
# so it is refused (tests/lab/test_ignored_settings.py holds this table to what the model code reads).
NO_GATE = ("gate_dropout",)                        # the post-LN layer has no copy gate to drop out
NOT_COMPOSITIONAL = ("n_search", "n_retrieval")    # read by compositional attention only
NO_ATTENTION_DROPOUT = ("attention_dropout",)      # as the official plain MHA (docs/ndr.md §4.1)
UNREAD = {
    # the NDR paper's encoders (models/encoder.py)
    "transformer": NO_ATTENTION_DROPOUT + NO_GATE + NOT_COMPOSITIONAL,
    "transformer-rel": NO_GATE + NOT_COMPOSITIONAL,
    "transformer-rel-gate": NOT_COMPOSITIONAL,
    "transformer-absrel-gate": NOT_COMPOSITIONAL,
    "transformer-geom": NO_GATE + NOT_COMPOSITIONAL,
    "ndr": NOT_COMPOSITIONAL,
    "transformer-compositional": NO_ATTENTION_DROPOUT + NO_GATE,
    "transformer-coda": NO_ATTENTION_DROPOUT + NO_GATE + NOT_COMPOSITIONAL,
    # the CRT (models/compositional.py)
    "mha": ("separate",),
    "compositional": ("n_head",),
    "compositional-mlp": ("n_head",),
    # sorting (models/abstractor.py): the ablation's relational cross-attention is plain cross-attention
    "abstractor-ablation": ("activation", "symmetric", "rca_scale"),
    # sorting and MLU (models/seq2seq.py): the plain encoder–decoder reads EncoderDecoderConfig's fields
    # only, not those of the Abstractor (sort) or CoDA (mlu)
    "transformer-seq2seq": ("n_abstractor_layers", "architecture", "activation", "symmetric", "rca_scale",
                            "symbols", "max_len", "n_library", "add_pe", "symbol_self_attention",
                            "rca_residual", "attend_a1", "coda_alpha", "coda_beta", "coda_gate",
                            "coda_center_e", "coda_scale", "coda_composition"),
}
# settings read only under another setting's value (the Abstractor's symbolic attention)
CONDITIONAL = {"n_library": ("symbols", "symbolic")}


def refuse_unread(cfg, sets):
    """A --set that the run's model would not read (``UNREAD``; ``CONDITIONAL`` without its other
    setting's value) changes nothing: refused, naming the models that do read it."""
    recipe = recipe_for(cfg.task)
    for key, value in sets.items():
        if key in UNREAD.get(cfg.model, ()):
            readers = [m for m in recipe.models if key in fields(recipe.model_config_class(m))
                       and key not in UNREAD.get(m, ())]
            raise UsageError(f"--set {key}={value}: {cfg.model} does not use {key}, so it would change "
                             "nothing" + (f" (the models that do: {', '.join(readers)})" if readers else ""))
        other, needed = CONDITIONAL.get(key, (None, None))
        if other and getattr(cfg.model_config, other) != needed:
            raise UsageError(f"--set {key}={value}: {key} is read only with {other}={needed} (this run "
                             f"has {other}={getattr(cfg.model_config, other)}), so it would change nothing")


# --- a checkpoint's settings ----------------------------------------------------------------------

def saved_settings(ckpt, path):
    """The checkpoint's configuration as flat {setting: value}, each value checked as a --set of it
    would be (its type, RULES): an edited configuration is refused here, not later."""
    flat = settings(ckpt["config"])
    types = setting_types(flat["task"], flat["model"])
    for key, value in flat.items():
        if key not in types and key not in ("task", "model", "preset"):
            raise corrupted(path, f"config.{key}: no such setting")
        if key in types and value is not None and not SAVED[types[key]](value):
            raise corrupted(path, f"config.{key}: expected {EXPECTED[types[key]]}, got {value!r:.40}")
    bad = refused(flat) or (flat.get("device") not in (None, "cpu", "gpu") and ("device", "cpu or gpu"))
    if bad:
        raise corrupted(path, f"config.{bad[0]}: {flat[bad[0]]!r:.40}, not {bad[1]}")
    return flat


def path_flags(device="cpu"):
    """Which path a run on ``device`` trains on, as its checkpoint records it: the textbook path (the
    CPU's, or forced by MINATTN_PLAIN=1/0) and the GPU tier's kernels (MINATTN_KERNELS=1)."""
    return {"plain": is_plain(device), "kernels": kernels.is_on() and not is_plain(device)}


def resume_check(cfg, out_dir):
    """The checkpoint in out_dir, checked for a --resume with ``cfg``: whole (optimizer state too)
    and written by this run; ``cfg.steps`` and ``cfg.eval_every`` None become the run's own."""
    path = os.path.join(out_dir, CHECKPOINT)
    ckpt = load_checkpoint(path)
    opt, names = ckpt["optimizer"], ckpt["parameters"]
    lacking = [n for n, s in zip(names, opt["state"]) if not s and n not in opt["without_state"]]
    if lacking:
        raise UsageError(f"checkpoint {path} lacks the optimizer state of {len(lacking)} of "
                         f"{len(names)} parameters (e.g. {lacking[0]}), so --resume could not "
                         "continue exactly; --evaluate and --plot still read it")
    saved = saved_settings(ckpt, path)
    cfg.steps = saved["steps"] if cfg.steps is None else cfg.steps
    cfg.eval_every = saved["eval_every"] if cfg.eval_every is None else cfg.eval_every
    now = settings(json.loads(json.dumps(to_json(dataclasses.asdict(cfg)))))
    diff = sorted(k for k in saved.keys() | now.keys() if k not in FREE and saved.get(k) != now.get(k))
    if diff:
        raise UsageError(f"checkpoint in {out_dir} was written by a different run (differs in: "
                         f"{', '.join(diff)}); nothing was overwritten")
    for key, now in path_flags(cfg.device).items():   # the GPU tier's kernels act on the GPU only
        if ckpt[key] != now and (key == "plain" or cfg.device == "gpu"):
            name, was = f"MINATTN_{key.upper()}", int(ckpt[key])
            raise UsageError(f"{out_dir} was trained with {name}={was} and this resume runs with "
                             f"{name}={1 - was}: the two paths agree to ~1e-4, not bit for bit; "
                             f"continue with {name}={was}")
    if cfg.steps < ckpt["step"]:
        raise UsageError(f"--steps {cfg.steps} is below step {ckpt['step']}, which {out_dir} has "
                         "already reached")
    return ckpt
