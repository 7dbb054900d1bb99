"""Launches per training step (minattn/tools/counting.py): the counting device's rules, the NDR step's budget,
and the annex (minattn/fast/) that cuts them: flat optimizer buffer, grouped and slice gradients, shared
layers. Every test here runs with the annex on, whatever MINATTN_PLAIN says (tests/library/test_plain_vs_fast.py
compares the two paths)."""
import numpy as np
import pytest

from minattn import backend, nn, optim
from minattn import functional as F
from minattn.engine import Tensor, plain
from minattn.models.encoder import CopyGateLayer, EncoderConfig
from minattn.attention.geometric import GeometricAttention

from minattn.tools import counting
from minattn.tools.counting import COUNTER, count_step
from minattn.tools.strict import HostConversionError

@pytest.fixture(autouse=True)
def _annex_on():
    with plain(False):
        yield


# Launches of one NDR training step on CTL at train.py's cpu preset (forward + backward + clipping +
# AdamW), and the autograd nodes its forward records (the engine's Python work): bounds just above what
# ``python -m minattn.tools.counting`` prints (their history is in RESULTS.md); with the GPU tier on
# (``--kernels``, tests/library/test_gpu_kernels.py), each kernel one launch.
NDR_CTL_BUDGET, NDR_CTL_NODES, NDR_CTL_KERNELS_BUDGET = 1845, 460, 770


def _counted(fn):
    COUNTER.reset()
    fn()
    return sum(COUNTER.launches.values()), sum(COUNTER.syncs.values())


def test_counting_rules_follow_cupy():
    x = backend.to_device(np.arange(12.0).reshape(3, 4), "counting")
    assert _counted(lambda: (x.reshape(4, 3), x.T, x.swapaxes(0, 1), x[1:], x[None])) == (0, 0)   # views
    assert _counted(lambda: x.T.reshape(-1)) == (1, 0)                         # a reshape that copies
    assert _counted(lambda: (x + 1, x.sum(axis=0), x @ x.T, np.exp(x))) == (4, 0)
    with pytest.raises(HostConversionError):
        x + np.ones(4)                                                         # host data mixed in
    assert _counted(lambda: (float(x[0, 0]), x.sum().item(), backend.to_numpy(x)))[1] == 3
    idx = backend.to_device(np.array([0, 2]), "counting")
    assert _counted(lambda: x[idx]) == (1, 0)                                  # a gather kernel
    assert _counted(lambda: x.take(idx, axis=1)) == (1, 0)
    assert _counted(lambda: x[idx, idx]) == (4, 0)                             # fill, 2 index folds, take
    b = backend.to_device(np.ones((2, 3, 4)), "counting")
    # cuBLAS via CuPy: a batched operand must be C-contiguous, a 2-D one C- or F-contiguous, else a copy
    assert _counted(lambda: (b @ b.swapaxes(-1, -2), x.T @ x, x[:, :2] @ x[:2])) == (5, 0)
    assert _counted(lambda: b.swapaxes(-1, -2) @ b[:, :, :3].swapaxes(-1, -2)) == (3, 0)
    assert _counted(lambda: x[x > 3]) == (2, 1)                                # size known only on the host


def test_ndr_ctl_step_stays_within_its_launch_budget_without_host_syncs():
    model, loss_fn, opt, clip, rng = counting.ndr_ctl_step("ndr")
    launches, syncs = count_step(model, loss_fn, opt, clip, rng)
    assert sum(syncs.values()) == 0, syncs
    assert sum(launches.values()) <= NDR_CTL_BUDGET, launches
    assert sum(COUNTER.nodes.values()) <= NDR_CTL_NODES, COUNTER.nodes
    assert launches["optimizer"] <= 20 and launches["clipping"] <= 10, launches


# The flat buffer is used off NumPy (fast.flat.FlatParameters.possible): these tests run on the strict device.
def _dev(a):
    return backend.to_device(np.asarray(a, np.float32), "strict")


def _host(a):
    return backend.to_numpy(a)


def _params(seed, shapes=((3, 2), (4,), (1,))):
    rng = np.random.default_rng(seed)
    return [nn.Parameter(_dev(rng.standard_normal(s))) for s in shapes]


@pytest.mark.parametrize("cls,kw", [(optim.AdamW, dict(lr=0.01, weight_decay=0.1)), (optim.Adam, dict(lr=0.01)),
                                    (optim.SGD, dict(lr=0.1, momentum=0.9))])
def test_flat_update_gives_the_bits_of_one_parameter_at_a_time(cls, kw):
    """The flat buffer changes only how many array operations a step takes, not its arithmetic."""
    flat, single = _params(0), _params(0)
    opt_flat = cls(flat, **kw)
    opt_single = [cls([p], **kw) for p in single]             # one parameter each: the same per-element math
    rng = np.random.default_rng(1)
    for _ in range(3):
        for p, q in zip(flat, single):
            g = rng.standard_normal(p.shape)
            p.grad, q.grad = _dev(g), _dev(g)
        opt_flat.step()
        for o in opt_single:
            o.step()
    assert vars(opt_flat).get("_flat") is not None and opt_flat._flat.intact()
    for p, q in zip(flat, single):
        np.testing.assert_array_equal(_host(p.data), _host(q.data))
    host = [nn.Parameter(_host(p.data)) for p in flat]         # NumPy: one parameter at a time
    cls(host, **kw).step()
    assert all(p.grad is None for p in host)


def test_a_step_with_a_missing_gradient_keeps_the_state_of_the_others():
    """A step where one parameter has no gradient goes one parameter at a time; the flat state follows."""
    flat, single = _params(0), _params(0)
    opt_flat, opt_single = optim.AdamW(flat, lr=0.01), [optim.AdamW([p], lr=0.01) for p in single]
    rng = np.random.default_rng(4)
    for step in range(4):
        for i, (p, q) in enumerate(zip(flat, single)):
            g = None if (step in (0, 2) and i == 2) else rng.standard_normal(p.shape)
            p.grad, q.grad = (None, None) if g is None else (_dev(g), _dev(g))
        opt_flat.step()
        for p, o in zip(single, opt_single):
            if p.grad is not None:
                o.step()
            else:
                o.t += 1                                      # the flat optimizer's clock ticks for all
    for p, q in zip(flat, single):
        np.testing.assert_array_equal(_host(p.data), _host(q.data))


def test_parameters_are_views_of_the_flat_buffer_and_state_dicts_keep_their_form():
    params = _params(0)
    opt = optim.AdamW(params, lr=0.01)
    for p in params:
        p.grad = _dev(np.ones(p.shape))
    opt.step()
    opt._flat.data[:] = 7
    assert all((_host(p.data) == 7).all() for p in params)   # views: one update moves them all
    sd = opt.state_dict()
    assert [sorted(s) for s in sd["state"]] == [["m", "v"]] * 3
    assert [s["m"].shape for s in sd["state"]] == [p.shape for p in params]
    assert all(type(s["m"]) is np.ndarray for s in sd["state"])
    # Replacing p.data (load_state_dict, Module.to) breaks the view: the next step builds a new buffer.
    params[1].data = _dev(np.full(4, 2.0))
    opt.load_state_dict(sd)
    for p in params:
        p.grad = _dev(np.zeros(p.shape))
    opt.step()
    assert opt._flat.intact() and (_host(params[1].data) < 2).all()


def test_a_loaded_state_is_what_the_flat_buffer_steps_from():
    """load_state_dict while the parameters are still views of the flat buffer (resuming into the same
    model): the next flat step reads the loaded moments, as one parameter at a time does."""
    donor, rng = _params(5), np.random.default_rng(6)
    opt_donor = optim.AdamW(donor, lr=0.01)
    for _ in range(2):
        for p in donor:
            p.grad = _dev(rng.standard_normal(p.shape))
        opt_donor.step()
    sd = opt_donor.state_dict()
    flat, single = _params(0), [nn.Parameter(_host(p.data)) for p in _params(0)]   # single: NumPy, never flat
    opt_flat, opt_single = optim.AdamW(flat, lr=0.01), [optim.AdamW([p], lr=0.01) for p in single]
    for step in range(2):
        if step == 1:                                          # after the first step built the buffer
            opt_flat.load_state_dict(sd)
            for i, o in enumerate(opt_single):
                o.load_state_dict({"t": sd["t"], "lr": sd["lr"], "state": [sd["state"][i]]})
        for p, q in zip(flat, single):
            g = rng.standard_normal(p.shape).astype(np.float32)
            p.grad, q.grad = _dev(g), g
        opt_flat.step()
        for o in opt_single:
            o.step()
    assert opt_flat._flat.intact()
    for p, q in zip(flat, single):
        np.testing.assert_array_equal(_host(p.data), _host(q.data))


def test_clip_grad_norm_over_the_flat_buffer_matches_one_by_one():
    params = _params(0)
    opt = optim.SGD(params, lr=0.0)
    for p in params:
        p.grad = _dev(np.ones(p.shape))
    opt.step()                                                # builds the flat buffer
    rng = np.random.default_rng(2)
    grads = [rng.standard_normal(p.shape).astype(np.float32) * 3 for p in params]
    for p, g in zip(params, grads):
        p.grad = _dev(g)
    norm = optim.clip_grad_norm(params, 1.0)
    assert all(p.grad is g for p, g in zip(params, opt._flat.grad_views))   # views of the flat gradient
    expected = np.sqrt(sum((g.astype(np.float64) ** 2).sum() for g in grads))
    assert float(_host(norm)) == pytest.approx(expected, rel=1e-6)
    for p, g in zip(params, grads):
        np.testing.assert_allclose(_host(p.grad), g / expected, rtol=1e-5)
    flat_grads = [_host(p.grad) for p in params]
    opt.step()                                                 # uses the clipped flat gradient as it is
    assert all(np.array_equal(_host(p.grad), g) for p, g in zip(params, flat_grads))
    norm = optim.clip_grad_norm(params, 100.0)                 # a norm under max_norm: the gradients stay as they are
    assert float(_host(norm)) == pytest.approx(1.0, rel=1e-5)
    assert all(np.array_equal(_host(p.grad), g) for p, g in zip(params, flat_grads))


@pytest.mark.parametrize("device", ["cpu", "strict"])
def test_gradients_of_a_tensor_sum_to_an_array_of_its_own(device):
    """Several gradients of one tensor are summed (on the strict device, as on a GPU, once when the
    tensor is reached; one-element ones in order), into an array of the tensor's own."""
    put = (lambda a: backend.to_device(a, device))
    a = Tensor(put(np.ones(3, np.float32)), requires_grad=True)
    b = Tensor(put(np.ones(3, np.float32)), requires_grad=True)
    c = Tensor(put(np.float32([0.1])), requires_grad=True)
    y = (a + b) + (a + b) + a + b + c + c + c + c
    y.backward(put(np.ones(3, np.float32)))
    assert a.grad is not b.grad
    np.testing.assert_array_equal(backend.to_numpy(a.grad), [3, 3, 3])
    np.testing.assert_array_equal(backend.to_numpy(b.grad), [3, 3, 3])
    np.testing.assert_array_equal(backend.to_numpy(c.grad), [12])


@pytest.mark.parametrize("device", ["cpu", "strict"])
def test_fused_linear_agrees_with_its_composite(device):
    """F.linear (one node, bias added in place) vs x @ W + b: the same bits forward and back on NumPy."""
    rng = np.random.default_rng(3)
    arrays = [rng.standard_normal(s).astype(np.float32) for s in ((6, 4), (4, 3), (3,))]
    g = backend.to_device(rng.standard_normal((6, 3)).astype(np.float32), device)
    out = []
    for fn in (lambda x, W, b: F.linear(x, W, b), lambda x, W, b: x @ W + b):
        xs = [Tensor(backend.to_device(a, device), requires_grad=True) for a in arrays]
        y = fn(*xs)
        y.backward(g)
        out.append([backend.to_numpy(t) for t in [y.data] + [x.grad for x in xs]])
    for a, b in zip(*out):
        np.testing.assert_array_equal(a, b)


def _grads(device, fn, shape, seed=5):
    """y = fn(x) for a random x on ``device``, backward with a random gy: (y, x.grad) on the host."""
    rng = np.random.default_rng(seed)
    x = Tensor(backend.to_device(rng.standard_normal(shape).astype(np.float32), device), requires_grad=True)
    y = fn(x)
    y.backward(backend.to_device(rng.standard_normal(y.shape).astype(np.float32), device))
    return backend.to_numpy(y.data), backend.to_numpy(x.grad)


@pytest.mark.parametrize("pieces", [
    lambda x: F.concat([x[:, :2] * 2, x[:, 2:5], x[:, 5:] * 3], axis=1),       # tiles axis 1: one concatenate
    lambda x: F.stack([x[1] * 2, x[0], x[2] * 3]),                              # tiles axis 0: one stack
    lambda x: F.concat([x[:, -3:], x[:, :3]], axis=1),                          # negative bounds
    lambda x: F.concat([x[:, :3], x[:, :3], x[:, 3:]], axis=1),                 # a slice twice: not a tiling
    lambda x: F.concat([x[:, :2], x[:, 3:]], axis=1),                           # a gap: not a tiling
    lambda x: F.concat([x[0], x[1:].reshape(-1)]),                              # an int beside a slice
    lambda x: F.concat([x[:, ::2], x[:, 1::2]], axis=1),                        # steps: not a tiling
])
def test_slice_gradients_agree_with_numpy_whether_or_not_they_tile(pieces):
    """Off NumPy the gradients of a tensor's slices are put together by the engine (fast.slices.Slices): side by side
    in one operation when the slices tile an axis, into zeros otherwise. Both give NumPy's bits."""
    cpu, strict = _grads("cpu", pieces, (3, 6)), _grads("strict", pieces, (3, 6))
    for a, b in zip(cpu, strict):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("device", ["cpu", "strict"])
@pytest.mark.parametrize("fn,x,want", [
    (lambda x: x[0] + x[0], [1., 2, 3], [2, 0, 0]),                 # an int index twice: a 0-d view each
    (lambda x: x[0] * x[1], [1., 2, 3], [2, 1, 0]),
    (lambda x: x[0, 1] + x[0, 1], [[1., 2], [3, 4]], [[0, 2], [0, 0]]),
    (lambda x: x[()] * 2, [1., 2, 3], [2, 2, 2]),                   # an empty index
    (lambda x: x[()] * 2, 1., 2),                                   # ... of a 0-d tensor
    (lambda x: x[0] * 3 + x[True].sum(), [1., 2], [4, 1]),          # a scalar bool is a mask, not an int
])
def test_basic_index_gradients_in_edge_cases(device, fn, x, want):
    x = Tensor(backend.to_device(np.array(x), device), requires_grad=True)
    y = fn(x)
    y.backward(backend.to_device(np.ones(y.shape), device))
    np.testing.assert_array_equal(backend.to_numpy(x.grad), want)


def test_tiling_slices_cost_one_launch():
    x = Tensor(backend.to_device(np.ones((4, 6), np.float32), "counting"), requires_grad=True)
    parts = [x[:, :2], x[:, 2:]]
    y, gy = F.concat([parts[0] * 2, parts[1] * 3], axis=1), backend.to_device(np.ones((4, 6), np.float32), "counting")
    COUNTER.reset()
    y.backward(gy)
    # backward: concat's split (views), two multiplies, one concatenate of the slices' gradients
    assert sum(COUNTER.launches.values()) == 3, COUNTER.launches


def test_shared_layer_weights_are_built_once_per_repeated_block(monkeypatch):
    """fast/shared_layer.py: inside ``repeated`` a derived-weights method makes its weights once (a nested
    block keeps the outer's); outside, and on the textbook path, at every call."""
    calls = []
    real = GeometricAttention.in_projection
    monkeypatch.setattr(GeometricAttention, "in_projection", lambda self: calls.append(1) or real(self))
    attn = GeometricAttention(8, 2, rng=np.random.default_rng(0))
    first = attn.in_projection()
    assert attn.in_projection() is not first and len(calls) == 2              # outside a block: every call
    with attn.repeated(3):
        w = attn.in_projection()
        with attn.repeated(2):                                               # a nested block keeps the outer's
            assert attn.in_projection() is w
        assert attn.in_projection() is w and len(calls) == 3
    assert "in_projection" not in vars(attn)
    with plain(), attn.repeated(3):
        assert attn.in_projection() is not attn.in_projection() and len(calls) == 5


@pytest.mark.parametrize("tanh_out", [False, True])
def test_copy_gate_layer_with_joint_first_layers_equals_its_two_feed_forwards(tanh_out):
    """The feed-forward and the gate share one matmul for their first layers: the same function as
    FF(a) and FF_g(a) computed apart (Csordás et al. 2022, Eqs. 3–6)."""
    cfg = EncoderConfig(d_model=8, n_head=2, d_ff=12, dropout=0.0, attention_dropout=0.0, gate_dropout=0.0)
    layer = CopyGateLayer(GeometricAttention(8, 2, rng=np.random.default_rng(1)), cfg, np.random.default_rng(2),
                          tanh_out=tanh_out).eval()
    h = Tensor(np.random.default_rng(3).standard_normal((2, 5, 8)).astype(np.float32))
    a = layer.norm_merge(h + layer.attn(h))
    u = F.tanh(layer.ff(a)) if tanh_out else layer.norm_out(layer.ff(a))
    g = F.sigmoid(layer.gate(a))
    np.testing.assert_allclose(layer(h).data, (h + g * (u - h)).data, rtol=1e-5, atol=1e-6)
