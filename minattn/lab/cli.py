"""train.py's command line (its usage: train.py's docstring): the loop is train.py's; this file
turns flags into a run configuration and runs the modes that read a trained run (--evaluate,
--plot, --analyze) or finished ones (--report DIR...); a run's settings are merged in one pass
(``resolve``). Bad input is one line ``error: ...`` and exit code 2; a run whose loss is not finite
exits 3; Ctrl-C 130 and SIGTERM 143, abandoning a write in progress (minattn/lab/rundir.py).
"""
import argparse
import dataclasses
import json
import os
import shlex
import sys

from minattn import backend

from . import viz
from .errors import Diverged, UsageError
from .recipes import RECIPES, recipe_for
from .recipes.base import schedule
from .report import report, run_curves
from .rundir import CHECKPOINT, Terminated, handling_signals, load_checkpoint, to_json
from .settings import (TASK_FLAGS, make_config, parse_settings, refuse_unread, resume_check,
                       saved_settings, user_values)


# --- the command line ---------------------------------------------------------------------------

def parse_args(argv=None, description=__doc__):
    ap = argparse.ArgumentParser(prog="train.py", description=description,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    # --task and --model default to ctl and ndr for training; None tells --plot that none was given
    ap.add_argument("--task", help="one of: " + ", ".join(t for r in RECIPES for t in r.tasks)
                    + " (default ctl)")
    # sort and MLU share transformer-seq2seq
    models = dict.fromkeys(m for r in RECIPES for m in r.models)
    ap.add_argument("--model", help="one of: " + ", ".join(models) + " (default ndr)")
    ap.add_argument("--split", help="scan: the split, e.g. filler0, length, length_cutoff_26 (all: "
                    "SCAN_SPLITS in minattn/data/seq2attn.py)")
    ap.add_argument("--device", help="cpu (default) or gpu (needs CuPy: README \"On a GPU\"); a "
                    "--resume keeps the run's unless given")
    ap.add_argument("--preset", help="cpu (default; ~30 min on 2 cores) or paper (the paper's "
                    "hyperparameters, for a GPU); a --resume keeps the run's")
    ap.add_argument("--steps", type=int, help="optimizer steps (default: the preset's)")
    ap.add_argument("--batch-size", type=int, help="training batch size (default: the preset's)")
    ap.add_argument("--lr", type=float, help="learning rate (default: the preset's)")
    ap.add_argument("--seed", type=int, help="seed of initialisation, data order and dropout "
                    "(default 0)")
    ap.add_argument("--eval-every", type=int, help="evaluate and checkpoint every N steps")
    ap.add_argument("--out", help="run directory (default: runs/TASK-MODEL-PRESET-sSEED, the task "
                    "tagged with the data's flags, e.g. --split, when given)")
    ap.add_argument("--resume", nargs="?", const=True, default=False, metavar="DIR",
                    help="continue the checkpoint in --out (or DIR) exactly, with the run's task, "
                         "model and settings (add --steps N to extend it)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="override any setting, e.g. --set d_model=64 --set batching=random")
    ap.add_argument("--show-config", action="store_true", help="print the resolved run and model "
                    "configuration (marking what flags and --set changed) and exit")
    ap.add_argument("--no-progress", action="store_true", help="no progress bar")
    ap.add_argument("--report", nargs="+", metavar="DIR",
                    help="print a markdown table of finished runs (mean ± std over seeds) and exit")
    ap.add_argument("--analyze", action="store_true",
                    help="print the analysis of --out's checkpoint (retrieval: paper Fig. 5) and exit")
    ap.add_argument("--evaluate", action="store_true",
                    help="evaluate the checkpoint in --out on every split and exit (--set "
                         "n_steps_eval=N: a shared-layer encoder applied N times)")
    ap.add_argument("--plot", action="store_true", help="draw what the checkpoint in --out learned "
                    "and the run's learning curves into DIR/plots (needs matplotlib) and exit")
    ap.add_argument("--plot-dir", metavar="DIR",
                    help="--plot: write the PNGs to DIR (default: the run's plots/); --report: "
                         "also draw the runs' learning curves into DIR/learning-curves.png")
    ap.add_argument("--example", action="append", default=[], metavar="TEXT",
                    help="--plot this input, not test examples (repeatable): the task's text, e.g. "
                         "ctl '101 d a b', scan 'jump twice'; object indices for sort, pairwise, set")
    ap.add_argument("--train-size", type=int,
                    help="sort, pairwise, set, mlu: training samples drawn from the train pool")
    ap.add_argument("--searches", type=int, help="retrieval: ground-truth searches S (default 2)")
    ap.add_argument("--retrievals", type=int,
                    help="retrieval: ground-truth retrievals R (default 4)")
    ap.add_argument("--ood", action="store_true", default=None,
                    help="retrieval: train on 80%% of the combinations of retrieval choices; "
                         "ood_l1 is then out of distribution")
    return ap.parse_args(argv)


def main(argv, train):
    """train.py's main: ``train(cfg, out_dir, resume, progress)`` is its loop."""
    # --help shows train.py's own docstring (what a user reads), not this file's
    args, where = parse_args(argv, sys.modules[train.__module__].__doc__), {"out": None}
    try:
        with handling_signals():
            return _main(args, where, train)
    except (UsageError, backend.DeviceError, Diverged) as e:   # Diverged: the loss is not finite
        print(f"error: {e}", file=sys.stderr)
        return 3 if isinstance(e, Diverged) else 2
    # `train.py --report runs/* | head`: the reader left; not an error of ours
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    # a full disk, a read-only directory: the system's one line, not a traceback
    except OSError as e:
        print(f"error: {e.strerror or e}" + (f": {e.filename}" if e.filename else ""),
              file=sys.stderr)
        return 2
    # e.g. --set d_model=1000000: numpy names the array it could not allocate
    except MemoryError as e:
        print(f"error: not enough memory ({e or 'MemoryError'}); choose smaller sizes (d_model, "
              "d_ff, n_steps, --batch-size)", file=sys.stderr)
        return 2
    except (KeyboardInterrupt, Terminated) as e:
        out = where["out"]
        kept = out and os.path.exists(os.path.join(out, CHECKPOINT))
        print(("interrupted" if isinstance(e, KeyboardInterrupt) else "terminated") + (
            "" if out is None else   # out: set once training starts (not --evaluate, --plot)
            ": the last checkpoint is intact; continue with --resume" if kept else
            ": before the first checkpoint, so there is nothing to resume"), file=sys.stderr)
        return 130 if isinstance(e, KeyboardInterrupt) else 143


def _main(args, where, train):
    """main() without its error handling; ``where["out"]``: the run directory, once training starts.
    First the flags on their own: none empty, one mode at a time, what a mode needs."""
    for flag in ("task", "model", "preset", "split", "out", "plot_dir", "resume"):
        if getattr(args, flag) == "":
            raise UsageError(f"--{flag.replace('_', '-')} is empty")
    if isinstance(args.resume, str):  # --resume DIR: the run directory, as --out DIR
        if args.out and args.out != args.resume:
            raise UsageError(f"--resume {args.resume} and --out {args.out} name different run "
                             "directories")
        args.out, args.resume = args.resume, True
    modes = [f"--{m.replace('_', '-')}" for m in ("report", "analyze", "evaluate", "plot", "show_config")
             if getattr(args, m)]
    if len(modes) > 1:   # each runs alone
        raise UsageError(f"{' and '.join(modes)} are separate modes: give one at a time")
    inspect = next((flag for flag in ("analyze", "evaluate", "plot") if getattr(args, flag)), None)
    if inspect and not args.out:
        raise UsageError(f"--{inspect} needs --out DIR (or --resume DIR), a run directory with a "
                         "checkpoint")
    if args.example and not args.plot:
        raise UsageError("--example goes with --plot")
    if args.report:
        report(args.report, args.plot_dir)
        return 0
    device = "cpu" if args.device is None else args.device
    if args.analyze or args.evaluate:   # --evaluate: the last evaluation's weights, not
        recipe, model, step = _load_run(args.out, device, args.set)   # results.json's selected ones
        with user_values():   # --analyze: e.g. the CRT value-score table, paper Fig. 5
            print(recipe.analyze(model) if args.analyze else json.dumps(to_json(
                {"step": step, "settings": args.set, "metrics": recipe.evaluate(model)})))
        return 0
    if args.plot:
        plot(args.out, device, args.example, args.task, args.model, args.set, args.plot_dir)
        return 0
    cfg, given = resolve(args)
    # the data options are part of the default name, so runs at different sizes or splits don't collide
    task_name = "-".join([cfg.task] + [f"{tag}{given[key]}" for tag, key in (
        ("", "split"), ("n", "train_size"), ("S", "searches"), ("R", "retrievals")) if given.get(key)]
        + ["ood"] * bool(given.get("ood")))
    out = args.out or os.path.join("runs", f"{task_name}-{cfg.model}-{cfg.preset}-s{cfg.seed}")
    if args.show_config:   # resolved as training would (steps may count epochs), then compared
        if args.resume:    # as the resume would run it, or refused as it would be
            resume_check(cfg, out)
        preset = make_config(cfg.task, cfg.model, cfg.preset, split=given.get("split"))
        print(show_config(schedule(cfg), schedule(preset)))
        return 0
    where["out"] = out
    r = train(cfg, out, resume=args.resume, progress=not args.no_progress)
    metrics = ", ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}"
                        for k, v in r["metrics"].items())
    print(f"done: {r['task']} / {r['model']}, {r['steps']} steps in {r['wall_s']:.0f} s "
          f"({r['ms_per_step'] or 0:.0f} ms/step); {metrics or 'no metrics'} "
          + (f"(selected at step {r['best_step']})\n" if r["best_step"] is not None else
             "(the last evaluation: the task has no split to select by)\n") +
          f"results: {os.path.join(out, 'results.json')}, learning curve: "
          f"{os.path.join(out, 'metrics.jsonl')}, checkpoint: {os.path.join(out, CHECKPOINT)}\n"
          f"pictures: python train.py --plot --out {shlex.quote(out)}")
    return 0


# the flags that give a setting of the same name (the others choose what runs, where and how)
SETTING_FLAGS = ("seed", "steps", "batch_size", "lr", "eval_every") + TASK_FLAGS


def resolve(args):
    """The run's configuration, resolved in one pass, each source over the one before:

    1. the recipe's preset for (task, model, preset), by ``make_config``;
    2. on a --resume: the settings saved in the checkpoint, and its task, model, preset and device
       (a --task, --model or --preset that is not the run's is refused, naming the run);
    3. the flags (--seed, --steps, --lr, --train-size, ...);
    4. --set KEY=VALUE (a setting given both as a flag and by --set: the two must agree).

    Returns the configuration and the settings given by 2–4, by name."""
    saved, path = {}, os.path.join(args.out or "", CHECKPOINT)
    # (a directory without a checkpoint is left to the resume's own check: a live writer's lock, say)
    if args.resume and args.out and os.path.exists(path):
        saved = saved_settings(load_checkpoint(path, arrays=False), path)   # (the resume reads the arrays)
        for flag in ("task", "model", "preset"):
            if getattr(args, flag) not in (None, saved[flag]):
                raise UsageError(f"{args.out} holds a {saved['task']} / {saved['model']} run "
                                 f"({saved['preset']} preset), not --{flag} {getattr(args, flag)}: a "
                                 f"resume continues the run as it is (drop --{flag}, or choose "
                                 "another --out)")
    task, model, preset = (saved.pop(name, None) or getattr(args, name) or default
                           for name, default in (("task", "ctl"), ("model", "ndr"), ("preset", "cpu")))
    device = saved.pop("device", None) or "cpu"   # a resume's: the run's (null, hand-made: the CPU)
    if args.device is not None:
        device = args.device
    elif device == "gpu":   # a GPU run continues on the GPU (not bit for bit on the CPU)
        try:
            backend.get_xp("gpu")
        except backend.DeviceError as e:
            raise UsageError(f"{e}; the run in {args.out} was trained on the GPU: --device cpu "
                             "continues it on the CPU") from None
    if device not in ("cpu", "gpu"):
        raise UsageError(f"unknown device {device!r}; valid devices: cpu, gpu")
    flags = {k: getattr(args, k) for k in SETTING_FLAGS if getattr(args, k) is not None}
    sets = parse_settings(args.set, task, model)
    for key in (k for k in sets if k in flags and sets[k] != flags[k]):   # --set lr=… is --lr …
        raise UsageError(f"--set {key}={sets[key]} contradicts --{key.replace('_', '-')} "
                         f"{flags[key]}")
    given = {**saved, **flags, **sets}
    cfg = make_config(task, model, preset, device=device, **given)
    refuse_unread(cfg, sets)
    if args.resume:   # the run's own step budget and evaluation interval unless given (see train())
        cfg.steps, cfg.eval_every = given.get("steps"), given.get("eval_every")
    return cfg, given


def show_config(cfg, preset):
    """The resolved run configuration, its task options and its model, one field a line; ``*`` marks
    the fields a flag or --set changed, with the preset's value in brackets."""
    lines = [f"{cfg.task} / {cfg.model}, {cfg.preset} preset (* = changed from the preset, its "
             "value in brackets)"]
    for title, now, was in (("run (RunConfig)", cfg, preset),
                            (f"task options ({type(cfg.options).__name__})", cfg.options,
                             preset.options),
                            (f"model ({type(cfg.model_config).__name__})", cfg.model_config,
                             preset.model_config)):
        if now is None:
            continue
        lines.append(title + ":")
        for f in dataclasses.fields(now):
            value, old = getattr(now, f.name), getattr(was, f.name)
            if f.name not in ("model_config", "options"):
                lines.append(f"  * {f.name} = {value!r}   [{old!r}]" if value != old else
                             f"    {f.name} = {value!r}")
    return "\n".join(lines)


# --- trained runs: --evaluate, --analyze, --plot --------------------------------------------------

# what `--set` may change in a trained run (--evaluate, --plot, --analyze): evaluation, not weights
EVAL_SETTINGS = ("n_steps_eval", "eval_batch_size")


def _load_run(out_dir, device, overrides=()):
    """The recipe (its task loaded), the trained model of out_dir's checkpoint on ``device``, and its
    step; ``overrides``: --set's KEY=VALUE strings (EVAL_SETTINGS only)."""
    if not os.path.isdir(out_dir):
        raise UsageError(f"no run directory {out_dir}")
    path = os.path.join(out_dir, CHECKPOINT)
    ckpt = load_checkpoint(path)
    saved = dict(saved_settings(ckpt, path), device=device)
    saved.update(parse_settings(overrides, saved["task"], saved["model"], allowed=EVAL_SETTINGS))
    cfg = make_config(saved.pop("task"), saved.pop("model"), saved.pop("preset"), **saved)
    recipe = recipe_for(cfg.task)(cfg)
    with user_values():
        recipe.load_task()
        model = recipe.build_model()
    try:
        model.load_state_dict(ckpt["model"])
    except ValueError as e:
        raise UsageError(f"checkpoint {path} does not fit the model: {e}") from None
    return recipe, model.to(device).eval(), ckpt["step"]   # eval(): e.g. n_steps_eval applies


def plot(out_dir, device="cpu", texts=(), task=None, model=None, settings=(), plot_dir=None):
    """Pictures of what the checkpoint in out_dir learned (minattn/lab/viz.py) as PNGs in
    ``plot_dir`` (default out_dir/plots); returns the paths written. ``texts``: inputs to show
    instead of the test examples; ``task``/``model``, when given, must be the checkpoint's."""
    viz.require_matplotlib("--plot")   # before the checkpoint is read
    if any(not t.strip() for t in texts):
        raise UsageError("--example is empty: give the input to draw, e.g. --example '101 d a b'")
    default_dir, plot_dir = plot_dir is None, plot_dir or os.path.join(out_dir, "plots")
    not_a_dir = os.path.exists(plot_dir) and not os.path.isdir(plot_dir)
    if (default_dir and os.path.islink(plot_dir)) or not_a_dir:
        raise UsageError(f"{plot_dir} is a link or a file, not a directory for the pictures "
                         "(choose --plot-dir)")
    recipe, net, _ = _load_run(out_dir, device, settings)
    for flag, given in (("task", task), ("model", model)):   # when given, the checkpoint's
        if given not in (None, getattr(recipe.cfg, flag)):
            raise UsageError(f"{out_dir} holds a {recipe.cfg.task} / {recipe.cfg.model} "
                             f"checkpoint, not --{flag} {given}")
    with user_values():
        pictures = recipe.plot_examples(net, list(texts))
    pictures += run_curves(out_dir)   # metrics.jsonl against the step, the selected step marked
    writes_into = plot_dir if os.path.isdir(plot_dir) else out_dir   # (permission, read-only disk)
    if default_dir and not (os.access(writes_into, os.W_OK)
                            and not os.statvfs(writes_into).f_flag & os.ST_RDONLY):
        raise UsageError(f"cannot write the pictures into {plot_dir} (read-only): choose "
                         "--plot-dir DIR")
    paths = viz.write_pictures(pictures, plot_dir)
    for path in paths:
        print(f"wrote {path}")
    return paths
