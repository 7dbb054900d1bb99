"""The report of finished runs (``train.py --report``): a row per run directory (results.json, or the
checkpoint of an unfinished run), means ± sample std over seeds, learning curves over the step (also for
``--plot``) and over training-set sizes. What it cannot read it skips, naming why.
"""
import contextlib
import json
import os
import sys

import numpy as np

from . import viz
from .errors import UsageError
from .rundir import CHECKPOINT, _number, load_checkpoint, open_regular, read_log, settings


REPORT_FIELDS = {"task": str, "model": str, "preset": str, "seed": int, "steps": int, "metrics": dict,
                 "best_step": (int, type(None)), "wall_s": (int, float),
                 "ms_per_step": (int, float, type(None)), "config": dict}


def finished_run(d):
    """(results, learning curve, status) of the run in d: status is None for a finished run, else what marks
    its row ("diverged at step k", "unfinished: step k of n"); a UsageError says why d holds no run to
    show."""
    try:
        with open_regular(os.path.join(d, "results.json")) as f:
            r = json.load(f)
    except FileNotFoundError:   # a run that has checkpointed but not finished: its checkpoint's metadata
        if not any(os.path.isfile(os.path.join(d, n)) for n in (CHECKPOINT, "checkpoint.pkl")):
            raise UsageError(f"{d} has no results.json (not a run directory, or the run is not finished)")
        meta = load_checkpoint(os.path.join(d, CHECKPOINT), arrays=False)
        cfg, step = meta["config"], meta["step"]
        r = dict(cfg, steps=step, config=cfg, wall_s=meta["train_time"], best_step=meta["best"].get("step"),
                 ms_per_step=None, metrics={k: v for k, v in meta["last"].items() if v is not None})
        return r, meta["history"], f"unfinished: step {step} of {cfg.get('steps')}"
    except (OSError, ValueError) as e:
        raise UsageError(f"{d} does not hold a readable run ({e.__class__.__name__}: {e})") from None
    missing = set(REPORT_FIELDS) - set(r if isinstance(r, dict) else ())
    if missing:
        raise UsageError(f"{d}: results.json lacks {', '.join(sorted(missing))}")
    wrong = [k for k, kind in REPORT_FIELDS.items() if not isinstance(r[k], kind) or isinstance(r[k], bool)]
    wrong += [f"metrics.{k}" for k, v in r["metrics"].items() if v is not None and not _number(v)]
    wrong += [f"config.{k}" for k in ("model_config", "options")
              if not isinstance(r["config"].get(k) or {}, dict)]
    if wrong:
        raise UsageError(f"{d}: results.json is malformed ({', '.join(wrong)} of the wrong type)")
    try:
        log = read_log(os.path.join(d, "metrics.jsonl"))
    except OSError:
        log = []
    status = f"diverged at step {r['diverged_at']}" if "diverged_at" in r else None
    if status is None and os.path.isfile(os.path.join(d, CHECKPOINT)):   # resumed since, and stopped again?
        with contextlib.suppress(UsageError):
            step = load_checkpoint(os.path.join(d, CHECKPOINT), arrays=False)["step"]
            if step > r["steps"]:
                status = f"unfinished: step {step}, results of step {r['steps']}"
    return r, log, status


def _two_se(values):
    """Twice the standard error of the mean (sample std / √n): a mean ± this is the usual ~95% interval."""
    return 2 * np.std(values, ddof=1) / np.sqrt(len(values))


def _cell(v):
    """A learning-curve entry: floats to 4 decimals (an accuracy 1/12 is 0.0833), a huge one (a loss of 1e308)
    in 4 significant digits, a missing or diverged one (None) empty."""
    if not isinstance(v, float):
        return "" if v is None else str(v)
    return f"{v:.4f}" if abs(v) < 1e6 else f"{v:.4g}"


CURVE_ROWS = 20   # a run's curve in the report: at most this many evaluations (the PNG and the log have all)


def report(paths, plot_dir=None):
    """Markdown table of runs and each run's learning curve. Diverged and unfinished runs get a row marked so,
    and are left out of the means over seeds and sizes. A run is counted once, however often it is listed
    or copied (training is deterministic). ``plot_dir``: also draw the runs' learning curves side by side
    into plot_dir/learning-curves.png; returns the paths written."""
    if plot_dir is not None:   # before the tables are printed
        viz.require_matplotlib("--report --plot-dir")
        if os.path.exists(plot_dir) and not os.path.isdir(plot_dir):
            raise UsageError(f"{plot_dir} is a file, not a directory for the pictures (choose --plot-dir)")
    rows, curves, groups, seen, drawn = [], [], {}, {}, []
    for d in paths:
        try:
            r, log, status = finished_run(d)
            row, curve = _report_row(d, r, log, status)
        except Exception as e:   # anything one directory holds must not cost the others their report
            print(f"warning: skipped: {e}" if isinstance(e, UsageError) else f"warning: skipped {d}: its "
                  f"results cannot be read ({e.__class__.__name__}: {e})", file=sys.stderr)
            continue
        config = settings(r["config"])
        run_key = json.dumps({k: v for k, v in config.items() if k != "device"}, sort_keys=True)
        if run_key in seen:
            print(f"warning: skipped {d}: the same run as {seen[run_key]}", file=sys.stderr)
            continue
        seen[run_key] = d
        rows.append(row)
        drawn.append((d, r, log))
        # runs that differ only in their seed (and device) are seeds of one experiment
        same = json.dumps({k: v for k, v in config.items() if k not in ("seed", "device")}, sort_keys=True)
        groups.setdefault(same, (row.split(" | ")[0][2:], r, [], []))[3 if status else 2].append((r, status))
        if curve is None:
            print(f"warning: {d} has no readable metrics.jsonl: no learning curve", file=sys.stderr)
        else:
            curves.append(curve)
    if not rows:
        raise UsageError("none of the directories holds a finished run")
    print("| task | model | preset | seed | steps | metrics | best step | train time | ms/step "
          "| run directory |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    print("\n".join(rows))
    seeded = [(task, r, runs, out) for task, r, runs, out in groups.values() if len(runs) > 1]
    if seeded:   # the papers report mean ± std over seeds; std here is the sample std (n − 1)
        print("\nOver seeds (mean ± sample std, and twice the standard error of the mean; diverged and "
              "unfinished runs left out; steps: the budget, which early stopping may cut):\n\n"
              "| task | model | preset | steps | seeds | metrics |\n|---|---|---|---|---|---|")
        for task, r, runs, out in seeded:
            values = {k: [x["metrics"].get(k) for x, _ in runs] for k in r["metrics"]}
            m = ", ".join(f"{k} {np.mean(v):.3f} ± {np.std(v, ddof=1):.3f} (2 s.e. {_two_se(v):.3f})"
                          for k, v in values.items() if all(isinstance(x, float) for x in v))
            left = "".join(f" (seed {x['seed']} left out: {status})" for x, status in out)
            print(f"| {task} | {r['model']} | {r['preset']} | {settings(r['config'])['steps']} | "
                  f"{', '.join(str(x['seed']) for x, _ in runs)}{left} | {m} |")
    size_curves = _size_curves([run for _, _, runs, _ in groups.values() for run, _ in runs])
    if size_curves:
        print(size_curves)
    print("\n".join(curves))
    if plot_dir is None:
        return []
    picture = _curves_picture(drawn)
    if picture is None:
        raise UsageError("none of the runs has a readable metrics.jsonl: no learning curves to draw")
    paths = viz.write_pictures([picture], plot_dir)
    for path in paths:
        print(f"wrote {path}")
    return paths


def run_curves(out_dir):
    """What ``--plot`` adds: [the learning curves of the run in out_dir], or [] with a warning."""
    try:
        picture, why = _curves_picture([(out_dir, *finished_run(out_dir)[:2])]), "no readable metrics.jsonl"
    except UsageError as e:
        picture, why = None, e
    if picture is None:
        print(f"warning: no learning curves for {out_dir}: {why}", file=sys.stderr)
        return []
    return [picture]


def _curves_picture(runs):
    """One picture of the learning curves of ``runs`` ((directory, results, log) triples; those without a log
    are left out), or None if none has a log."""
    runs = [(d, r, log) for d, r, log in runs if log]
    if not runs:
        return None
    names = [os.path.basename(os.path.normpath(d)) for d, _, _ in runs]   # the legend: the directories' names
    names = names if len(set(names)) == len(names) else [d for d, _, _ in runs]   # (or their paths)
    marks = [r["best_step"] if r["best_step"] is not None else log[-1]["step"] for _, r, log in runs]
    d, r, _ = runs[0]
    if len(runs) == 1:
        what = f"{r['task']} / {r['model']} ({r['preset']} preset, seed {r['seed']}) in {d}"
        mark = (f"dashed: the selected evaluation, step {marks[0]} (results.json's best_step)"
                if r["best_step"] is not None else
                f"dashed: the last evaluation, step {marks[0]} (this task selects none)")
    else:
        kinds = dict.fromkeys(f"{r['task']} / {r['model']}" for _, r, _ in runs)
        what = f"{len(runs)} runs of " + ", ".join(kinds)
        mark = "dashed: each run's selected evaluation (results.json's best_step; none selected: its last)"
    return viz.learning_curves([(name, log, m) for name, (_, _, log), m in zip(names, runs, marks)],
                               f"learning curves of {what}\n{mark}")


def _report_row(d, r, log, status):
    """The run's row of the table and its learning curve (None without a log)."""
    m = ", ".join(f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}" for k, v in r["metrics"].items())
    config = settings(r["config"])   # the data options that tell runs of one task apart
    data = ", ".join(f"{k} {config[k]}" for k in ("split", "train_size", "searches", "retrievals")
                     if config.get(k))
    task = f"{r['task']} ({data}{', ood' if config.get('ood') else ''})" if data else r["task"]
    steps = f"{r['steps']} ({status})" if status else r["steps"]
    row = (f"| {task} | {r['model']} | {r['preset']} | {r['seed']} | {steps} | {m} | "
           f"{'' if r['best_step'] is None else r['best_step']} | {r['wall_s'] / 60:.1f} min | "
           f"{r['ms_per_step'] or 0:.0f} | {d} |")
    if not log:
        return row, None
    # every column any line has, in order of first appearance (a divergence line has only the train loss)
    keys = list(dict.fromkeys(k for e in log for k in e if k not in ("step", "wall_s")))
    shown = log
    if len(log) > CURVE_ROWS:   # evenly spaced: the first, the last and the selected one among them
        keep = {round(i * (len(log) - 1) / (CURVE_ROWS - 2)) for i in range(CURVE_ROWS - 1)}
        shown = [e for i, e in enumerate(log) if i in keep or e["step"] == r["best_step"]]
    cut = f" ({len(shown)} of its {len(log)} evaluations; all in metrics.jsonl)" if shown != log else ""
    return row, (f"\n{r['task']} / {r['model']} (seed {r['seed']}, {d}){cut}:\n\n| step | "
                 + " | ".join(keys) + " |\n|" + "---|" * (len(keys) + 1) + "\n" +
                 "\n".join(f"| {e['step']} | " + " | ".join(_cell(e.get(k)) for k in keys) + " |"
                           for e in shown))


SIZE_CURVE_FREE = ("seed", "device", "steps", "eval_every")   # what a learning curve's points may differ in


def _size_curves(runs):
    """Markdown table of the test metric over the training-set size (the Abstractor paper's learning curves),
    one row per experiment, when one was run at two sizes or more, or "" (its warnings are printed with it).
    Settings that tell two rows of one model apart (e.g. ``init keras``) are named in the row."""
    rows, warnings = {}, []
    for r in runs:
        # the run's identity (as in the rows above): its settings by name
        cfg = settings(r["config"])
        size = cfg.pop("train_size", None)
        if size and isinstance(r["metrics"].get("test"), float):
            # the step count follows from the size (epochs of it), so it does not tell curves apart
            key = json.dumps({k: v for k, v in cfg.items() if k not in SIZE_CURVE_FREE}, sort_keys=True)
            # the budget, not the steps run: early stopping is part of a protocol, not another budget
            rows.setdefault(key, {}).setdefault(size, []).append((cfg.get("steps"), r["metrics"]["test"]))
    for key, curve in rows.items():
        for size, cell in curve.items():
            budgets = sorted({steps for steps, _ in cell}, key=str)
            if len(budgets) > 1:
                warnings.append(f"warning: the learning curve of {json.loads(key)['model']} averages runs of "
                                f"{size} examples with different step budgets ({budgets})")
            curve[size] = [test for _, test in cell]
    rows = [(json.loads(k), curve) for k, curve in rows.items()]
    if all(len(curve) < 2 for _, curve in rows):   # no run spans sizes: the tables above say it all
        return ""
    print("\n".join(warnings), file=sys.stderr)
    sizes = sorted({n for _, curve in rows for n in curve})
    out = ["\nTest over the training-set size (mean over seeds ± twice its standard error, the number of "
           "seeds in brackets):\n",
           "| task | model | preset | settings | " + " | ".join(map(str, sizes)) + " |",
           "|---|---|---|---|" + "---|" * len(sizes)]
    for cfg, curve in sorted(rows, key=lambda row: (row[0]["task"], row[0]["model"], json.dumps(row[0]))):
        same = (cfg["task"], cfg["model"], cfg["preset"])
        twins = [c for c, _ in rows if (c["task"], c["model"], c["preset"]) == same]
        differ = ", ".join(f"{k} {cfg.get(k)}" for k in sorted({k for c in twins for k in c})
                           if any(c.get(k) != cfg.get(k) for c in twins))
        cells = [f"{np.mean(v):.3f}{f' ± {_two_se(v):.3f}' if len(v) > 1 else ''} ({len(v)})" if v else ""
                 for v in (curve.get(n) for n in sizes)]   # the mean ± twice its standard error, the seeds
        out.append(f"| {cfg['task']} | {cfg['model']} | {cfg['preset']} | {differ} | {' | '.join(cells)} |")
    return "\n".join(out)
