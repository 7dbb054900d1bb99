"""The run directory: one writer at a time, files replaced atomically, checkpoints as .npz + JSON (never a
pickle; the format is docs/checkpoints.md), the metrics log kept in step with the checkpoint, and the
report of finished runs (``train.py --report``).

A run directory holds: lock (its writer's pid), checkpoint.npz, metrics.jsonl (one line per evaluation,
appended) and, at the end, results.json. Every file but the log is replaced whole, atomically.
"""
import contextlib
import dataclasses
import fcntl
import json
import os
import sys
import tempfile

import numpy as np

from .errors import UsageError

CHECKPOINT_VERSION = 2   # 1: checkpoint.pkl (pickle), read only by --convert


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
# is a function of its seed and the step (see train.py's module docstring).
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
    if os.path.exists(os.path.join(out_dir, CHECKPOINT)):   # converted before, and maybe trained on since
        raise UsageError(f"{out_dir} already holds {CHECKPOINT}, which is read instead of checkpoint.pkl; "
                         "nothing was overwritten (delete checkpoint.pkl)")
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
        history = [h for h in read_log(log) if h["step"] <= old["step"]] if os.path.exists(log) else []
        params, opt_state, selected = state
        metadata = {k: old[k] for k in ("identity", "config", "step", "best", "train_time")}
        save_checkpoint(os.path.join(out_dir, CHECKPOINT), dict(metadata, history=history), params, opt_state, selected)
    print(f"wrote {os.path.join(out_dir, CHECKPOINT)}; {path} is no longer read and may be deleted", file=sys.stderr)


def identity(cfg):
    """What must match for a checkpoint to belong to this run (the step budget may grow), as JSON has it."""
    d = dataclasses.asdict(cfg)
    for k in ("steps", "device", "eval_every", "eval_batch_size"):
        d.pop(k)
    return json.loads(json.dumps(to_json(d)))


def read_log(path):
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


def repair_log(path, history, step):
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


REPORT_FIELDS = ("task", "model", "preset", "seed", "steps", "metrics", "best_step", "wall_s", "ms_per_step", "config")


def finished_run(d):
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
        log = read_log(os.path.join(d, "metrics.jsonl"))
    except OSError:
        log = []
    return r, log


def _cell(v):
    """A learning-curve entry: floats to 4 decimals (an accuracy 1/12 is 0.0833), a missing or diverged one
    (None) empty."""
    return "" if v is None else f"{v:.4f}" if isinstance(v, float) else str(v)


def report(paths):
    """Markdown table of finished runs (their results.json) and each run's learning curve. Directories that
    hold no finished run are skipped with a warning; a run is counted once, however often it is listed or
    copied: runs with one configuration (seed included; device aside) are one run, as training is deterministic."""
    rows, curves, groups, seen = [], [], {}, {}
    for d in paths:
        try:
            r, log = finished_run(d)
        except UsageError as e:
            print(f"warning: skipped: {e}", file=sys.stderr)
            continue
        run_key = json.dumps({k: v for k, v in r["config"].items() if k != "device"}, sort_keys=True)
        if run_key in seen:
            print(f"warning: skipped {d}: the same run as {seen[run_key]}", file=sys.stderr)
            continue
        seen[run_key] = d
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
                      "\n".join(f"| {e['step']} | " + " | ".join(_cell(e.get(k)) for k in keys) + " |" for e in log))
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
    size_curves = _size_curves([run for _, _, runs in groups.values() for run in runs])
    if size_curves:
        print(size_curves)
    print("\n".join(curves))


SIZE_CURVE_FREE = ("seed", "device", "model_config", "steps", "eval_every")   # what a learning curve's points may differ in


def _size_curves(runs):
    """Markdown table of the test metric over the training-set size (mean over seeds, their number in
    brackets), one row per experiment, when one of them was run at two sizes or more: the learning curves of
    the Abstractor paper's figures. Settings other than the seed and the size that tell two rows of one model
    apart (e.g. ``init keras``) are named in the row."""
    rows = {}
    for r in runs:
        # the run's identity (as in the rows above) and its settings, model_config's by name
        cfg = {**r["config"], **r["config"].get("model_config", {}), "task": r["task"], "model": r["model"],
               "preset": r["preset"]}
        size = cfg.pop("train_size", None)
        if size and isinstance(r["metrics"].get("test"), float):
            # the step count follows from the size (epochs of it), so it does not tell curves apart
            key = json.dumps({k: v for k, v in cfg.items() if k not in SIZE_CURVE_FREE}, sort_keys=True)
            rows.setdefault(key, {}).setdefault(size, []).append((r["steps"], r["metrics"]["test"]))
    for key, curve in rows.items():
        for size, cell in curve.items():
            if len({steps for steps, _ in cell}) > 1:
                print(f"warning: the learning curve of {json.loads(key)['model']} averages runs of {size} examples "
                      f"with different step counts ({sorted({steps for steps, _ in cell}, key=str)})", file=sys.stderr)
            curve[size] = [test for _, test in cell]
    rows = [(json.loads(k), curve) for k, curve in rows.items()]
    if all(len(curve) < 2 for _, curve in rows):   # no run spans sizes: the tables above say it all
        return ""
    sizes = sorted({n for _, curve in rows for n in curve})
    out = ["\nTest over the training-set size (mean over seeds, their number in brackets):\n",
           "| task | model | preset | settings | " + " | ".join(map(str, sizes)) + " |",
           "|---|---|---|---|" + "---|" * len(sizes)]
    for cfg, curve in sorted(rows, key=lambda row: (row[0]["task"], row[0]["model"], json.dumps(row[0]))):
        twins = [c for c, _ in rows if (c["task"], c["model"], c["preset"]) == (cfg["task"], cfg["model"], cfg["preset"])]
        differ = ", ".join(f"{k} {cfg.get(k)}" for k in sorted({k for c in twins for k in c})
                           if any(c.get(k) != cfg.get(k) for c in twins))
        out.append(f"| {cfg['task']} | {cfg['model']} | {cfg['preset']} | {differ} | " + " | ".join(
            f"{np.mean(curve[n]):.3f} ({len(curve[n])})" if n in curve else "" for n in sizes) + " |")
    return "\n".join(out)
