"""The gradient-check table: every op and every module is a row, checked on every device.

A row is (name, fn, make_inputs[, make_module]): ``make_inputs(rng)`` returns host arrays (float
arrays become float64 tensors that require grad; integer arrays stay constants), ``fn`` maps the
device tensors (and the module) to one output tensor. Inputs keep away from kinks (ReLU at 0, ties
in max/abs, log/sqrt near 0). Adding a variant = adding a row.
"""

import numpy as np
import pytest

from minattn import backend, nn, ops
from minattn import functional as F
from minattn.engine import Function, Tensor
from minattn.gradcheck import GradcheckError, check_backward
from minattn.attention.additive import AdditiveAttention
from minattn.attention.coda import (COMPOSITIONS, CoDAttention, PairwiseCoDA, l1_distance,
                                   l1_distance_reference)
from minattn.attention.compositional import CompositionalAttention
from minattn.attention.geometric import (GeometricAttention, constants, directional_logits,
                                        geometric_attention_weights, geometric_weights, invalid_keys)
from minattn.fast.geometric import DirectionalLogits, GeometricWeights, scan_indices, sides
from minattn.attention.multihead import MultiHeadAttention
from minattn.attention.relational import PositionRelativeRCA, RelationalCrossAttention, SimplifiedRCA
from minattn.attention.relative import RelativeMultiHeadAttention
from minattn.models.abstractor import (AbstractorConfig, AbstractorLayer, AbstractorSeq2Seq, PositionalSymbols,
                                       RelationalClassifier, SimplifiedAbstractorLayer, SimplifiedConfig,
                                       SymbolicAttention)
from minattn.models.compositional import MODELS as CRT_MODELS, CRTConfig, CRTModel, CRTMultiHeadAttention
from minattn.models.seq2attn import Seq2Attn, model_config as seq2attn_config
from minattn.models.encoder import (ARCHITECTURES, Classifier, CoDAEncoderConfig, CopyGateLayer, EncoderConfig,
                                    PostLNLayer)
from minattn.models.seq2seq import DecoderLayer, EncoderDecoderConfig, Seq2SeqTransformer, keras_attention
from minattn.models.seq2seq import CoDAEncoderDecoderConfig, CoDASeq2SeqTransformer
from minattn.ops import Softmax

from tests.reference import directional_logits_reference, geometric_attention_weights_reference


def N(*shape):
    return lambda rng: rng.standard_normal(shape)


def away_from_zero(*shape):
    """Normal samples with |x| ≥ 0.1 (for relu, abs, maximum ties)."""
    def make(rng):
        x = rng.standard_normal(shape)
        return np.where(np.abs(x) < 0.1, 0.5, x)
    return make


def positive(*shape):
    return lambda rng: rng.uniform(0.5, 2.0, shape)


def inputs(*makers):
    return lambda rng: [m(rng) for m in makers]


def const(x):
    """A constant input (no gradient), e.g. integer ids or a mask."""
    return lambda rng: x


def dropout_fn(x):
    # A fresh RNG per call makes the mask identical in every finite-difference evaluation.
    return nn.Dropout(0.3, rng=backend.RNG(1, backend.device_of(x.data)))(x)


MASK = np.array([[True, False, True, False], [False, False, True, True], [True, True, True, False]])

OPS = [
    ("add_broadcast", lambda a, b: a + b, inputs(N(2, 3, 4), N(3, 1))),
    ("sub_broadcast", lambda a, b: a - b, inputs(N(3, 4), N(4))),
    ("mul_broadcast", lambda a, b: a * b, inputs(N(2, 1, 4), N(3, 1))),
    ("div_broadcast", lambda a, b: a / b, inputs(N(3, 4), positive(4))),
    ("radd_scalar", lambda a: 2.0 + a, inputs(N(3, 4))),
    ("rsub_scalar", lambda a: 2.0 - a, inputs(N(3, 4))),
    ("mul_scalar", lambda a: a * 3.0, inputs(N(3, 4))),
    ("rdiv_scalar", lambda a: 3.0 / a, inputs(positive(3, 4))),
    ("div_scalar", lambda a: a / 4.0, inputs(N(3, 4))),
    ("pow_int", lambda a: a ** 3, inputs(N(3, 4))),
    ("pow_frac", lambda a: a ** 0.5, inputs(positive(3, 4))),
    ("neg", lambda a: -a, inputs(N(3, 4))),
    ("exp", lambda a: a.exp(), inputs(N(3, 4))),
    ("log", lambda a: a.log(), inputs(positive(3, 4))),
    ("sqrt", lambda a: a.sqrt(), inputs(positive(3, 4))),
    ("abs", lambda a: a.abs(), inputs(away_from_zero(3, 4))),
    ("tanh", lambda a: a.tanh(), inputs(N(3, 4))),
    ("sigmoid", lambda a: a.sigmoid(), inputs(N(3, 4))),
    ("relu", lambda a: a.relu(), inputs(away_from_zero(3, 4))),
    ("softplus", F.softplus, inputs(N(3, 4))),
    ("logsigmoid", F.logsigmoid, inputs(N(3, 4))),
    ("maximum", F.maximum, inputs(away_from_zero(3, 4), const(np.zeros(4)))),
    ("maximum_both", lambda a, b: F.maximum(a, b), inputs(N(3, 4), lambda r: r.standard_normal((3, 4)) + 0.3)),
    ("maximum_scalar", lambda a: F.maximum(a, 0.2), inputs(away_from_zero(3, 4))),
    ("minimum_broadcast", F.minimum, inputs(N(3, 4), lambda r: r.standard_normal(4) + 0.3)),
    ("where", lambda a, b, m: F.where(m, a, b), inputs(N(3, 4), N(4), const(MASK))),
    ("where_scalar", lambda a, m: F.where(m, a, 0.5), inputs(N(3, 4), const(MASK))),
    ("masked_fill", lambda a, m: F.masked_fill(a, m, 3.0).sum(axis=1), inputs(N(3, 2, 4), const(MASK[:, None]))),
    ("sum_all", lambda a: a.sum(), inputs(N(3, 4))),
    ("sum_axis", lambda a: a.sum(axis=1), inputs(N(2, 3, 4))),
    ("sum_axes_keepdims", lambda a: a.sum(axis=(0, 2), keepdims=True), inputs(N(2, 3, 4))),
    ("mean_axis", lambda a: a.mean(axis=-1), inputs(N(2, 3, 4))),
    ("mean_all", lambda a: a.mean(), inputs(N(2, 3))),
    ("max_axis", lambda a: a.max(axis=1), inputs(N(2, 5, 3))),
    ("max_keepdims", lambda a: a.max(axis=-1, keepdims=True), inputs(N(3, 4))),
    ("max_all", lambda a: a.max(), inputs(N(3, 4))),
    ("cumsum", lambda a: F.cumsum(a, axis=1), inputs(N(2, 5, 3))),
    ("cumsum_reverse", lambda a: F.cumsum(a, axis=-1, reverse=True), inputs(N(2, 5))),
    ("matmul", lambda a, b: a @ b, inputs(N(2, 3, 4), N(4, 5))),
    ("matmul_batch_broadcast", lambda a, b: a @ b, inputs(N(2, 1, 3, 4), N(3, 4, 2))),
    ("linear", F.linear, inputs(N(5, 4), N(4, 3), N(3))),
    ("linear_no_bias", F.linear, inputs(N(5, 4), N(4, 3))),
    ("reshape", lambda a: a.reshape(4, 6) * a.reshape(4, 6), inputs(N(2, 3, 4))),
    ("transpose", lambda a: a.transpose(2, 0, 1), inputs(N(2, 3, 4))),
    ("transpose_T", lambda a: a.T, inputs(N(3, 4))),
    ("swapaxes", lambda a: a.swapaxes(-1, -2), inputs(N(2, 3, 4))),
    ("getitem_basic", lambda a: a[1:, None, ::2, 0], inputs(N(3, 4, 5))),
    ("getitem_int_array_repeats", lambda a, i: a[i], inputs(N(4, 3), const(np.array([0, 2, 2, 3, 0])))),
    ("getitem_mixed", lambda a, i: a[:, i], inputs(N(2, 4, 3), const(np.array([[1, 1], [3, 0]])))),
    ("getitem_bool", lambda a, m: a[m], inputs(N(3, 4), const(MASK))),
    # gathers whose backward is a segment sum: many rows (CPU sorts), two adjacent index arrays, negative
    # indices, an Ellipsis, and forms summed over flat positions (an int or a slice beside an array)
    ("getitem_many_rows_repeats", lambda a, i: a[i], inputs(N(70, 2), const(np.array([69, 3, 69, 0, 3, 3])))),
    ("getitem_two_arrays_repeats", lambda a, i, j: a[:, i, j],
     inputs(N(2, 3, 4), const(np.array([[0, 2], [2, 1]])), const(np.array([3, 3])))),
    ("getitem_negative", lambda a, i: a[..., i], inputs(N(2, 3, 4), const(np.array([-1, 3, 0, -4])))),
    ("getitem_list_repeats", lambda a: a[[0, 2, 2, -1]], inputs(N(3, 4))),
    ("getitem_int_and_array", lambda a, i: a[1, i], inputs(N(3, 4, 2), const(np.array([2, 2, 0])))),
    ("getitem_slice_and_array", lambda a, i: a[1:, i], inputs(N(3, 4), const(np.array([2, 2, 0])))),
    ("concat", lambda a, b: F.concat([a, b, a], axis=1), inputs(N(2, 3), N(2, 2))),
    ("stack", lambda a, b: F.stack([a, b], axis=1), inputs(N(2, 3), N(2, 3))),
    ("broadcast_to", lambda a: F.broadcast_to(a, (2, 3, 4)), inputs(N(3, 1))),
    ("softmax", F.softmax, inputs(N(3, 5))),
    ("softmax_axis0", lambda a: F.softmax(a, axis=0), inputs(N(3, 5))),
    ("softmax_masked", lambda a, m: F.softmax(F.masked_fill(a, ~m, -1e9)), inputs(N(3, 4), const(MASK))),
    ("log_softmax", F.log_softmax, inputs(N(3, 5))),
    ("cross_entropy", lambda a, t: F.cross_entropy(a, t), inputs(N(4, 5), const(np.array([0, 4, 2, 2])))),
    ("cross_entropy_3d_ignore", lambda a, t: F.cross_entropy(a, t, ignore_index=-1),
     inputs(N(2, 3, 5), const(np.array([[1, -1, 4], [0, 3, -1]])))),
    ("layer_norm", F.layer_norm, inputs(N(2, 3, 6), N(6), N(6))),
    # Each fused op and its composed definition, both checked whichever path runs the rows above
    ("softmax_fused", lambda a: ops.Softmax(-1)(a), inputs(N(3, 5))),
    ("softmax_composed", ops.softmax_composed, inputs(N(3, 5))),
    ("softmax_composed_masked", lambda a, m: ops.softmax_composed(F.masked_fill(a, ~m, -1e9)),
     inputs(N(3, 4), const(MASK))),
    ("log_softmax_fused", lambda a: ops.LogSoftmax(-1)(a), inputs(N(3, 5))),
    ("log_softmax_composed", ops.log_softmax_composed, inputs(N(3, 5))),
    ("cross_entropy_fused", lambda a, t: ops.CrossEntropy(t, -1)(a),
     inputs(N(2, 3, 5), const(np.array([[1, -1, 4], [0, 3, -1]])))),
    ("cross_entropy_composed", lambda a, t: ops.cross_entropy_composed(a, t, -1),
     inputs(N(2, 3, 5), const(np.array([[1, -1, 4], [0, 3, -1]])))),
    ("layer_norm_fused", lambda x, w, b: ops.LayerNorm()(x, w, b), inputs(N(2, 3, 6), N(6), N(6))),
    ("layer_norm_composed", ops.layer_norm_composed, inputs(N(2, 3, 6), N(6), N(6))),
    ("split_heads", lambda x: ops.split_heads(x, 2, 2, 3), inputs(N(2, 4, 9))),
    ("split_heads_composed", lambda x: ops.split_heads_composed(x, 2, 2, 3), inputs(N(2, 4, 9))),
    ("merge_heads", ops.merge_heads, inputs(N(2, 2, 4, 3))),
    ("merge_heads_composed", ops.merge_heads_composed, inputs(N(2, 2, 4, 3))),
    ("embedding_repeats", lambda w, i: F.embedding(w, i), inputs(N(5, 3), const(np.array([[0, 4, 4], [2, 0, 0]])))),
    ("embedding_many_rows_repeats", lambda w, i: F.embedding(w, i),     # > ONEHOT_MAX_ROWS: CPU sorts
     inputs(N(80, 2), const(np.array([[79, 4, 79], [2, 4, 4]])))),
    ("dropout", dropout_fn, inputs(N(4, 5))),
    ("geometric_weights", lambda z: geometric_attention_weights(z), inputs(lambda r: r.uniform(-3, 3, (2, 2, 5, 5)))),
    ("geometric_weights_padded_normalized", lambda z, m: geometric_attention_weights(z, m, normalize=True),
     inputs(lambda r: r.uniform(-3, 3, (2, 1, 4, 4)), const(np.array([[1, 1, 1, 0], [1, 1, 1, 1]], bool)))),
    ("geometric_weights_T1", lambda z: geometric_attention_weights(z), inputs(N(1, 1, 1, 1))),
    ("geometric_weights_fused", lambda z, m: GeometricWeights(invalid_keys(m, 4, z.data), scan_indices(4, z.data))(z),
     inputs(lambda r: r.uniform(-3, 3, (2, 1, 4, 4)), const(np.array([[1, 1, 1, 0], [1, 1, 1, 1]], bool)))),
    ("geometric_weights_composed", lambda z, m: geometric_weights(z, invalid_keys(m, 4, z.data)),
     inputs(lambda r: r.uniform(-3, 3, (2, 1, 4, 4)), const(np.array([[1, 1, 1, 0], [1, 1, 1, 1]], bool)))),
    ("geometric_weights_reference", lambda z, m: geometric_attention_weights_reference(z, m),
     inputs(lambda r: r.uniform(-3, 3, (2, 1, 4, 4)), const(np.array([[1, 1, 1, 0], [1, 1, 1, 1]], bool)))),
    ("directional_logits",
     lambda qk, s, a, b, g: DirectionalLogits(constants(5, qk.data).right, sides(5, qk.data))(qk, s, a, b, g),
     inputs(N(2, 2, 5, 5), N(2, 2, 5, 2), N(1), N(1), N(1))),
    ("directional_logits_reference", directional_logits_reference,
     inputs(N(2, 2, 5, 5), N(2, 2, 5, 2), N(1), N(1), N(1))),
    ("directional_logits_composed",
     lambda qk, s, a, b, g: directional_logits(qk, s, a, b, g, constants(5, qk.data).right),
     inputs(N(2, 2, 5, 5), N(2, 2, 5, 2), N(1), N(1), N(1))),
    ("gumbel_softmax_soft", lambda a, g: F.gumbel_softmax(a, tau=0.7, hard=False, noise=g),
     inputs(N(3, 5), N(3, 5))),
    ("gumbel_softmax_soft_tau_tensor", lambda a, tau, g: F.gumbel_softmax(a, tau=tau, hard=False, noise=g),
     inputs(N(3, 5), positive(3, 1), N(3, 5))),
]


KEY_MASK = np.array([[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]], bool)
# Tiny encoder config without dropout, so every forward pass is the same function.
TINY = dict(d_model=8, n_head=2, d_ff=12, n_steps=2, dropout=0.0, attention_dropout=0.0, gate_dropout=0.0)
IDS, LENGTHS = np.array([[21, 3, 4, 20, 0], [21, 1, 2, 5, 20]]), np.array([4, 5])


def _layer(kind, attention):
    cfg = EncoderConfig(**TINY)
    rng = np.random.default_rng(0)
    if kind == "postln":
        return PostLNLayer(attention(cfg, rng), cfg, rng)
    return CopyGateLayer(attention(cfg, rng), cfg, rng, tanh_out=kind == "gate-tanh")


# Compositional attention at small sizes (docs/compositional.md §3): B = 2, N = 4, S = 2, R = 3, d_s = 4, d_v = 5.
CA_MASK = np.array([[1, 1, 1, 0], [1, 1, 1, 1]], bool)


def _ca(**options):
    return lambda rng: CompositionalAttention(6, 2, 3, search_dim=8, value_dim=15, rng=rng, **options)


# seq2attn (docs/seq2attn.md §1.8): additive attention alone, then whole models on a padded batch of two
# (source lengths 4 and 3, target lengths 3 and 2, the loss summing both). Gumbel straight-through is not
# finite-difference checkable (tests/papers/seq2attn/test_mechanism_and_models.py checks it against the soft sample), so the soft
# sample is checked here, with its noise and the teacher-forcing draws fixed by a fresh RNG per call.
S2A_KEY_MASK = np.array([[1, 1, 1, 1], [1, 1, 1, 0]], bool)
S2A_BATCH = [np.array([[2, 3, 4, 5], [6, 2, 3, 1]]), np.array([4, 3]),      # source ids, lengths
             np.array([[4, 5, 3], [5, 3, 1]]), np.array([3, 2])]               # target ids, lengths


def _additive(activation, temperature="conditioned"):
    return lambda rng: AdditiveAttention(3, 4, 5, activation, temperature, tau_init=2.0, rng=rng)


def _seq2attn(name="seq2attn", activation="gumbel", **options):
    def make(rng):
        model = Seq2Attn(seq2attn_config(name, d_embedding=4, d_hidden=4, **options), 7, 6, sos_id=2)
        model.attention.activation = activation   # the soft sample in place of straight-through
        return model
    return make


def _seq2attn_loss(m, src, src_lengths, tgt, tgt_lengths):
    m.set_rng(backend.RNG(1, backend.device_of(src)))
    return m.loss(src, src_lengths, tgt, tgt_lengths)


MODULES = [
    ("Linear", lambda m, x: m(x), lambda rng: nn.Linear(4, 3, rng=rng), inputs(N(2, 4))),
    ("Linear_3d", lambda m, x: m(x), lambda rng: nn.Linear(4, 3, rng=rng), inputs(N(2, 5, 4))),
    ("Linear_nobias", lambda m, x: m(x), lambda rng: nn.Linear(4, 3, bias=False, rng=rng), inputs(N(2, 4))),
    ("Embedding", lambda m, i: m(i), lambda rng: nn.Embedding(6, 3, rng=rng), inputs(const(np.array([[1, 5, 1]])))),
    ("LayerNorm", lambda m, x: m(x), lambda rng: nn.LayerNorm(5), inputs(N(2, 3, 5))),
    ("FeedForward", lambda m, x: m(x), lambda rng: nn.FeedForward(4, 8, rng=rng), inputs(N(2, 3, 4))),
    ("FeedForward_xavier", lambda m, x: m(x), lambda rng: nn.FeedForward(4, 8, rng=rng, xavier=True, gain1=2 ** .5),
     inputs(N(2, 3, 4))),
    ("GRUCell", lambda m, x, h: m(x, h), lambda rng: nn.GRUCell(4, 3, rng=rng), inputs(N(2, 4), N(2, 3))),
    ("GRUCell_unrolled", lambda m, x, h: m(x[:, 1], m(x[:, 0], h)), lambda rng: nn.GRUCell(4, 3, rng=rng),
     inputs(N(2, 2, 4), N(2, 3))),
    ("LSTMCell", lambda m, x, h, c: F.concat(list(m(x, (h, c))), axis=-1), lambda rng: nn.LSTMCell(4, 3, rng=rng),
     inputs(N(2, 4), N(2, 3), N(2, 3))),
    ("MultiHeadAttention_masked", lambda m, x, k: m(x, key_mask=k), lambda rng: MultiHeadAttention(8, 2, rng=rng),
     inputs(N(2, 5, 8), const(KEY_MASK))),
    ("MultiHeadAttention_causal_cross", lambda m, x, c: m(x, context=c, causal=True),
     lambda rng: MultiHeadAttention(8, 2, rng=rng), inputs(N(2, 3, 8), N(2, 3, 8))),
    ("RelativeAttention", lambda m, x, k: m(x, key_mask=k), lambda rng: RelativeMultiHeadAttention(8, 2, rng=rng),
     inputs(N(2, 5, 8), const(KEY_MASK))),
    ("RelativeAttention_absgate", lambda m, x, k: m(x, key_mask=k),
     lambda rng: RelativeMultiHeadAttention(8, 2, abs_gate=True, rng=rng), inputs(N(2, 5, 8), const(KEY_MASK))),
    ("GeometricAttention", lambda m, x, k: m(x, key_mask=k), lambda rng: GeometricAttention(8, 2, rng=rng),
     inputs(N(2, 5, 8), const(KEY_MASK))),
    ("GeometricAttention_normalized", lambda m, x, k: m(x, key_mask=k),
     lambda rng: GeometricAttention(8, 1, normalize=True, rng=rng), inputs(N(2, 5, 8), const(KEY_MASK))),
    ("PostLNLayer_softmax", lambda m, x, k: m(x, key_mask=k),
     lambda rng: _layer("postln", lambda c, r: MultiHeadAttention(8, 2, rng=r)), inputs(N(2, 5, 8), const(KEY_MASK))),
    ("CopyGateLayer_geometric", lambda m, x, k: m(x, key_mask=k),
     lambda rng: _layer("gate", lambda c, r: GeometricAttention(8, 2, rng=r)), inputs(N(2, 5, 8), const(KEY_MASK))),
    ("CopyGateLayer_tanh_relative", lambda m, x, k: m(x, key_mask=k),
     lambda rng: _layer("gate-tanh", lambda c, r: RelativeMultiHeadAttention(8, 2, rng=r)),
     inputs(N(2, 5, 8), const(KEY_MASK))),
    ("CompositionalAttention_masked", lambda m, x, k: m(x, key_mask=k), _ca(), inputs(N(2, 4, 6), const(CA_MASK))),
    ("CompositionalAttention_concat_diagonal", lambda m, x: m(x), _ca(concat=True, mask_diagonal=True),
     inputs(N(2, 4, 6))),
    ("CompositionalAttention_separate", lambda m, x, k: m(x, key_mask=k),
     _ca(separate=True, concat=True, mask_diagonal=True), inputs(N(2, 4, 6), const(CA_MASK))),
    ("CompositionalAttention_mlp_masked", lambda m, x, k: m(x, key_mask=k), _ca(score="mlp"),
     inputs(N(2, 4, 6), const(CA_MASK))),
    ("CompositionalAttention_mlp_concat_diagonal", lambda m, x: m(x), _ca(score="mlp", concat=True, mask_diagonal=True),
     inputs(N(2, 4, 6))),
    ("CompositionalAttention_value_scores", lambda m, x: m(x, return_weights=True)[2], _ca(mask_diagonal=True),
     inputs(N(2, 4, 6))),
    ("CRTMultiHeadAttention", lambda m, x, k: m(x, key_mask=k),
     lambda rng: CRTMultiHeadAttention(6, 2, search_dim=8, value_dim=10, rng=rng), inputs(N(2, 4, 6), const(CA_MASK))),
] + [
    (f"CRTModel_{name}", lambda m, x: m(x),
     lambda rng, name=name: CRTModel(name, 11, CRTConfig(searches=2, retrievals=3, d_model=6)), inputs(N(2, 4, 11)))
    for name in CRT_MODELS
] + [
    (f"Classifier_{name}", lambda m, i, n: m(i, n), lambda rng, name=name: Classifier(name, 20, 4, EncoderConfig(**TINY)).eval(),
     inputs(const(IDS), const(LENGTHS)))
    for name in ARCHITECTURES
] + [
    ("AdditiveAttention_softmax_masked", lambda m, q, k, mask: m(q, m.prepare(k, mask)), _additive("softmax"),
     inputs(N(2, 4), N(2, 4, 3), const(S2A_KEY_MASK))),
] + [
    (f"AdditiveAttention_gumbel_soft_{tau}", lambda m, q, k, g, mask: m(q, m.prepare(k, mask), noise=g),
     _additive("gumbel", tau), inputs(N(2, 4), N(2, 4, 3), N(2, 4), const(S2A_KEY_MASK)))
    for tau in ("conditioned", "latent", "fixed")
] + [
    (f"Seq2Attn_{name}", _seq2attn_loss, make, inputs(*map(const, S2A_BATCH))) for name, make in [
        ("gumbel_soft", _seq2attn()),
        ("lstm_2layer_latent", _seq2attn(cell="lstm", n_layers=2, dropout=0.3, temperature="latent")),
        ("baseline", _seq2attn("seq2seq", "softmax")),
        ("baseline_lstm_2layer", _seq2attn("seq2seq", "softmax", cell="lstm", n_layers=2, dropout=0.3)),
        ("GF_without_ET", _seq2attn(embedding_values=False, transcoder=False)),
    ]
]


# Abstractor (docs/abstractor.md §1–4): RCA with every σ_rel, symmetric or not, both scalings and masks;
# position-relative RCA with clipped offsets; the symbol mechanisms; the Abstractor layers (with the
# Ablation's cross-attention); the encoder–decoder, its multi-attention decoder in both forms, and the
# Abstractor architectures. Tiny sizes (heads 3 wide), no dropout.
ABS = dict(d_model=8, n_head=2, d_head=3, d_ff=6, n_encoder_layers=1, n_decoder_layers=1, dropout=0.0,
           attention_dropout=0.0)
SIMPLE = dict(d_model=8, n_relations=2, d_key=3, d_ff=6, dropout=0.0)
ABS_MASK = np.array([[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]], bool)
ABS_SEQ = inputs(N(2, 5, 3), const(np.array([[6, 1, 4], [6, 0, 2]])), const(ABS_MASK))  # objects, decoder input


def _abstractor_cfg(**changes):
    return AbstractorConfig(**ABS, n_abstractor_layers=1, max_len=5, **changes)


def _rca(**options):
    return lambda rng: RelationalCrossAttention(8, 2, d_head=3, rng=rng, **options)


def _decoder_layer(rng, contexts):
    cfg = EncoderDecoderConfig(**ABS)
    return DecoderLayer(cfg, rng, lambda role: keras_attention(cfg, rng), contexts)


MODULES += [
    (f"RCA_{activation}{'_symmetric' if symmetric else ''}", lambda m, x, s, k: m(x, s, key_mask=k),
     _rca(activation=activation, symmetric=symmetric), inputs(N(2, 5, 8), N(2, 5, 8), const(ABS_MASK)))
    for activation in ("softmax", "sigmoid", "tanh", "linear") for symmetric in (False, True)
] + [
    ("RCA_softmax_causal_unscaled", lambda m, x, s: m(x, s, causal=True), _rca(scale="none"),
     inputs(N(2, 5, 8), N(2, 5, 8))),
    ("PositionRelativeRCA_clipped", lambda m, x, k: m(x, key_mask=k),
     lambda rng: PositionRelativeRCA(8, 2, max_offset=2, d_head=3, activation="tanh", rng=rng),
     inputs(N(2, 5, 8), const(ABS_MASK))),
    ("SimplifiedRCA_sigmoid", lambda m, x, s: m(x, s), lambda rng: SimplifiedRCA(8, 2, 3, 6, "sigmoid", rng=rng),
     inputs(N(2, 3, 8), N(2, 3, 6))),
    ("SimplifiedRCA_linear_symmetric_bias", lambda m, x, s, k: m(x, s, key_mask=k),
     lambda rng: SimplifiedRCA(8, 4, 3, 8, "linear", symmetric=True, bias=True, rng=rng),
     inputs(N(2, 5, 8), N(2, 5, 8), const(ABS_MASK))),
    ("PositionalSymbols_learned", lambda m, x: m(x), lambda rng: PositionalSymbols(6, 8, rng=rng), inputs(N(2, 5, 8))),
    ("SymbolicAttention", lambda m, x: m(x), lambda rng: SymbolicAttention(8, 5, 2, d_binding=3, rng=rng),
     inputs(N(2, 5, 8))),
    ("AbstractorLayer", lambda m, a, e, k: m(a, e, k), lambda rng: AbstractorLayer(_abstractor_cfg(), rng),
     inputs(N(2, 5, 8), N(2, 5, 8), const(ABS_MASK))),
    ("AbstractorLayer_ablation", lambda m, a, e, k: m(a, e, k),
     lambda rng: AbstractorLayer(_abstractor_cfg(), rng, ablation=True),
     inputs(N(2, 5, 8), N(2, 5, 8), const(ABS_MASK))),
    ("AbstractorLayer_simple_sigmoid_symmetric", lambda m, a, e: m(a, e),
     lambda rng: AbstractorLayer(_abstractor_cfg(symbol_self_attention=False, rca_residual=False, activation="sigmoid",
                                                 symmetric=True), rng), inputs(N(2, 5, 8), N(2, 5, 8))),
    ("SimplifiedAbstractorLayer", lambda m, a, x: m(a, x),
     lambda rng: SimplifiedAbstractorLayer(SimplifiedConfig(**SIMPLE), rng),
     inputs(N(2, 3, 8), N(2, 3, 8))),
    ("DecoderLayer_multi_attention", lambda m, y, c1, c2, k: m(y, [c1, c2], k),
     lambda rng: _decoder_layer(rng, (0, 1)), inputs(N(2, 3, 8), N(2, 5, 8), N(2, 5, 8), const(ABS_MASK))),
    ("Seq2SeqTransformer", lambda m, x, t, k: m(x, t, k),
     lambda rng: Seq2SeqTransformer(7, 6, EncoderDecoderConfig(**ABS), d_src=3), ABS_SEQ),
    ("RelationalClassifier", lambda m, x: m(x),
     lambda rng: RelationalClassifier(4, 3, 2, SimplifiedConfig(**SIMPLE)), inputs(N(2, 3, 4))),
] + [
    (f"AbstractorSeq2Seq_{name}", lambda m, x, t, k: m(x, t, k),
     lambda rng, changes=changes: AbstractorSeq2Seq(7, 6, _abstractor_cfg(**changes), d_src=3), ABS_SEQ)
    for name, changes in [  # the Ablation model differs only where AbstractorLayer_ablation checks it
        ("b", {}), ("d_multi_attention", dict(architecture="d")),
        ("e_multi_attention_code_form", dict(architecture="e", decoder_form="code")),
    ]
] + [
    # init="keras" (docs/abstractor.md §5.1): the same functions from other starting weights (small q/k/v,
    # zero FF biases), so every module and model that reads the option is a row of its own
    ("MultiHeadAttention_keras_init", lambda m, x, c, k: m(x, context=c, key_mask=k),
     lambda rng: MultiHeadAttention(8, 2, rng=rng, d_head=3, bias=True, init="keras"),
     inputs(N(2, 3, 8), N(2, 5, 8), const(ABS_MASK))),
    ("RCA_softmax_keras_init", lambda m, x, s, k: m(x, s, key_mask=k), _rca(init="keras"),
     inputs(N(2, 5, 8), N(2, 5, 8), const(ABS_MASK))),
    ("SimplifiedRCA_sigmoid_keras_init", lambda m, x, s: m(x, s),
     lambda rng: SimplifiedRCA(8, 2, 3, 6, "sigmoid", rng=rng, init="keras"), inputs(N(2, 3, 8), N(2, 3, 6))),
    ("AbstractorLayer_ablation_keras_init", lambda m, a, e, k: m(a, e, k),
     lambda rng: AbstractorLayer(_abstractor_cfg(init="keras"), rng, ablation=True),
     inputs(N(2, 5, 8), N(2, 5, 8), const(ABS_MASK))),
    ("AbstractorSeq2Seq_b_keras_init", lambda m, x, t, k: m(x, t, k),
     lambda rng: AbstractorSeq2Seq(7, 6, _abstractor_cfg(init="keras"), d_src=3), ABS_SEQ),
    ("Seq2SeqTransformer_keras_init", lambda m, x, t, k: m(x, t, k),
     lambda rng: Seq2SeqTransformer(7, 6, EncoderDecoderConfig(**ABS, init="keras"), d_src=3), ABS_SEQ),
    ("RelationalClassifier_keras_init", lambda m, x: m(x),
     lambda rng: RelationalClassifier(4, 3, 2, SimplifiedConfig(**SIMPLE, init="keras")), inputs(N(2, 3, 4))),
    ("RelationalClassifier_set_form_keras_init", lambda m, x: m(x),
     lambda rng: RelationalClassifier(4, 3, 2, SimplifiedConfig(**SIMPLE, activation="linear", symmetric=True,
                                                                rel_bias=True, head_hidden=0, init="keras")),
     inputs(N(2, 3, 4))),
]


# CoDA (docs/coda.md §3.1): the fused L1 distance (in one block, and in blocks of query rows and of
# (sample, head) slabs) and its composite; the Transformer form with every mask, gate, centring, temperature
# and Table 9 composition; the pairwise form; the CoDA encoder–decoder. Random float64 inputs make ties
# q_ic = k_jc (the kink of |·|) improbable; the pairwise rows never compare a sequence with itself.
CODA_ALL_MASKED = np.array([[1, 1, 1, 1, 0], [0, 0, 0, 0, 0]], bool)   # the second sample sees no key at all


def _coda(**options):
    return lambda rng: CoDAttention(8, 2, rng=rng, **options)


OPS += [
    ("l1_distance", l1_distance, inputs(N(2, 3, 5, 4), N(2, 3, 6, 4))),
    ("l1_distance_query_blocks", lambda q, k: l1_distance(q, k, block=9), inputs(N(2, 5, 4), N(2, 3, 4))),
    ("l1_distance_slab_blocks", lambda q, k: l1_distance(q, k, block=40), inputs(N(5, 2, 4), N(5, 3, 4))),
    ("l1_distance_reference", l1_distance_reference, inputs(N(2, 5, 4), N(2, 6, 4))),
]
MODULES += [
    ("CoDA_masked", lambda m, x, k: m(x, key_mask=k), _coda(), inputs(N(2, 5, 8), const(KEY_MASK))),
    ("CoDA_all_keys_masked_centered", lambda m, x, k: m(x, key_mask=k), _coda(gate="centered", center_e=True),
     inputs(N(2, 5, 8), const(CODA_ALL_MASKED))),
    ("CoDA_causal_cross", lambda m, x, c: m(x, context=c, causal=True), _coda(), inputs(N(2, 3, 8), N(2, 3, 8))),
    ("CoDA_cross_masked_row_mean", lambda m, x, c, k: m(x, context=c, key_mask=k),
     _coda(gate="centered", center_e=True, row_mean=True), inputs(N(2, 3, 8), N(2, 5, 8), const(KEY_MASK))),
    ("CoDA_centered_matrix_mean_masked", lambda m, x, k: m(x, key_mask=k), _coda(gate="centered", center_e=True),
     inputs(N(2, 5, 8), const(KEY_MASK))),
    ("CoDA_centered_row_mean_causal", lambda m, x: m(x, causal=True), _coda(gate="centered", row_mean=True),
     inputs(N(2, 4, 8))),
    ("CoDA_unscaled_temperatures_bias", lambda m, x, k: m(x, key_mask=k),
     _coda(alpha=0.5, beta=0.3, scale=False, bias=True, d_head=3), inputs(N(2, 5, 8), const(KEY_MASK))),
    ("CoDA_kv_step", lambda m, x, c, k: m(x, kv=m.kv(c), key_mask=k), _coda(), inputs(N(2, 1, 8), N(2, 5, 8),
                                                                                     const(KEY_MASK))),
] + [
    (f"CoDA_composition_{c}", lambda m, x, k: m(x, key_mask=k), _coda(composition=c, gate=g),
     inputs(N(2, 5, 8), const(KEY_MASK)))
    for c in COMPOSITIONS if c != "tanh-sigmoid" for g in ("scaled", "centered")
] + [
    (f"PairwiseCoDA_{name}", lambda m, a, b, ka, kb: F.concat(list(m(a, b, ka, kb)), axis=1),
     lambda rng, kw=kw: PairwiseCoDA(6, 4, rng=rng, **kw),
     inputs(N(2, 5, 6), N(2, 4, 6), const(ABS_MASK), const(np.array([[1, 1, 0, 0], [1, 1, 1, 1]], bool))))
    for name, kw in [("scaled", {}), ("shared_centered_temperatures",
                                       dict(shared=True, gate="centered", center_e=True, alpha=0.7, beta=0.5))]
] + [
    ("CoDASeq2SeqTransformer_centered", lambda m, x, t, k: m(x, t, k),
     lambda rng: CoDASeq2SeqTransformer(7, 6, CoDAEncoderDecoderConfig(**ABS, coda_gate="centered", coda_center_e=True),
                                        d_src=3, seed=1), ABS_SEQ),
] + [
    # the models' CoDA options as the command line sets them (--set coda_beta=1, --set
    # coda_gate=centered), through the config fields that CoDAttention.from_config reads; and init="keras"
    (f"CoDASeq2SeqTransformer_{name}", lambda m, x, t, k: m(x, t, k),
     lambda rng, kw=kw: CoDASeq2SeqTransformer(7, 6, CoDAEncoderDecoderConfig(**ABS, **kw), d_src=3, seed=1), ABS_SEQ)
    for name, kw in [("beta1_scaled", dict(coda_beta=1.0, coda_gate="scaled")),
                     ("beta1_centered", dict(coda_beta=1.0, coda_gate="centered")),
                     ("keras_init", dict(coda_beta=0.5, init="keras"))]
] + [
    (f"Classifier_transformer-coda_{name}", lambda m, i, n: m(i, n),
     lambda rng, kw=kw: Classifier("transformer-coda", 20, 4, CoDAEncoderConfig(**TINY, **kw)).eval(),
     inputs(const(IDS), const(LENGTHS)))
    for name, kw in [("beta1_scaled", dict(coda_beta=1.0, coda_gate="scaled")),
                     ("beta1_centered", dict(coda_beta=1.0, coda_gate="centered"))]
]


def _to(arrays, device):
    return [backend.to_device(a, device) for a in arrays]


@pytest.mark.parametrize("name,fn,make", OPS, ids=[r[0] for r in OPS])
def test_op_gradients(name, fn, make, device):
    rng = np.random.default_rng(0)
    check_backward(fn, _to(make(rng), device))


@pytest.mark.parametrize("name,fn,make_module,make", MODULES, ids=[r[0] for r in MODULES])
def test_module_gradients(name, fn, make_module, make, device):
    rng = np.random.default_rng(0)
    module = make_module(rng).to(device)
    check_backward(lambda *xs: fn(module, *xs), _to(make(rng), device), params=module)


@pytest.mark.parametrize("name,fn,make_module,make", MODULES, ids=[r[0] for r in MODULES])
def test_module_gradients_away_from_initialisation(name, fn, make_module, make, device):
    """The same rows with every parameter moved off its initial value. At initialisation a scale or a
    temperature may be exactly 1 and a bias or γ exactly 0 (geometric attention's β = 1, γ = 0), where a
    backward that drops the factor still passes: a mutant of the annex's off-NumPy directional term hid so."""
    rng = np.random.default_rng(1)
    module = make_module(np.random.default_rng(0)).to(device).double()
    for p in module.parameters():
        p.data = p.data + backend.to_device(0.2 * rng.standard_normal(p.shape), device)
    check_backward(lambda *xs: fn(module, *xs), _to(make(rng), device), params=module, n_directions=1)


# --- the checker itself must be able to fail --------------------------------------------------

class _SoftmaxDropsTerm(Softmax):
    def backward(self, gy):
        return self.y * gy  # the correct rule also subtracts y·Σ(gy·y)


class _SoftmaxZeroGrad(Softmax):
    def backward(self, gy):
        return gy * 0  # passes an all-ones upstream gradient, since Σ softmax = 1


@pytest.mark.parametrize("bad", [_SoftmaxDropsTerm, _SoftmaxZeroGrad])
def test_checker_catches_planted_wrong_backward(bad):
    x = np.random.default_rng(0).standard_normal((3, 5))
    with pytest.raises(GradcheckError, match="numeric .* vs analytic"):
        check_backward(lambda a: bad(-1)(a), [x])
    check_backward(lambda a: Softmax(-1)(a), [x])  # the honest op passes on the same input


def test_checker_elementwise_mode_names_the_entry():
    x = np.random.default_rng(0).standard_normal((2, 3))
    with pytest.raises(GradcheckError, match="entry"):
        check_backward(lambda a: _SoftmaxDropsTerm(-1)(a), [x], elementwise=True)


def test_checker_catches_a_wrong_parameter_gradient():
    lin = nn.Linear(3, 2)

    class Wrong(nn.Module):
        def __init__(self):
            self.lin = lin

        def forward(self, x):
            return x @ Tensor(self.lin.weight.data) + self.lin.bias  # weight silently detached

    model = Wrong()
    with pytest.raises(GradcheckError, match="weight"):
        check_backward(model, [np.ones((2, 3))], params=model)


def test_checker_rejects_float32_computation():
    class ToFloat32(Function):
        def forward(self, x):
            return x.astype(np.float32)

        def backward(self, gy):
            return gy.astype(np.float64)

    with pytest.raises(GradcheckError, match="float32"):
        check_backward(lambda a: ToFloat32()(a), [np.ones(3)])


@pytest.mark.parametrize("K", [5, ops.ONEHOT_MAX_ROWS + 1])       # one-hot on every device / CPU sorts
def test_segment_sum_matches_a_float64_add_at(device, K):
    """The gather gradient (no atomics) against np.add.at in float64 as the reference, repeats included."""
    rng = np.random.default_rng(K)
    g, k = rng.standard_normal((3, 40, 2)).astype(np.float32), rng.integers(0, K, 40)
    k[:4] = K - 1                                                   # some row gets many
    want = np.zeros((3, K, 2))
    np.add.at(want, (slice(None), k), g.astype(np.float64))
    got = ops.segment_sum(backend.to_device(g, device), backend.to_device(k, device), K)
    assert backend.device_of(got) == device and got.dtype == np.float32
    np.testing.assert_allclose(backend.to_numpy(got), want, rtol=1e-5, atol=1e-5)
