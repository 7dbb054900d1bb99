"""One command for a GPU machine (``make gpu-check``) and, with ``--window --out DIR``, the one call
for a lent GPU (docs/gpu.md). Its parts, in the order a decision on the GPU tier
(minattn/fast/kernels*.py, off unless MINATTN_KERNELS=1) needs them:

a. ``kernels``: each kernel form against its NumPy definition on the same inputs (``compare``);
b. ``steps``: NDR's training step with the kernels off, on, and in PyTorch eager (the twin, once
   tests/tools/test_torch_twin.py has shown it computes the same; skipped without torch),
   alternating in one process, at the paper and cpu presets;
c. ``why``: host time split into minattn's Python and CuPy's cost per call (a batch-1 step on the
   device and on NumPy), per-phase host times, a profile of kernels-on steps, the GPU's busy time;
d. ``resume``: NDR on CTL straight, and stopped halfway then resumed: every checkpoint array and
   the final metrics bit-identical (float atomics or a device RNG that does not replay show here);
e. ``suite``: ``pytest -m gpu`` with MINATTN_REQUIRE_GPU=1 (a skip is a failure);
f. ``card``: ``train.py --task ctl --model ndr`` into DIR/f-card-run, the kernels on if (a) passed,
   until ``--budget`` seconds from the start; then SIGTERM (train.py saves its step; a later window
   continues it with ``--card-run``).

Without ``--window`` it runs (a)-(e), 200 steps in (d); ``--window`` runs all six, 100 steps in (d),
and (d) and (e) with the kernels on. With ``--out DIR`` each part's output also goes to
DIR/<part>.txt as it runs and its summary line to DIR/summary.txt, so a cut call keeps the parts
before it. ``--device cpu`` runs every part on the CPU (tests/tools/test_gpucheck.py). It needs a
Python with numpy, cupy, tqdm and pytest (no venv, no network), runs train.py from this repository
with the arguments after ``--``, and exits 0 when every part passed, 1 when one failed, 2 when the
device cannot be used.
"""
import argparse
import contextlib
import cProfile
import importlib.util
import json
import os
import pstats
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

from minattn import backend

from . import bench

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _run(argv, env=None, stop_after=None):
    """Run a command, echoing its output; returns (exit status, output lines). ``stop_after``:
    seconds after which it gets SIGTERM (and SIGKILL a minute later)."""
    print("$ " + " ".join([*(f"{k}={v}" for k, v in (env or {}).items()), *argv]), flush=True)
    p = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         env=dict(os.environ, **(env or {})))
    timers = [] if stop_after is None else [threading.Timer(stop_after, p.terminate),
                                            threading.Timer(stop_after + 60, p.kill)]
    lines = []
    try:
        for timer in timers:
            timer.daemon = True
            timer.start()
        for line in p.stdout:
            print(line, end="", flush=True)
            lines.append(line.rstrip("\n"))
        return p.wait(), lines
    finally:   # the check itself interrupted (Ctrl-C, a test's time limit): no orphan left running
        for timer in timers:
            timer.cancel()
        if p.poll() is None:
            p.kill()
            p.wait()


def _pytest(device, *args, env=None):
    """pytest on ``args`` (a skipped GPU case fails on a GPU): (passed, pytest's last line)."""
    code, lines = _run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args],
                       env={"MINATTN_REQUIRE_GPU": "1" if device == "gpu" else "0", **(env or {})})
    return code == 0, (lines[-1].strip("= ") if lines else "no output")


# --- (a) each GPU kernel of the annex (minattn/fast/kernels.py) against its definition ---------

def check_kernels(device, _):
    """Each kernel form with the kernels on against the same code with them off (its definition):
    ``kernel_cases`` compared by tests/library/test_gpu_kernels.py on the device, and on NumPy
    transcriptions of the kernels' CUDA."""
    return _pytest(device, "-v", "tests/library/test_gpu_kernels.py", "-k", "equals_its_definition")


# --- (b) NDR's step with the kernels off, on and in PyTorch eager; (c) why ------------------------

def have_torch():
    return importlib.util.find_spec("torch") is not None


def twin_problem(device):
    """None when the torch twin computes what minattn does (tests/tools/test_torch_twin.py), else
    why it is not timed."""
    if not have_torch():
        return "PyTorch is not installed"
    ok, last = _pytest(device, "-q", "tests/tools/test_torch_twin.py")
    return None if ok else "the torch twin does not match minattn: " + last


def check_steps(device, opts):
    """NDR's training step with the kernels off, on, and in PyTorch eager (the twin), in one process:
    ``--rounds`` rounds, the order reversed every other round, each round a ``bench.timeit`` block of
    at least ``--min-time`` seconds per variant; the median of each and the ratios."""
    from minattn.fast import kernels
    xp, found, twin = backend.get_xp(device), [], twin_problem(device)
    for preset in opts.presets.split(","):
        variants = {}   # name -> (step, sync, kernels on)
        for name, on in (("kernels off", False), ("kernels on", True)):
            step, _, inputs, run = bench.ndr_step(device, preset, opts.batch)
            variants[name] = step, None, on
        try:            # a twin that cannot run costs its column, not the kernels' numbers
            if twin is None:
                from .torch_twin import twin_step
                torch_step, torch_sync = twin_step(run, inputs, device)
                torch_step()
                variants["torch eager"] = torch_step, torch_sync, False
        except Exception as e:
            twin = f"{e.__class__.__name__}: {e}"
        if twin:
            print(f"torch eager: skipped ({twin})")
        times, order = {name: [] for name in variants}, list(variants)
        for r in range(opts.rounds):
            for name in order if r % 2 == 0 else order[::-1]:
                step, sync, on = variants[name]
                with kernels.switched(on):
                    times[name].append(bench.timeit(step, xp, 1, opts.min_time, sync) * 1e3)
        ms = {name: statistics.median(t) for name, t in times.items()}
        B, T = inputs[0].shape
        print(f"{preset} preset, batch {B}×{T}, {opts.rounds} alternating rounds, ms per step:")
        for name, t in times.items():
            print(f"  {name:12s} {ms[name]:8.2f}   rounds {' '.join(f'{x:.2f}' for x in t)}")
        ratios = {"on/off": ms["kernels on"] / ms["kernels off"]}
        if "torch eager" in ms:
            ratios.update({"on/torch": ms["kernels on"] / ms["torch eager"],
                           "off/torch": ms["kernels off"] / ms["torch eager"]})
        print("  " + "   ".join(f"{k} {v:.3f}" for k, v in ratios.items()), flush=True)
        found.append(f"{preset}: " + ", ".join(f"{k} {v:.2f}" for k, v in ratios.items()))
    mismatch = bool(twin) and twin.startswith("the torch twin")
    return not mismatch, "; ".join(found + [twin] * mismatch)


def gpu_busy_ms(step, xp, host_ms, n=4096):
    """(GPU ms of one step's work, whether the host had queued all of it before the GPU reached it):
    float32 matmuls that last about twice the step's host time run first, and CUDA events time what
    follows them, so the GPU never waits for the host and the time is its own."""
    a = xp.ones((n, n), np.float32)
    out = xp.empty_like(a)
    start, mid, end = (xp.cuda.Event() for _ in range(3))
    start.record()
    xp.matmul(a, a, out=out)
    mid.record()
    mid.synchronize()
    one = xp.cuda.get_elapsed_time(start, mid)
    start.record()
    for _ in range(int(2 * host_ms / one) + 1):
        xp.matmul(a, a, out=out)
    mid.record()
    t0 = time.perf_counter()
    step()
    queued = (time.perf_counter() - t0) * 1e3
    end.record()
    end.synchronize()
    return xp.cuda.get_elapsed_time(mid, end), queued < xp.cuda.get_elapsed_time(start, mid)


def _steps(step, n, xp):
    for _ in range(n):
        step()
    bench.wait(xp)


def check_why(device, opts):
    """Why: host time = minattn's Python (P) + n device operations × CuPy's cost per call (c); a
    profile of kernels-on training steps; the host time of each phase and the GPU's busy time (last:
    the one measurement only a GPU runs)."""
    from minattn.engine import plain
    from minattn.fast import kernels
    from . import counting
    xp, presets = backend.get_xp(device), opts.presets.split(",")
    print("1. host work alone: a batch-1 step (cpu preset; the GPU's work negligible) on the device "
          "and on NumPy (the annex's path, as on CuPy; there the kernels run their definitions)")
    n, ms = {}, {}
    for on in (False, True):
        with plain(False), kernels.switched(on):
            n[on] = sum(counting.count_step(*counting.ndr_ctl_step())[0].values())   # device operations
            for dev in dict.fromkeys((device, "cpu")):
                step = bench.ndr_step(dev, "cpu", 1)[0]
                ms[dev, on] = bench.timeit(step, backend.get_xp(dev), 3, opts.min_time) * 1e3
                print(f"   {dev} kernels {'on ' if on else 'off'}: {ms[dev, on]:7.2f} ms/step, "
                      f"{n[on]} device operations counted")
    found = [f"batch 1: {device} {ms[device, False]:.1f}/{ms[device, True]:.1f} ms (kernels off/on)"]
    if device != "cpu":
        c = {on: (ms[device, on] - ms["cpu", on]) / n[on] * 1e3 for on in (False, True)}
        print(f"   P ≤ the NumPy time (minattn's Python + NumPy's calls); c ≈ (device − NumPy) / "
              f"n: {c[False]:.1f} µs per call (kernels off), {c[True]:.1f} µs (on)")
        found.append(f"NumPy {ms['cpu', False]:.1f}/{ms['cpu', True]:.1f} ms, "
                     f"c ≈ {c[False]:.1f}/{c[True]:.1f} µs per call")
    print(f"2. cProfile of {opts.block} training steps, kernels on ({presets[0]} preset), by own time")
    with kernels.switched(True):
        step = bench.ndr_step(device, presets[0], opts.batch)[0]
        _steps(step, 2, xp)
        profile = cProfile.Profile()
        profile.enable()
        _steps(step, opts.block, xp)
        profile.disable()
    pstats.Stats(profile, stream=sys.stdout).sort_stats("tottime").print_stats(45)
    print("3. host ms per phase (no sync between phases: what the host spends), and on a GPU its busy "
          "time per step (its work queued behind a blocker, CUDA events)")
    for preset, on in [(p, on) for p in presets for on in (False, True)]:
        phases = {}
        with kernels.switched(on):
            step = bench.ndr_step(device, preset, opts.batch, bench.timed(phases))[0]
            _steps(step, 2, xp)
            phases.clear()
            _steps(step, opts.block, xp)
            row = "  ".join(f"{k} {v / opts.block * 1e3:7.2f}" for k, v in phases.items())
            host = sum(phases.values()) / opts.block * 1e3
            busy = [gpu_busy_ms(step, xp, host) for _ in range(3 * (device != "cpu"))]
        if busy:
            row += f"   GPU {statistics.median(b for b, _ in busy):7.2f} ms" + (
                "" if all(q for _, q in busy) else " (the host was not ahead of the GPU: an upper bound)")
        print(f"   {preset} kernels {'on ' if on else 'off'}: {row}")
    return True, "; ".join(found)


# --- (d) resume bit for bit; (e) the GPU suite; (f) the card's run ----------------------------------

def checkpoint_arrays(run_dir):
    """Every array of a run's checkpoint.npz, by name (the JSON metadata, which holds wall times,
    aside)."""
    with np.load(os.path.join(run_dir, "checkpoint.npz"), allow_pickle=False) as z:
        return {k: z[k] for k in z.files if k != "metadata"}


def compare_arrays(a, b):
    """None when both dicts hold the same keys and bit-identical arrays, else what differs first."""
    if a.keys() != b.keys():
        return f"different arrays: {sorted(set(a) ^ set(b))[:3]}"
    for k in sorted(a):
        if a[k].shape != b[k].shape or a[k].dtype != b[k].dtype or a[k].tobytes() != b[k].tobytes():
            same_shape = a[k].shape == b[k].shape
            diff = np.abs(a[k].astype(np.float64) - b[k].astype(np.float64)).max() if same_shape else "shape"
            return f"{k} differs (max |diff| {diff})"
    return None


def check_resume(device, opts):
    """200 steps straight vs 100 + resume to 200, compared bit for bit."""
    steps, half = opts.steps, opts.steps // 2
    base = [sys.executable, "train.py", "--task", "ctl", "--model", "ndr", "--device", device,
            "--preset", opts.presets.split(",")[0], "--no-progress", *opts.train_args]
    with tempfile.TemporaryDirectory(prefix="gpucheck-") as tmp:
        straight, split = os.path.join(tmp, "straight"), os.path.join(tmp, "split")
        for argv in ([*base, "--steps", str(steps), "--out", straight],
                     [*base, "--steps", str(half), "--out", split],
                     [*base, "--steps", str(steps), "--out", split, "--resume"]):
            code, lines = _run(argv, opts.env)
            if code != 0:
                return False, f"train.py exited {code}: {lines[-1] if lines else ''}"
        a, b = checkpoint_arrays(straight), checkpoint_arrays(split)
        results = [json.load(open(os.path.join(d, "results.json"))) for d in (straight, split)]
    problem = compare_arrays(a, b)
    if problem is None and results[0]["final_metrics"] != results[1]["final_metrics"]:
        problem = f"final metrics differ: {results[0]['final_metrics']} vs {results[1]['final_metrics']}"
    if problem:
        return False, f"{steps} steps straight vs {half} + resume: {problem}"
    return True, (f"{steps} steps straight == {half} + resume to {steps}: {len(a)} arrays "
                  f"bit-identical; {results[0]['ms_per_step']} ms/step; final "
                  f"{results[0]['final_metrics']}")


def check_suite(device, opts):
    return _pytest(device, "-q", "-m", "gpu", env=opts.env)


def check_card(device, opts):
    """The card's run in OUT/f-card-run until the window's time is up, then SIGTERM; ``--card-run
    DIR``: an earlier window's f-card-run, copied there first and continued (--resume)."""
    run_dir = os.path.join(opts.out, "f-card-run")
    if opts.card_run and not os.path.exists(run_dir):
        shutil.copytree(opts.card_run, run_dir)
    resume = os.path.exists(os.path.join(run_dir, "checkpoint.npz"))
    seconds = max(opts.deadline - time.monotonic() - STOP_GRACE_S, MIN_CARD_S)
    on = opts.kernels_passed
    print(f"kernels {'on' if on else 'off'}; SIGTERM in {seconds:.0f} s", flush=True)
    code, lines = _run([sys.executable, "train.py", "--task", "ctl", "--model", "ndr", "--device",
                        device, "--no-progress", "--out", run_dir, *(["--resume"] if resume else []),
                        *opts.train_args], env={"MINATTN_KERNELS": str(int(on))}, stop_after=seconds)
    if code == 0:
        with open(os.path.join(run_dir, "results.json")) as f:
            r = json.load(f)
        return True, f"finished: {r['steps']} steps, {r['ms_per_step']} ms/step, {r['metrics']}"
    if code != 143 or not os.path.exists(os.path.join(run_dir, "checkpoint.npz")):
        return False, f"train.py exited {code}: {lines[-1] if lines else ''}"
    from minattn.lab.rundir import load_checkpoint
    ckpt = load_checkpoint(os.path.join(run_dir, "checkpoint.npz"))
    return True, (f"stopped (SIGTERM) at step {ckpt['step']}, saved: "
                  f"{ckpt['train_time'] / max(ckpt['step'], 1) * 1e3:.1f} ms/step, last evaluation "
                  f"{ckpt['history'][-1] if ckpt['history'] else None}; a later window continues it "
                  f"with --card-run (this f-card-run)")


STOP_GRACE_S = 15   # seconds between the card's SIGTERM and the budget's end
MIN_CARD_S = 10     # the card's run gets at least this, even past the budget
PARTS = (("a-kernels", check_kernels), ("b-steps", check_steps), ("c-why", check_why),
         ("d-resume", check_resume), ("e-suite", check_suite), ("f-card", check_card))


class _Tee:
    """stdout to the console and a part's file."""

    def __init__(self, *streams):
        self.streams = streams

    def write(self, text):
        for stream in self.streams:
            stream.write(text)
        return len(text)

    def flush(self):
        for stream in self.streams:
            stream.flush()


def run_parts(parts, device, opts):
    """Each part in order, its output to the console and (with --out) to OUT/<part>.txt as it runs,
    its summary line appended to OUT/summary.txt."""
    def path(name):
        return os.path.join(opts.out, name) if opts.out else os.devnull
    summary, t0 = [], time.monotonic()
    for name, check in parts:
        with open(path(name + ".txt"), "w") as f, contextlib.redirect_stdout(_Tee(sys.stdout, f)):
            print(f"=== gpu-check: {name} ({time.monotonic() - t0:.0f} s in; device {device}) ===",
                  flush=True)
            try:
                ok, detail = check(device, opts)
            except Exception as e:   # keep going: the summary reports it
                ok, detail = False, f"{e.__class__.__name__}: {e}"
            print(f"{name} {'PASS' if ok else 'FAIL'}  {detail}")
        if name == "a-kernels":
            opts.kernels_passed = ok      # the card's run (f) turns them on only then
        summary.append((name, ok, detail))
        with open(path("summary.txt"), "a") as f:
            f.write(f"{name:9s} {'PASS' if ok else 'FAIL'}  {detail}\n")
    return summary


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    names = [name[2:] for name, _ in PARTS]
    ap.add_argument("--device", default="gpu", help="gpu (cpu only to test this check itself)")
    ap.add_argument("--only", help=f"comma-separated parts of {names} (default: all but the card's "
                                   "run; with --window all)")
    ap.add_argument("--window", action="store_true",
                    help="the GPU window: every part, the kernels on in (d) and (e); needs --out")
    ap.add_argument("--out", help="the directory of the parts' files (needed by the card's run)")
    ap.add_argument("--steps", type=int, default=None,
                    help="(d): steps, resumed at half (200; with --window 100)")
    ap.add_argument("--presets", default="paper,cpu", help="(b, c): NDR's presets; (d): the first")
    ap.add_argument("--batch", type=int, default=0, help="(b, c): another batch size")
    ap.add_argument("--rounds", type=int, default=5, help="(b): alternating rounds")
    ap.add_argument("--min-time", type=float, default=0.5, help="(b, c): seconds per timing")
    ap.add_argument("--block", type=int, default=20,
                    help="(c): steps of the per-phase times and of the profile")
    ap.add_argument("--budget", type=float, default=480,
                    help="(f): seconds from the start to the end of the card's run")
    ap.add_argument("--card-run", help="(f): an earlier window's f-card-run, to continue")
    ap.add_argument("train_args", nargs="*",
                    help="after --: more train.py arguments for (d) and (f)")
    opts = ap.parse_args(argv)
    only = opts.only.split(",") if opts.only else [n for n in names if opts.window or n != "card"]
    opts.steps = opts.steps or (100 if opts.window else 200)
    problem = (f"--only takes {', '.join(names)}" if set(only) - set(names) else
               "--steps takes at least 2" if opts.steps < 2 else
               "--window and the card's run need --out DIR"
               if (opts.window or "card" in only) and not opts.out else
               "--presets takes paper, cpu" if set(opts.presets.split(",")) - {"paper", "cpu"} else
               "--rounds, --min-time and --block take positive numbers"
               if min(opts.rounds, opts.min_time, opts.block, opts.batch + 1) <= 0 else None)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    if not os.path.exists(os.path.join(ROOT, "train.py")):
        print(f"error: gpucheck runs train.py from the repository, and {ROOT} has none: run it in "
              "a clone", file=sys.stderr)
        return 2
    try:
        backend.get_xp(opts.device)   # an unusable GPU is one line here, not six failures
    except backend.DeviceError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if opts.out:
        os.makedirs(opts.out, exist_ok=True)
    opts.env = {"MINATTN_KERNELS": "1"} if opts.window else {}
    opts.deadline, opts.kernels_passed = time.monotonic() + opts.budget, False
    t0 = time.perf_counter()
    summary = run_parts([(name, check) for name, check in PARTS if name[2:] in only], opts.device, opts)
    print(f"\n=== gpu-check summary (device {opts.device}, {time.perf_counter() - t0:.0f} s) ===")
    for name, ok, detail in summary:
        print(f"{name:9s} {'PASS' if ok else 'FAIL'}  {detail}")
    passed = all(ok for _, ok, _ in summary)
    print("gpu-check: " + ("all passed" if passed else "FAILED"))
    return 0 if passed else 1


if __name__ == "__main__":
    backend.keep_freed_memory()  # as train.py and bench do, so the window's NumPy times are theirs
    sys.exit(main())
