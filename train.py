"""Train and evaluate minattn models from the command line.

    python train.py --task ctl --model ndr                 # the cpu preset (fits ~30 min on 2 cores)
    python train.py --task ctl --model ndr --preset paper --device gpu
    python train.py --task arith --model transformer --steps 2000 --set d_model=128 --out runs/arith
    python train.py --resume --out runs/ctl-ndr            # continue an interrupted run exactly

One readable loop: batches → loss → backward → clip → AdamW step; every ``--eval-every`` steps an
evaluation of every split under ``no_grad()``/``eval_mode()``, a line in ``DIR/metrics.jsonl`` and an
atomic checkpoint (model, optimizer, step, best result); at the end ``DIR/results.json``.

Model selection follows the NDR paper (spec ndr.md §6.6): "iid" is the IID accuracy at the end of
training; "test" is the test accuracy at the evaluation with the best "valid" accuracy (ties go to
the later one), reported with that "best_step".

Randomness: parameters are initialised from ``--seed``; the data order comes from a NumPy generator
seeded from it; dropout and gate-dropout masks of step k come from ``RNG(seed).fork(k)``. So
``--resume`` replays the data stream up to the saved step and continues bit for bit.
"""
import argparse
import dataclasses
import json
import os
import pickle
import sys
import tempfile
import time

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # before NumPy loads BLAS; see README "Speed"

import numpy as np  # noqa: E402
from tqdm import tqdm  # noqa: E402

import tasks  # noqa: E402
from minattn import backend, optim  # noqa: E402
from minattn import functional as F  # noqa: E402
from minattn.engine import eval_mode, no_grad  # noqa: E402
from minattn.models.transformer import ARCHITECTURES, Classifier, EncoderConfig  # noqa: E402

CHECKPOINT_VERSION = 1


class UsageError(Exception):
    """Bad input from the user: printed as one line, exit code 2."""


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
    grad_clip: float = 5.0         # global L2 norm
    batching: str = "bucketed"     # "bucketed" (length-sorted batches) or "random" (with replacement)
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
    metric_higher_is_better = True

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

    def log_extra(self, model):
        """Extra numbers for the metrics log (e.g. the mean gate)."""
        return {}


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

# "cpu": sized for a 2-core machine (~30 min per run). Only the model, batch and number of steps
# shrink; the task is the paper's. NDR settings from the PyTorch calibration run of the NDR issue.
_CPU = {
    "ndr": dict(d_model=128, d_ff=256, n_head=1, dropout=0.3, attention_dropout=0.1, gate_dropout=0.1),
    "transformer-rel-gate": dict(d_model=128, n_head=1, dropout=0.3, attention_dropout=0.1),
    "transformer-absrel-gate": dict(d_model=128, n_head=1, dropout=0.3, attention_dropout=0.1),
}
_CPU_STEPS = {"ctl": 4000, "arith": 3000, "listops": 3000}


def _task_family(task):
    return "ctl" if task.startswith("ctl") else task


def _classification_config(task, model, preset):
    """Presets of the NDR paper's models on CTL, arithmetic and ListOps (spec ndr.md §8)."""
    family = _task_family(task)
    d, d_ff, H, n_steps, lr, wd, drop, att_drop, gate_drop, iters = _PAPER[(family, model)]
    gated = model in ("ndr", "transformer-rel-gate", "transformer-absrel-gate")
    if family == "listops":
        readout = "sos"
    elif family == "arith" and model in ("transformer", "transformer-rel"):
        readout = "sos"   # the code's default for these two (spec §1.4)
    else:
        readout = "eos"
    if gated or (family == "listops" and model == "transformer"):
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
        cfg.batch_size, cfg.steps, cfg.eval_every = 128, _CPU_STEPS[family], 500
        cfg.lr = 3e-4
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
        return Classifier(self.cfg.model, len(self.task.vocab), len(self.task.classes), self.cfg.model_config,
                          seed=self.cfg.seed)

    def batches(self, rng):
        return tasks.batches(self.task.splits["train"], self.cfg.batch_size, rng, self.cfg.batching)

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
        """Mean copy-gate activation on a few IID samples: the spec warns gates can stay shut."""
        if self.cfg.model not in ("ndr", "transformer-rel-gate", "transformer-absrel-gate"):
            return {}
        x, lengths, _ = self._to_device(next(tasks.eval_batches(self.task.splits["iid"], 256)))
        trace = []
        with no_grad(), eval_mode():
            model(x, lengths, trace=trace)
        return {"gate_mean": round(float(np.mean([backend.to_numpy(g.data).mean() for _, g in trace])), 4)}


FAMILIES = [ClassificationFamily]


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
    cfg = fam.config(task, model, preset)
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
    return cfg


def _run_fields():
    return [f.name for f in dataclasses.fields(RunConfig) if f.name != "model_config"]


def _parse_value(key, text, task):
    """--set values take the type of the field they override."""
    model_config = family_of(task).config(task, family_of(task).models[0], "cpu").model_config
    field_types = {f.name: f.type for f in dataclasses.fields(model_config)}
    field_types.update({f.name: f.type for f in dataclasses.fields(RunConfig)})
    kind = field_types.get(key)
    if kind is None:
        raise UsageError(f"unknown setting {key!r} in --set")
    try:
        return {"int": int, "float": float, "str": str}.get(getattr(kind, "__name__", kind), str)(text)
    except ValueError:
        raise UsageError(f"--set {key}={text}: expected {kind}") from None


# --- checkpoints ------------------------------------------------------------------------------------------

def save_atomic(path, obj):
    """Write to a temporary file in the same directory, then rename: a crash never leaves half a file."""
    d = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=d, prefix=".tmp-")
    try:
        with os.fdopen(fd, "wb") as f:
            pickle.dump(obj, f, protocol=pickle.HIGHEST_PROTOCOL)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def load_checkpoint(path):
    try:
        with open(path, "rb") as f:
            ckpt = pickle.load(f)
    except FileNotFoundError:
        raise UsageError(f"no checkpoint at {path} to resume from") from None
    except Exception as e:
        raise UsageError(f"checkpoint {path} is corrupted or unreadable ({e.__class__.__name__})") from None
    if not isinstance(ckpt, dict) or ckpt.get("version") != CHECKPOINT_VERSION:
        raise UsageError(f"checkpoint {path} is not a minattn checkpoint of version {CHECKPOINT_VERSION}")
    return ckpt


def _identity(cfg):
    """What must match for a checkpoint to belong to this run (the step budget may grow)."""
    d = dataclasses.asdict(cfg)
    for k in ("steps", "device", "eval_every", "eval_batch_size"):
        d.pop(k)
    return d


# --- the loop ---------------------------------------------------------------------------------------------

def _better(new, old, higher_is_better):
    """Model selection: ties go to the later evaluation (spec ndr.md §6.6)."""
    if old is None:
        return True
    return new >= old if higher_is_better else new <= old


def train(cfg, out_dir, resume=False, progress=True):
    """Run (or continue) training as configured; returns the results dict written to results.json."""
    backend.get_xp(cfg.device)  # a missing GPU fails here, before any work
    os.makedirs(out_dir, exist_ok=True)
    ckpt_path = os.path.join(out_dir, "checkpoint.pkl")
    log_path = os.path.join(out_dir, "metrics.jsonl")
    if os.path.exists(ckpt_path) and not resume:
        raise UsageError(f"{out_dir} already holds a checkpoint: pass --resume to continue it, "
                         "or choose another --out")

    fam = family_of(cfg.task)(cfg)
    fam.load_task()
    model = fam.build_model().to(cfg.device)
    opt = optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    step, train_time, history = 0, 0.0, []
    best = {"metric": None, "metrics": {}, "step": None}

    if resume:
        ckpt = load_checkpoint(ckpt_path)
        if ckpt["identity"] != _identity(cfg):
            diff = sorted(k for k in _identity(cfg) if ckpt["identity"].get(k) != _identity(cfg)[k])
            raise UsageError(f"checkpoint in {out_dir} was written by a different run (differs in: {', '.join(diff)}); "
                             "nothing was overwritten")
        try:
            model.load_state_dict(ckpt["model"])
            opt.load_state_dict(ckpt["optimizer"])
        except ValueError as e:
            raise UsageError(f"checkpoint {ckpt_path} does not fit the model: {e}") from None
        step, best, train_time = ckpt["step"], ckpt["best"], ckpt["train_time"]
        if os.path.exists(log_path):  # drop log lines written after the checkpoint
            with open(log_path) as f:
                history = [h for h in (json.loads(line) for line in f if line.strip()) if h["step"] <= step]
            with open(log_path, "w") as f:
                f.writelines(json.dumps(h) + "\n" for h in history)
    elif os.path.exists(log_path):
        os.remove(log_path)

    # The data stream is a pure function of the seed: replay it up to the current step.
    stream = fam.batches(np.random.default_rng([cfg.seed, 1]))
    for _ in range(step):
        next(stream)
    run_rng = backend.RNG(cfg.seed, cfg.device)

    def checkpoint():
        save_atomic(ckpt_path, {"version": CHECKPOINT_VERSION, "identity": _identity(cfg),
                                "config": dataclasses.asdict(cfg), "step": step, "best": best,
                                "train_time": train_time, "model": model.state_dict(), "optimizer": opt.state_dict()})

    bar = tqdm(total=cfg.steps, initial=step, disable=not progress, desc=f"{cfg.task}/{cfg.model}", unit="step")
    start_step, loss_sum, stats, seen, n_batches = step, 0.0, {}, 0, 0
    model.train()
    while step < cfg.steps:
        t0 = time.perf_counter()
        batch = next(stream)
        model.set_rng(run_rng.fork(step))     # dropout masks of step k are the same after a resume
        loss, batch_stats, n = fam.loss(model, batch)
        opt.zero_grad()
        loss.backward()
        optim.clip_grad_norm(model.parameters(), cfg.grad_clip)
        opt.step()
        step += 1
        # running statistics stay on the device; they are read only when logged
        loss_sum = loss_sum + loss.data
        for k, v in batch_stats.items():
            stats[k] = stats.get(k, 0) + v
        seen, n_batches = seen + n, n_batches + 1
        train_time += time.perf_counter() - t0
        bar.update(1)
        if step % cfg.eval_every == 0 or step == cfg.steps:
            entry = {"step": step, "train_loss": round(float(backend.to_numpy(loss_sum)) / n_batches, 5)}
            entry.update({f"train_{k}": round(float(backend.to_numpy(v)) / seen, 5) for k, v in stats.items()})
            entry.update(fam.log_extra(model))
            entry.update(fam.evaluate(model))
            model.train()
            entry["wall_s"] = round(train_time, 1)
            selected = entry.get(fam.select_split)
            if selected is not None and _better(selected, best["metric"], fam.metric_higher_is_better):
                best = {"metric": selected, "metrics": {k: v for k, v in entry.items()}, "step": step}
            history.append(entry)
            with open(log_path, "a") as f:
                f.write(json.dumps(entry) + "\n")
            bar.set_postfix({k: v for k, v in entry.items() if k not in ("step", "wall_s")})
            loss_sum, stats, seen, n_batches = 0.0, {}, 0, 0
            checkpoint()
    bar.close()

    final = history[-1] if history else {}
    split_names = [k for k in final if k not in ("step", "wall_s", "train_loss") and not k.startswith("train_")
                   and not k.startswith("gate")]
    metrics = {k: (final.get(k) if k in fam.report_final else best["metrics"].get(k, final.get(k)))
               for k in split_names}
    results = {
        "task": cfg.task, "model": cfg.model, "preset": cfg.preset, "seed": cfg.seed, "device": cfg.device,
        "steps": step, "wall_s": round(train_time, 2),
        "ms_per_step": round(1000 * train_time / step, 3) if step else None,
        "metrics": metrics, "final_metrics": {k: final.get(k) for k in split_names},
        "best_step": best["step"], "steps_this_invocation": step - start_step,
        "config": dataclasses.asdict(cfg),
    }
    with open(os.path.join(out_dir, "results.json"), "w") as f:
        json.dump(results, f, indent=2)
    return results


def report(paths):
    """Markdown table of finished runs (their results.json) and each run's learning curve."""
    rows, curves = [], []
    for d in paths:
        f = os.path.join(d, "results.json")
        if not os.path.exists(f):
            raise UsageError(f"{d} has no results.json (is the run finished?)")
        r = json.load(open(f))
        m = ", ".join(f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}" for k, v in r["metrics"].items())
        rows.append(f"| {r['task']} | {r['model']} | {r['preset']} | {r['seed']} | {r['steps']} | {m} | "
                    f"{r['best_step']} | {r['wall_s'] / 60:.1f} min | {r['ms_per_step']:.0f} |")
        log = [json.loads(line) for line in open(os.path.join(d, "metrics.jsonl"))]
        keys = [k for k in log[-1] if k not in ("step", "wall_s")]
        curves.append(f"\n{r['task']} / {r['model']} (seed {r['seed']}):\n\n| step | " + " | ".join(keys) +
                      " |\n|" + "---|" * (len(keys) + 1) + "\n" +
                      "\n".join(f"| {e['step']} | " + " | ".join(str(e.get(k, "")) for k in keys) + " |" for e in log))
    print("| task | model | preset | seed | steps | metrics | best step | train time | ms/step |")
    print("|---|---|---|---|---|---|---|---|---|")
    print("\n".join(rows))
    print("\n".join(curves))


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--task", default="ctl", help="one of: " + ", ".join(t for f in FAMILIES for t in f.tasks))
    ap.add_argument("--model", default="ndr", help="one of: " + ", ".join(m for f in FAMILIES for m in f.models))
    ap.add_argument("--device", default="cpu", help="cpu or gpu (needs CuPy: pip install cupy-cuda12x)")
    ap.add_argument("--preset", default="cpu", help="cpu (default; ~30 min on 2 cores) or paper (the paper's "
                    "hyperparameters, for a GPU)")
    ap.add_argument("--steps", type=int, help="optimizer steps (default: the preset's)")
    ap.add_argument("--batch-size", type=int, help="training batch size (default: the preset's)")
    ap.add_argument("--lr", type=float, help="learning rate (default: the preset's)")
    ap.add_argument("--seed", type=int, default=0, help="seed of initialisation, data order and dropout")
    ap.add_argument("--eval-every", type=int, help="evaluate and checkpoint every N steps")
    ap.add_argument("--out", help="run directory (default: runs/TASK-MODEL-PRESET-sSEED)")
    ap.add_argument("--resume", action="store_true", help="continue the checkpoint in --out exactly")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="override any setting, e.g. --set d_model=64 --set n_steps=10 --set batching=random")
    ap.add_argument("--no-progress", action="store_true", help="no progress bar")
    ap.add_argument("--report", nargs="+", metavar="DIR", help="print a markdown table of finished runs and exit")
    return ap.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    try:
        if args.report:
            report(args.report)
            return 0
        family_of(args.task)
        if args.device not in ("cpu", "gpu"):
            raise UsageError(f"unknown device {args.device!r}; valid devices: cpu, gpu")
        overrides = {}
        for item in args.set:
            if "=" not in item:
                raise UsageError(f"--set expects KEY=VALUE, got {item!r}")
            key, value = item.split("=", 1)
            overrides[key] = _parse_value(key, value, args.task)
        cfg = make_config(args.task, args.model, args.preset, seed=args.seed, device=args.device, steps=args.steps,
                          batch_size=args.batch_size, lr=args.lr, eval_every=args.eval_every, **overrides)
        out = args.out or os.path.join("runs", f"{args.task}-{args.model}-{args.preset}-s{args.seed}")
        results = train(cfg, out, resume=args.resume, progress=not args.no_progress)
    except (UsageError, backend.DeviceError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted: the last checkpoint is intact; continue with --resume", file=sys.stderr)
        return 130
    print(json.dumps({k: results[k] for k in ("task", "model", "steps", "wall_s", "ms_per_step", "metrics",
                                             "best_step")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
