"""What the lab keeps only for runs saved by older versions of minattn: their pickled checkpoints
(refused, converted on request), checkpoints saved before the last evaluation's metrics were kept
apart, and settings whose default changed after runs were saved. Nothing here is needed to train or
read a new run.

This file is a leaf that rundir.py reads (``convert`` alone writes, through rundir, imported where
it runs).
"""
import os
import sys

from .errors import UsageError

OLD_CHECKPOINT = "checkpoint.pkl"   # checkpoint version 1: a pickle, read only by ``convert``

# Settings added after runs were saved, whose default then changed: the value the older runs trained
# with. Sorting selected and stopped on the validation teacher-forcing accuracy until stop_on came
# (the default is now the training loss, the rule behind the Abstractor paper's Fig. 4).
SAVED_BEFORE = {"sort": {"stop_on": "valid_tf"}}


def old_checkpoint(out_dir):
    """Whether out_dir holds a checkpoint of version 1."""
    return os.path.exists(os.path.join(out_dir, OLD_CHECKPOINT))


def refuse_old_checkpoint(out_dir):
    """A checkpoint.pkl is never loaded: unpickling runs any code the file carries."""
    if old_checkpoint(out_dir):
        raise UsageError(f"{out_dir} holds an old {OLD_CHECKPOINT}, which is not loaded because "
                         f"unpickling runs any code the file carries; if you trust it, convert it "
                         f"once with: python train.py --convert {out_dir}")


def older_metrics(best, history):
    """The metrics of the last evaluation in a checkpoint written before they were kept apart
    ("last"), and its selected evaluation's: then a log entry held them among the loop's own numbers
    and the recipe's extras, which started with "train" or "gate"."""
    def metrics(entry):
        return {k: v for k, v in entry.items() if k not in ("step", "wall_s", "train_loss")
                and not k.startswith(("train_", "gate"))}
    # not a diverged one
    final = next((h for h in reversed(history) if h.get("train_loss") is not None), {})
    best["metrics"] = metrics(best["metrics"])
    return metrics(final)


def convert(out_dir):
    """Rewrite DIR/checkpoint.pkl as checkpoint.npz (``train.py --convert DIR``), on explicit
    request only."""
    import pickle   # only here: the one place that unpickles, and only when the user asks

    from .rundir import CHECKPOINT, locked, read_log, save_checkpoint
    path = os.path.join(out_dir, OLD_CHECKPOINT)
    if not os.path.exists(path):
        raise UsageError(f"{out_dir} holds no {OLD_CHECKPOINT} to convert")
    # converted before, and maybe trained on since
    if os.path.exists(os.path.join(out_dir, CHECKPOINT)):
        raise UsageError(f"{out_dir} already holds {CHECKPOINT}, which is read instead of "
                         f"{OLD_CHECKPOINT}; nothing was overwritten (delete {OLD_CHECKPOINT})")
    print(f"warning: unpickling {path} runs any code it carries; convert only files you trust",
          file=sys.stderr)
    with locked(out_dir):
        try:
            with open(path, "rb") as f:
                old = pickle.load(f)
            state = old.pop("model"), old.pop("optimizer"), old["best"].pop("state", None)
        except Exception as e:
            raise UsageError(f"{path} is not a readable minattn checkpoint "
                             f"({e.__class__.__name__})") \
                from None
        # the old format kept the log only in metrics.jsonl: its lines up to the checkpoint's step
        log = os.path.join(out_dir, "metrics.jsonl")
        history = [h for h in read_log(log) if h["step"] <= old["step"]] if os.path.exists(log) else []
        params, opt_state, selected = state
        metadata = {k: old[k] for k in ("identity", "config", "step", "best", "train_time")}
        save_checkpoint(os.path.join(out_dir, CHECKPOINT), dict(metadata, history=history), params, opt_state,
                        selected)
    print(f"wrote {os.path.join(out_dir, CHECKPOINT)}; {path} is no longer read and may be deleted",
          file=sys.stderr)
