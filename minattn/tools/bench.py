"""``make bench``: speed of the engine and of the models, printed as a table (never asserted).

    python -m minattn.tools.bench [--device cpu|gpu] [--only engine,ndr,models] [--repeat N]

Each section reports the median of ``--repeat`` timings. Ratios mean something only within one run
(the machines are shared and noisy), so the raw matmul throughput is measured in the same process.
"""
import argparse
import contextlib
import os
import statistics
import sys
import time

import numpy as np

from minattn import backend, optim
from minattn import functional as F
from minattn.engine import Tensor


def wait(xp):
    """Wait for the device's queued work (CuPy's null stream; nothing on NumPy)."""
    if xp is not np:
        xp.cuda.Stream.null.synchronize()


def timeit(fn, xp=np, repeat=5, min_time=0.2, sync=None):
    """Median seconds per call of ``fn`` over ``repeat`` batches of calls lasting ≥ min_time each.
    ``sync`` waits for the device (default: CuPy's null stream when ``xp`` is CuPy)."""
    sync = sync or (lambda: wait(xp))
    fn()                                      # a warm-up, then one timed call sets the batch size
    sync()
    times, t0 = [], time.perf_counter()
    fn()
    sync()
    n = max(1, int(min_time / max(time.perf_counter() - t0, 1e-7)))
    for _ in range(repeat):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        sync()
        times.append((time.perf_counter() - t0) / n)
    return statistics.median(times)


PHASES = ("forward", "backward", "clipping", "optimizer")


def train_step(model, opt, loss_fn, rng=None, clip=None, phase=None):
    """A closure that runs one training step as train.py does: (set_rng) → loss → backward → (clip)
    → optimizer update, each of PHASES inside ``phase(name)`` (a context manager: the counter's, or
    ``timed``'s) when given."""
    phase = phase or (lambda name: contextlib.nullcontext())

    def step():
        with phase("forward"):
            if rng is not None:
                model.set_rng(rng)
            loss = loss_fn()
        with phase("backward"):
            opt.zero_grad()
            loss.backward()
        if clip:
            with phase("clipping"):
                optim.clip_grad_norm(model.parameters(), clip)
        with phase("optimizer"):
            opt.step()
    return step


def timed(seconds):
    """A ``phase`` for train_step that adds each phase's host seconds to the dict ``seconds`` (no
    sync between phases: on a GPU this is the host's time, the GPU's work overlapping it)."""
    @contextlib.contextmanager
    def phase(name):
        t0 = time.perf_counter()
        yield
        seconds[name] = seconds.get(name, 0.0) + time.perf_counter() - t0
    return phase


def matmul_peak(device, n=2048, repeat=5):
    """Measured float32 matmul throughput (FLOP/s) of this machine, right now."""
    xp = backend.get_xp(device)
    a = xp.ones((n, n), dtype=np.float32)
    return 2 * n ** 3 / timeit(lambda: a @ a, xp, repeat)


def bench_engine(device, repeat):
    """Per-op overhead: forward + backward of a chain of tiny elementwise ops, per op."""
    xp = backend.get_xp(device)
    x = Tensor(xp.ones(4, dtype=np.float32), requires_grad=True)
    K = 100

    def step():
        y = x
        for _ in range(K):
            y = y * 1.0001
        y.backward(xp.ones(4, dtype=np.float32))
    def raw():
        y = x.data
        # the same array work without the engine: one multiply forward, one back
        for _ in range(2 * K):
            y = y * 1.0001
    t = timeit(step, xp, repeat) / K
    r = timeit(raw, xp, repeat) / K
    print(f"engine  tiny mul, forward+backward: {t * 1e6:6.2f} µs/op, of which the array work "
          f"itself {r * 1e6:5.2f} µs: engine overhead {(t - r) * 1e6:5.2f} µs/op")


def ndr_flops(B, T, cfg):
    """Matmul FLOPs of one training step of NDR's shared-layer encoder (forward 2·M·N·K, ×3 with
    backward)."""
    d, N = cfg.d_model, B * T
    per_layer = N * d * 3 * d + N * d * d          # q, k, v and output projections
    per_layer += 2 * B * T * T * d                  # Q Kᵀ and A V over all heads
    per_layer += 2 * N * d * cfg.d_ff + 2 * N * d * d   # feed-forward and the gate's
    return 3 * 2 * per_layer * cfg.n_steps


def ndr_step(device, preset="cpu", batch=None, phase=None):
    """NDR on CTL at a preset of its recipe (model, batch size, lr, weight decay, clipping as its runs
    have them; ``batch`` another batch size), on a fixed random batch of T = 7 tokens (CTL's training
    samples are 4–8 tokens with SOS/EOS; bucketing leaves little padding). Returns (the training
    step's closure, the model, its inputs (ids, lengths, labels), the run's config)."""
    from minattn.lab.recipes import recipe_for
    from minattn.models.encoder import Classifier
    xp = backend.get_xp(device)
    run = recipe_for("ctl").config("ctl", "ndr", preset)
    B, T = batch or run.batch_size, 7
    model = Classifier("ndr", 19, 8, run.model_config).to(device)
    rng = np.random.default_rng(0)
    x = xp.asarray(rng.integers(0, 19, (B, T)))
    lengths = xp.full(B, T)
    y = xp.asarray(rng.integers(0, 8, B))
    opt = optim.AdamW(model.parameters(), lr=run.lr, weight_decay=run.weight_decay)
    step = train_step(model, opt, lambda: F.cross_entropy(model(x, lengths), y), backend.RNG(0, device),
                      clip=run.grad_clip, phase=phase)
    return step, model, (x, lengths, y), run


def bench_ndr(device, repeat):
    """NDR on CTL at the cpu preset: a training step on a batch of CTL-sized sequences; evaluation."""
    from minattn.engine import eval_mode, no_grad
    xp = backend.get_xp(device)
    step, model, (x, lengths, _), run = ndr_step(device)
    cfg = run.model_config
    B, T = x.shape

    def evaluate():
        with no_grad(), eval_mode():
            model(x, lengths)
    peak = matmul_peak(device)
    t = timeit(step, xp, repeat, min_time=1.0)
    te = timeit(evaluate, xp, repeat, min_time=1.0)
    flops = ndr_flops(B, T, cfg)
    print(f"ndr     CTL cpu preset (d={cfg.d_model}, d_ff={cfg.d_ff}, {cfg.n_steps} steps), batch "
          f"{B}×{T}:")
    print(f"        train {t * 1e3:7.1f} ms/step  {B * T / t:8.0f} tokens/s  {flops / 1e9:5.1f} "
          f"GFLOP/step  MFU {flops / t / peak:4.2f} (peak {peak / 1e9:.0f} GFLOP/s)")
    print(f"        eval  {te * 1e3:7.1f} ms/batch  train/eval time per sample {t / te:4.1f}×")


def bench_models(device, repeat):
    """A training step of each model family in the counter's table (minattn/tools/counting.py), at
    its sizes, so that the milliseconds here and the launches there describe the same step."""
    from .counting import families
    xp = backend.get_xp(device)
    print("models  a training step of each family of the counter's table, at its sizes:")
    for label, build in families(device):
        model, loss_fn, opt, clip, rng = build()
        t = timeit(train_step(model, opt, loss_fn, rng, clip), xp, repeat, min_time=1.0)
        print(f"        {label:32s} {t * 1e3:7.1f} ms/step  ({model.num_parameters():,} parameters)")


SECTIONS = {"engine": bench_engine, "ndr": bench_ndr, "models": bench_models}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu", help="cpu or gpu")
    ap.add_argument("--only", default=",".join(SECTIONS),
                    help=f"comma-separated sections of {list(SECTIONS)}")
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args(argv)
    try:
        backend.get_xp(args.device)
    except backend.DeviceError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    unknown = set(args.only.split(",")) - set(SECTIONS)
    if unknown:
        print(f"error: unknown section(s) {sorted(unknown)}; valid: {', '.join(SECTIONS)}",
              file=sys.stderr)
        return 2
    threads = os.environ.get("OPENBLAS_NUM_THREADS", "unset")
    print(f"device {args.device}, OPENBLAS_NUM_THREADS={threads}, numpy {np.__version__}")
    peak = matmul_peak(args.device)
    print(f"peak    float32 2048² matmul: {peak / 1e9:7.1f} GFLOP/s (measured now)")
    for name in args.only.split(","):
        SECTIONS[name](args.device, args.repeat)
    return 0


if __name__ == "__main__":
    backend.keep_freed_memory()  # ~10% faster steps here; see its docstring
    sys.exit(main())
