"""One command for a GPU machine: ``python -m minattn.tools.gpucheck`` (``make gpu-check``).

It runs, printing their output as they go, and then one summary line for each:

1. ``tests``:  the GPU test cases (``pytest -m gpu`` with MINATTN_REQUIRE_GPU=1, so a skip is a failure);
2. ``kernels``: each GPU kernel of the annex (minattn/fast/kernels.py, off in training unless
   MINATTN_KERNELS=1) against its NumPy definition on the same inputs: float32, 1e-5 relative to the
   array's largest entry, the same argmax in every row (a tie in the definition excepted); one line
   each;
3. ``bench``:  ``python -m minattn.tools.bench --device gpu``;
4. ``resume``: NDR on CTL at the paper preset for 200 steps, and the same run stopped after 100
   steps and resumed to 200: every array of the two final checkpoints (parameters, optimizer state)
   and the final metrics must be bit-identical. Float atomics or a device RNG that does not replay
   would show here first;
5. ``torch``:  where PyTorch is installed, NDR's training step at the paper's CTL shape against the same
   model in PyTorch eager on the same device (``python -m minattn.tools.torch_twin``), after
   ``tests/test_torch_twin.py`` has checked that the two compute the same logits and gradients. Without
   torch it passes as "skipped" (torch is no dependency of minattn).

It needs a Python with numpy, cupy, tqdm and pytest and nothing else (no venv, no network): ``make
gpu-check PY=python3``. It runs ``train.py`` from the repository this package sits in. Arguments
after ``--`` go to every train.py run (the tests use that for a tiny model on the CPU). Exit status:
0 when every part passed, 1 when one failed, 2 when the device cannot be used at all.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

from minattn import backend

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PARTS = ("tests", "kernels", "bench", "resume", "torch")


def _run(argv, env=None):
    """Run a command, echoing its output; returns (exit status, output lines)."""
    print("$ " + " ".join(argv), flush=True)
    p = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         env=dict(os.environ, **(env or {})))
    lines = []
    for line in p.stdout:
        print(line, end="", flush=True)
        lines.append(line.rstrip("\n"))
    return p.wait(), lines


def check_tests(device, _):
    code, lines = _run([sys.executable, "-m", "pytest", "-q", "-m", "gpu"],
                       env={"MINATTN_REQUIRE_GPU": "1" if device == "gpu" else "0"})
    return code == 0, (lines[-1].strip("= ") if lines else "no output")


def check_bench(device, _):
    code, lines = _run([sys.executable, "-m", "minattn.tools.bench", "--device", device])
    ndr = [ln.strip() for ln in lines if ln.strip().startswith("train")][:1]
    return code == 0, ("NDR " + ndr[0] if ndr else f"exit status {code}")


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
    base = [sys.executable, "train.py", "--task", "ctl", "--model", "ndr", "--preset", opts.preset,
            "--device", device, "--no-progress", *opts.train_args]
    with tempfile.TemporaryDirectory(prefix="gpucheck-") as tmp:
        straight, split = os.path.join(tmp, "straight"), os.path.join(tmp, "split")
        for argv in ([*base, "--steps", str(steps), "--out", straight],
                     [*base, "--steps", str(half), "--out", split],
                     [*base, "--steps", str(steps), "--out", split, "--resume"]):
            code, lines = _run(argv)
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


def check_torch(device, opts):
    """minattn/torch ms per step of NDR at the paper's CTL shape, once the twin is shown to compute
    the same."""
    try:
        import torch  # noqa: F401
    except ImportError:
        return True, "skipped: PyTorch is not installed"
    code, lines = _run([sys.executable, "-m", "pytest", "-q", "tests/test_torch_twin.py"])
    if code != 0:
        return False, "the torch twin does not match minattn: " + (lines[-1] if lines else "")
    code, lines = _run([sys.executable, "-m", "minattn.tools.torch_twin", "--device", device,
                        "--preset", "paper"])
    timing = [ln.strip() for ln in lines if "minattn/torch" in ln][:1]
    return code == 0 and bool(timing), (timing[0] if timing else f"exit status {code}")


# --- kernels: each GPU kernel of the annex (minattn/fast/kernels.py) against its definition -------

TOLERANCE = 1e-5   # float32: the largest difference, relative to the definition's largest entry


def compare(ref, got, tol=TOLERANCE):
    """(largest relative difference, ties, problem or None) for two dicts of host arrays: each array
    within ``tol`` of the definition's, relative to its largest entry, and the same argmax along its
    last axis in every row but those where the definition's own top two are closer than ``tol``
    (ties, counted)."""
    worst, ties = 0.0, 0
    for name, r in ref.items():
        g = got[name]
        if g.shape != r.shape or not np.all(np.isfinite(g)):
            return worst, ties, f"{name}: shape {g.shape} vs {r.shape}, or not finite"
        rows = (-1, r.shape[-1] if r.ndim else 1)
        r, g = r.astype(np.float64).reshape(rows), g.astype(np.float64).reshape(rows)
        scale = max(np.abs(r).max(initial=0.0), 1e-30)
        rel = np.abs(g - r).max(initial=0.0) / scale
        worst = max(worst, rel)
        if rel > tol:
            return worst, ties, f"{name}: relative difference {rel:.1e} > {tol:.0e}"
        top2 = -np.sort(-r, axis=1)[:, :2]
        tie = (top2[:, 0] - top2[:, -1] < tol * scale) if r.shape[1] > 1 else np.zeros(len(r), bool)
        differ = (g.argmax(axis=1) != r.argmax(axis=1)) & ~tie
        ties += int(tie.sum())
        if differ.any():
            return worst, ties, f"{name}: another argmax in {int(differ.sum())} of {len(r)} rows"
    return worst, ties, None


def _forward_backward(device, fn, *inputs, seed=1):
    """fn(*tensors) on ``device`` and its backward for a fixed random output gradient: the output
    and every input's gradient, as host arrays. ``inputs``: host arrays or Modules (parameters)."""
    from minattn.engine import Tensor
    from minattn.nn import Module
    ins = [a.to(device) if isinstance(a, Module) else
           Tensor(backend.to_device(a, device), requires_grad=True) for a in inputs]
    y = fn(*ins)
    gy = np.random.default_rng(seed).standard_normal(y.shape).astype(np.float32)
    y.backward(backend.to_device(gy, device))
    grads = {f"grad {i}": t.grad for i, t in enumerate(ins) if not isinstance(t, Module)}
    for i, m in enumerate(ins):
        if isinstance(m, Module):
            grads.update({f"grad {i}.{n}": p.grad for n, p in m.named_parameters()})
    grads["forward"] = y.data
    return {k: backend.to_numpy(g) for k, g in grads.items()}


def kernel_cases():
    """(name, case(device) -> host arrays) for each kernel form: fixed inputs with padding, a width
    d that is not a multiple of 32, dropout masks drawn from a fixed stream (the same each run)."""
    from minattn import functional as F
    from minattn import nn
    from minattn.attention import geometric as G
    from minattn.engine import faster
    from minattn.models.encoder import CopyGateLayer, EncoderConfig
    B, H, T, d, r = 4, 2, 9, 72, np.random.default_rng(0)
    i, j = np.arange(T)[:, None], np.arange(T)[None, :]
    key_mask = j[0] < np.array([T, T - 2, 5, 1])[:, None]          # padding; one row with one key

    def normal(*shape):
        return r.standard_normal(shape).astype(np.float32)
    qk, s, abc, z = normal(B, H, T, T), normal(B, H, T, 2), normal(3), 3 * normal(B, H, T, T)
    x, h = normal(B, T, d), normal(B, T, d)
    norm_weight, norm_bias = 1 + 0.1 * normal(d), 0.1 * normal(d)

    def norm():
        m = nn.LayerNorm(d)
        m.weight.data, m.bias.data = norm_weight, norm_bias
        return m

    def logits(dev):
        right = backend.to_device(j > i, dev)
        return _forward_backward(dev, lambda q, s_, a: faster(G.directional_logits, q)(
            q, s_, a[:1], a[1:2], a[2:], right), qk, s, abc)

    def weights(dev):
        mask = backend.to_device(key_mask, dev)
        return _forward_backward(dev, lambda z_: G.geometric_attention_weights(z_, mask), z)

    def layer_norm(dev):
        return _forward_backward(dev, lambda x_, n: F.layer_norm(x_, n.weight, n.bias), x, norm())

    def layer(dev):
        cfg = EncoderConfig(d_model=d, n_head=H, d_ff=2 * d, dropout=0.3)
        rng = np.random.default_rng(0)                            # the same weights in every run
        m = CopyGateLayer(G.GeometricAttention(d, H, 0.1, rng=rng), cfg, rng).to(dev)
        m.set_rng(backend.RNG(7, dev))
        mask = backend.to_device(key_mask, dev)
        return _forward_backward(dev, lambda h_, m_: m_(h_, key_mask=mask), h, m)

    return [("directional logits (Eqs. 9-10)", logits), ("geometric weights (Eq. 7)", weights),
            ("layer norm", layer_norm),
            ("the NDR copy-gate layer (3 kernels)", layer)]


def check_kernels(device, _):
    """Each kernel form with the kernels on against the same code with them off (its definition)."""
    from minattn.engine import plain
    from minattn.fast import kernels
    if device not in kernels.KERNEL_DEVICES:
        print(f"(on {device} no kernel runs: each definition is compared with itself)")
    failed, worst, cases = [], 0.0, kernel_cases()
    for name, case in cases:
        with plain(False):
            with kernels.switched(False):
                ref = case(device)
            with kernels.switched(True):
                got = case(device)
        rel, ties, problem = compare(ref, got)
        worst = max(worst, rel)
        print(f"  {name:40s} {'DIFFERS' if problem else 'equal'}  max rel. diff {rel:.1e}, "
              f"same argmax ({ties} ties)" + (f": {problem}" if problem else ""), flush=True)
        if problem:
            failed.append(name)
    if failed:
        return False, f"{len(failed)} kernel(s) differ from their definitions: {', '.join(failed)}"
    return True, f"{len(cases)} kernel forms equal to their definitions (max rel. diff {worst:.1e})"


CHECKS = {"tests": check_tests, "bench": check_bench, "resume": check_resume, "torch": check_torch,
          "kernels": check_kernels}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="gpu", help="gpu (cpu only to test this check itself)")
    ap.add_argument("--only", default=",".join(PARTS),
                    help=f"comma-separated parts of {list(PARTS)}")
    ap.add_argument("--steps", type=int, default=200,
                    help="steps of the resume check (resumed at half)")
    ap.add_argument("--preset", default="paper", help="train.py preset of the resume check")
    ap.add_argument("train_args", nargs="*",
                    help="after --: more train.py arguments for the resume check")
    opts = ap.parse_args(argv)
    parts = opts.only.split(",")
    if set(parts) - set(PARTS) or opts.steps < 2:
        print(f"error: --only takes {', '.join(PARTS)} and --steps at least 2", file=sys.stderr)
        return 2
    if not os.path.exists(os.path.join(ROOT, "train.py")):
        print(f"error: gpucheck runs train.py from the repository, and {ROOT} has none: run it in "
              "a clone",
              file=sys.stderr)
        return 2
    try:
        backend.get_xp(opts.device)   # an unusable GPU is one line here, not three failures
    except backend.DeviceError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    summary, t0 = [], time.perf_counter()
    for name in parts:
        print(f"\n=== gpu-check: {name} ===", flush=True)
        try:
            ok, detail = CHECKS[name](opts.device, opts)
        except Exception as e:   # keep going: the summary reports it
            ok, detail = False, f"{e.__class__.__name__}: {e}"
        summary.append((name, ok, detail))
    print(f"\n=== gpu-check summary (device {opts.device}, {time.perf_counter() - t0:.0f} s) ===")
    for name, ok, detail in summary:
        print(f"{name:7s} {'PASS' if ok else 'FAIL'}  {detail}")
    passed = all(ok for _, ok, _ in summary)
    print("gpu-check: " + ("all passed" if passed else "FAILED"))
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
