"""``make bench``: speed of the engine and of the models, printed as a table (never asserted).

    python -m minattn.bench [--device cpu|gpu] [--only engine,mlp,...] [--repeat N]

Each section reports the median of ``--repeat`` timings. Ratios are only meaningful within one run:
the machines here are shared and noisy, so every section that compares against a "physical" limit
measures that limit (a raw matmul) in the same process.
"""
import argparse
import os
import statistics
import sys
import time

import numpy as np

from . import backend, optim
from . import functional as F
from . import nn
from .engine import Tensor


def _sync(xp):
    if xp is not np:
        xp.cuda.Stream.null.synchronize()


def timeit(fn, xp=np, repeat=5, min_time=0.2):
    """Median seconds per call of ``fn`` over ``repeat`` batches of calls lasting ≥ min_time each."""
    fn()
    _sync(xp)
    n, times = 1, []
    t0 = time.perf_counter()
    fn()
    _sync(xp)
    one = max(time.perf_counter() - t0, 1e-7)
    n = max(1, int(min_time / one))
    for _ in range(repeat):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        _sync(xp)
        times.append((time.perf_counter() - t0) / n)
    return statistics.median(times)


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
    t = timeit(step, xp, repeat) / K
    print(f"engine  per-op overhead (mul fwd+bwd, 4 floats): {t * 1e6:6.2f} µs/op")


def bench_mlp(device, repeat):
    """A 2-layer MLP training step vs the raw matmuls it needs (fwd 2, bwd 3)."""
    xp = backend.get_xp(device)
    print("mlp     2-layer MLP step (fwd+bwd+AdamW) vs its 5 raw matmuls")
    for B, d in [(64, 64), (256, 256), (1024, 1024), (2048, 2048)]:
        rng = np.random.default_rng(0)
        l1, l2 = nn.Linear(d, d, rng=rng).to(device), nn.Linear(d, 10, rng=rng).to(device)
        x = Tensor(xp.asarray(rng.standard_normal((B, d)), dtype=np.float32))
        y = xp.asarray(rng.integers(0, 10, B))
        params = l1.parameters() + l2.parameters()
        opt = optim.AdamW(params, lr=1e-3)

        def step():
            loss = F.cross_entropy(l2(F.relu(l1(x))), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
        t = timeit(step, xp, repeat)
        a, w1, w2 = x.data, l1.weight.data, l2.weight.data
        h = a @ w1
        g = xp.ones((B, 10), np.float32)

        def raw():
            a @ w1, h @ w2, g @ w2.T, h.T @ g, a.T @ h
        r = timeit(raw, xp, repeat)
        print(f"        B={B:5d} d={d:5d}: step {t * 1e3:8.3f} ms   raw matmuls {r * 1e3:8.3f} ms   "
              f"step/raw {t / r:5.2f}")


SECTIONS = {"engine": bench_engine, "mlp": bench_mlp}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu", help="cpu or gpu")
    ap.add_argument("--only", default=",".join(SECTIONS), help=f"comma-separated sections of {list(SECTIONS)}")
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args(argv)
    try:
        backend.get_xp(args.device)
    except backend.DeviceError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    unknown = set(args.only.split(",")) - set(SECTIONS)
    if unknown:
        print(f"error: unknown section(s) {sorted(unknown)}; valid: {', '.join(SECTIONS)}", file=sys.stderr)
        return 2
    print(f"device {args.device}, OPENBLAS_NUM_THREADS={os.environ.get('OPENBLAS_NUM_THREADS', 'unset')}, "
          f"numpy {np.__version__}")
    peak = matmul_peak(args.device)
    print(f"peak    float32 2048² matmul: {peak / 1e9:7.1f} GFLOP/s (measured now)")
    for name in args.only.split(","):
        SECTIONS[name](args.device, args.repeat)
    return 0


if __name__ == "__main__":
    sys.exit(main())
