"""The fault harness of issue 30, kept in the repo (slow: ``make test-slow``).

1. Kill and resume: a short run is killed again and again (SIGKILL at random moments, SIGKILL as soon as a write
   has begun, i.e. with its ``.tmp-*`` file present, SIGKILL right after a log line, and some SIGTERM and SIGINT)
   and resumed each time until it finishes; it must end bit-identical to an uninterrupted run (every checkpoint
   array, the metadata, the log and results.json, timings aside) with a clean log (every evaluation once, in
   order, strict JSON) and no temporary file left.
2. Crafted checkpoints: damaged, forged and hostile checkpoint.npz files, each under --resume, --evaluate,
   --plot and --analyze: one line and exit 2 (the weights of a checkpoint stripped of its optimizer state still
   evaluate and draw), no traceback, no hang, no code run.

``MINATTN_KILLS`` sets the number of kills (default 50). Each test prints its counts and time.
"""
import io
import json
import os
import pickle
import random
import shutil
import signal
import struct
import subprocess
import sys
import time
import zipfile

import numpy as np
import pytest

import train

from tests.lab.test_unanswered_input import _set
from tests.lab.test_train import ROOT, TINY, ctl_generated, run  # noqa: F401 (ctl_generated: an autouse fixture)

pytestmark = pytest.mark.slow

STEPS = 24           # evaluations every 2 steps: 12 checkpoints, each a log append and an atomic write
TIMINGS = ("wall_s", "ms_per_step", "steps_this_invocation", "train_time")


def _strict_lines(path):
    def refuse(name):
        raise ValueError(f"non-finite {name} in {path}")
    return [json.loads(line, parse_constant=refuse) for line in open(path)]


def _snapshot(out):
    """Everything a run leaves, timings aside: checkpoint arrays (bytes), metadata, log lines, results."""
    with np.load(os.path.join(out, "checkpoint.npz"), allow_pickle=False) as z:
        arrays = {k: z[k].tobytes() for k in z.files if k != "metadata"}
        meta = json.loads(z["metadata"].item())
    meta.pop("train_time")
    meta["best"]["metrics"].pop("wall_s", None)
    for h in meta["history"]:
        h.pop("wall_s")
    log = [{k: v for k, v in e.items() if k != "wall_s"} for e in _strict_lines(os.path.join(out, "metrics.jsonl"))]
    results = json.load(open(os.path.join(out, "results.json")))
    for k in TIMINGS:
        results.pop(k, None)
    return arrays, meta, log, results


def _start(out, resume):
    argv = [sys.executable, "train.py", *TINY, "--steps", str(STEPS), "--out", out] + (["--resume"] if resume else [])
    return subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def _kill_at(p, out, mode, rng, left=frozenset()):
    """Wait for the moment of ``mode`` (or for the process to end), then send the signal. Returns the signal
    sent, or None when the run finished first. ``left``: temp files of earlier kills, not a write of this run."""
    log = os.path.join(out, "metrics.jsonl")
    size = os.path.getsize(log) if os.path.exists(log) else 0
    deadline = time.time() + (rng.uniform(0.3, 3.0) if mode == "random" else 30)
    while p.poll() is None and time.time() < deadline:
        if mode == "write" and os.path.isdir(out) and any(n.startswith(".tmp-") and n not in left
                                                          for n in os.listdir(out)):
            break
        if mode == "append" and os.path.exists(log) and os.path.getsize(log) > size:
            break
        time.sleep(0.0005 if mode != "random" else 0.01)
    if p.poll() is not None:
        return None
    sig = rng.choice([signal.SIGKILL] * 6 + [signal.SIGTERM, signal.SIGINT])
    p.send_signal(sig)
    return sig


def test_kill_and_resume_at_random_moments_ends_bit_identical(tmp_path):
    n_kills, rng, t0 = int(os.environ.get("MINATTN_KILLS", 50)), random.Random(30), time.time()
    reference = str(tmp_path / "reference")
    subprocess.run([sys.executable, "train.py", *TINY, "--steps", str(STEPS), "--out", reference], cwd=ROOT,
                   check=True, capture_output=True)
    expected = _snapshot(reference)
    kills, rounds, by_mode, by_signal, torn, startup = 0, 0, {}, {}, 0, 0
    while kills < n_kills:
        rounds += 1
        out = str(tmp_path / f"round{rounds}")
        while True:
            resume = os.path.exists(os.path.join(out, "checkpoint.npz"))
            left = set(n for n in os.listdir(out) if n.startswith(".tmp-")) if os.path.isdir(out) else set()
            p = _start(out, resume)
            mode = rng.choice(["random", "write", "write", "append"]) if kills < n_kills else "none"
            sig = _kill_at(p, out, mode, rng, left) if mode != "none" else None
            err = p.communicate(timeout=120)[1]
            assert "Traceback" not in err, err
            if sig is None:
                assert p.returncode == 0, err
                break
            kills += 1
            by_mode[mode] = by_mode.get(mode, 0) + 1
            if sig == signal.SIGKILL and p.returncode and any(n.startswith(".tmp-") and n not in left
                                                              for n in os.listdir(out)):
                torn += 1   # killed inside a write: its temp file is left, for the next start to sweep
            by_signal[sig.name] = by_signal.get(sig.name, 0) + 1
            if sig == signal.SIGKILL or p.returncode == 0:   # a run may end between the check and the signal
                assert p.returncode in (-signal.SIGKILL, 0), err
                continue
            if p.returncode == -sig and err == "":   # during the interpreter's start-up, before train.py runs
                startup += 1
                continue
            assert p.returncode in ({signal.SIGTERM: 143, signal.SIGINT: 130}[sig], 0), err
            if p.returncode:
                assert err.splitlines()[-1].startswith(("terminated", "interrupted")), err
                new = {n for n in os.listdir(out) if n.startswith(".tmp-")} - left if os.path.isdir(out) else set()
                assert not new, new   # handled: no temp file of its own (one of a kill -9 before may wait for the lock)
        got = _snapshot(out)
        for part, a, b in zip(("arrays", "metadata", "log", "results"), got, expected):
            diff = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k)) if isinstance(a, dict) else \
                [i for i, (x, y) in enumerate(zip(a, b)) if x != y] + ([len(a), len(b)] if len(a) != len(b) else [])
            assert not diff, f"round {rounds}: {part} differ from the uninterrupted run's in {diff[:5]}: " + \
                (str([(a.get(k), b.get(k)) for k in diff[:2]]) if isinstance(a, dict) else str(diff[:3]))
        log = [e["step"] for e in _strict_lines(os.path.join(out, "metrics.jsonl"))]
        assert log == list(range(2, STEPS + 1, 2))
        assert not [n for n in os.listdir(out) if n.startswith(".tmp-")]
    print(f"\nkill-and-resume: {kills} kills ({by_signal}; moments {by_mode}) over {rounds} runs of {STEPS} steps, "
          f"{torn} of them inside a write (a temp file left, swept by the next start), {startup} SIGTERM/SIGINT "
          f"during the interpreter's start-up (no handler yet: killed by the signal); every run bit-identical to the "
          f"uninterrupted one, in {time.time() - t0:.0f} s")


# --- crafted checkpoints ----------------------------------------------------------------------------------------

class Payload:
    """Unpickling this creates a file: the proof that something was (not) unpickled."""
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def _members(path):
    with np.load(path, allow_pickle=False) as z:
        return {k: z[k] for k in z.files}


def _save(path, arrays, meta=None):
    if meta is not None:
        arrays = dict(arrays, metadata=np.array(json.dumps(meta)))
    with open(path, "wb") as f:
        np.savez(f, **arrays)


def _crafted(marker):
    """{name: function(path of a good checkpoint) that damages or forges it in place}."""
    def meta_edit(edit):
        def craft(path):
            arrays = _members(path)
            meta = json.loads(arrays.pop("metadata").item())
            result = edit(meta)
            _save(path, arrays, meta if result is None else result)
        return craft

    def array_edit(edit):
        def craft(path):
            arrays = _members(path)
            edit(arrays, next(k for k in arrays if k.startswith("model/") and arrays[k].ndim == 2))
            _save(path, arrays)
        return craft

    def raw(data):
        def craft(path):
            content = data(path) if callable(data) else data
            with open(path, "wb") as f:
                f.write(content)
        return craft

    def bytes_of(path):
        with open(path, "rb") as f:
            return f.read()

    def flip(path):   # in the middle of the largest member's data, which its CRC-32 covers (the middle of the
        data = bytearray(bytes_of(path))   # file can fall in a header field no reader checks, e.g. zip64's extra)
        with zipfile.ZipFile(io.BytesIO(bytes(data))) as z:
            info = max(z.infolist(), key=lambda i: i.file_size)
        name_len, extra_len = struct.unpack("<HH", data[info.header_offset + 26:info.header_offset + 30])
        data[info.header_offset + 30 + name_len + extra_len + info.compress_size // 2] ^= 0x10
        return bytes(data)

    def replace_file(make):
        def craft(path):
            os.remove(path)
            make(path)
        return craft

    def pickled_member(name):
        def craft(path):
            arrays = _members(path)
            buf = io.BytesIO()
            np.lib.format.write_array(buf, np.array([Payload(marker)], dtype=object), allow_pickle=True)
            with zipfile.ZipFile(path, "w") as z:
                for k, v in arrays.items():
                    if k != name:
                        with z.open(k + ".npy", "w") as f:
                            np.lib.format.write_array(f, v)
                z.writestr(name + ".npy", buf.getvalue())
        return craft

    def zip_bomb(path):
        arrays = _members(path)
        with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
            for k, v in arrays.items():
                with z.open(k + ".npy", "w") as f:
                    np.lib.format.write_array(f, v)
            with z.open("model/bomb.npy", "w", force_zip64=True) as f:
                np.lib.format.write_array(f, np.zeros(1 << 26, np.float32))   # 256 MiB in ~256 KiB

    def huge_header(shape):
        def craft(path):
            arrays = _members(path)
            with zipfile.ZipFile(path, "w") as z:
                for k, v in arrays.items():
                    with z.open(k + ".npy", "w") as f:
                        np.lib.format.write_array(f, v)
                with z.open("model/huge.npy", "w") as f:
                    np.lib.format.write_array_header_1_0(f, {"descr": "<f4", "fortran_order": False, "shape": shape})
        return craft

    def setter(key, value):
        return meta_edit(_set(key, value))

    def strip_optimizer(path):
        arrays = _members(path)
        _save(path, {k: v for k, v in arrays.items() if not k.startswith("optimizer/")})

    cases = {
        "zero-length": raw(b""), "truncated to 100 bytes": raw(lambda p: bytes_of(p)[:100]),
        "truncated to half": raw(lambda p: bytes_of(p)[:len(bytes_of(p)) // 2]),
        "truncated by 1 byte": raw(lambda p: bytes_of(p)[:-1]), "a flipped bit": raw(flip),
        "random bytes": raw(np.random.default_rng(0).bytes(5000)), "text": raw(b"hello, checkpoint\n" * 50),
        "a pickle renamed to .npz": raw(pickle.dumps({"payload": Payload(marker)})),
        "a .npy object array": raw(lambda p: (lambda b: (np.save(b, np.array([Payload(marker)], dtype=object),
                                                                 allow_pickle=True), b.getvalue())[1])(io.BytesIO())),
        "pickled metadata": pickled_member("metadata"), "a pickled parameter": pickled_member("model/head.weight"),
        "a pickled optimizer state": pickled_member("optimizer/head.weight/m"),
        "a pickled extra member": pickled_member("extra"),
        "metadata not JSON": meta_edit(lambda m: "{not json"),
        "metadata a list": meta_edit(lambda m: [1, 2]),
        "version 1": setter("version", 1), "version '2'": setter("version", "2"),
        "unknown task ../../evil": setter("config.task", "../../evil"),
        "unknown model os.system": setter("config.model", "os.system"),
        "an extra config field": setter("config.evil", 1),
        "steps -5": setter("config.steps", -5), "eval_every 0": setter("config.eval_every", 0),
        "config.lr a string": setter("config.lr", "fast"), "model_config a list": setter("config.model_config", [1]),
        "config a string": setter("config", "x"), "d_hidden a string": setter("config.model_config.d_model", "big"),
        "d_model 10^6": setter("config.model_config.d_model", 10 ** 6),
        "options a list": setter("config.options", [1]), "last a list": setter("last", [1]),
        "last with a string metric": setter("last", {"valid": "x"}),
        "an option ctl does not take": setter("config.options", {"train_size": 5}),
        "history of strings": setter("history", ["a"]), "history an int": setter("history", 5),
        "best a list": setter("best", [1]), "step -3": setter("step", -3), "step '200'": setter("step", "200"),
        "train_time a string": setter("train_time", "x"), "optimizer.t a string": setter("optimizer.t", "x"),
        "parameters repeated": meta_edit(lambda m: m["parameters"].append(m["parameters"][0])),
        "a missing parameter": array_edit(lambda a, k: a.pop(k)),
        "an extra array": array_edit(lambda a, k: a.update({"model/evil": np.zeros(3, np.float32)})),
        "a wrongly shaped parameter": array_edit(lambda a, k: a.update({k: np.zeros((3, 3), np.float32)})),
        "a transposed parameter": array_edit(lambda a, k: a.update({k: np.ascontiguousarray(a[k].T[:, :-1])})),
        "a scalar parameter": array_edit(lambda a, k: a.update({k: np.float32(1)})),
        "a string parameter": array_edit(lambda a, k: a.update({k: np.full(a[k].shape, "x")})),
        "float64 weights": array_edit(lambda a, k: a.update({k: a[k].astype(np.float64)})),
        "float16 weights": array_edit(lambda a, k: a.update({k: a[k].astype(np.float16)})),
        "int32 weights": array_edit(lambda a, k: a.update({k: a[k].astype(np.int32)})),
        "bool weights": array_edit(lambda a, k: a.update({k: a[k] > 0})),
        "complex weights": array_edit(lambda a, k: a.update({k: a[k].astype(np.complex64)})),
        "structured weights": array_edit(lambda a, k: a.update({k: a[k].astype([("x", np.float32)])})),
        "NaN weights": array_edit(lambda a, k: a.update({k: np.full_like(a[k], np.nan)})),
        "inf weights": array_edit(lambda a, k: a.update({k: np.full_like(a[k], np.inf)})),
        "a NaN optimizer moment": (lambda p: _save(p, {k: (np.full_like(v, np.nan) if k.startswith("optimizer/") else v)
                                                       for k, v in _members(p).items()})),
        "a declared shape of 10^12": huge_header((10 ** 12,)),
        "a declared shape of (2^62, 4)": huge_header((2 ** 62, 4)),
        "a zip bomb": zip_bomb,
        "a directory": replace_file(os.mkdir), "a FIFO": replace_file(os.mkfifo),
        "a link to /dev/zero": replace_file(lambda p: os.symlink("/dev/zero", p)),
        "a dangling link": replace_file(lambda p: os.symlink(p + ".gone", p)),
        "an old checkpoint.pkl with a payload": replace_file(
            lambda p: open(os.path.join(os.path.dirname(p), "checkpoint.pkl"), "wb").write(
                pickle.dumps({"version": 1, "payload": Payload(marker)}))),
        "optimizer state stripped": strip_optimizer,
        "running sums without their metadata": (lambda p: _save(p, dict(_members(p), **{
            "running/loss_sum": np.float32(1), "running/norm_sum": np.float32(1)}))),
        "running metadata without its sums": setter("running", {"seen": 3, "n_batches": 1, "stats": []}),
        "a running sum that is not finite": (lambda p: _save(p, dict(_members(p), **{
            "running/loss_sum": np.float32(np.nan), "running/norm_sum": np.float32(1)}),
            dict(json.loads(_members(p)["metadata"].item()), running={"seen": 3, "n_batches": 1, "stats": []}))),
    }
    return cases


MODES = {"--resume": lambda d: ["--resume", d, "--steps", "4", "--no-progress"],
         "--evaluate": lambda d: ["--evaluate", "--out", d],
         "--plot": lambda d: ["--plot", "--out", d, "--plot-dir", os.path.join(os.path.dirname(d), "plots")],
         "--analyze": lambda d: ["--analyze", "--out", d]}
READ_WEIGHTS_ONLY = {("optimizer state stripped", mode) for mode in ("--evaluate", "--plot", "--analyze")}


def test_crafted_checkpoints_are_refused_in_one_line_in_every_mode(tmp_path, capsys):
    t0 = time.time()
    good = str(tmp_path / "good")
    assert train.main(TINY + ["--steps", "2", "--out", good]) == 0
    marker = str(tmp_path / "unpickled")
    cases, n, refused = _crafted(marker), 0, 0
    for name, craft in cases.items():
        for mode, argv in MODES.items():
            d = str(tmp_path / "case" / "run")
            shutil.rmtree(tmp_path / "case", ignore_errors=True)
            shutil.copytree(good, d)
            craft(os.path.join(d, "checkpoint.npz"))
            capsys.readouterr()
            start = time.time()
            code = train.main(argv(d))
            err = capsys.readouterr().err
            n += 1
            assert time.time() - start < 30, (name, mode)
            assert not os.path.exists(marker), (name, mode)
            loaded = code == 0 or err == "error: no analysis for task ctl\n"   # (ctl has no --analyze)
            assert loaded == ((name, mode) in READ_WEIGHTS_ONLY), (name, mode, err)
            if loaded:
                continue
            lines = err.splitlines()
            assert code == 2 and len(lines) == 1 and lines[0].startswith("error: "), (name, mode, err)
            assert "checkpoint" in err or "unknown" in err or "memory" in err, (name, mode, err)   # says what
            refused += 1
    print(f"\ncrafted checkpoints: {len(cases)} cases x {len(MODES)} modes = {n} runs, {refused} refused in one line "
          f"with exit 2, {n - refused} read the weights only (optimizer state stripped: --evaluate, --plot, "
          f"--analyze), "
          f"no code run, in {time.time() - t0:.0f} s")
