"""Train a minattn model: ``train`` reads top to bottom as restore → loop → finish.

    python train.py --task ctl --model ndr                 # the cpu preset (~30 min on 2 cores)
    python train.py --task ctl --model ndr --preset paper --device gpu
    python train.py --task arith --model transformer --steps 2000 --set d_model=128 --out runs/arith
    python train.py --resume runs/ctl-ndr-cpu-s0           # continue an interrupted run exactly

One readable loop: batches → loss → backward → clip → AdamW step. Every ``--eval-every`` steps: an
evaluation of every split under ``no_grad()``/``eval_mode()``, a line in ``DIR/metrics.jsonl`` and
an atomic ``DIR/checkpoint.npz`` (NumPy arrays and JSON, never a pickle: docs/checkpoints.md); at
the end ``DIR/results.json``. One run holds a directory at a time (``DIR/lock``). A loss or gradient
norm that is not finite stops the run (exit code 3).

What differs between papers (model, presets, batches, loss, evaluation, pictures) is a recipe in
minattn/lab/recipes/, found by task in ``RECIPES``. The rest is the lab's: the command line and the
modes that read a trained run are minattn/lab/cli.py, the settings by name minattn/lab/settings.py,
the run directory's files minattn/lab/rundir.py.

Model selection is each task's ``Selection`` (minattn/lab/recipes/base.py), e.g. the NDR paper's
(docs/ndr.md §6): "iid" at the end of training, "test" at the best "valid" evaluation (ties: the later).

Randomness: parameters are initialised from ``--seed``; the data order comes from a NumPy generator
seeded from it; the dropout masks of step k from ``RNG(seed).reseed(k)``. So ``--resume`` replays
the data stream up to the saved step and continues bit for bit.
"""
import dataclasses
import json
import math
import os
import signal
import sys
import time

if __name__ == "__main__":   # a signal while the imports below run (before main() handles it)
    for _sig, _code in ((signal.SIGINT, 130), (signal.SIGTERM, 143)):
        signal.signal(_sig, lambda signum, frame, code=_code: (
            print("interrupted" if code == 130 else "terminated", file=sys.stderr), os._exit(code)))

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # before NumPy loads BLAS; see README "Speed"

import numpy as np  # noqa: E402
from tqdm import tqdm  # noqa: E402

from minattn import backend, optim  # noqa: E402
from minattn.lab import cli  # noqa: E402
from minattn.lab.errors import Diverged, UsageError  # noqa: E402
from minattn.lab.recipes import RECIPES, recipe_for  # noqa: E402, F401 (RECIPES: for scripts)
from minattn.lab.recipes.base import optimizer, schedule, stop_early  # noqa: E402
from minattn.lab.rundir import (CHECKPOINT, Terminated, append_line, defer_sigterm,  # noqa: E402, F401
                                load_checkpoint, locked, repair_log, save_checkpoint, to_json,
                                write_atomic)
from minattn.lab.settings import (make_config, path_flags, resume_check,  # noqa: E402, F401
                                  user_values)   # (make_config: for scripts and the tests too)


@dataclasses.dataclass
class Sums:
    """The training numbers of the steps since the last evaluation, summed where they are: on the
    device, read only when logged. The divergence guard reads them then too, rather than syncing
    every step: a NaN or inf stays in a sum until it is read."""
    loss: object = 0.0
    norm: object = 0.0                 # of the gradients, before clipping (0 without clipping)
    stats: dict = dataclasses.field(default_factory=dict)   # the recipe's, e.g. correct predictions
    samples: int = 0
    batches: int = 0

    def add(self, loss, norm, stats, n):
        self.loss, self.norm = self.loss + loss, self.norm + norm
        for k, v in stats.items():
            self.stats[k] = self.stats.get(k, 0) + v
        self.samples, self.batches = self.samples + n, self.batches + 1


@dataclasses.dataclass
class Run:
    """A run in progress: what it trains with, then what its checkpoint holds."""
    cfg: object
    out_dir: str
    recipe: object                     # the paper's model, batches, loss and evaluation
    rule: object                       # its model selection (a ``Selection``)
    model: object
    opt: object
    stream: object                     # the training batches: a pure function of the seed
    step: int = 0
    start_step: int = 0                # where this invocation started
    train_time: float = 0.0            # seconds in training steps (not evaluations, checkpoints)
    history: list = dataclasses.field(default_factory=list)   # the log's entries
    best: dict = dataclasses.field(default_factory=lambda: {"metric": None, "metrics": {},
                                                            "step": None})
    last: dict = dataclasses.field(default_factory=dict)      # the metrics of the last evaluation
    selected: dict = None              # the parameters of the selected evaluation (``rule.once``)
    sums: Sums = dataclasses.field(default_factory=Sums)
    diverged: str = None               # what was not finite: "training loss" or "gradient norm"

    @property
    def log_path(self):
        return os.path.join(self.out_dir, "metrics.jsonl")


def train(cfg, out_dir, resume=False, progress=True):
    """Run (or continue) training as configured, holding the run directory's lock; returns the
    results written to results.json. On ``resume``, ``cfg.steps`` and ``cfg.eval_every`` None mean
    the run's own."""
    backend.get_xp(cfg.device)         # a missing GPU fails here, before any work
    with locked(out_dir):
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):   # (the guard)
            run = restore(cfg, out_dir, resume)
            try:
                loop(run, progress)
            except Terminated:   # SIGTERM: the step it came in is saved with its interval's sums
                if run.sums.batches and not run.diverged:   # (an evaluation it cut: the resume's)
                    checkpoint(run, running=True)
                raise
            return finish(run)


def restore(cfg, out_dir, resume):
    """The run at its start: the recipe's data and model and a fresh optimizer, or on ``resume`` the
    checkpoint's state; the data stream replayed up to its step."""
    if resume:   # refused unless the checkpoint is this run's and whole
        ckpt = resume_check(cfg, out_dir)
    elif os.path.exists(os.path.join(out_dir, CHECKPOINT)):
        raise UsageError(f"{out_dir} already holds a checkpoint: pass --resume to continue it, "
                         "or choose another --out")

    cfg = schedule(cfg)   # steps and evaluations counted in epochs: resolved before the recipe
    recipe = recipe_for(cfg.task)(cfg)
    with user_values():
        rule = recipe.selection
        recipe.load_task()
        model = recipe.build_model().to(cfg.device)
        stream = recipe.batches(np.random.default_rng([cfg.seed, 1]))   # a function of the seed
    run = Run(cfg, out_dir, recipe, rule, model, optimizer(cfg, model.parameters()), stream)

    if resume:
        try:
            model.load_state_dict(ckpt["model"])
            run.opt.load_state_dict(ckpt["optimizer"])
        except ValueError as e:
            raise UsageError(f"checkpoint {os.path.join(out_dir, CHECKPOINT)} does not fit the "
                             f"model: {e}") from None
        run.step, run.best, run.train_time = ckpt["step"], ckpt["best"], ckpt["train_time"]
        run.history, run.selected = ckpt["history"], ckpt["selected"]
        run.last = ckpt["last"]
        r = ckpt.get("running")   # saved between evaluations (SIGTERM)
        if r:
            sums = {k: backend.to_device(v, cfg.device) for k, v in ckpt["running_sums"].items()}
            run.sums = Sums(sums["loss_sum"], sums["norm_sum"], {k: sums[f"stats/{k}"] for k in r["stats"]},
                            r["seen"], r["n_batches"])
        repair_log(run.log_path, run.history, run.step)
    elif os.path.exists(run.log_path):
        os.remove(run.log_path)
    for _ in range(run.step):   # replay the data stream up to the current step
        next(stream)
    run.start_step = run.step
    print(f"{'resuming' if run.step else 'training'} {cfg.task} / {cfg.model} ({cfg.preset} "
          f"preset, seed {cfg.seed}) on {cfg.device} in {out_dir}: step {run.step} of "
          f"{cfg.steps}, batch {cfg.batch_size}, lr {cfg.lr:g}, an evaluation every "
          f"{cfg.eval_every} steps", file=sys.stderr)
    return run


def loop(run, progress):
    """Train up to ``cfg.steps``: batches → loss → backward → clip → AdamW step; every
    ``eval_every`` steps (and after the last) an evaluation, a line in the log and a checkpoint.
    SIGTERM stops the loop at the end of its step (in an evaluation: at once), which ``train``
    saves; a loss that is not finite stops the loop at the next evaluation."""
    cfg, recipe, model, opt = run.cfg, run.recipe, run.model, run.opt
    rng = backend.RNG(cfg.seed, cfg.device)
    bar = tqdm(total=cfg.steps, initial=run.step, disable=not progress,
               desc=f"{cfg.task}/{cfg.model}", unit="step")
    model.train()
    while True:
        defer_sigterm(True)           # SIGTERM waits for the end of the step, then stops the run
        if run.sums.batches and (run.step % cfg.eval_every == 0 or run.step == cfg.steps):
            entry = evaluate(run, bar)
            if run.diverged:          # the last checkpoint (finite weights) stays as it is
                break
            bar.set_postfix({k: v for k, v in entry.items() if k not in ("step", "wall_s")})
            run.sums = Sums()
            checkpoint(run)
            bar.unpause()             # rate and ETA count training, not evaluation and checkpoint
        if run.step >= cfg.steps or stop_early(cfg, run.rule, run.step, run.history):
            break

        t0 = time.perf_counter()
        batch = next(run.stream)
        model.set_rng(rng.reseed(run.step))   # step k's masks, also after a resume
        loss, stats, n = recipe.loss(model, batch)
        opt.zero_grad()
        loss.backward()
        norm = optim.clip_grad_norm(model.parameters(), cfg.grad_clip) if cfg.grad_clip else 0.0
        opt.step()
        run.step += 1
        run.sums.add(loss.data, norm, stats, n)
        run.train_time += time.perf_counter() - t0
        bar.update(1)
    defer_sigterm(False)              # (a SIGTERM after the last step stops the run here)
    bar.close()


def evaluate(run, bar):
    """The evaluation at ``run.step``: the interval's training means and, unless one of them is not
    finite (``run.diverged``), the recipe's metrics; the selection; the entry appended to the log
    and returned."""
    sums, rule = run.sums, run.rule
    loss, norm = (float(backend.to_numpy(x)) for x in (sums.loss, sums.norm))
    entry = {"step": run.step, "train_loss": round(loss / sums.batches, 5)}
    entry.update({f"train_{k}": round(float(backend.to_numpy(v)) / sums.samples, 5)
                  for k, v in sums.stats.items()})
    run.diverged = next((what for what, value in (("training loss", loss), ("gradient norm", norm))
                         if not math.isfinite(value)), None)
    if not run.diverged:
        bar.set_postfix_str("evaluating…", refresh=True)   # or the bar looks frozen meanwhile
        run.model.eval()              # with eval_mode() in the recipes: dropout off either way
        defer_sigterm(False)          # SIGTERM: the evaluation (a minute, maybe) is abandoned
        entry.update(run.recipe.log_extra(run.model))
        run.last = run.recipe.evaluate(run.model)
        defer_sigterm(True)
        entry.update(run.last)
        run.model.train()
    entry["wall_s"] = round(run.train_time, 1)
    metric, best = entry.get(rule.metric), run.best["metric"]
    # model selection: ties go to the later evaluation (docs/ndr.md §6)
    if metric is not None and (best is None or (metric >= best if rule.higher else metric <= best)):
        run.best = {"metric": metric, "metrics": dict(run.last), "step": run.step}
        if rule.once:                 # the selected parameters, for evaluate_selected() at the end
            run.selected = run.model.state_dict()
    entry = to_json(entry)
    run.history.append(entry)
    append_line(run.log_path, json.dumps(entry, allow_nan=False) + "\n")   # a kill tears only this
    return entry


def checkpoint(run, running=False):
    """Save the run atomically; ``running``: with the sums of the evaluation interval so far."""
    cfg = run.cfg
    save_checkpoint(os.path.join(run.out_dir, CHECKPOINT),
                    {"config": dataclasses.asdict(cfg),
                     "step": run.step, "best": run.best, "last": run.last,
                     "train_time": run.train_time, "history": run.history,
                     **path_flags(cfg.device)},   # the path it trains on: see settings.resume_check
                    run.model.state_dict(), run.opt.state_dict(), run.selected,
                    dataclasses.astuple(run.sums) if running else None)


def finish(run):
    """results.json: the selected evaluation's metrics (the rule's ``final`` ones from the last
    evaluation, its ``once`` ones computed now with the selected parameters), the run's timing and
    configuration."""
    cfg, rule, step = run.cfg, run.rule, run.step
    metrics = {k: v if k in rule.final else run.best["metrics"].get(k, v)
               for k, v in run.last.items()}
    if rule.once and run.selected is not None and not run.diverged:
        run.model.load_state_dict(run.selected)   # training is over and checkpointed
        run.model.eval()
        with user_values():
            metrics.update(run.recipe.evaluate_selected(run.model))
    results = {
        "task": cfg.task, "model": cfg.model, "preset": cfg.preset, "seed": cfg.seed,
        "device": cfg.device, "steps": step, "wall_s": round(run.train_time, 2),
        "ms_per_step": round(1000 * run.train_time / step, 3) if step else None,
        "metrics": metrics, "final_metrics": run.last,
        "best_step": run.best["step"], "steps_this_invocation": step - run.start_step,
        "config": dataclasses.asdict(cfg),
    }
    if run.diverged:
        results["diverged_at"] = step
    write_atomic(os.path.join(run.out_dir, "results.json"),
                 lambda f: json.dump(to_json(results), f, indent=2, allow_nan=False))
    if run.diverged:
        saved = step - run.sums.batches
        raise Diverged(f"the {run.diverged} is not finite at step {step}, so training stopped (a "
                       f"lower --lr may help); {run.log_path} and results.json are written, "
                       + (f"the checkpoint is that of step {saved}" if saved else
                          "no checkpoint was written"))
    return results


def main(argv=None):
    """The command line (minattn/lab/cli.py), training with ``train`` above."""
    return cli.main(argv, train)


if __name__ == "__main__":
    backend.keep_freed_memory()  # fewer page faults per step; see its docstring
    sys.exit(main())
