"""``make bench``: speed of the engine and of the models, printed as a table (never asserted).

    python -m minattn.tools.bench [--device cpu|gpu] [--only engine,mlp,...] [--repeat N]

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

from minattn import backend, optim
from minattn import functional as F
from minattn import nn
from minattn.engine import Tensor


def wait(xp):
    """Wait for the device's queued work (CuPy's null stream; nothing on NumPy)."""
    if xp is not np:
        xp.cuda.Stream.null.synchronize()


def timeit(fn, xp=np, repeat=5, min_time=0.2, sync=None):
    """Median seconds per call of ``fn`` over ``repeat`` batches of calls lasting ≥ min_time each.
    ``sync`` waits for the device (default: CuPy's null stream when ``xp`` is CuPy)."""
    sync = sync or (lambda: wait(xp))
    fn()
    sync()
    n, times = 1, []
    t0 = time.perf_counter()
    fn()
    sync()
    one = max(time.perf_counter() - t0, 1e-7)
    n = max(1, int(min_time / one))
    for _ in range(repeat):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        sync()
        times.append((time.perf_counter() - t0) / n)
    return statistics.median(times)


PHASES = ("forward", "backward", "clip", "optimizer")


def train_step(model, opt, loss_fn, rng=None, clip=None, phases=None):
    """A closure that runs one training step: loss → backward → (clip) → optimizer update. ``phases``:
    a dict to which each step adds the host seconds of each of PHASES (no sync between them: on a
    GPU this is the host's time, the GPU's work overlapping it)."""
    def step():
        t = [time.perf_counter()]
        if rng is not None:
            model.set_rng(rng)
        loss = loss_fn()
        t.append(time.perf_counter())
        opt.zero_grad()
        loss.backward()
        t.append(time.perf_counter())
        if clip:
            optim.clip_grad_norm(model.parameters(), clip)
        t.append(time.perf_counter())
        opt.step()
        t.append(time.perf_counter())
        if phases is not None:
            for name, a, b in zip(PHASES, t, t[1:]):
                phases[name] = phases.get(name, 0.0) + b - a
    return step


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


def bench_mlp(device, repeat):
    """A 2-layer MLP training step vs the raw matmuls it needs (fwd 2, bwd 3)."""
    xp = backend.get_xp(device)
    print("mlp     2-layer MLP forward+backward vs the 5 raw matmuls it needs")
    for B, d in [(64, 64), (256, 256), (1024, 1024), (2048, 2048)]:
        rng = np.random.default_rng(0)
        l1, l2 = nn.Linear(d, d, rng=rng).to(device), nn.Linear(d, 10, rng=rng).to(device)
        x = Tensor(xp.asarray(rng.standard_normal((B, d)), dtype=np.float32))
        y = xp.asarray(rng.integers(0, 10, B))
        params = l1.parameters() + l2.parameters()
        opt = optim.AdamW(params, lr=1e-3)

        def fwd_bwd():
            loss = F.cross_entropy(l2(F.relu(l1(x))), y)
            opt.zero_grad()
            loss.backward()
        t = timeit(fwd_bwd, xp, repeat)
        t_opt = timeit(opt.step, xp, repeat)
        a, w1, w2 = x.data, l1.weight.data, l2.weight.data
        h = a @ w1
        g = xp.ones((B, 10), np.float32)

        def raw():
            a @ w1, h @ w2, g @ w2.T, h.T @ g, a.T @ h
        r = timeit(raw, xp, repeat)
        print(f"        B={B:5d} d={d:5d}: fwd+bwd {t * 1e3:8.3f} ms   raw matmuls {r * 1e3:8.3f} "
              f"ms   ratio {t / r:5.2f}   (+ AdamW step {t_opt * 1e3:7.3f} ms)")


def encoder_flops(B, T, cfg, gated):
    """Matmul FLOPs of one training step of a shared-layer encoder (forward 2·M·N·K, ×3 with
    backward)."""
    d = cfg.d_model
    N = B * T
    per_layer = N * d * 3 * d + N * d * d          # q, k, v and output projections
    per_layer += 2 * B * T * T * d                  # Q Kᵀ and A V over all heads
    per_layer += 2 * N * d * cfg.d_ff               # feed-forward
    if gated:
        per_layer += 2 * N * d * d                  # gate feed-forward
    return 3 * 2 * per_layer * cfg.n_steps


def ndr_step(device, preset="cpu", batch=None, phases=None):
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
                      clip=run.grad_clip, phases=phases)
    return step, model, (x, lengths, y), run


def bench_ndr(device, repeat):
    """NDR on CTL at the cpu preset: a training step on a batch of CTL-sized sequences, and
    evaluation."""
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
    flops = encoder_flops(B, T, cfg, gated=True)
    print(f"ndr     CTL cpu preset (d={cfg.d_model}, d_ff={cfg.d_ff}, {cfg.n_steps} steps), batch "
          f"{B}×{T}:")
    print(f"        train {t * 1e3:7.1f} ms/step  {B * T / t:8.0f} tokens/s  {flops / 1e9:5.1f} "
          f"GFLOP/step  MFU {flops / t / peak:4.2f} (peak {peak / 1e9:.0f} GFLOP/s)")
    print(f"        eval  {te * 1e3:7.1f} ms/batch  train/eval time per sample {t / te:4.1f}×")


def bench_crt(device, repeat):
    """A Contextual Retrieval Task training step (docs/compositional.md §9: batch 256 × 10 objects,
    D = 64, 2 searches, 4 retrievals) for the multi-head and the compositional model; data
    generation excluded."""
    from minattn.models.compositional import CRTConfig, CRTModel
    xp = backend.get_xp(device)
    B, N, S, R = 256, 10, 2, 4
    rng = np.random.default_rng(0)
    x = xp.asarray(rng.standard_normal((B, N, S + R + S * R)), dtype=np.float32)
    y = xp.asarray(rng.standard_normal((B, N)), dtype=np.float32)
    print(f"crt     CRT step (L1 loss, Adam), batch {B}×{N}, D=64, S={S}, R={R}:")
    for name in ("mha", "compositional"):
        model = CRTModel(name, x.shape[-1], CRTConfig(searches=S, retrievals=R)).to(device)
        opt = optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.0)

        step = train_step(model, opt, lambda: F.abs(model(x) - y).mean())
        t = timeit(step, xp, repeat, min_time=1.0)
        print(f"        {name:14s} {t * 1e3:7.1f} ms/step  ({model.num_parameters():,} parameters)")


def bench_seq2attn(device, repeat):
    """seq2attn on lookup tables (docs/seq2attn.md §2.5: E = H = 256, Adam, clip 5, teacher forcing
    0.5) on binary compositions (4 input and 4 output steps): ms per training sequence at batch 1
    (the paper's) and 64. At batch 1 the AdamW update of all 1.5M parameters is a large share, so it
    is shown apart."""
    from minattn.models.seq2attn import Seq2Attn, model_config
    xp = backend.get_xp(device)
    model = Seq2Attn(model_config("seq2attn"), 19, 12, sos_id=2).to(device)
    opt = optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0)
    run_rng, rng = backend.RNG(0, device), np.random.default_rng(0)
    print(f"seq2attn lookup tables (E = H = 256, {model.num_parameters():,} parameters), 4 input "
          "and 4 output steps:")
    for B in (1, 64):
        src, tgt = xp.asarray(rng.integers(2, 19, (B, 4))), xp.asarray(rng.integers(4, 12, (B, 4)))
        lengths = xp.full(B, 4)

        step = train_step(model, opt, lambda: model.loss(src, lengths, tgt, lengths), run_rng, clip=5.0)
        t = timeit(step, xp, repeat, min_time=1.0)
        t_opt = timeit(opt.step, xp, repeat)
        print(f"        batch {B:3d}: {t * 1e3:7.2f} ms/step = {t * 1e3 / B:7.3f} ms per training "
              f"sequence (of which the AdamW update {t_opt * 1e3:5.2f} ms/step)")


def bench_abstractor(device, repeat):
    """One object-sorting training step (docs/abstractor.md §6.1: batch 512 × 10 objects, d = 64, 2
    heads each 64 wide, Adam) for the Abstractor and the Transformer. MFU counts the matmuls: every
    attention (self, cross, RCA) maps 10 positions to 10, so each costs the same."""
    from minattn.attention.multihead import MultiHeadAttention
    from minattn.attention.relational import RelationalCrossAttention
    from minattn.models.abstractor import AbstractorConfig, build_seq2seq
    from minattn.models.seq2seq import FeedForwardBlock
    xp = backend.get_xp(device)
    B, T, d_in, n_classes = 512, 10, 12, 10
    rng = np.random.default_rng(0)
    x = xp.asarray(rng.standard_normal((B, T, d_in)), dtype=np.float32)
    y = xp.asarray(np.argsort(rng.random((B, T)), axis=1))
    tgt_in = xp.concatenate([xp.full((B, 1), n_classes, dtype=y.dtype), y[:, :-1]], axis=1)
    peak = matmul_peak(device)
    print(f"abstractor object sorting, batch {B}×{T} (peak {peak / 1e9:.0f} GFLOP/s measured now):")
    for name, layers in (("abstractor", {}),
                         ("transformer-seq2seq", dict(n_encoder_layers=4, n_decoder_layers=4))):
        cfg = AbstractorConfig(**layers)
        model = build_seq2seq(name, n_classes + 1, n_classes, cfg, d_src=d_in).to(device)
        opt = optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0)
        run_rng = backend.RNG(0, device)

        step = train_step(model, opt, lambda: F.cross_entropy(model(x, tgt_in), y), run_rng)
        t = timeit(step, xp, repeat, min_time=1.0)
        n_attn = sum(isinstance(m, (MultiHeadAttention, RelationalCrossAttention))
                     for _, m in model.named_modules())
        n_ffn = sum(isinstance(m, FeedForwardBlock) for _, m in model.named_modules())
        N, d, inner = B * T, cfg.d_model, cfg.n_head * (cfg.d_head or cfg.d_model)
        # q, k, v, o; QKᵀ and αV
        attention = 2 * N * d * 3 * inner + 2 * N * inner * d + 2 * 2 * N * T * inner
        flops = 3 * (n_attn * attention + n_ffn * 2 * 2 * N * d * cfg.d_ff + 2 * N * (d_in + n_classes) * d)
        print(f"        {name:20s} {t * 1e3:7.1f} ms/step  {B * T / t:8.0f} tokens/s  "
              f"{flops / 1e9:5.1f} GFLOP/step  "
              f"MFU {flops / t / peak:4.2f}  ({model.num_parameters():,} parameters)")


def peak_step_memory(step, device):
    """Peak bytes of the arrays one call of ``step()`` allocates (activations, the graph, gradients;
    call it after a first step, so optimizer state exists): tracemalloc on CPU (NumPy reports its
    buffers to it); on GPU, what CuPy's pool holds after the step, emptied before (freed blocks stay
    in the pool)."""
    xp = backend.get_xp(device)
    if xp is np:
        import tracemalloc
        tracemalloc.start()
        try:
            step()
            return tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    pool = xp.get_default_memory_pool()
    before = pool.used_bytes()
    pool.free_all_blocks()
    step()
    wait(xp)
    return pool.total_bytes() - before


def bench_coda(device, repeat):
    """CoDA (docs/coda.md) next to softmax attention at the same sizes: a training step of the
    encoder classifier ("transformer" vs "transformer-coda" at the CTL cpu preset: d 128, 4 heads,
    d_ff 256, 11 steps; batch 128 at two lengths) and of the MLU encoder–decoder (cpu preset: 2+2
    layers, d 128, 4 heads of 32, batch 128, inputs of 16 characters, targets of 8), with the peak
    memory of a step. Then the L1 distance alone, fused vs its composite, at the MLU encoder's size.
    Target: CoDA ≤ 2× softmax."""
    from minattn.attention.coda import l1_distance, l1_distance_reference
    from minattn.models.encoder import Classifier, EncoderConfig
    from minattn.models.seq2seq import CoDASeq2SeqTransformer, EncoderDecoderConfig, Seq2SeqTransformer
    xp = backend.get_xp(device)
    rng = np.random.default_rng(0)

    def measure(model, loss_fn):
        opt = optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.0)
        run_rng = backend.RNG(0, device)

        step = train_step(model, opt, loss_fn, run_rng)
        step()
        return timeit(step, xp, repeat, min_time=1.0), peak_step_memory(step, device)

    def row(label, soft, quasi):
        (ts, ms), (tc, mc) = soft, quasi
        print(f"        {label:34s} softmax {ts * 1e3:7.1f} ms {ms / 2**20:6.1f} MiB   coda "
              f"{tc * 1e3:7.1f} ms {mc / 2**20:6.1f} MiB   ratio time {tc / ts:4.2f} memory "
              f"{mc / ms:4.2f}")
    print("coda    CoDA vs softmax attention, one training step (ms) and the peak memory of its "
          "arrays (MiB):")
    cfg = EncoderConfig(d_model=128, n_head=4, d_ff=256, n_steps=11, dropout=0.1,
                        embedding_init="kaiming")
    for T in (8, 32):
        x, y = xp.asarray(rng.integers(0, 19, (128, T))), xp.asarray(rng.integers(0, 8, 128))
        lengths = xp.full(128, T)
        results = [measure(m, lambda m=m: F.cross_entropy(m(x, lengths), y)) for m in
                   (Classifier(name, 19, 8, cfg).to(device)
                    for name in ("transformer", "transformer-coda"))]
        row(f"encoder, CTL preset, batch 128×{T}", *results)
    cfg = EncoderDecoderConfig(d_model=128, n_head=4, d_head=32, d_ff=512, n_encoder_layers=2,
                               n_decoder_layers=2,
                               ln_eps=1e-5, pe_layout="interleaved")
    src, tgt = xp.asarray(rng.integers(1, 18, (128, 16))), xp.asarray(rng.integers(3, 14, (128, 8)))
    tgt_in = xp.concatenate([xp.ones((128, 1), dtype=tgt.dtype), tgt[:, :-1]], axis=1)
    results = [measure(m, lambda m=m: F.cross_entropy(m(src, tgt_in), tgt)) for m in
               (cls(14, 14, cfg, n_src_tokens=18).to(device)
                for cls in (Seq2SeqTransformer, CoDASeq2SeqTransformer))]
    row("MLU encoder–decoder, batch 128", *results)
    q, k = (Tensor(xp.asarray(rng.standard_normal((128, 4, 16, 32)), dtype=np.float32),
                   requires_grad=True)
            for _ in range(2))
    g = xp.ones((128, 4, 16, 16), dtype=np.float32)
    fused, naive = (timeit(lambda fn=fn: fn(q, k).backward(g), xp, repeat)
                    for fn in (l1_distance, l1_distance_reference))
    print(f"        L1 distance (128, 4, 16×16, 32) fwd+bwd: fused {fused * 1e3:6.1f} ms, "
          f"composite {naive * 1e3:6.1f} ms")


SECTIONS = {"engine": bench_engine, "mlp": bench_mlp, "ndr": bench_ndr, "crt": bench_crt,
            "seq2attn": bench_seq2attn, "abstractor": bench_abstractor, "coda": bench_coda}


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
    print(f"device {args.device}, "
          f"OPENBLAS_NUM_THREADS={os.environ.get('OPENBLAS_NUM_THREADS', 'unset')}, "
          f"numpy {np.__version__}")
    peak = matmul_peak(args.device)
    print(f"peak    float32 2048² matmul: {peak / 1e9:7.1f} GFLOP/s (measured now)")
    for name in args.only.split(","):
        SECTIONS[name](args.device, args.repeat)
    return 0


if __name__ == "__main__":
    backend.keep_freed_memory()  # ~10% faster steps here; see its docstring
    sys.exit(main())
