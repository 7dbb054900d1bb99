"""A run's settings by name: what ``--set`` may change in a run of a task and model (the fields of
the run's config, of the task options and of the model's own, typed by its recipe), and a
checkpoint's configuration in any layout checked against them before a ``--resume`` or
``--evaluate`` uses it. The run directory's files are minattn/lab/rundir.py's; this is where the
recipes are asked what a setting is.
"""
import contextlib
import dataclasses
import json
import math
import os

from minattn import backend
from minattn.engine import is_plain
from minattn.fast import kernels

from .errors import UsageError
from .recipes import RECIPES, recipe_for
from .recipes.base import field_types, fields
from .rundir import CHECKPOINT, Corrupted, _int, _number, check_resumable, identity, load_checkpoint, settings


# --- configuration: a recipe's preset, then the command line's overrides --------------------------

@contextlib.contextmanager
def user_values():
    """Bad user values, found where they are used (a recipe's hooks, the models, the data), raise
    ValueError: here, and only here, that becomes a UsageError, one line for the user."""
    try:
        yield
    except ValueError as e:
        raise UsageError(str(e)) from None


# task options with a flag of their own
TASK_FLAGS = ("split", "train_size", "searches", "retrievals", "ood")


def make_config(task, model, preset="cpu", **overrides):
    """The full configuration of a run: the preset for (task, model), then explicit overrides
    (settings of the run, the task options or the model, by name; None means "keep the preset's").
    The task options are given to the preset, which may count in them (e.g. SCAN's steps in epochs
    of its split)."""
    recipe = recipe_for(task)
    recipe.check_names(task, model, preset)
    fields = field_types(recipe, model)
    unknown = sorted(k for k, v in overrides.items() if v is not None and k not in fields)
    # a task option given as its flag to a task without it
    flags = [k for k in unknown if k in TASK_FLAGS]
    if flags:
        having = [t for r in RECIPES for t in r.tasks
                  if flags[0] in field_types(r, next(iter(r.models)))]
        raise UsageError(f"task {task} has no --{flags[0].replace('_', '-')} (the tasks with one: "
                         f"{', '.join(having)})")
    if unknown:
        # task, model, preset: flags, not settings
        raise UsageError(f"unknown setting {unknown[0]!r}; valid: "
                         f"{', '.join(sorted(k for k in fields if k not in ('task', 'model', 'preset')))}")
    option_names = {f.name for f in dataclasses.fields(recipe.Options)} if recipe.Options else set()
    with user_values():
        cfg = recipe.config(task, model, preset, **{k: v for k, v in overrides.items()
                                                    if k in option_names and v is not None})
    model_fields = {f.name for f in dataclasses.fields(cfg.model_config)}
    for key, value in overrides.items():
        if value is None or key in option_names:
            continue
        if key in model_fields:
            cfg.model_config = dataclasses.replace(cfg.model_config, **{key: value})
        else:
            setattr(cfg, key, value)
    # a count or a rate: > 0
    for key in ("steps", "batch_size", "lr", "eval_every", "eval_batch_size"):
        value = getattr(cfg, key)
        # None: counted in epochs
        if value is not None and not value > 0:
            raise UsageError(f"{key} must be positive, got {value}")
    if cfg.seed < 0:
        raise UsageError(f"--seed must be ≥ 0, got {cfg.seed}")
    # refused before gigabytes are allocated
    if max(cfg.batch_size or 0, cfg.eval_batch_size) > 2 ** 20:
        raise UsageError(f"batch sizes above {2 ** 20:,} are refused (the presets' largest is "
                         "2,048)")
    # 0 switches them off
    for key in ("weight_decay", "grad_clip"):
        value = getattr(cfg, key)
        if value < 0:
            raise UsageError(f"{key} must be ≥ 0, got {value}")
    # NaN passes every comparison above, inf most
    for part in (cfg, cfg.options, cfg.model_config):
        for f in dataclasses.fields(part) if part is not None else ():
            value = getattr(part, f.name)
            if isinstance(value, float) and not math.isfinite(value):
                raise UsageError(f"{f.name} must be a finite number, got {value}")
            # 10⁹ would never end
            if f.name in LOOPS and isinstance(value, int) and value > MAX_LOOPS:
                raise UsageError(f"{f.name} is {value}: above {MAX_LOOPS:,} applications or layers "
                                 "are refused")
    return cfg


# settings that count applications of a layer or layers: bounded (a checkpoint's too), so none runs
# forever
LOOPS = ("n_steps", "n_steps_eval", "n_layers", "n_encoder_layers", "n_decoder_layers",
         "n_abstractor_layers")
MAX_LOOPS = 10_000


# --- settings by name -----------------------------------------------------------------------------

def setting_types(task, model=None):
    """{setting: int, float, bool or str}: what --set may change in a run of ``task`` with ``model``
    (when known): the fields of the run's config, of the task options and of the model's own."""
    recipe = recipe_for(task)
    types = field_types(recipe, model if model in recipe.models else next(iter(recipe.models)))
    for name in ("task", "model", "preset"):   # not --set's to change
        types.pop(name)
    # a class, or its name under postponed annotations
    return {k: {"int": int, "float": float, "bool": bool, "str": str}.get(getattr(t, "__name__", t), str)
            for k, t in types.items()}


def _bool(text):
    if text.lower() not in ("true", "false", "1", "0"):
        raise ValueError(text)
    return text.lower() in ("true", "1")


# how --set reads a value of each type, and what one looks like
PARSE = {int: int, float: float, bool: _bool, str: str}
EXPECTED = {int: "an integer", float: "a number", bool: "true or false", str: "text"}


def parse_settings(items, task, model, allowed=None):
    """--set KEY=VALUE strings → {key: value of the setting's type}. ``allowed``: the only keys taken
    (a trained run's)."""
    types, settings = setting_types(task, model), {}
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
            settings[key] = PARSE[types[key]](text)
        except ValueError:
            raise UsageError(f"--set {item}: expected {EXPECTED[types[key]]}") from None
    return settings


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
# settings a model reads only under another setting's value: the Abstractor's symbols (symbolic
# attention)
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


def saved_settings(ckpt, path):
    """The checkpoint's configuration as flat {setting: value} (``settings``: any layout, older ones
    included), each value checked against its setting's type and the whole against the checkpoint's
    identity: a mistyped or edited configuration is refused here rather than failing later."""
    config = ckpt["config"]
    types = setting_types(config["task"], config["model"])
    flat = settings(config)
    ok = {int: _int, float: _number, bool: lambda v: isinstance(v, bool),
          str: lambda v: isinstance(v, str)}
    for key, value in flat.items():
        kind = types.get(key)
        if kind is None and key not in ("task", "model", "preset"):
            raise Corrupted(f"checkpoint {path} is corrupted (config.{key}: no such setting)")
        if kind is not None and value is not None and not ok[kind](value):
            raise Corrupted(f"checkpoint {path} is corrupted (config.{key}: expected "
                            f"{EXPECTED[kind]}, got {value!r:.40})")
    loops = [k for k in LOOPS if _int(flat.get(k)) and flat[k] > MAX_LOOPS]
    if loops:
        raise Corrupted(f"checkpoint {path} is corrupted (config.{loops[0]}: {flat[loops[0]]}, "
                        f"above {MAX_LOOPS:,})")
    # not in the identity, so checked here (a resume runs there)
    if flat.get("device") not in (None, "cpu", "gpu"):
        raise Corrupted(f"checkpoint {path} is corrupted (config.device: {flat['device']!r:.40}, "
                        "not cpu or gpu)")
    # as make_config has them: > 0
    for key in ("steps", "batch_size", "lr", "eval_every", "eval_batch_size"):
        if flat.get(key) is not None and not flat[key] > 0:
            raise Corrupted(f"checkpoint {path} is corrupted (config.{key}: {flat[key]}, not "
                            "positive)")
    rest = {k: v for k, v in flat.items()
            if k not in ("steps", "device", "eval_every", "eval_batch_size")}
    if json.loads(json.dumps(rest)) != settings(ckpt["identity"]):
        raise Corrupted(f"checkpoint {path} is corrupted (its config and identity disagree)")
    return flat


def resume_settings(out_dir, task=None, model=None, preset=None):
    """The settings of the run saved in out_dir (task, model, preset and the rest, flat), for a
    --resume that takes them from its checkpoint; a --task, --model or --preset given, and not the
    run's, is refused. (Its device: resume_device.)"""
    path = os.path.join(out_dir, CHECKPOINT)
    saved = saved_settings(load_checkpoint(path), path)
    for flag, given in (("task", task), ("model", model), ("preset", preset)):
        if given is not None and given != saved[flag]:
            raise UsageError(f"{out_dir} holds a {saved['task']} / {saved['model']} run "
                             f"({saved['preset']} preset), not --{flag} {given}: a resume "
                             f"continues the run as it is (drop --{flag}, or choose another --out)")
    saved.pop("device", None)
    return saved


def resume_device(out_dir, given=None):
    """The device a --resume of out_dir runs on: ``given`` (--device), else the run's own, so that a
    GPU run continues on the GPU (on the CPU it would be much slower and not bit for bit); where
    there is no GPU, the error says how to move it. A directory without a checkpoint is left to the
    resume's own check."""
    path = os.path.join(out_dir, CHECKPOINT)
    if given is not None or not os.path.exists(path):
        return "cpu" if given is None else given
    # null in a hand-made config
    device = saved_settings(load_checkpoint(path), path).get("device") or "cpu"
    if device == "gpu":
        try:
            backend.get_xp("gpu")
        except backend.DeviceError as e:
            raise UsageError(f"{e}; the run in {out_dir} was trained on the GPU: --device cpu "
                             "continues it on the CPU") from None
    return device


def path_flags(device="cpu"):
    """Which path a run on ``device`` trains on, as its checkpoint records it: the textbook path (the
    CPU's, or forced by MINATTN_PLAIN=1/0) and the GPU tier's kernels (MINATTN_KERNELS=1)."""
    return {"plain": is_plain(device), "kernels": kernels.is_on() and not is_plain(device)}


def resume_check(cfg, out_dir):
    """The checkpoint in out_dir, checked for a --resume with ``cfg``: whole (optimizer state
    included) and written by this run; ``cfg.steps`` and ``cfg.eval_every`` None become the run's
    own."""
    path = os.path.join(out_dir, CHECKPOINT)
    ckpt = load_checkpoint(path)
    check_resumable(ckpt, path)
    saved = saved_settings(ckpt, path)
    cfg.steps = saved["steps"] if cfg.steps is None else cfg.steps
    cfg.eval_every = saved["eval_every"] if cfg.eval_every is None else cfg.eval_every
    # compared setting by setting, so that a checkpoint whose config has the older layout (task
    # options and schedule inside model_config) belongs to the same run
    was, now = settings(ckpt["identity"]), settings(identity(cfg))
    diff = sorted(k for k in was.keys() | now.keys() if was.get(k) != now.get(k))
    if diff:
        raise UsageError(f"checkpoint in {out_dir} was written by a different run (differs in: "
                         f"{', '.join(diff)}); nothing was overwritten")
    # absent before the path was recorded: not checked. The GPU tier's kernels act on the GPU only.
    for key, now in path_flags(cfg.device).items():
        if ckpt.get(key, now) != now and (key == "plain" or cfg.device == "gpu"):
            name, was = f"MINATTN_{key.upper()}", int(ckpt[key])
            raise UsageError(f"{out_dir} was trained with {name}={was} and this resume runs with "
                             f"{name}={1 - was}: the two paths agree to ~1e-4, not bit for bit; "
                             f"continue with {name}={was}")
    if cfg.steps < ckpt["step"]:
        raise UsageError(f"--steps {cfg.steps} is below step {ckpt['step']}, which {out_dir} has "
                         "already reached")
    return ckpt
