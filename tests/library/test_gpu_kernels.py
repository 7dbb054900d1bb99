"""The GPU tier of the annex (minattn/fast/kernels*.py): what can be checked without a GPU, and on one.

(a) every CUDA source compiles with NVRTC (CuPy's own bindings with an explicit -arch need no device; CuPy's
    compile_using_nvrtc and RawModule.compile ask the device for its arch, so they would). Skipped where CuPy
    is absent, as in the CI venv. (b) Each kernel's algorithm as a NumPy transcription of its CUDA source
    (``EMULATIONS``: the same loops, per thread or per warp lane) stands in for the compiled kernel, so the
    kernel Functions' launch code runs on the CPU against their definitions; a planted bug is caught; the
    counter counts each kernel as one launch. (c) On the ``gpu`` marker, each kernel against its definition on
    CuPy (``make gpu-check``'s kernels part runs the same cases).
"""
import os

import numpy as np
import pytest

from minattn import backend
from minattn.engine import Tensor, faster, plain
from minattn.fast import kernels
from minattn.fast.grouped import GroupedLayerNorm
from minattn.models.encoder import CopyGateLayer
from minattn.ops.fused import LayerNorm
from minattn.tools import counting

from tests.conftest import _skip_or_fail_without_gpu
from tests.library.test_launches import NDR_CTL_KERNELS_BUDGET

f32 = np.float32


# --- (b) the kernels, transcribed into NumPy: one vectorised step per step of a thread (or warp lane) -------

def _weights(grid, block, args, right_first=True):
    """ndr_geometric_weights: one thread per row r; every row's loop runs side by side."""
    z, invalid, A, rows, T, rows_per_mask, masked = args
    rows, T, r = int(rows), int(T), np.arange(int(rows))
    i, z, A = r % T, z.reshape(rows, T), A.reshape(rows, T)
    mask = invalid.reshape(-1, T)[(r // int(rows_per_mask)) * T + i]         # invalid[m + j], by row
    acc = np.zeros(rows, f32)
    for k in range(2 * T):
        j = (i - k // 2 if k % 2 else i + k // 2) if right_first else (i + k // 2 if k % 2 else i - k // 2)
        on = (j >= 0) & (j < T) & (k != 1)
        zj = np.where(mask[on, j[on]], masked, z[r[on], j[on]])
        acc[on] += np.maximum(zj, f32(0)) + np.log1p(np.exp(-np.abs(zj)))
        A[r[on], j[on]] = np.exp(zj - acc[on])


def _weights_backward(grid, block, args):
    z, invalid, A, gA, gz, rows, T, rows_per_mask, masked = args
    rows, T, r = int(rows), int(T), np.arange(int(rows))
    i, z, A, gA, gz = r % T, z.reshape(rows, T), A.reshape(rows, T), gA.reshape(rows, T), gz.reshape(rows, T)
    mask = invalid.reshape(-1, T)[(r // int(rows_per_mask)) * T + i]
    acc = np.zeros(rows, f32)
    for k in range(2 * T - 1, -1, -1):
        j = i - k // 2 if k % 2 else i + k // 2
        on = (j >= 0) & (j < T) & (k != 1)
        rr, jj = r[on], j[on]
        zj = np.where(mask[on, jj], masked, z[rr, jj])
        g = gA[rr, jj] * A[rr, jj]
        acc[on] += g
        gz[rr, jj] = g - acc[on] * np.exp(zj - (np.maximum(zj, f32(0)) + np.log1p(np.exp(-np.abs(zj)))))


def _logits(qk, s, alpha, beta, gamma, T):
    """ndr_directional_logits (elementwise): i is each entry's flat index."""
    T, i = int(T), np.arange(qk.size)
    row, key = i // T, i % T
    z = alpha[0] * qk.reshape(-1) + (s.reshape(-1)[2 * row + (key > row % T)] * beta[0] + gamma[0])
    return z.reshape(qk.shape)


def _logits_backward(grid, block, args):
    gz, alpha, beta, gqk, gs, gbs, rows, T = args
    rows, T = int(rows), int(T)
    i, gz, gqk = np.arange(rows) % T, gz.reshape(rows, T), gqk.reshape(rows, T)
    left, right = np.zeros(rows, f32), np.zeros(rows, f32)
    for j in range(T):
        gqk[:, j] = alpha[0] * gz[:, j]
        right += np.where(j > i, gz[:, j], f32(0))
        left += np.where(j > i, f32(0), gz[:, j])
    gbs.reshape(rows, 2)[:] = np.stack([left, right], 1)
    gs.reshape(rows, 2)[:] = np.stack([left * beta[0], right * beta[0]], 1)


def _lanes(d):
    """The warp's rounds: in round k0 lane l handles entry k0 + l (lanes past d idle)."""
    return [slice(k0, min(k0 + 32, d)) for k0 in range(0, d, 32)]


def _warp_sum(v):
    """__shfl_xor_sync's butterfly over the lanes' partial sums (rows, 32): each lane ends with the sum."""
    for offset in (16, 8, 4, 2, 1):
        v = v + v[:, np.arange(32) ^ offset]
    assert (v == v[:, :1]).all()
    return v[:, 0]


def _norm(grid, block, args):
    """ndr_layer_norm: one warp per row; lane l's partial sums are column l of ``s``."""
    x, res, mask, w, b, y, xhat, rstd, rows, d, eps, residual, masked = args
    rows, d = int(rows), int(d)
    x, res, mask, y, xhat = (a.reshape(rows, d) for a in (x, res, mask, y, xhat))
    s = np.zeros((rows, 32), f32)
    for k in _lanes(d):
        v = x[:, k] * mask[:, k] if masked else x[:, k]
        v = res[:, k] + v if residual else v
        xhat[:, k] = v
        s[:, :k.stop - k.start] += v
    mu, s = _warp_sum(s) / f32(d), np.zeros((rows, 32), f32)
    for k in _lanes(d):
        c = xhat[:, k] - mu[:, None]
        xhat[:, k] = c
        s[:, :k.stop - k.start] += c * c
    r = f32(1) / np.sqrt(_warp_sum(s) / f32(d) + eps)
    for k in _lanes(d):
        xhat[:, k] = xhat[:, k] * r[:, None]
        y[:, k] = xhat[:, k] * w[k] + b[k]
    rstd.reshape(-1)[:] = r


def _norm_backward(grid, block, args, use_mask=True):
    gy, xhat, rstd, w, mask, gv, gx, rows, d, masked = args
    rows, d = int(rows), int(d)
    gy, xhat, mask, gv, gx = (a.reshape(rows, d) for a in (gy, xhat, mask, gv, gx))
    s1, s2 = np.zeros((rows, 32), f32), np.zeros((rows, 32), f32)
    for k in _lanes(d):
        g = gy[:, k] * w[k]
        s1[:, :k.stop - k.start] += g
        s2[:, :k.stop - k.start] += g * xhat[:, k]
    m1, m2, r = _warp_sum(s1) / f32(d), _warp_sum(s2) / f32(d), rstd.reshape(-1)
    for k in _lanes(d):
        v = r[:, None] * (gy[:, k] * w[k] - m1[:, None] - xhat[:, k] * m2[:, None])
        gv[:, k] = v
        if masked:
            gx[:, k] = v * mask[:, k] if use_mask else v


def _sigmoid(x):
    return f32(0.5) * (np.tanh(f32(0.5) * x) + f32(1))


def _gate(pre, c, u, h, m):
    g = _sigmoid(pre + c) * m
    return h + g * (u - h), g


def _gate_backward(go, pre, c, u, h, m):
    s = _sigmoid(pre + c)
    gu = go * (s * m)
    return go * (u - h) * m * s * (f32(1) - s), gu, go - gu


EMULATIONS = {
    "ndr_directional_logits": _logits, "ndr_directional_logits_backward": _logits_backward,
    "ndr_geometric_weights": _weights, "ndr_geometric_weights_backward": _weights_backward,
    "ndr_layer_norm": _norm, "ndr_layer_norm_backward": _norm_backward,
    "ndr_bias_relu_dropout": lambda y, b, m: np.maximum(y + b, f32(0)) * m,
    "ndr_bias_relu_dropout_backward": lambda go, out, m: np.where(out > 0, go * m, f32(0)),
    "ndr_copy_gate": _gate, "ndr_copy_gate_backward": _gate_backward,
}

PLANTS = {   # a bug each, in the emulation: the check must see it
    "left key wins ties": ("ndr_geometric_weights", lambda g, b, a: _weights(g, b, a, right_first=False)),
    "dropout mask missing in the norm's backward": (
        "ndr_layer_norm_backward", lambda g, b, a: _norm_backward(g, b, a, use_mask=False)),
    "ReLU passes negatives back": ("ndr_bias_relu_dropout_backward", lambda go, out, m: go * m),
}


def emulate(monkeypatch, plant=None):
    """Run the kernels' launch code on NumPy, the emulations standing in for the compiled kernels. Returns
    the set that collects the names of the kernels launched."""
    emulations, used = dict(EMULATIONS), set()
    if plant:
        name, fn = PLANTS[plant]
        emulations[name] = fn

    def launcher(name, fn):
        return lambda *args: used.add(name) or fn(*args)
    monkeypatch.setattr(kernels, "_COMPILED", {name: launcher(name, fn) for name, fn in emulations.items()})
    monkeypatch.setattr(kernels, "KERNEL_DEVICES", {"gpu", "cpu"})
    return used


def test_every_kernel_has_an_emulation_here():
    assert set(EMULATIONS) == set(kernels.SOURCES)


# --- the cases: each kernel form on fixed inputs, its output and every gradient (make gpu-check's part (a)
# runs the tests below that use them, on the GPU) ------------------------------------------------------------

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
    out = {"forward": y.data}
    for i, t in enumerate(ins):
        named = [(f".{n}", p) for n, p in t.named_parameters()] if isinstance(t, Module) else [("", t)]
        out.update({f"grad {i}{n}": p.grad for n, p in named})
    return {k: backend.to_numpy(g) for k, g in out.items()}


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

    def logits(dev):
        right = backend.to_device(j > i, dev)
        return _forward_backward(dev, lambda q, s_, a: faster(G.directional_logits, q)(
            q, s_, a[:1], a[1:2], a[2:], right), qk, s, abc)

    def weights(dev):
        mask = backend.to_device(key_mask, dev)
        return _forward_backward(dev, lambda z_: G.geometric_attention_weights(z_, mask), z)

    def layer_norm(dev):
        n = nn.LayerNorm(d)
        n.weight.data, n.bias.data = norm_weight, norm_bias
        return _forward_backward(dev, lambda x_, n_: F.layer_norm(x_, n_.weight, n_.bias), x, n)

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


CASES = dict(kernel_cases())


@pytest.mark.parametrize("name", list(CASES))
def test_each_emulated_kernel_equals_its_definition(name, monkeypatch):
    with plain(False):
        with kernels.switched(False):
            ref = CASES[name]("cpu")
        used = emulate(monkeypatch)
        with kernels.switched(True):
            got = CASES[name]("cpu")
    worst, ties, problem = compare(ref, got)
    assert problem is None, problem
    assert len(used) >= 2 and all(n + "_backward" in used for n in used if not n.endswith("_backward")), used
    print(f"{name}: {sorted(used)}: max rel. diff {worst:.1e}, {ties} ties")


LAYER = "the NDR copy-gate layer (3 kernels)"


@pytest.mark.parametrize("plant,case", [
    ("left key wins ties", "geometric weights (Eq. 7)"),
    ("dropout mask missing in the norm's backward", LAYER),
    ("ReLU passes negatives back", LAYER)])
def test_a_planted_bug_is_caught(plant, case, monkeypatch):
    with plain(False):
        with kernels.switched(False):
            ref = CASES[case]("cpu")
        emulate(monkeypatch, plant)
        with kernels.switched(True):
            got = CASES[case]("cpu")
    assert compare(ref, got)[2] is not None


def test_dropout_masks_come_from_the_same_draws(monkeypatch):
    """The kernel form of the copy-gate layer draws its masks as the layer's Dropouts do: the same result,
    and the stream ends in the same state."""
    from minattn.attention.geometric import GeometricAttention
    from minattn.models.encoder import EncoderConfig
    emulate(monkeypatch)
    ends, outs = [], []
    cfg = EncoderConfig(d_model=40, n_head=2, d_ff=80, dropout=0.3, gate_dropout=0.2)
    for on in (False, True):
        weights = np.random.default_rng(0)
        layer = CopyGateLayer(GeometricAttention(40, 2, 0.1, rng=weights), cfg, weights)
        rng = backend.RNG(7, "cpu")
        layer.set_rng(rng)
        h = Tensor(np.random.default_rng(0).standard_normal((2, 3, 40)).astype(f32), requires_grad=True)
        with plain(False), kernels.switched(on):
            outs.append(layer(h).data)
        ends.append(rng._gen.bit_generator.state["state"])
    assert ends[0] == ends[1] and np.abs(outs[0] - outs[1]).max() < 1e-5


def test_kernels_are_off_by_default_and_switch_on_and_off():
    if os.environ.get("MINATTN_KERNELS", "") in ("", "0"):
        assert not kernels.is_on()
    with plain(False):
        with kernels.switched(False):
            assert faster(LayerNorm) is GroupedLayerNorm
            assert faster(CopyGateLayer.forward) is CopyGateLayer.forward
        with kernels.switched(True):
            assert faster(LayerNorm).__name__ == "LayerNormKernel"
            assert faster(CopyGateLayer.forward).__name__ == "copy_gate_forward"
            with plain():
                assert faster(LayerNorm) is LayerNorm and faster(CopyGateLayer.forward) is CopyGateLayer.forward


def test_the_counter_counts_each_kernel_as_one_launch_and_ndr_within_its_budget():
    with plain(False), kernels.switched(True):
        counting.COUNTER.detail = True
        try:
            launches, syncs = counting.count_step(*counting.ndr_ctl_step("ndr"))
            sites = counting.COUNTER.sites
        finally:
            counting.COUNTER.detail = False
    per_kernel = {what: n for (_, _, what), n in sites.items() if what.startswith("kernel ")}
    assert len(per_kernel) == 12 and set(per_kernel.values()) == {14}, per_kernel   # 6 kernels x 2, 14 steps
    assert sum(syncs.values()) == 0 and sum(launches.values()) <= NDR_CTL_KERNELS_BUDGET, launches


# --- (a) NVRTC: every source compiles (no device needed) ---------------------------------------------------

_C_TYPES = {"float32": "float", "int32": "int", "bool": "bool"}


def as_raw_kernel(name, in_params, out_params, operation):
    """An ElementwiseKernel's source in outline, as CuPy generates it: each parameter a local of the index i
    (an output a reference to its entry), ``raw`` ones pointers, the operation the loop's body."""
    args, locals_ = [], []
    params = [(p, False) for p in in_params.split(",")] + [(p, True) for p in out_params.split(",")]
    for param, out in params:
        *raw, typ, var = param.split()
        c = _C_TYPES[typ]
        if raw:
            args.append(f"const {c}* {var}")
        else:
            args.append(f"{'' if out else 'const '}{c}* _{var}")
            locals_.append(f"{c}{'&' if out else ''} {var} = _{var}[i];")
    return (f'extern "C" __global__ void {name}({", ".join(args)}, long long n) {{\n'
            f"  for (long long i = blockIdx.x * blockDim.x + threadIdx.x; i < n;"
            f" i += blockDim.x * gridDim.x) {{\n"
            f"    {' '.join(locals_)}\n{operation}\n  }}\n}}\n")


def nvrtc_compile(name, code, arch):
    """PTX of ``code`` for ``arch`` by CuPy's NVRTC bindings, or the compiler's log as an AssertionError."""
    nvrtc = pytest.importorskip("cupy", reason="CuPy is not installed (the CI venv has none)").cuda.nvrtc
    try:
        nvrtc.getVersion()
    except Exception as e:   # a CuPy without its NVRTC library
        pytest.skip(f"NVRTC cannot be loaded: {e}")
    prog = nvrtc.createProgram(code, f"{name}.cu", (), ())
    try:
        nvrtc.compileProgram(prog, (f"-arch={arch}",))
    except nvrtc.NVRTCError as e:
        log = nvrtc.getProgramLog(prog)
        raise AssertionError(f"{name} does not compile for {arch}: {e}\n{log}") from None
    return nvrtc.getPTX(prog)


@pytest.mark.parametrize("name", sorted(kernels.SOURCES))
@pytest.mark.parametrize("arch", ["compute_70", "compute_90"])
def test_every_kernel_source_compiles_with_nvrtc(name, arch):
    kind, src = kernels.SOURCES[name]
    ptx = nvrtc_compile(name, src if kind == "raw" else as_raw_kernel(name, *src), arch)
    assert f".entry {name}".encode() in ptx


def test_the_nvrtc_check_fails_on_a_broken_source():
    kind, (ins, outs, op) = kernels.SOURCES["ndr_copy_gate"]
    with pytest.raises(AssertionError, match="does not compile"):
        broken = as_raw_kernel("broken", ins, outs, op.replace("tanhf", "tanh_f"))
        nvrtc_compile("broken", broken, "compute_70")


# --- (c) on a GPU: each kernel against its definition ------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("name", list(CASES))
def test_each_kernel_equals_its_definition_on_the_gpu(name):
    _skip_or_fail_without_gpu()
    with plain(False):
        with kernels.switched(False):
            ref = CASES[name]("gpu")
        with kernels.switched(True):
            got = CASES[name]("gpu")
    worst, ties, problem = compare(ref, got)
    assert problem is None, problem
