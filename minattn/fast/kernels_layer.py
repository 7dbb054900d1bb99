"""GPU tier (see kernels.py): the copy-gate layer's chains (NDR, docs/ndr.md §2) as kernels, in
``copy_gate_forward``, the kernel form of ``CopyGateLayer.forward`` (models/encoder.py: the layer's
forward is its definition, line for line).

* LayerNorm, and residual + dropout + LayerNorm (``a = LN(h + Drop(Attn(h)))``): one warp per row,
  its sums butterfly shuffles in a fixed order; definition ``GroupedLayerNorm`` (fast/grouped.py).
  The weight and bias gradients stay the grouped ``ProductSum`` and the engine's sum.
* The feed-forward's hidden layer, bias + ReLU + dropout.
* The copy gate, bias + σ + gate dropout + h + g(u − h) (Eqs. 5–6).

The matmuls stay cuBLAS calls; each kernel takes the product without its bias. The two second
layers are one product on all of the hidden layer (``SecondLayers``): no column slice of it is
copied for cuBLAS.
"""
import numpy as np

from .. import functional as F
from ..backend import array_module
from ..engine import Function, Tensor
from ..models.encoder import CopyGateLayer
from ..ops.fused import LayerNorm
from ..ops.matmul import _mm
from .grouped import GroupedLayerNorm, Outer, ProductSum
from .kernels import FORMS, KernelFunction, elementwise_source, kernel, mode, raw_source

_WARP_SUM = r"""
__device__ float warp_sum(float v) {   // butterfly: every lane gets the sum, in the same order
    for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
    return v;
}
"""

NORM = raw_source("ndr_layer_norm", _WARP_SUM + r"""
// LayerNorm over the last axis (LayerNorm.forward), a warp per row, lane l on entries l, l + 32...:
// v = res + x * mask (flags residual, masked), mu = mean v, rstd = 1 / sqrt(mean (v - mu)^2 + eps),
// xhat = (v - mu) rstd, y = xhat w + b. xhat holds v, then v - mu, then xhat (a lane its entries).
extern "C" __global__ void ndr_layer_norm(const float* x, const float* res, const float* mask,
        const float* w, const float* b, float* y, float* xhat, float* rstd,
        int rows, int d, float eps, int residual, int masked) {
    int row = blockIdx.x * blockDim.y + threadIdx.y, lane = threadIdx.x;
    if (row >= rows) return;                                    // the whole warp leaves together
    long long o = (long long)row * d;
    float s = 0.f;
    for (int k = lane; k < d; k += 32) {
        float v = masked ? x[o + k] * mask[o + k] : x[o + k];
        if (residual) v = res[o + k] + v;
        xhat[o + k] = v;
        s += v;
    }
    float mu = warp_sum(s) / d;
    s = 0.f;
    for (int k = lane; k < d; k += 32) { float c = xhat[o + k] - mu; xhat[o + k] = c; s += c * c; }
    float r = 1.f / sqrtf(warp_sum(s) / d + eps);
    for (int k = lane; k < d; k += 32) {
        float c = xhat[o + k] * r;
        xhat[o + k] = c;
        y[o + k] = c * w[k] + b[k];
    }
    if (lane == 0) rstd[row] = r;
}
""")

NORM_BACKWARD = raw_source("ndr_layer_norm_backward", _WARP_SUM + r"""
// LayerNorm backward (LayerNorm.grad_x), a warp per row: with gw = gy w,
// gv = rstd (gw - mean gw - xhat mean(gw xhat)); the residual gets gv, the dropped-out x gv mask.
extern "C" __global__ void ndr_layer_norm_backward(const float* gy, const float* xhat,
        const float* rstd, const float* w, const float* mask, float* gv, float* gx,
        int rows, int d, int masked) {
    int row = blockIdx.x * blockDim.y + threadIdx.y, lane = threadIdx.x;
    if (row >= rows) return;
    long long o = (long long)row * d;
    float s1 = 0.f, s2 = 0.f;
    for (int k = lane; k < d; k += 32) {
        float g = gy[o + k] * w[k];
        s1 += g;
        s2 += g * xhat[o + k];
    }
    float m1 = warp_sum(s1) / d, m2 = warp_sum(s2) / d, r = rstd[row];
    for (int k = lane; k < d; k += 32) {
        float v = r * (gy[o + k] * w[k] - m1 - xhat[o + k] * m2);
        gv[o + k] = v;
        if (masked) gx[o + k] = v * mask[o + k];
    }
}
""")

FF = elementwise_source(
    "ndr_bias_relu_dropout", "float32 y, float32 b, float32 m", "float32 out",
    "out = fmaxf(y + b, 0.f) * m;   // Drop(ReLU(x W1 + b1)): y = x W1, m the dropout mask")
FF_BACKWARD = elementwise_source(
    "ndr_bias_relu_dropout_backward", "float32 go, float32 out, float32 m", "float32 gy",
    "gy = out > 0.f ? go * m : 0.f;   // out > 0 exactly where the ReLU and the mask let it pass")

GATE = elementwise_source(
    "ndr_copy_gate", "float32 pre, float32 c, float32 u, float32 h, float32 m",
    "float32 out, float32 g",
    """
    // Eqs. 5-6: g = Drop(sigma(pre + c2)), sigma as ops' Sigmoid: 0.5 (tanh(x / 2) + 1);
    // h' = h + g (u - h)
    g = 0.5f * (tanhf(0.5f * (pre + c)) + 1.f) * m;
    out = h + g * (u - h);
    """)
GATE_BACKWARD = elementwise_source(
    "ndr_copy_gate_backward", "float32 go, float32 pre, float32 c, float32 u, float32 h, float32 m",
    "float32 gpre, float32 gu, float32 gh",
    """
    float s = 0.5f * (tanhf(0.5f * (pre + c)) + 1.f);
    gu = go * (s * m);                          // dh'/du = g
    gh = go - gu;                               // dh'/dh = 1 - g
    gpre = go * (u - h) * m * s * (1.f - s);    // through the mask and sigma' = sigma (1 - sigma)
    """)


def _warps(rows):
    """Grid and block for a warp per row: 4 warps a block."""
    return ((rows + 3) // 4,), (32, 4)


class LayerNormKernel(KernelFunction, GroupedLayerNorm):
    """LayerNorm as one kernel each way (both norms of the copy-gate layer; every LayerNorm on
    CuPy); equals ``GroupedLayerNorm`` (its definition): forward 10 array operations → 1, backward
    ~7 → 1."""
    define, define_backward = GroupedLayerNorm.forward, GroupedLayerNorm.backward
    mask = None

    def launch(self, x, weight, bias):
        return self._norm(x, None, weight, bias)

    def _norm(self, x, res, weight, bias):
        xp, d = array_module(x), x.shape[-1]
        x, rows = xp.ascontiguousarray(x), x.size // d
        y, self.xhat, self.weight = xp.empty_like(x), xp.empty_like(x), weight
        self.rstd = xp.empty(x.shape[:-1] + (1,), x.dtype)
        self.masked = self.mask is not None
        if self.masked:
            self.mask = xp.ascontiguousarray(xp.broadcast_to(self.mask, x.shape))
        flags = np.int32(res is not None), np.int32(self.masked)
        res = x if res is None else xp.ascontiguousarray(res)
        kernel(NORM, xp)(*_warps(rows), (x, res, self.mask if self.masked else x, weight, bias, y,
                                          self.xhat, self.rstd, np.int32(rows), np.int32(d),
                                          np.float32(self.eps)) + flags)
        return y

    def _grad(self, gy):
        xp, d = array_module(gy), gy.shape[-1]
        gy, rows = xp.ascontiguousarray(gy), gy.size // d
        gv = xp.empty_like(gy)
        gx = xp.empty_like(gy) if self.masked else gv
        kernel(NORM_BACKWARD, xp)(*_warps(rows), (
            gy, self.xhat, self.rstd, self.weight, self.mask if self.masked else gy, gv, gx,
            np.int32(rows), np.int32(d), np.int32(self.masked)))
        return gv, gx

    def launch_backward(self, gy):
        return self._grad(gy)[0], ProductSum(gy, self.xhat, self.weight.shape), gy


class ResidualNorm(LayerNormKernel):
    """LN(h + x ⊙ mask) (``norm_merge(h + drop_att(x))``, the dropout's mask drawn), inputs (x, h,
    weight, bias); its definition is the dropout's multiply and the residual add before
    ``GroupedLayerNorm``."""

    def __init__(self, mask, eps):
        super().__init__(eps)
        self.mask = mask

    def define(self, x, h, weight, bias):
        v = h + (x if self.mask is None else x * self.mask)
        return GroupedLayerNorm.forward(self, v, weight, bias)

    def define_backward(self, gy):
        gv, gw, gb = GroupedLayerNorm.backward(self, gy)
        return (gv if self.mask is None else gv * self.mask), gv, gw, gb

    def launch(self, x, h, weight, bias):
        return self._norm(x, h, weight, bias)

    def launch_backward(self, gy):
        gv, gx = self._grad(gy)
        return gx, gv, ProductSum(gy, self.xhat, self.weight.shape), gy


class BiasReluDropout(KernelFunction):
    """Drop(ReLU(y + b)) for y = x W; its definition is ops' Linear bias add, ReLU and Dropout
    (forward 4 array operations → 1, backward 2 → 1; b's gradient is the engine's sum over rows)."""

    def __init__(self, mask):
        self.mask = mask

    def define(self, y, b):
        pre = y + b
        self.relu = pre > 0
        out = pre * self.relu
        return out if self.mask is None else out * self.mask

    def define_backward(self, g):
        g = (g if self.mask is None else g * self.mask) * self.relu
        return g, g

    def launch(self, y, b):
        self.m = np.float32(1) if self.mask is None else self.mask
        self.out = kernel(FF, array_module(y))(y, b, self.m)
        return self.out

    def launch_backward(self, g):
        gy = kernel(FF_BACKWARD, array_module(g))(g, self.out, self.m)
        return gy, gy


class GateMix(KernelFunction):
    """h' = h + g ⊙ (u − h), g = σ(pre + c) ⊙ mask (NDR Eqs. 5–6 with gate dropout), inputs
    (pre, c, u, h); its definition is ops' Linear bias add, Sigmoid, Dropout and the mix (forward ~8
    array operations → 1, backward ~8 → 1). ``g`` (h's shape) is kept for ``last_gate``."""

    def __init__(self, mask):
        self.mask = mask

    def define(self, pre, c, u, h):
        xp = array_module(pre)
        self.s = 0.5 * (xp.tanh(0.5 * (pre + c)) + 1)               # σ as ops.elementwise.Sigmoid
        g = self.s if self.mask is None else self.s * self.mask
        self.g, self.diff, self.u_shape = g.reshape(h.shape), u.reshape(h.shape) - h, u.shape
        return h + self.g * self.diff

    def define_backward(self, go):
        gu = go * self.g
        gpre = (go * self.diff).reshape(self.s.shape)
        gpre = (gpre if self.mask is None else gpre * self.mask) * self.s * (1 - self.s)
        return gpre, gpre, gu.reshape(self.u_shape), go - gu

    def launch(self, pre, c, u, h):
        self.m = np.float32(1) if self.mask is None else self.mask
        self.args = (pre, c, u.reshape(pre.shape), h.reshape(pre.shape), self.m)
        self.u_shape, self.h_shape = u.shape, h.shape
        out, g = kernel(GATE, array_module(pre))(*self.args)
        self.g = g.reshape(h.shape)
        return out.reshape(h.shape)

    def launch_backward(self, go):
        go = go.reshape(self.args[0].shape)
        gpre, gu, gh = kernel(GATE_BACKWARD, array_module(go))(go, *self.args)
        return gpre, gpre, gu.reshape(self.u_shape), gh.reshape(self.h_shape)


class SecondLayers(Function):
    """[f | pre] = hidden [W2 0; 0 G2] for hidden (B·T, d_ff + d), the feed-forward's and the
    gate's hidden layers side by side: both second layers (biases aside) as one product, hidden's
    gradient as one. W2's and G2's are their blocks of hiddenᵀ g, deferred (``GroupedMatMul``'s)."""

    def __init__(self, both):
        self.both = both

    def forward(self, hidden, W2, G2):
        self.hidden, self.w2_shape = hidden, W2.shape
        return _mm(hidden, self.both)

    def backward(self, g):
        (m, n), hidden = self.w2_shape, self.hidden
        return _mm(g, self.both.T), Outer(hidden[:, :m], g[:, :n]), Outer(hidden[:, m:], g[:, n:])


def both_second_layers(layer, W1):
    """[W2 0; 0 G2], made once per pass and kept on the layer: inside ``Module.repeated``
    (fast/shared_layer.py) every application gets the same ``W1`` from ``first_layers``, and no
    weight changes within a pass."""
    made = vars(layer).get("_both")
    if made is None or made[0] is not W1:
        W2, G2 = layer.ff.fc2.weight.data, layer.gate.fc2.weight.data
        (m, n), (k, l) = W2.shape, G2.shape
        both = array_module(W2).zeros((m + k, n + l), W2.dtype)
        both[:m, :n], both[m:, n:] = W2, G2
        made = layer._both = (W1, both)
    return made[1]


def copy_gate_forward(layer, h, key_mask=None):
    """``CopyGateLayer.forward`` with its three chains as kernels (on CuPy float32; elsewhere the
    layer's own forward). Each mask is drawn by the same ``Dropout``, in the same order."""
    if mode(h.data) is None:
        return CopyGateLayer.forward(layer, h, key_mask)
    B, T, d = h.shape
    x, norm = layer.attn(h, key_mask=key_mask), layer.norm_merge
    a = ResidualNorm(layer.drop_att.draw(x), norm.eps)(x, h, norm.weight, norm.bias)
    W1, b1 = layer.first_layers()
    y = F.matmul(a.reshape(B * T, d), W1)
    hidden = BiasReluDropout(layer.ff.dropout.draw(y))(y, b1)
    W2, G2 = layer.ff.fc2.weight, layer.gate.fc2.weight
    second = SecondLayers(both_second_layers(layer, W1))(hidden, W2, G2)     # [f − b2 | pre]
    f = second[:, :d] + layer.ff.fc2.bias
    u = F.tanh(f) if layer.tanh_out else layer.norm_out(f)
    pre = second[:, d:]
    mix = GateMix(layer.gate_dropout.draw(pre))
    h_next = mix(pre, layer.gate.fc2.bias, u, h)
    if layer.record:
        layer.last_gate = Tensor(mix.g)
    return h_next


FORMS.extend([(LayerNorm, LayerNormKernel), (CopyGateLayer.forward, copy_gate_forward)])
