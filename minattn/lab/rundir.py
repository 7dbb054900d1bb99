"""The run directory: lock (its writer's pid), checkpoint.npz (arrays + JSON, never a pickle; the
format is docs/checkpoints.md), metrics.jsonl (one line per evaluation, appended) and, at the end,
results.json. One writer at a time (``locked``); the lock and the log are written in place, every
other file is replaced whole (``write_atomic``), so a kill leaves the old file or the new; every
file is opened by ``open_regular``; a checkpoint is read without trusting it (``load_checkpoint``).
"""
import contextlib
import errno
import fcntl
import json
import os
import signal
import stat
import sys

import numpy as np

from minattn import backend

from .errors import UsageError

CHECKPOINT = "checkpoint.npz"
CHECKPOINT_VERSION = 2   # 1 was checkpoint.pkl
LATER_FIELDS = ("last", "plain", "kernels")   # gained during format 2's life: without one, an older minattn's
OLDER = "{} is a run of an older minattn ({}), which this one does not read: start a new run elsewhere"


# --- signals: Ctrl-C (SIGINT) and SIGTERM ---------------------------------------------------------

class Terminated(BaseException):
    """SIGTERM (``kill``, ``docker stop``, a scheduler's preemption): as Ctrl-C, but exit 143."""


_sigterm = {"deferred": False, "pending": False}


@contextlib.contextmanager
def handling_signals():
    """In the block (in the main thread), SIGINT raises KeyboardInterrupt and SIGTERM Terminated,
    unless ``defer_sigterm`` holds it back."""
    def on_signal(signum, frame):
        if signum == signal.SIGTERM and _sigterm["deferred"]:   # raised by the next defer_sigterm
            _sigterm["pending"] = True
        else:   # in a write, write_atomic removes its temporary file: the old file stays whole
            raise KeyboardInterrupt if signum == signal.SIGINT else Terminated
    _sigterm.update(deferred=False, pending=False)   # nothing left from a block that raised
    try:
        old = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    except ValueError:                 # not the main thread: signals are not ours to handle
        old = {}
    try:
        yield
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)
        _sigterm.update(deferred=False, pending=False)


def defer_sigterm(on):
    """On (training steps): SIGTERM waits for the next call, at the end of the step, so that a
    preempted run loses no step. Off (an evaluation, which may outlast a scheduler's grace period;
    the end of training): SIGTERM raises at once. Either way a pending one raises Terminated now."""
    _sigterm["deferred"] = on
    if _sigterm["pending"]:
        _sigterm["pending"] = False
        raise Terminated


# --- files: opened safely, replaced atomically ----------------------------------------------------

def open_regular(path, mode="r", flags=os.O_RDONLY):
    """open(path) for a file of a run directory, which may be shared: a regular file only (a FIFO
    would block, a device never end). A file written in place (the lock, the log) is never reached
    through a symbolic link (``lock -> ~/.bashrc``) nor shared by a hard link (``cp -al``)."""
    writing = flags != os.O_RDONLY
    try:
        fd = os.open(path, flags | os.O_NONBLOCK | os.O_CLOEXEC | (writing and os.O_NOFOLLOW), 0o644)
    except OSError as e:
        if e.errno not in (errno.ELOOP, errno.ENXIO):   # ENXIO: a FIFO opened to write
            raise
        raise UsageError(f"{path} is a symbolic link or a special file: minattn writes only "
                         "regular files in a run directory (remove it)") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or writing and st.st_nlink > 1:
        os.close(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(errno.EINVAL, "not a regular file", path)
        raise UsageError(f"{path} has {st.st_nlink} hard links (a copy made with cp -al?), so a "
                         "run would write into every copy: remove it (it is made afresh), or copy "
                         "the run directory with cp -a")
    os.set_blocking(fd, True)
    return os.fdopen(fd, mode)


def append_line(path, line):
    with open_regular(path, "a", os.O_WRONLY | os.O_APPEND | os.O_CREAT) as f:
        f.write(line)   # one write: a kill can tear this line only (--resume drops it)


def write_atomic(path, write, mode="w"):
    """``write(file)`` into a new temporary file beside ``path``, fsynced, then renamed over it (a
    link at ``path`` is replaced, not written through): ``path`` holds the old content or the new,
    whatever a kill, Ctrl-C, a power cut or a full disk interrupts."""
    d = os.path.dirname(os.path.abspath(path))
    tmp = os.path.join(d, f".tmp-{os.getpid()}-{os.path.basename(path)}")
    try:   # "x": a new file (O_EXCL: never through a link), with the user's umask
        with open(tmp, mode.replace("w", "x")) as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        if isinstance(e, OSError) and e.filename is None:   # a full disk: say which file
            raise OSError(e.errno, e.strerror, path) from None
        raise
    dir_fd = os.open(d, os.O_RDONLY)
    os.fsync(dir_fd)                        # the rename itself survives a power cut
    os.close(dir_fd)


@contextlib.contextmanager
def locked(out_dir):
    """Hold an exclusive lock on the run directory (made if needed) while the block runs; a second
    writer is refused. The kernel releases ``flock`` when its process dies, so a killed run's lock
    is taken over; the file stays (deleting it would let a waiting writer lock an orphan inode),
    unless the block refuses the start before writing a file: then the directories made go too."""
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise UsageError(f"--out {out_dir} is a file, not a run directory")
    if os.path.exists(os.path.join(out_dir, "checkpoint.pkl")):
        raise UsageError(OLDER.format(out_dir, "it holds checkpoint.pkl"))
    made, d = [], os.path.abspath(out_dir)
    while not os.path.exists(d):
        made, d = made + [d], os.path.dirname(d)
    os.makedirs(out_dir, exist_ok=True)
    with open_regular(os.path.join(out_dir, "lock"), "r+", os.O_RDWR | os.O_CREAT) as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pid = f.read(32).strip()
            try:
                os.kill(int(pid), 0)        # alive? (PermissionError: another user's process)
            except (ValueError, OverflowError, ProcessLookupError):
                pid = "unknown"
            except PermissionError:
                pass
            raise UsageError(f"{out_dir} is in use by another run (pid {pid}); wait for it to end "
                             "or choose another --out") from None
        f.truncate()
        f.write(f"{os.getpid()}\n")
        f.flush()
        for name in os.listdir(out_dir):    # the temporary files of writes a kill -9 cut short
            if name.startswith(".tmp-"):    # (unlink removes a link, never what it points to)
                with contextlib.suppress(FileNotFoundError, IsADirectoryError, PermissionError):
                    os.unlink(os.path.join(out_dir, name))
        try:
            yield
        except (UsageError, MemoryError):
            if made and os.listdir(out_dir) == ["lock"]:
                os.remove(os.path.join(out_dir, "lock"))
                with contextlib.suppress(OSError):
                    for d in made:
                        os.rmdir(d)
            raise


def to_json(obj):
    """Strict JSON (no bare NaN or Infinity, which strict readers reject): those become null."""
    if isinstance(obj, dict):
        return {k: to_json(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_json(v) for v in obj]
    return None if isinstance(obj, float) and not np.isfinite(obj) else obj


# --- checkpoint.npz (docs/checkpoints.md) ---------------------------------------------------------

def save_checkpoint(path, metadata, params, opt_state, selected=None, running=None):
    """``params``, ``selected`` (at the selected evaluation): {name: array}; ``opt_state``: the
    optimizer's state_dict; ``running``: train.Sums as a tuple, the sums of the interval in progress.
    No RNG state: a run's random streams are functions of its seed and the step."""
    states = dict(zip(params, opt_state["state"]))
    arrays = {f"model/{k}": v for k, v in params.items()}
    arrays.update({f"selected/{k}": v for k, v in (selected or {}).items()})
    arrays.update({f"optimizer/{name}/{k}": v for name, s in states.items() for k, v in s.items()})
    meta = dict(metadata, version=CHECKPOINT_VERSION, parameters=list(params),
                optimizer={"t": opt_state["t"], "lr": opt_state["lr"],
                           "without_state": [name for name, s in states.items() if not s]})
    if running:
        loss_sum, norm_sum, stats, seen, n_batches = running
        sums = {"loss_sum": loss_sum, "norm_sum": norm_sum, **{f"stats/{k}": v for k, v in stats.items()}}
        arrays.update({f"running/{k}": np.asarray(backend.to_numpy(v)) for k, v in sums.items()})
        meta["running"] = {"seen": seen, "n_batches": n_batches, "stats": list(stats)}
    arrays["metadata"] = np.array(json.dumps(to_json(meta), allow_nan=False))
    write_atomic(path, lambda f: np.savez(f, **arrays), mode="wb")


def corrupted(path, what):
    """A checkpoint whose contents are not what minattn writes: one line saying what."""
    return UsageError(f"checkpoint {path} is corrupted ({what})")


def _number(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _int(v):
    return isinstance(v, int) and not isinstance(v, bool)


def _finite_only(constant):   # json reads NaN and ±Infinity, which minattn never writes
    raise ValueError(f"{constant} in JSON")


def _object(v, *objects):   # a JSON object whose members ``objects`` are objects too, or absent
    return isinstance(v, dict) and all(isinstance(v.get(k) or {}, dict) for k in objects)


_METADATA = {   # what each field must be (docs/checkpoints.md), and what the message says
    "version": (lambda v: _int(v) and v == CHECKPOINT_VERSION, f"{CHECKPOINT_VERSION}"),
    "config": (lambda v: _object(v, "options") and isinstance(v.get("model_config"), dict)
               and all(isinstance(v.get(k), str) for k in ("task", "model", "preset")),
               "an object with task, model, preset, model_config and options"),
    "step": (lambda v: _int(v) and v >= 0, "a non-negative integer"),
    "train_time": (lambda v: _number(v) and 0 <= v < float("inf"), "a non-negative number"),
    "history": (lambda v: isinstance(v, list) and all(_object(h) and _int(h.get("step")) for h in v),
                "a list of log entries"),
    "best": (lambda v: _object(v) and isinstance(v.get("metrics"), dict)
             and (v.get("metric") is None or _number(v["metric"]))
             and (v.get("step") is None or _int(v["step"])), "an object with metric, metrics and step"),
    "last": (lambda v: _object(v) and all(x is None or _number(x) for x in v.values()),
             "an object of metrics"),
    "optimizer": (lambda v: _object(v) and _int(v.get("t")) and v["t"] >= 0 and _number(v.get("lr"))
                  and isinstance(v.get("without_state"), list), "an object with t, lr and without_state"),
    "parameters": (lambda v: isinstance(v, list) and all(isinstance(n, str) for n in v)
                   and len(set(v)) == len(v), "a list of distinct names"),
    "plain": (lambda v: isinstance(v, bool), "true or false"),     # MINATTN_PLAIN and MINATTN_KERNELS:
    "kernels": (lambda v: isinstance(v, bool), "true or false"),   # see settings.resume_check
}


def load_checkpoint(path, arrays=True):
    """The checkpoint at ``path``: its metadata, "model" and "selected" ({name: array}), "optimizer"
    (a state_dict), "running_sums" ({name: array}); ``arrays=False``: its metadata alone. What
    save_checkpoint would not write is one line naming it; so is an older minattn's checkpoint."""
    out_dir = os.path.dirname(path) or "."
    if not os.path.exists(path):
        if os.path.exists(os.path.join(out_dir, "checkpoint.pkl")):
            raise UsageError(OLDER.format(out_dir, "it holds checkpoint.pkl"))
        raise UsageError(f"{out_dir} holds no {CHECKPOINT} (is it a run directory? train there "
                         "first)")
    with open_regular(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        try:
            with np.load(f, allow_pickle=False) as z:
                declared = sum(i.file_size for i in z.zip.infolist())   # a zip bomb: GB in kB
                if declared > 2 * size + (1 << 20):
                    raise corrupted(path, f"its members declare {declared} bytes in a file of {size}")
                members = {k: z[k] for k in z.files if arrays or k == "metadata"}
            ckpt = json.loads(str(members.pop("metadata")), parse_constant=_finite_only)
        except UsageError:
            raise
        except Exception as e:   # not a zip, truncated, a pickle, no metadata, not JSON
            raise UsageError(f"checkpoint {path} is corrupted or unreadable ({e.__class__.__name__})") \
                from None
    if not isinstance(ckpt, dict):
        raise corrupted(path, "its metadata is not an object")
    v = ckpt.get("version")
    if _int(v) and v != CHECKPOINT_VERSION:   # an older minattn's checkpoint, or a newer one's
        raise UsageError(OLDER.format(out_dir, f"{CHECKPOINT} of format {v}") if v < CHECKPOINT_VERSION
                         else f"checkpoint {path} is a newer minattn's (format {v}): update minattn")
    lacking = [k for k in LATER_FIELDS if k not in ckpt]
    if ckpt.get("version") == CHECKPOINT_VERSION and isinstance(ckpt.get("optimizer"), dict) and (
            lacking or "without_state" not in ckpt["optimizer"]):
        raise UsageError(OLDER.format(out_dir, f"its {CHECKPOINT} lacks "
                                               f"{', '.join(lacking or ['optimizer.without_state'])}"))
    for key, (ok, what) in _METADATA.items():
        if not ok(ckpt.get(key)):
            raise corrupted(path, f"{key}: expected {what}" if key in ckpt else f"it lacks {key}")
    if not arrays:
        return ckpt
    names = ckpt.pop("parameters")
    r = ckpt.get("running")   # the sums of an evaluation interval in progress (on SIGTERM)
    running = {k[8:]: members.pop(k) for k in [k for k in members if k.startswith("running/")]}
    if (r is not None or running) and not (
            _object(r) and _int(r.get("seen")) and _int(r.get("n_batches")) and r["n_batches"] > 0
            and isinstance(r.get("stats"), list)
            and set(running) == {"loss_sum", "norm_sum", *(f"stats/{k}" for k in r["stats"])}
            and all(v.ndim == 0 and v.dtype.kind in "fiu" and np.isfinite(v)
                    for v in running.values())):
        raise corrupted(path, "running: expected the sums of the interval in progress")
    part = {"model": {}, "selected": {}, "optimizer": {}}
    for k, v in members.items():
        kind, _, name = k.partition("/")
        owner = name.rpartition("/")[0] if kind == "optimizer" else name
        if kind not in part or owner not in names:
            raise corrupted(path, f"{k}: an array of no parameter")
        if v.dtype != np.float32 or v.ndim == 0:   # train.py's parameters and Adam's moments
            raise corrupted(path, f"{k}: {v.dtype} {v.shape}, expected float32 arrays")
        if not np.isfinite(v).all():
            raise corrupted(path, f"{k} is not finite")
        part[kind][name] = v
    state = [{k.rpartition("/")[2]: v for k, v in part["optimizer"].items()
              if k.rpartition("/")[0] == n} for n in names]
    return dict(ckpt, model=part["model"], selected=part["selected"] or None, parameters=names,
                optimizer=dict(ckpt["optimizer"], state=state), running_sums=running)


def settings(config):
    """A run's configuration (as results.json and checkpoints hold it) as {setting: value}."""
    return {**{k: v for k, v in config.items() if k not in ("model_config", "options")},
            **(config.get("model_config") or {}), **(config.get("options") or {})}


def read_log(path):
    """The entries of a metrics log, skipping with a warning the lines that are not JSON objects
    with a step (torn by a kill, edited, not UTF-8): the checkpoint holds the history."""
    entries, skipped = [], 0
    with open_regular(path, "rb") as f:
        for line in filter(bytes.strip, f):
            try:
                entry = json.loads(line.decode(), parse_constant=_finite_only)   # (UnicodeDecodeError too)
            except ValueError:
                entry = None
            if isinstance(entry, dict) and _int(entry.get("step")):
                entries.append(entry)
            else:
                skipped += 1
    if skipped:
        print(f"warning: {path}: skipped {skipped} unreadable line{'s' * (skipped > 1)}", file=sys.stderr)
    return entries


def repair_log(path, history, step):
    """On --resume: make metrics.jsonl hold exactly the checkpoint's evaluations (a kill can leave
    lines after the checkpoint, or a torn one: dropped with a warning). Rewritten whole either way,
    so that it is this run's own file (not a link, not a cp -al copy's) before it is appended to."""
    lines = [json.dumps(h, allow_nan=False) + "\n" for h in history]   # ASCII: json escapes others
    try:
        with open_regular(path, "rb") as f:   # bytes: a line that is not UTF-8 is one more to drop
            old = [line.decode("ascii", "replace") for line in f]
    except FileNotFoundError:
        old = []
    if old != lines:
        keep = next((i for i, (a, b) in enumerate(zip(old, lines)) if a != b), min(len(old), len(lines)))
        print(f"warning: {path} did not match the checkpoint of step {step}: kept {keep} lines, "
              f"dropped {len(old) - keep} (written after the checkpoint, or torn by a kill), "
              f"restored {len(lines) - keep} from the checkpoint", file=sys.stderr)
    write_atomic(path, lambda f: f.writelines(lines))
