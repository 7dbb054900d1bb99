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
    lr: float = 3e-4               # constant, no warm-up or decay (spec §6.2)
    weight_decay: float = 0.01     # AdamW, on all parameters (spec §6.1)
    grad_clip: float = 5.0         # global L2 norm (5 for CTL, 1 for arithmetic and ListOps)
    batching: str = "bucketed"     # "bucketed" (length-sorted batches) or "random" (with replacement)
    eval_every: int = 500
    eval_batch_size: int = 1024
    encoder: EncoderConfig = dataclasses.field(default_factory=EncoderConfig)


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


def make_config(task, model, preset="cpu", **overrides):
    """The full configuration of a run: the preset for (task, model), then explicit overrides."""
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
                    eval_every=1000, encoder=enc)
    if preset == "cpu":
        cfg.batch_size, cfg.steps, cfg.eval_every = 128, _CPU_STEPS[family], 500
        cfg.lr = 3e-4
        cfg.encoder = dataclasses.replace(enc, **_CPU.get(model, {}))
    elif preset != "paper":
        raise UsageError(f"unknown preset {preset!r}; valid presets: cpu, paper")
    enc_fields = {f.name for f in dataclasses.fields(EncoderConfig)}
    for key, value in overrides.items():
        if value is None:
            continue
        if key in enc_fields:
            cfg.encoder = dataclasses.replace(cfg.encoder, **{key: value})
        elif hasattr(cfg, key):
            setattr(cfg, key, value)
        else:
            raise UsageError(f"unknown setting {key!r}; valid: {', '.join(sorted(enc_fields | set(_run_fields())))}")
    return cfg


def _run_fields():
    return [f.name for f in dataclasses.fields(RunConfig) if f.name != "encoder"]


def _parse_value(key, text):
    """--set values take the type of the field they override."""
    field_types = {f.name: f.type for f in dataclasses.fields(EncoderConfig)}
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

def evaluate(model, split, batch_size, device, n_classes):
    """Accuracy on a split: forward passes only, nothing recorded, dropout off."""
    xp = backend.get_xp(device)
    correct = xp.zeros((), dtype=np.int64)
    with no_grad(), eval_mode():
        for x, lengths, y in tasks.eval_batches(split, batch_size):
            logits = model(backend.to_device(x, device), backend.to_device(lengths, device))
            correct = correct + (logits.data.argmax(-1) == backend.to_device(y, device)).sum()
    return float(backend.to_numpy(correct)) / len(split)


def train(cfg, out_dir, resume=False, progress=True):
    """Run (or continue) training as configured; returns the results dict written to results.json."""
    backend.get_xp(cfg.device)  # a missing GPU fails here, before any work
    os.makedirs(out_dir, exist_ok=True)
    ckpt_path = os.path.join(out_dir, "checkpoint.pkl")
    log_path = os.path.join(out_dir, "metrics.jsonl")
    if os.path.exists(ckpt_path) and not resume:
        raise UsageError(f"{out_dir} already holds a checkpoint: pass --resume to continue it, "
                         "or choose another --out")

    task = tasks.get_task(cfg.task, seed=0)
    n_classes = len(task.classes)
    model = Classifier(cfg.model, len(task.vocab), n_classes, cfg.encoder, seed=cfg.seed).to(cfg.device)
    opt = optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    step, best, history = 0, {"valid": -1.0, "test": None, "step": None}, []
    train_time = 0.0

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
                history = [json.loads(line) for line in f if line.strip()]
            history = [h for h in history if h["step"] <= step]
            with open(log_path, "w") as f:
                f.writelines(json.dumps(h) + "\n" for h in history)
    elif os.path.exists(log_path):
        os.remove(log_path)

    # The data stream is a pure function of the seed: replay it up to the current step.
    stream = tasks.batches(task.splits["train"], cfg.batch_size, np.random.default_rng([cfg.seed, 1]), cfg.batching)
    for _ in range(step):
        next(stream)
    run_rng = backend.RNG(cfg.seed, cfg.device)
    eval_splits = [s for s in ("iid", "valid", "test") if s in task.splits]

    def checkpoint():
        save_atomic(ckpt_path, {"version": CHECKPOINT_VERSION, "identity": _identity(cfg),
                                "config": dataclasses.asdict(cfg), "step": step, "best": best,
                                "train_time": train_time, "model": model.state_dict(), "optimizer": opt.state_dict()})

    bar = tqdm(total=cfg.steps, initial=step, disable=not progress, desc=f"{cfg.task}/{cfg.model}", unit="step")
    start_step, loss_sum, correct_sum, seen = step, None, None, 0
    model.train()
    while step < cfg.steps:
        t0 = time.perf_counter()
        x, lengths, y = next(stream)
        x, lengths, y_dev = (backend.to_device(a, cfg.device) for a in (x, lengths, y))
        model.set_rng(run_rng.fork(step))
        logits = model(x, lengths)
        loss = F.cross_entropy(logits, y_dev)
        opt.zero_grad()
        loss.backward()
        optim.clip_grad_norm(model.parameters(), cfg.grad_clip)
        opt.step()
        step += 1
        # running loss/accuracy stay on the device; they are read only when shown
        batch_correct = (logits.data.argmax(-1) == y_dev).sum()
        loss_sum = loss.data if loss_sum is None else loss_sum + loss.data
        correct_sum = batch_correct if correct_sum is None else correct_sum + batch_correct
        seen += len(y)
        train_time += time.perf_counter() - t0
        bar.update(1)
        if step % cfg.eval_every == 0 or step == cfg.steps:
            n_batches = seen // cfg.batch_size
            entry = {"step": step, "train_loss": float(backend.to_numpy(loss_sum)) / max(n_batches, 1),
                     "train_acc": float(backend.to_numpy(correct_sum)) / max(seen, 1)}
            if cfg.model in ("ndr", "transformer-rel-gate", "transformer-absrel-gate"):
                entry["gate_mean"] = _mean_gate(model, task, cfg.device)
            for s in eval_splits:
                entry[s] = evaluate(model, task.splits[s], cfg.eval_batch_size, cfg.device, n_classes)
            model.train()
            if entry.get("valid", -1) >= best["valid"]:          # ties go to the later evaluation
                best = {"valid": entry["valid"], "test": entry.get("test"), "step": step}
            history.append(entry)
            with open(log_path, "a") as f:
                f.write(json.dumps(entry) + "\n")
            bar.set_postfix(loss=f"{entry['train_loss']:.3f}", iid=entry.get("iid"), valid=entry.get("valid"),
                            test=entry.get("test"))
            loss_sum, correct_sum, seen = None, None, 0
            checkpoint()
    bar.close()

    final = history[-1] if history else {}
    steps_run = step - start_step
    results = {
        "task": cfg.task, "model": cfg.model, "preset": cfg.preset, "seed": cfg.seed, "device": cfg.device,
        "steps": step, "wall_s": round(train_time, 2),
        "ms_per_step": round(1000 * train_time / step, 3) if step else None,
        "metrics": {"iid": final.get("iid"), "valid": best["valid"], "test": best["test"]},
        "final_metrics": {s: final.get(s) for s in eval_splits},
        "best_step": best["step"], "steps_this_invocation": steps_run,
        "config": dataclasses.asdict(cfg),
    }
    with open(os.path.join(out_dir, "results.json"), "w") as f:
        json.dump(results, f, indent=2)
    return results


def _mean_gate(model, task, device, n=256):
    """Mean copy-gate activation on a few IID samples (logged: a closed gate means "copy")."""
    split = task.splits["iid"]
    x, lengths, _ = next(tasks.eval_batches(split, n))
    trace = []
    with no_grad(), eval_mode():
        model(backend.to_device(x, device), backend.to_device(lengths, device), trace=trace)
    return round(float(np.mean([backend.to_numpy(g.data).mean() for _, g in trace])), 4)


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--task", default="ctl", help=f"one of: {', '.join(tasks.TASKS)}")
    ap.add_argument("--model", default="ndr", help=f"one of: {', '.join(ARCHITECTURES)}")
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
    return ap.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    try:
        if args.task not in tasks.TASKS:
            raise UsageError(f"unknown task {args.task!r}; valid tasks: {', '.join(tasks.TASKS)}")
        if args.model not in ARCHITECTURES:
            raise UsageError(f"unknown model {args.model!r}; valid models: {', '.join(ARCHITECTURES)}")
        if args.device not in ("cpu", "gpu"):
            raise UsageError(f"unknown device {args.device!r}; valid devices: cpu, gpu")
        overrides = {}
        for item in args.set:
            if "=" not in item:
                raise UsageError(f"--set expects KEY=VALUE, got {item!r}")
            key, value = item.split("=", 1)
            overrides[key] = _parse_value(key, value)
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
