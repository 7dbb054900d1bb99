"""Attention mechanisms and encoder models of the NDR paper (docs/ndr.md): definitions, masks, padding."""
import numpy as np
import pytest

from minattn import backend
from minattn.attention.geometric import GeometricAttention, constants, geometric_attention_weights, scan_order
from minattn.attention.multihead import MultiHeadAttention
from minattn.attention.relative import RelativeMultiHeadAttention, rel_shift
from minattn.engine import Tensor, eval_mode, no_grad, plain
from minattn.fast.geometric import DirectionalLogits, sides
from minattn.models.encoder import ARCHITECTURES, Classifier, EncoderConfig

from tests.reference import directional_logits_reference, geometric_attention_weights_reference


def naive_geometric(z, key_mask=None, normalize=False):
    """The definition as an O(T³) loop, A_ij = P_ij Π_{k∈S_ij} (1 − P_ik): docs/ndr.md §3.4 shows it too."""
    B, H, T, _ = z.shape
    valid = np.ones((B, T), bool) if key_mask is None else key_mask
    P = 1 / (1 + np.exp(-z))
    A = np.zeros_like(z)
    for b in range(B):
        for h in range(H):
            for i in range(T):
                for j in range(T):
                    if j == i or not valid[b, j]:
                        continue
                    closer = {k for k in range(T) if k not in (i, j) and abs(k - i) < abs(j - i)}
                    if j < i and 2 * i - j < T:
                        closer.add(2 * i - j)            # the right mirror wins the tie
                    A[b, h, i, j] = P[b, h, i, j] * np.prod([1 - P[b, h, i, k] for k in closer if valid[b, k]])
                if normalize:
                    A[b, h, i] /= max(A[b, h, i].sum(), 1e-12)
    return A


def test_scan_order_matches_the_worked_example():
    perm, inv = scan_order(5)
    assert perm[2].tolist() == [2, 3, 1, 4, 0]           # S_{2,3} = {}, S_{2,1} = {3}, S_{2,4} = {1,3}, ...
    assert perm[4].tolist() == [4, 3, 2, 1, 0]
    np.testing.assert_array_equal(np.take_along_axis(perm, inv, 1), np.tile(np.arange(5), (5, 1)))


@pytest.mark.parametrize("T", [1, 2, 5, 8])
@pytest.mark.parametrize("normalize", [False, True])
def test_geometric_weights_match_the_definition(T, normalize):
    rng = np.random.default_rng(T)
    z = rng.uniform(-4, 4, (2, 2, T, T))
    key_mask = np.ones((2, T), bool)
    key_mask[1, T - T // 3:] = False                       # padding in the second sample
    got = geometric_attention_weights(Tensor(z), key_mask, normalize).data
    np.testing.assert_allclose(got, naive_geometric(z, key_mask, normalize), rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("normalize", [False, True])
def test_fused_geometric_weights_agree_with_the_composite(normalize):
    """GeometricWeights (one op, analytic backward) vs the composite of ops it replaced: values and
    gradients, with padding, large logits (z + m loses nothing that matters) and T = 1."""
    rng = np.random.default_rng(0)
    for T, scale in ((1, 1.0), (6, 3.0), (9, 30.0)):
        z = rng.standard_normal((2, 3, T, T)) * scale
        key_mask = np.ones((2, T), bool)
        key_mask[1, T - T // 3:] = False
        g = rng.standard_normal(z.shape)
        out = []
        for fn in (geometric_attention_weights, geometric_attention_weights_reference):
            x = Tensor(z, requires_grad=True)
            with plain(False):                               # the annex's fused op, then the composite
                A = fn(x, key_mask, normalize)
            A.backward(g)
            out.append((A.data, x.grad))
        np.testing.assert_allclose(out[0][0], out[1][0], rtol=1e-9, atol=1e-13)
        np.testing.assert_allclose(out[0][1], out[1][1], rtol=1e-7, atol=1e-12)


def test_fused_directional_logits_agree_with_the_composite_off_the_diagonal():
    rng = np.random.default_rng(1)
    T = 6
    arrays = [rng.standard_normal(shape) for shape in ((2, 2, T, T), (2, 2, T, 2), (1,), (1,), (1,))]
    g = rng.standard_normal((2, 2, T, T)) * (1 - np.eye(T))       # the diagonal is masked: no gradient there
    out = []
    for fn in (lambda *a: DirectionalLogits(constants(T, a[0].data).right, sides(T, a[0].data))(*a),
               directional_logits_reference):
        xs = [Tensor(a, requires_grad=True) for a in arrays]
        z = fn(*xs)
        z.backward(g)
        out.append((z.data * (1 - np.eye(T)), [x.grad for x in xs]))
    np.testing.assert_allclose(out[0][0], out[1][0], rtol=1e-12, atol=1e-12)
    for a, b in zip(out[0][1], out[1][1]):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)


def test_fused_geometric_weights_float32_stay_within_one():
    z = np.full((1, 1, 8, 8), 30.3, np.float32)                  # z + m rounds to ±1 ulp of 30
    with plain(False):
        A = geometric_attention_weights(Tensor(z)).data
    assert (A.sum(-1) <= 1 + 1e-5).all() and np.isfinite(A).all()


def test_geometric_ties_right_key_blocks_left_mirror():
    z = np.full((1, 1, 3, 3), 10.0)                         # every key matches almost surely
    A = geometric_attention_weights(Tensor(z)).data[0, 0]
    assert A[1, 2] > 0.99 and A[1, 0] < 1e-3                # query 1: right neighbour wins the tie
    assert (np.diag(A) == 0).all()                          # the diagonal is never attended
    assert (A.sum(-1) <= 1 + 1e-12).all()


def test_geometric_weights_stay_finite_and_masked_exactly():
    z = np.array([[[[0.0, 1e4, -1e4], [-1e4, 0.0, 1e4], [1e4, 1e4, 0.0]]]])
    A = geometric_attention_weights(Tensor(z, requires_grad=True), np.array([[True, True, False]]))
    A.backward(np.ones_like(z))
    assert np.isfinite(A.data).all()
    assert (A.data[..., 2] == 0).all()                      # the padded key gets weight exactly 0


def _tiny_cfg(**kw):
    base = dict(d_model=16, n_head=2, d_ff=32, n_steps=2, dropout=0.0, attention_dropout=0.0, gate_dropout=0.0)
    return EncoderConfig(**{**base, **kw})


def _batch():
    """Two samples: one of length 4 padded to 6, one of length 6 (SOS = 21, EOS = 20)."""
    ids = np.array([[21, 3, 4, 20, 0, 0], [21, 1, 2, 5, 7, 20]])
    return ids, np.array([4, 6])


@pytest.mark.parametrize("name", list(ARCHITECTURES))
def test_padding_never_changes_unpadded_outputs(name):
    model = Classifier(name, 20, 8, _tiny_cfg(dropout=0.3, attention_dropout=0.1, gate_dropout=0.1)).eval()
    ids, lengths = _batch()
    with no_grad(), eval_mode():
        both = model(ids, lengths).data
        alone = model(ids[:1, :4], lengths[:1]).data
        garbage = ids.copy()
        garbage[0, 4:] = 9                                  # whatever sits in the padding
        other = model(garbage, lengths).data
    np.testing.assert_allclose(both[0], alone[0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(both, other, rtol=1e-5, atol=1e-6)


def test_geometric_module_never_attends_to_the_diagonal_or_padding():
    att = GeometricAttention(16, 2)
    x = Tensor(np.random.default_rng(0).standard_normal((2, 5, 16)).astype(np.float32))
    mask = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], bool)
    _, A = att(x, mask, return_weights=True)
    assert (A.data[:, :, np.arange(5), np.arange(5)] == 0).all()
    assert (A.data[0, :, :, 3:] == 0).all()


def test_causal_mask_hides_the_future():
    att = MultiHeadAttention(8, 2)
    x = np.random.default_rng(0).standard_normal((1, 4, 8)).astype(np.float32)
    y1 = att(Tensor(x), causal=True).data
    x2 = x.copy()
    x2[0, 3] += 1.0
    y2 = att(Tensor(x2), causal=True).data
    np.testing.assert_allclose(y1[0, :3], y2[0, :3], rtol=1e-6)
    assert not np.allclose(y1[0, 3], y2[0, 3])


def test_relative_attention_is_translation_invariant_without_abs_gate():
    """Only offsets enter the logits, so shifting content by one position shifts the output."""
    att = RelativeMultiHeadAttention(8, 2)
    x = np.random.default_rng(0).standard_normal((1, 3, 8)).astype(np.float32)
    padded = np.concatenate([x, np.zeros((1, 1, 8), np.float32)], axis=1)
    shifted = np.concatenate([np.zeros((1, 1, 8), np.float32), x], axis=1)
    y1 = att(Tensor(padded), key_mask=np.array([[1, 1, 1, 0]], bool)).data
    y2 = att(Tensor(shifted), key_mask=np.array([[0, 1, 1, 1]], bool)).data
    np.testing.assert_allclose(y1[0, :3], y2[0, 1:], rtol=1e-5, atol=1e-6)


def test_ndr_parameter_count_is_about_0_66_million():
    # docs/ndr.md §8: NDR on CTL has about 0.66 M parameters (d=256, d_FF=512, 1 head)
    n = Classifier("ndr", 19, 8, EncoderConfig()).num_parameters()
    assert 0.64e6 < n < 0.68e6


def test_gate_starts_nearly_closed_and_gate_dropout_closes_whole_columns():
    model = Classifier("ndr", 20, 8, _tiny_cfg(gate_dropout=0.5))
    model.set_rng(backend.RNG(0))
    ids, lengths = _batch()
    trace = []
    model(ids, lengths, trace=trace)
    gates = [g.data for _, g in trace]
    open_frac = np.mean([g[g > 0].mean() for g in gates])
    assert 0.01 < open_frac < 0.2                           # σ(−3) ≈ 0.047 at init
    closed_columns = (gates[0] == 0).all(axis=-1)
    assert closed_columns.any() and not closed_columns.all()


def test_unknown_model_is_a_clear_error():
    with pytest.raises(ValueError, match="valid models: transformer, "):
        Classifier("lstm-transformer", 19, 8, EncoderConfig())


@pytest.mark.parametrize("attention", [MultiHeadAttention, RelativeMultiHeadAttention, GeometricAttention])
@pytest.mark.parametrize("d_model,n_head", [(10, 3), (8, 0), (0, 1)])
def test_heads_that_do_not_fit_the_model_width_are_a_value_error(attention, d_model, n_head):
    with pytest.raises(ValueError, match=f"d_model {d_model} must be a positive multiple of n_head {n_head}"):
        attention(d_model, n_head)


@pytest.mark.parametrize("setting,message", [
    ({"n_steps": 0}, "n_steps ≥ 1"), ({"d_model": -4}, "d_model ≥ 1"), ({"dropout": 1.5}, "dropout probability"),
    ({"d_ff": 0}, "sizes must be ≥ 1"),
])
def test_encoder_settings_out_of_range_are_a_value_error_when_the_model_is_built(setting, message):
    cfg = EncoderConfig(**{"d_model": 8, "d_ff": 8, "n_steps": 2, **setting})
    with pytest.raises(ValueError, match=message):
        Classifier("ndr", 19, 8, cfg)


@pytest.mark.parametrize("device", ["cpu", "strict"])
@pytest.mark.parametrize("T", [1, 2, 5])
def test_rel_shift_is_the_offset_gather_forward_and_back(device, T):
    """relative.rel_shift (views) picks what an index table picks: by_offset[..., i, j − i + T − 1]."""
    rng = np.random.default_rng(T)
    x, g = rng.standard_normal((2, 3, T, 2 * T - 1)), rng.standard_normal((2, 3, T, T))
    index = (np.arange(T)[None, :] - np.arange(T)[:, None]) + (T - 1)
    grads = []
    for fn in (rel_shift, lambda t: t[:, :, backend.to_device(np.arange(T)[:, None], device),
                                      backend.to_device(index, device)]):
        t = Tensor(backend.to_device(x, device), requires_grad=True)
        y = fn(t)
        y.backward(backend.to_device(g, device))
        np.testing.assert_array_equal(backend.to_numpy(y.data), x[:, :, np.arange(T)[:, None], index])
        grads.append(backend.to_numpy(t.grad))
    np.testing.assert_array_equal(*grads)
