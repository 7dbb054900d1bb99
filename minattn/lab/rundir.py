"""The run directory: one writer at a time, files replaced atomically, checkpoints as .npz + JSON
(never a pickle; the format is docs/checkpoints.md), the metrics log kept in step with the
checkpoint, and a run's configuration as settings by name (``settings``, any layout). What ``--set``
may change and the checks of a checkpoint's configuration against its recipe are
minattn/lab/settings.py; the report of finished runs (``train.py --report``) is
minattn/lab/report.py. Neither this file nor those two read anything else of a run.

A run directory holds: lock (its writer's pid), checkpoint.npz, metrics.jsonl (one line per
evaluation, appended) and, at the end, results.json. Every file but the log is replaced whole,
atomically.

Nothing in a run directory is trusted, as it may be shared: minattn writes there only regular files
and never through a symbolic link (O_NOFOLLOW, or a rename over the link), reads a checkpoint only
after bounding what it declares and checking every field, and skips in ``--report`` what it cannot
read. Ctrl-C and SIGTERM take effect after the write in progress (SIGTERM in training: after saving
its step), so a stopped run leaves whole files; the temporary files of a ``kill -9`` are swept by
the next writer.
"""
import contextlib
import dataclasses
import errno
import fcntl
import json
import os
import signal
import stat
import sys
import tempfile
import zipfile

import numpy as np

from minattn import backend

from .errors import UsageError
from .legacy import SAVED_BEFORE, refuse_old_checkpoint

CHECKPOINT_VERSION = 2   # 1: checkpoint.pkl (pickle), read only by --convert (legacy.py)


# --- signals: Ctrl-C (SIGINT) and SIGTERM stop a run between writes, never inside one -------------

class Terminated(BaseException):
    """SIGTERM (``kill``, ``docker stop``, a scheduler's preemption): handled like Ctrl-C, exit code
    143."""


_signals = {"deferring": 0, "pending": None, "at_step_end": False, "terminated": False}


def _raise_for(signum):
    raise KeyboardInterrupt if signum == signal.SIGINT else Terminated


def _on_signal(signum, frame):
    # the training loop saves its step, then stops
    if signum == signal.SIGTERM and _signals["at_step_end"]:
        _signals["terminated"] = True
        return
    if _signals["deferring"]:          # inside a write: finish it first (see deferring_signals)
        _signals["pending"] = _signals["pending"] or signum
        return
    _raise_for(signum)


@contextlib.contextmanager
def handling_signals():
    """While the block runs (in the main thread), SIGINT raises KeyboardInterrupt and SIGTERM
    ``Terminated``, both deferred to the end of any write in progress, so a stopped run leaves whole
    files and no temp file.
    """
    _signals.update(pending=None, at_step_end=False, terminated=False)
    try:
        old = {s: signal.signal(s, _on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    except ValueError:                 # not the main thread: signals are not ours to handle
        old = {}
    try:
        yield
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)
        _signals.update(pending=None, at_step_end=False, terminated=False)


def stop_at_step_end(on):
    """On: SIGTERM waits for the end of the training step (``terminated()`` then says so, and the
    loop saves that step before it raises ``Terminated``): a preempted run loses no step. Off: a
    SIGTERM still pending stops the run here."""
    _signals["at_step_end"] = on
    if not on and _signals["terminated"]:
        _signals["terminated"] = False
        raise Terminated


def terminated():
    return _signals["terminated"]


@contextlib.contextmanager
def stopping_at_once():
    """In the block (an evaluation, which may take a minute: longer than a scheduler's grace period
    before its SIGKILL), SIGTERM raises ``Terminated`` where it comes, as Ctrl-C does, rather than
    at the end of the step."""
    was, _signals["at_step_end"] = _signals["at_step_end"], False
    try:
        yield
    finally:
        _signals["at_step_end"] = was


def writable(path):
    """Whether files can be created in the directory ``path`` (permissions, and not a read-only file
    system).
    """
    return os.access(path, os.W_OK) and not os.statvfs(path).f_flag & os.ST_RDONLY


@contextlib.contextmanager
def deferring_signals():
    """A signal that arrives in the block takes effect when the block ends (the write is then
    complete)."""
    _signals["deferring"] += 1
    try:
        yield
    finally:
        _signals["deferring"] -= 1
        pending = _signals["pending"]
        if pending and not _signals["deferring"]:
            _signals["pending"] = None
            _raise_for(pending)


# --- files in a run directory: never through a symbolic link, never anything but a regular file ---

def open_in_run(path, flags, mode=0o644):
    """os.open(path) for writing a file of a run directory: a symbolic link at ``path`` is refused
    (O_NOFOLLOW, so a shared directory's ``lock -> ~/.bashrc`` cannot redirect a write), and so are
    anything but a regular file (a FIFO would block: O_NONBLOCK opens it without waiting, then it is
    refused) and a file with other hard links (the files opened here are appended to or truncated in
    place)."""
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, mode)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENXIO):
            raise UsageError(f"{path} is a symbolic link or a special file: minattn writes only "
                             "regular files in a run directory (remove it)") from None
        raise
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise UsageError(f"{path} is not a regular file: minattn writes only regular files in a "
                         "run directory (remove it)")
    # a copy made with cp -al or rsync --link-dest: writing here writes into the other
    if st.st_nlink > 1:
        os.close(fd)
        raise UsageError(f"{path} has {st.st_nlink} hard links (a copy made with cp -al?), so a "
                         "run would write into every copy: remove it (it is made afresh), or copy "
                         "the run directory with cp -a")
    fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
    return fd


def open_regular(path, mode="r"):
    """open(path) for reading a file of a run directory, refusing anything but a regular file
    (OSError): a FIFO would block the reader, a device never end."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(errno.EINVAL, "not a regular file", path)
    return os.fdopen(fd, mode)


def append_line(path, line):
    """Append one line to a file of the run directory (the metrics log) in one write."""
    with deferring_signals():
        with os.fdopen(open_in_run(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT), "a") as f:
            f.write(line)


def _pid_alive(text):
    try:
        os.kill(int(text), 0)
    except (ValueError, OverflowError, ProcessLookupError):
        return False
    except PermissionError:             # another user's process
        pass
    return True


def sweep_temporary_files(out_dir):
    """Remove the ``.tmp-*`` files of writes a kill (SIGKILL, a power cut) interrupted; only the
    lock's holder calls this, so no write of another run is in progress. Returns how many there
    were."""
    removed = 0
    for name in os.listdir(out_dir):
        if name.startswith(".tmp-"):
            with contextlib.suppress(FileNotFoundError, IsADirectoryError, PermissionError):
                # unlink removes a link, never what it points to
                os.unlink(os.path.join(out_dir, name))
                removed += 1
    return removed


def missing_top(path):
    """The outermost directory of ``path`` (itself included) that does not exist yet, or None."""
    top, path = None, os.path.abspath(path)
    while not os.path.exists(path):
        top, path = path, os.path.dirname(path)
    return top


def remove_empty(path, top):
    """Remove ``path`` and its parents up to ``top`` while they are empty (what a refused start
    created)."""
    path = os.path.abspath(path)
    with contextlib.suppress(OSError):
        while True:
            os.rmdir(path)
            if path == top:
                break
            path = os.path.dirname(path)


@contextlib.contextmanager
def locked(out_dir):
    """Hold an exclusive lock on the run directory (created if needed) while the block runs: a
    second writer gets a UsageError naming the holder's pid. ``flock`` is released by the kernel
    when its process dies, so the lock of a killed run is free and simply taken over; the pid inside
    is only for the message. The lock file is left behind: deleting it would let a waiting writer
    lock an orphaned inode. Temporary files that killed writes left behind are swept once the lock
    is held."""
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise UsageError(f"--out {out_dir} is a file, not a run directory")
    os.makedirs(out_dir, exist_ok=True)
    with os.fdopen(open_in_run(os.path.join(out_dir, "lock"), os.O_RDWR | os.O_CREAT), "r+") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            pid = f.read(32).strip()
            holder = pid if _pid_alive(pid) else "unknown"
            raise UsageError(f"{out_dir} is in use by another run (pid {holder}); wait for it to "
                             "end or choose another --out") from None
        f.seek(0)
        f.truncate()
        f.write(f"{os.getpid()}\n")
        f.flush()
        sweep_temporary_files(out_dir)
        yield


def write_atomic(path, write, mode="w"):
    """``write(file)`` into a temporary file beside ``path``, fsync it, rename it over ``path`` and
    fsync the directory: after a crash or a full disk ``path`` holds the old content or the new,
    never a mix. The temporary file is created exclusively (never through a link) and the rename
    replaces a link at ``path`` rather than writing through it. Ctrl-C and SIGTERM wait for the end
    of the write."""
    d = os.path.dirname(os.path.abspath(path))
    with deferring_signals():
        fd, tmp = tempfile.mkstemp(dir=d, prefix=".tmp-")
        umask = os.umask(0)
        os.umask(umask)
        try:
            # mkstemp's 0600 would hide a shared run's files from its readers
            os.fchmod(fd, 0o666 & ~umask)
            with os.fdopen(fd, mode) as f:
                write(f)
                f.flush()
                os.fsync(f.fileno())
        except BaseException as e:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            # a full disk: say which file did not fit
            if isinstance(e, OSError) and e.filename is None:
                raise OSError(e.errno, e.strerror, path) from None
            raise
        os.replace(tmp, path)
        dir_fd = os.open(d, os.O_RDONLY)
        try:
            os.fsync(dir_fd)              # the rename itself survives a power cut
        finally:
            os.close(dir_fd)


def to_json(obj):
    """Strict JSON (no bare NaN/Infinity, which strict readers reject): non-finite numbers become
    null."""
    if isinstance(obj, dict):
        return {k: to_json(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_json(v) for v in obj]
    if isinstance(obj, float) and not np.isfinite(obj):
        return None
    return obj


# checkpoint.npz, read with NumPy alone (docs/checkpoints.md): "model/NAME" and "selected/NAME" (the
# parameters at the selected evaluation, for tasks that evaluate them once at the end),
# "optimizer/NAME/KEY" (e.g. Adam's m and v) and "metadata", a JSON string. No RNG state is saved:
# every random stream of a run is a function of its seed and the step (see train.py's module
# docstring).
CHECKPOINT = "checkpoint.npz"
CHECKPOINT_METADATA = ("version", "identity", "config", "step", "best", "train_time", "history",
                       "optimizer",
                       "parameters")


def save_checkpoint(path, metadata, params, opt_state, selected=None, running=None):
    """``params``, ``selected``: {name: array} in the model's parameter order; ``opt_state``: the
    optimizer's state_dict, whose per-parameter state is stored under the parameter's name (the
    names without state, which never had a gradient, are listed in the metadata, so a checkpoint
    stripped of its state is told apart). ``running``: (loss sum, gradient-norm sum, {stat: sum},
    samples, batches) of an evaluation interval in progress (a checkpoint between evaluations, on
    SIGTERM), stored exactly so that a resume logs what an uninterrupted run logs."""
    arrays = {f"model/{k}": v for k, v in params.items()}
    arrays.update({f"selected/{k}": v for k, v in (selected or {}).items()})
    arrays.update({f"optimizer/{name}/{k}": v for name, s in zip(params, opt_state["state"])
                   for k, v in s.items()})
    stateless = [name for name, s in zip(params, opt_state["state"]) if not s]
    meta = dict(metadata, version=CHECKPOINT_VERSION, parameters=list(params),
                optimizer={"t": opt_state["t"], "lr": opt_state["lr"], "without_state": stateless})
    if running:
        loss_sum, norm_sum, stats, seen, n_batches = running
        sums = {"loss_sum": loss_sum, "norm_sum": norm_sum,
                **{f"stats/{k}": v for k, v in stats.items()}}
        arrays.update({f"running/{k}": np.asarray(backend.to_numpy(v)) for k, v in sums.items()})
        meta["running"] = {"seen": seen, "n_batches": n_batches, "stats": list(stats)}
    arrays["metadata"] = np.array(json.dumps(to_json(meta), allow_nan=False))
    write_atomic(path, lambda f: np.savez(f, **arrays), mode="wb")


def running_sums(ckpt, device):
    """(loss sum, gradient-norm sum, {stat: sum}, samples, batches) of the evaluation interval a
    checkpoint stopped in, on ``device``; zeros for a checkpoint taken at an evaluation (or
    none)."""
    r = ckpt.get("running")
    if not r:
        return 0.0, 0.0, {}, 0, 0
    sums = {k: backend.to_device(v, device) for k, v in ckpt["running_sums"].items()}
    stats = {k: sums[f"stats/{k}"] for k in r["stats"]}
    return sums["loss_sum"], sums["norm_sum"], stats, r["seen"], r["n_batches"]


class Corrupted(UsageError):
    """A checkpoint whose contents are not what minattn writes."""


def _read_npz(path, only=None):
    """The arrays of the .npz at ``path``, read without trusting it: a regular file only (a FIFO or
    a device would block or never end), no pickles, and no member may declare more bytes than the
    file can hold (np.savez stores members uncompressed; a zip bomb declares gigabytes in
    kilobytes), checked before any array is allocated. ``only``: read just that member
    (e.g. "metadata.npy")."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise UsageError(f"no checkpoint at {path} to resume from") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise UsageError(f"checkpoint {path} is not a regular file")
    with os.fdopen(fd, "rb") as f:
        try:
            with zipfile.ZipFile(f) as z:
                infos = z.infolist()
                declared = sum(i.file_size for i in infos)
                if declared > 2 * st.st_size + (1 << 20):
                    raise Corrupted(f"checkpoint {path} is corrupted (its members declare "
                                    f"{declared} bytes in a file of {st.st_size})")
                arrays = {}
                for info in infos:
                    if only is not None and info.filename != only:
                        continue
                    with z.open(info) as m:
                        version = np.lib.format.read_magic(m)
                        read_header = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                                       else np.lib.format.read_array_header_2_0)
                        shape, _, dtype = read_header(m)
                        size = int(np.prod(shape, dtype=object)) * dtype.itemsize
                        if dtype.hasobject or size > info.file_size:
                            raise Corrupted(f"checkpoint {path} is corrupted (member "
                                            f"{info.filename} is "
                                            + ("pickled)" if dtype.hasobject else "larger than it "
                                                                                  "says)"))
                    with z.open(info) as m:
                        arrays[info.filename[:-4] if info.filename.endswith(".npy") else info.filename] = \
                            np.lib.format.read_array(m, allow_pickle=False)
        except UsageError:
            raise
        except MemoryError:
            raise Corrupted(f"checkpoint {path} is corrupted (an array too large for "
                            "memory)") from None
        # not a zip, a truncated file, a bad header: all the same to the user
        except Exception as e:
            raise Corrupted(f"checkpoint {path} is corrupted or unreadable "
                            f"({e.__class__.__name__})") \
                from None
    return arrays


def _number(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _int(v):
    return isinstance(v, int) and not isinstance(v, bool)


# what each metadata field must be (docs/checkpoints.md): a check, and its description for the
# message
_METADATA_TYPES = {
    "identity": (lambda v: isinstance(v, dict)
                 and all(isinstance(v.get(k) or {}, dict) for k in ("model_config", "options")),
                 "an object"),
    "config": (lambda v: isinstance(v, dict) and isinstance(v.get("model_config"), dict)
               and isinstance(v.get("options") or {}, dict)
               and all(isinstance(v.get(k), str) for k in ("task", "model", "preset")),
               "an object with task, model, preset, model_config and options"),
    "step": (lambda v: _int(v) and v >= 0, "a non-negative integer"),
    "train_time": (lambda v: _number(v) and 0 <= v < float("inf"), "a non-negative number"),
    "history": (lambda v: isinstance(v, list) and all(isinstance(h, dict) and _int(h.get("step")) for h in v),
                "a list of log entries"),
    "best": (lambda v: isinstance(v, dict) and (v.get("metric") is None or _number(v.get("metric")))
             and isinstance(v.get("metrics"), dict) and (v.get("step") is None or _int(v.get("step"))),
             "an object with metric, metrics and step"),
    "optimizer": (lambda v: isinstance(v, dict) and _int(v.get("t")) and v["t"] >= 0 and _number(v.get("lr"))
                  and isinstance(v.get("without_state", []), list), "an object with t and lr"),
    "parameters": (lambda v: isinstance(v, list) and all(isinstance(n, str) for n in v)
                   and len(set(v)) == len(v), "a list of distinct names"),
}


def load_checkpoint(path):
    """The checkpoint at ``path`` as a dict: its metadata, plus "model" and "selected" ({name:
    array}) and "optimizer" (the optimizer's state_dict). Never unpickles: an old checkpoint.pkl is
    refused. Anything that is not what save_checkpoint writes (a mistyped field, a parameter that is
    not finite float32, an array of no parameter) is refused with a ``Corrupted`` error naming
    it."""
    if not os.path.exists(path):
        refuse_old_checkpoint(os.path.dirname(path) or ".")
    arrays = _read_npz(path)
    try:
        ckpt = json.loads(str(arrays.pop("metadata")))
    except Exception as e:   # no "metadata", or not JSON
        raise Corrupted(f"checkpoint {path} is corrupted or unreadable "
                        f"({e.__class__.__name__})") from None
    missing = [k for k in CHECKPOINT_METADATA if k not in ckpt] if isinstance(ckpt, dict) else ["all"]
    if missing or ckpt["version"] != CHECKPOINT_VERSION or not _int(ckpt["version"]):
        raise UsageError(f"checkpoint {path} is not a minattn checkpoint of version "
                         f"{CHECKPOINT_VERSION}"
                         + (f" (it lacks {', '.join(missing)})" if missing else ""))
    for key, (ok, what) in _METADATA_TYPES.items():
        if not ok(ckpt[key]):
            raise Corrupted(f"checkpoint {path} is corrupted ({key}: expected {what})")
    # the last evaluation's metrics (absent in checkpoints written before them)
    last = ckpt.get("last", {})
    if not (isinstance(last, dict) and all(v is None or _number(v) for v in last.values())):
        raise Corrupted(f"checkpoint {path} is corrupted (last: expected an object of metrics)")
    # the path it was trained on (MINATTN_PLAIN, MINATTN_KERNELS), if saved
    for key in ("plain", "kernels"):
        if not isinstance(ckpt.get(key, False), bool):
            raise Corrupted(f"checkpoint {path} is corrupted ({key}: expected true or false)")
    names = ckpt.pop("parameters")
    running = {k.split("/", 1)[1]: arrays.pop(k)
               for k in [k for k in arrays if k.startswith("running/")]}
    # the sums of an evaluation interval in progress (a checkpoint on SIGTERM)
    r = ckpt.get("running")
    whole = isinstance(r, dict) and _int(r.get("seen")) and _int(r.get("n_batches")) and r["n_batches"] > 0 \
        and isinstance(r.get("stats"), list) \
        and set(running) == {"loss_sum", "norm_sum", *(f"stats/{k}" for k in r["stats"])} \
        and all(v.ndim == 0 and v.dtype.kind in "fiu" and np.isfinite(v) for v in running.values())
    if (r is not None or running) and not whole:
        raise Corrupted(f"checkpoint {path} is corrupted (running: expected the sums of the "
                        "interval in progress)")
    for k, v in arrays.items():
        kind, _, name = k.partition("/")
        owner = name.rpartition("/")[0] if kind == "optimizer" else name
        if kind not in ("model", "selected", "optimizer") or owner not in names:
            raise Corrupted(f"checkpoint {path} is corrupted ({k}: an array of no parameter)")
        # train.py's parameters and Adam's moments are float32 arrays
        if v.dtype != np.float32 or v.ndim == 0:
            raise Corrupted(f"checkpoint {path} is corrupted ({k}: {v.dtype} {v.shape}, expected "
                            "float32 arrays)")
        if not np.isfinite(v).all():
            raise Corrupted(f"checkpoint {path} is corrupted ({k} is not finite)")
    part = {kind: {k.split("/", 1)[1]: v for k, v in arrays.items() if k.startswith(kind + "/")}
            for kind in ("model", "selected", "optimizer")}
    state = [{k.rpartition("/")[2]: v for k, v in part["optimizer"].items()
              if k.rpartition("/")[0] == name}
             for name in names]
    return dict(ckpt, model=part["model"], selected=part["selected"] or None,
                optimizer=dict(ckpt["optimizer"], state=state), parameters=names,
                running_sums=running)


def check_resumable(ckpt, path):
    """A resume continues bit for bit only with the optimizer's whole state: refuse a checkpoint
    whose state was stripped (a common way to share weights, which --evaluate and --plot still
    read)."""
    opt, names = ckpt["optimizer"], ckpt["parameters"]
    # written since the list was recorded: every other parameter has its state
    if "without_state" in opt:
        lacking = [n for n, s in zip(names, opt["state"])
                   if not s and n not in opt["without_state"]]
    else:                        # older: only a state stripped of every parameter can be told apart
        lacking = names if opt["t"] and not any(opt["state"]) else []
    if lacking:
        raise UsageError(f"checkpoint {path} lacks the optimizer state of {len(lacking)} of "
                         f"{len(names)} parameters (e.g. {lacking[0]}), so --resume could not "
                         "continue exactly; --evaluate and --plot still read it")


def identity(cfg):
    """What must match for a checkpoint to belong to this run (the step budget may grow), as JSON
    has it."""
    d = dataclasses.asdict(cfg)
    for k in ("steps", "device", "eval_every", "eval_batch_size"):
        d.pop(k)
    return json.loads(json.dumps(to_json(d)))


def settings(config):
    """A run's configuration (a dict, as results.json and checkpoints hold it) as one dict of its
    settings by name: the model's and the task options' fields beside the run's. The same for every
    layout: older runs kept the task options and the schedule inside ``model_config``, and lack
    settings added since (``SAVED_BEFORE`` gives those whose default changed)."""
    return {**SAVED_BEFORE.get(config.get("task"), {}),
            **{k: v for k, v in config.items() if k not in ("model_config", "options")},
            **(config.get("model_config") or {}), **(config.get("options") or {})}


def read_log(path):
    """The entries of a metrics log, skipping with a warning the lines that are not JSON objects
    with a step (a line torn by a kill, an edit, bytes that are not UTF-8): the checkpoint, not the
    log, holds the history."""
    entries, skipped = [], 0
    with open_regular(path, "rb") as f:
        for line in filter(bytes.strip, f):
            try:
                entry = json.loads(line.decode())   # UnicodeDecodeError is a ValueError too
            except ValueError:
                entry = None
            if isinstance(entry, dict) and isinstance(entry.get("step"), int):
                entries.append(entry)
            else:
                skipped += 1
    if skipped:
        print(f"warning: {path}: skipped {skipped} unreadable line{'s' * (skipped > 1)}",
              file=sys.stderr)
    return entries


def repair_log(path, history, step):
    """On --resume: make metrics.jsonl hold exactly the checkpoint's evaluations. It is only ever
    appended to, so it usually does; a kill can leave lines of evaluations after the checkpoint, or
    a torn last line, and those are dropped with a warning (a missing log is rewritten from the
    checkpoint)."""
    # ASCII: json.dumps escapes the rest
    lines = [json.dumps(h, allow_nan=False) + "\n" for h in history]
    try:
        # bytes: a line that is not UTF-8 is one more line to drop
        with open_regular(path, "rb") as f:
            old = [line.decode("ascii", "replace") for line in f]
            shared = os.fstat(f.fileno()).st_nlink > 1
    except FileNotFoundError:
        old, shared = [], False
    if old == lines:
        if shared:   # a hard link (cp -al): appending would write into the other copy's log too
            write_atomic(path, lambda f: f.writelines(lines))   # a file of its own, the same lines
        return
    keep = next((i for i, (a, b) in enumerate(zip(old, lines)) if a != b),
                min(len(old), len(lines)))
    print(f"warning: {path} did not match the checkpoint of step {step}: kept {keep} lines, "
          f"dropped {len(old) - keep} (written after the checkpoint, or torn by an interruption), "
          f"restored {len(lines) - keep} from the checkpoint", file=sys.stderr)
    write_atomic(path, lambda f: f.writelines(lines))
