"""Engine behaviour: graph shapes, lifetime, grad modes, aliasing, numerical stability, Gumbel."""
import re
import weakref

import numpy as np
import pytest

from minattn import backend, nn, ops
from minattn import functional as F
from minattn.attention.geometric import constants, directional_logits, geometric_weights, invalid_keys
from minattn.fast.geometric import DirectionalLogits, GeometricWeights, scan_indices, sides
from minattn.fast.grouped import GroupedLayerNorm
from minattn.fast.slices import SlicingGetItem
from minattn.engine import Function, Tensor, eval_mode, faster, is_training, no_grad, plain, sum_to
from minattn.gradcheck import check_backward


def leaf(x):
    return Tensor(np.asarray(x, dtype=np.float64), requires_grad=True)


def test_diamond_graph():
    x = leaf([1.5, -2.0])
    a = x * 3.0
    b = x.exp()
    y = (a * b).sum()          # d/dx (3x e^x) = 3e^x (1 + x)
    y.backward()
    np.testing.assert_allclose(x.grad, 3 * np.exp(x.data) * (1 + x.data))


def test_repeated_use_and_accumulation_across_backward_calls():
    x = leaf([2.0, 3.0])
    (x * x + x).sum().backward()
    np.testing.assert_allclose(x.grad, 2 * x.data + 1)
    (x * 2.0).sum().backward()
    np.testing.assert_allclose(x.grad, 2 * x.data + 3)


def test_long_chain_has_no_recursion_limit():
    x = leaf([1.0])
    y = x
    for _ in range(10_000):
        y = y * 1.0001
    y.sum().backward()
    np.testing.assert_allclose(x.grad, [1.0001 ** 10_000], rtol=1e-9)


@pytest.mark.parametrize("seed,said", [(np.ones(3), "float64(3,)"), (np.ones(2, np.float32), "float32(2,)")])
def test_a_seed_of_another_dtype_or_shape_is_named_as_the_seed(seed, said):
    """A float64 seed on a float32 graph is the caller's mistake: named as the seed, not as an op's
    backward returning float64 deep in the graph."""
    x = Tensor(np.ones(3, np.float32), requires_grad=True)
    with pytest.raises(ValueError, match=rf"backward: seed {re.escape(said)}, tensor float32\(3,\)$"):
        (x * 2).backward(seed)


def test_graph_and_saved_arrays_are_freed_after_backward():
    x = leaf(np.ones(3))
    h = x.exp()
    fn_ref = weakref.ref(h.creator)
    y = (h * 2.0).sum()
    y.backward()
    assert fn_ref() is None            # the Function and the arrays it saved are gone
    assert h.grad is None              # non-leaf gradients are not kept
    with pytest.raises(RuntimeError, match="already freed"):
        y.backward()                   # a second backward must not silently do nothing


def test_no_grad_records_nothing():
    x = leaf([1.0, 2.0])
    with no_grad():
        y = (x * 2.0).exp()
    assert y.creator is None and not y.requires_grad
    with pytest.raises(RuntimeError, match="does not require grad"):
        y.sum().backward()


def test_gradients_never_alias():
    a, b = leaf(np.ones(3)), leaf(np.ones(3))
    g = np.array([1.0, 2.0, 3.0])
    g_copy = g.copy()
    (a + b).backward(g)                # Add.backward hands the same array to both inputs
    assert a.grad is not b.grad and a.grad is not g
    a.grad *= 10                       # an optimizer scaling one gradient in place...
    np.testing.assert_array_equal(b.grad, g_copy)   # ...must not touch the other
    np.testing.assert_array_equal(g, g_copy)        # nor the caller's array
    c = leaf(np.ones(3))
    (c * 1.0 + c * 1.0).backward(g)    # accumulation into an owned buffer, caller's g intact
    np.testing.assert_array_equal(c.grad, 2 * g_copy)
    np.testing.assert_array_equal(g, g_copy)


def test_engine_names_the_op_with_a_wrong_gradient_shape():
    class BadShape(Function):
        def forward(self, x):
            return x * 2

        def backward(self, gy):
            return gy[:1]

    x = leaf(np.ones((3, 2)))
    with pytest.raises(ValueError, match="BadShape"):
        BadShape()(x).sum().backward()


def test_sum_to_reduces_broadcast_axes():
    g = np.ones((2, 3, 4))
    assert sum_to(g, (3, 1)).shape == (3, 1) and sum_to(g, (3, 1))[0, 0] == 8
    assert sum_to(g, (4,)).tolist() == [6, 6, 6, 6]
    assert sum_to(g, ()).shape == () and sum_to(g, ()) == 24


def test_comparisons_return_plain_arrays():
    x = Tensor(np.array([1.0, 3.0]))
    assert isinstance(x > 2, np.ndarray) and (x > 2).tolist() == [False, True]


def test_eval_mode_switches_dropout_off():
    x = Tensor(np.ones((50, 50), np.float32))
    rng = backend.RNG(0)
    assert is_training()
    assert (nn.Dropout(0.5, rng=rng)(x).data == 0).any()
    with eval_mode():
        assert not is_training()
        np.testing.assert_array_equal(nn.Dropout(0.5, rng=rng)(x).data, x.data)
    assert is_training()


def test_float32_stays_float32():
    x = Tensor(np.ones((2, 3), np.float32), requires_grad=True)
    y = (F.softmax(x * 0.5 + 1) / 3.0).sum()
    assert y.dtype == np.float32
    y.backward()
    assert x.grad.dtype == np.float32


# --- numerical stability ------------------------------------------------------------------------

EXTREME = np.array([[1000.0, -1000.0, 0.0], [-1000.0, -1000.0, -999.0]])


@pytest.mark.parametrize("fn", [
    lambda x: F.softmax(x),
    lambda x: F.log_softmax(x),
    lambda x: F.logsigmoid(x),
    lambda x: F.softplus(x),
    lambda x: F.sigmoid(x),
    lambda x: F.cross_entropy(x, np.array([1, 0])),
], ids=["softmax", "log_softmax", "logsigmoid", "softplus", "sigmoid", "cross_entropy"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_extreme_inputs_give_finite_values_and_gradients(fn, dtype):
    x = Tensor(EXTREME.astype(dtype), requires_grad=True)
    with np.errstate(over="raise", invalid="raise", divide="raise"):   # no overflow or 0/0 either
        y = fn(x)
        y.backward(np.random.default_rng(0).standard_normal(y.shape).astype(dtype))
    assert np.isfinite(y.data).all() and np.isfinite(x.grad).all()


def test_logsigmoid_is_exact_far_out():
    np.testing.assert_allclose(F.logsigmoid(Tensor(np.array([-1000.0, 1000.0]))).data, [-1000.0, 0.0])


def test_fully_masked_rows_give_no_nan():
    x = Tensor(np.array([[-np.inf, -np.inf], [0.0, -np.inf]]), requires_grad=True)
    y = F.softmax(x)
    np.testing.assert_array_equal(y.data, [[0, 0], [1, 0]])
    y.backward(np.ones((2, 2)))
    assert np.isfinite(x.grad).all()
    # the same with the large finite negatives the models use
    z = F.softmax(F.masked_fill(Tensor(np.zeros((1, 3))), np.ones((1, 3), bool), -1e9))
    assert np.isfinite(z.data).all()
    # cross-entropy where every target is ignored is 0, not 0/0
    assert F.cross_entropy(Tensor(np.zeros((2, 3))), np.array([-1, -1]), ignore_index=-1).data == 0


FUSED_AND_COMPOSED = [   # (name, fused form, composed form, input shapes) -- both take the same tensors
    ("softmax", lambda x: ops.Softmax(-1)(x), ops.softmax_composed, [(4, 6)]),
    ("softmax_axis0", lambda x: ops.Softmax(0)(x), lambda x: ops.softmax_composed(x, 0), [(4, 6)]),
    ("log_softmax", lambda x: ops.LogSoftmax(-1)(x), ops.log_softmax_composed, [(4, 6)]),
    ("log_softmax_axis0", lambda x: ops.LogSoftmax(0)(x), lambda x: ops.log_softmax_composed(x, 0), [(4, 6)]),
    ("cross_entropy", lambda x: ops.CrossEntropy(np.array([0, 5, -1, 3]), -1)(x),
     lambda x: ops.cross_entropy_composed(x, np.array([0, 5, -1, 3]), -1), [(4, 6)]),
    ("layer_norm", lambda x, w, b: ops.LayerNorm()(x, w, b), ops.layer_norm_composed, [(2, 4, 6), (6,), (6,)]),
    ("geometric_weights", lambda z: GeometricWeights(invalid_keys(None, 5, z.data), scan_indices(5, z.data))(z),
     lambda z: geometric_weights(z, invalid_keys(None, 5, z.data)), [(2, 3, 5, 5)]),
    ("directional_logits",
     lambda qk, s, a, b, g: DirectionalLogits(constants(5, qk.data).right, sides(5, qk.data))(qk, s, a, b, g),
     lambda qk, s, a, b, g: directional_logits(qk, s, a, b, g, constants(5, qk.data).right),
     [(2, 3, 5, 5), (2, 3, 5, 2), (1,), (1,), (1,)]),
]


@pytest.mark.parametrize("name,fused,composed,shapes", FUSED_AND_COMPOSED, ids=[r[0] for r in FUSED_AND_COMPOSED])
def test_fused_ops_match_their_composed_forms(name, fused, composed, shapes):
    """Each fused op and its composed definition (the normalising ops of ops/fused.py; geometric attention's
    textbook forms and their fused twins of the annex): the same values and the same gradients, in float64. (The diagonal of the directional logits differs by design: it is always
    masked, so the weights and every gradient through them agree.)"""
    rng = np.random.default_rng(0)
    values = [rng.standard_normal(s) for s in shapes]
    outs = []
    for fn in (fused, composed):
        xs = [Tensor(v.copy(), requires_grad=True) for v in values]
        y = fn(*xs)
        g = np.random.default_rng(1).standard_normal(y.shape)
        if name == "directional_logits":
            g = g * ~np.eye(5, dtype=bool)          # the diagonal gets no gradient in a model (masked)
        y.backward(g)
        outs.append((y.data, [x.grad for x in xs]))
    (y1, g1), (y2, g2) = outs
    if name == "directional_logits":
        y1, y2 = y1 * ~np.eye(5, dtype=bool), y2 * ~np.eye(5, dtype=bool)
    np.testing.assert_allclose(y1, y2, rtol=1e-12, atol=1e-12)
    for a, b in zip(g1, g2):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)


def test_the_device_picks_the_path_and_plain_forces_it():
    """On NumPy the seam gives the plain forms, elsewhere (the strict device) the annex's; plain(on) forces
    either. The normalising ops are one primitive op on every path."""
    x = Tensor(np.zeros((2, 3)), requires_grad=True)
    on_strict = Tensor(backend.to_device(np.zeros((2, 3)), "strict"))
    assert faster(ops.LayerNorm, x) is ops.LayerNorm and faster(ops.GetItem, x) is ops.GetItem
    assert faster(ops.LayerNorm, on_strict) is GroupedLayerNorm and faster(ops.GetItem, on_strict) is SlicingGetItem
    with plain(False):
        assert faster(ops.LayerNorm, x) is GroupedLayerNorm and faster(ops.GetItem, x) is SlicingGetItem
    with plain():
        assert faster(ops.LayerNorm, on_strict) is ops.LayerNorm and faster(ops.GetItem, on_strict) is ops.GetItem
    for textbook in (True, False, None):
        with plain(textbook):
            assert isinstance(F.softmax(x).creator, ops.Softmax)
            assert isinstance(F.log_softmax(x).creator, ops.LogSoftmax)


@pytest.mark.parametrize("form", [ops.cross_entropy, ops.cross_entropy_composed], ids=["fused", "composed"])
def test_cross_entropy_is_the_mean_negative_log_likelihood_of_the_counted_targets(form):
    """CE = (1/|counted|) Σ_{i counted} −log softmax(x_i)[t_i], ignored targets left out of sum and count
    (PyTorch's reduction="mean"); written with a loop over rows, for the op and its composed definition."""
    x = np.random.default_rng(0).standard_normal((2, 3, 5))
    t = np.array([[0, 4, -1], [2, -1, 2]])
    terms = [-(row[k] - np.log(np.exp(row).sum())) for row, k in zip(x.reshape(-1, 5), t.reshape(-1)) if k != -1]
    loss = form(Tensor(x), t, ignore_index=-1)
    assert float(loss.data) == pytest.approx(sum(terms) / len(terms), rel=1e-12)

def test_cross_entropy_rejects_bad_targets():
    with pytest.raises(ValueError, match="out of range"):
        F.cross_entropy(Tensor(np.zeros((2, 3))), np.array([0, 3]))
    with pytest.raises(ValueError, match="shape"):
        F.cross_entropy(Tensor(np.zeros((2, 3))), np.array([0, 1, 2]))


def test_embedding_rejects_out_of_vocabulary_ids():
    with pytest.raises(ValueError, match=r"token id out of range: must lie in \[0, 4\), got \[0, 4\]"):
        F.embedding(Tensor(np.zeros((4, 2))), np.array([0, 4]))
    with pytest.raises(TypeError, match="integers"):
        F.embedding(Tensor(np.zeros((4, 2))), np.array([0.0, 1.0]))


def test_out_of_range_ids_and_targets_fail_on_every_device(device):
    """CuPy's indexing wraps an id of -1 or n around silently, so ids are checked on the host, before
    upload: host ids are accepted on every device, checked, then moved to the weights' device."""
    w = Tensor(backend.to_device(np.arange(8.0).reshape(4, 2), device), requires_grad=True)
    for bad_id, bad_target in ((4, 2), (-1, -1)):   # w as logits: 4 rows, 2 classes
        with pytest.raises(ValueError, match="token id out of range"):
            F.embedding(w, np.array([0, bad_id]))
        with pytest.raises(ValueError, match="target out of range"):
            F.cross_entropy(w, np.array([0, 1, bad_target, 1]))
    np.testing.assert_array_equal(backend.to_numpy(F.embedding(w, np.array([3, 0])).data), [[6, 7], [0, 1]])
    loss = F.cross_entropy(w, np.array([1, -1, 0, 1]), ignore_index=-1)   # -1 ignored: no error
    assert backend.device_of(loss.data) == device


# --- Gumbel-softmax straight-through ---------------------------------------------------------------

def test_gumbel_hard_forward_is_exactly_one_hot():
    logits = Tensor(np.random.default_rng(0).standard_normal((64, 7)).astype(np.float32), requires_grad=True)
    y = F.gumbel_softmax(logits, tau=0.5, hard=True, rng=backend.RNG(3))
    assert set(np.unique(y.data).tolist()) == {0.0, 1.0}
    np.testing.assert_array_equal(y.data.sum(axis=-1), 1.0)


def test_gumbel_straight_through_backward_equals_soft_backward():
    rng = np.random.default_rng(0)
    logits_np, noise, up = rng.standard_normal((5, 4)), rng.gumbel(size=(5, 4)), rng.standard_normal((5, 4))
    grads = []
    for hard in (True, False):
        logits, tau = leaf(logits_np), leaf([[0.8]])
        F.gumbel_softmax(logits, tau=tau, hard=hard, noise=noise).backward(up)
        grads.append((logits.grad, tau.grad))
    np.testing.assert_array_equal(grads[0][0], grads[1][0])
    np.testing.assert_array_equal(grads[0][1], grads[1][1])
    assert np.abs(grads[0][1]).sum() > 0   # the temperature receives a gradient


def test_gumbel_soft_path_temperature_is_gradchecked():
    rng = np.random.default_rng(1)
    noise = rng.gumbel(size=(3, 4))
    check_backward(lambda a, tau: F.gumbel_softmax(a, tau=tau, hard=False, noise=noise),
                   [rng.standard_normal((3, 4)), np.array([[0.6], [1.0], [2.0]])])


def test_gumbel_noise_is_reproducible_from_the_seed():
    a = F.gumbel_softmax(Tensor(np.zeros((4, 5))), rng=backend.RNG(7)).data
    b = F.gumbel_softmax(Tensor(np.zeros((4, 5))), rng=backend.RNG(7)).data
    c = F.gumbel_softmax(Tensor(np.zeros((40, 5))), rng=backend.RNG(8)).data
    np.testing.assert_array_equal(a, b)
    assert c.argmax(-1).std() > 0          # different rows pick different classes
