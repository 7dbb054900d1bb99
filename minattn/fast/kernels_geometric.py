"""GPU tier (see kernels.py): geometric attention (NDR, Csordás et al. 2022, §3, Eqs. 7–10;
docs/ndr.md §3) as kernels. The definitions are the fused ops ``DirectionalLogits`` (Eqs. 9–10) and
``GeometricWeights`` (Eq. 7 in log space) of fast/geometric.py; a kernel thread owns one (batch,
head, query) row, so every sum is one thread's loop in a fixed order (no atomics).
"""
import numpy as np

from .. import functional as F
from ..backend import array_module
from .geometric import DirectionalLogits, GeometricWeights, GroupedDirectionalLogits
from .grouped import ProductSum
from .kernels import FORMS, KernelFunction, elementwise_source, kernel, launch_rows, raw_source

LOGITS = elementwise_source(
    "ndr_directional_logits",
    "float32 qk, raw float32 s, raw float32 alpha, raw float32 beta, raw float32 gamma, int32 T",
    "float32 z",
    """
    // Eqs. 9-10: z_ij = alpha q_i.k_j + beta D_ij + gamma, D_ij = s->_i if j > i else s<-_i.
    // i: this entry's flat index in qk (B, H, T, T); s (B, H, T, 2) = (s<-, s->) per query row.
    int row = i / T, key = i % T, query = row % T;
    z = alpha[0] * qk + (s[2 * row + (key > query)] * beta[0] + gamma[0]);
    """)

LOGITS_BACKWARD = raw_source("ndr_directional_logits_backward", r"""
// Eqs. 9-10 backward (DirectionalLogits.backward), one thread per query row r = (b, h, i):
// dL/dqk_ij = alpha dL/dz_ij; gbs = the sum of dL/dz_ij per side (left j <= i, right j > i);
// dL/ds = beta gbs.
extern "C" __global__ void ndr_directional_logits_backward(
        const float* gz, const float* alpha, const float* beta,
        float* gqk, float* gs, float* gbs, int rows, int T) {
    int r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= rows) return;
    int i = r % T;
    long long o = (long long)r * T;
    float left = 0.f, right = 0.f;
    for (int j = 0; j < T; ++j) {
        float g = gz[o + j];
        gqk[o + j] = alpha[0] * g;
        if (j > i) right += g; else left += g;
    }
    gbs[2 * r] = left;              gbs[2 * r + 1] = right;
    gs[2 * r] = left * beta[0];     gs[2 * r + 1] = right * beta[0];
}
""")

# The scan order of query i (geometric.scan_order): key j has rank k = 2|j - i| + (j < i), so rank k
# is key i + k/2 for even k (i itself, then the right keys), i - k/2 for odd k (rank 1 is no key).
WEIGHTS = raw_source("ndr_geometric_weights", r"""
// Eq. 7 in log space (GeometricWeights.forward), one thread per query row r = (b, h, i):
// log A_ij = z_ij - the sum of softplus(z_ik) over the keys k scanned up to and including j, the
// keys walked in scan order (i, i+1, i-1, i+2, ...: right wins ties); masked keys (invalid: the
// diagonal, padding) get z = masked, so softplus = 0 and A = 0.
extern "C" __global__ void ndr_geometric_weights(const float* z, const bool* invalid, float* A,
        int rows, int T, int rows_per_mask, float masked) {
    int r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= rows) return;
    int i = r % T;
    long long o = (long long)r * T, m = (long long)(r / rows_per_mask) * T * T + (long long)i * T;
    float acc = 0.f;                                 // the sum of softplus(z) = -log(1 - sigma(z))
    for (int k = 0; k < 2 * T; ++k) {
        int j = k % 2 ? i - k / 2 : i + k / 2;
        if (k == 1 || j < 0 || j >= T) continue;
        float zj = invalid[m + j] ? masked : z[o + j];
        acc += fmaxf(zj, 0.f) + log1pf(expf(-fabsf(zj)));   // softplus = logaddexp(0, z)
        A[o + j] = expf(zj - acc);
    }
}
""")

WEIGHTS_BACKWARD = raw_source("ndr_geometric_weights_backward", r"""
// Eq. 7 backward (GeometricWeights.backward), one thread per query row: with g = dL/dA * A, walk
// the keys in REVERSE scan order keeping acc = the sum of g over the keys scanned from j on;
// dL/dz_j = g_j - acc sigma(z_j), sigma(z) = exp(z - softplus(z)). Masked keys: A = sigma = 0.
extern "C" __global__ void ndr_geometric_weights_backward(
        const float* z, const bool* invalid, const float* A, const float* gA, float* gz,
        int rows, int T, int rows_per_mask, float masked) {
    int r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= rows) return;
    int i = r % T;
    long long o = (long long)r * T, m = (long long)(r / rows_per_mask) * T * T + (long long)i * T;
    float acc = 0.f;
    for (int k = 2 * T - 1; k >= 0; --k) {
        int j = k % 2 ? i - k / 2 : i + k / 2;
        if (k == 1 || j < 0 || j >= T) continue;
        float zj = invalid[m + j] ? masked : z[o + j];
        float g = gA[o + j] * A[o + j];
        acc += g;
        gz[o + j] = g - acc * expf(zj - (fmaxf(zj, 0.f) + log1pf(expf(-fabsf(zj)))));
    }
}
""")


class DirectionalLogitsKernel(KernelFunction, GroupedDirectionalLogits):
    """Eqs. 9–10 as one kernel each way; equals ``DirectionalLogits`` (its definition): forward 5
    array operations → 1, backward 4 → 1. α's and β's gradients stay deferred ``ProductSum``s
    (summed over the 14 applications at once, as ``GroupedDirectionalLogits`` does)."""
    define, define_backward = DirectionalLogits.forward, GroupedDirectionalLogits.backward

    def launch(self, qk, s, alpha, beta, gamma):
        xp = array_module(qk)
        self.qk, self.s = xp.ascontiguousarray(qk), xp.ascontiguousarray(s)
        self.alpha, self.beta = alpha, beta
        return kernel(LOGITS, xp)(self.qk, self.s, alpha, beta, gamma, np.int32(qk.shape[-1]))

    def launch_backward(self, gz):
        xp = array_module(gz)
        gz, T = xp.ascontiguousarray(gz), gz.shape[-1]
        gqk, gs, gbs = xp.empty_like(gz), xp.empty_like(self.s), xp.empty_like(self.s)
        rows = gz.size // T
        launch_rows(xp, LOGITS_BACKWARD, rows,
                    (gz, self.alpha, self.beta, gqk, gs, gbs, np.int32(rows), np.int32(T)))
        return (gqk, gs, ProductSum(gz, self.qk, self.alpha.shape),
                ProductSum(gbs, self.s, self.beta.shape), gbs)


class GeometricWeightsKernel(KernelFunction, GeometricWeights):
    """Eq. 7 as one kernel each way; equals ``GeometricWeights`` (its definition): forward 7 array
    operations → 1, backward 8 → 1. Not bit-equal to it (the device's exp and log1p, FMA), but
    deterministic."""
    define, define_backward = GeometricWeights.forward, GeometricWeights.backward

    def _sizes(self, z):
        T = z.shape[-1]
        rows = z.size // T
        masks = self.invalid.size // (T * T)    # 1 (no padding: the diagonal only) or B
        return (np.int32(rows), np.int32(T), np.int32(rows // masks), np.float32(F.MASKED))

    def launch(self, z):
        xp = array_module(z)
        self.z_in, self.mask = xp.ascontiguousarray(z), xp.ascontiguousarray(self.invalid)
        self.A = xp.empty_like(self.z_in)
        sizes = self._sizes(z)
        launch_rows(xp, WEIGHTS, int(sizes[0]), (self.z_in, self.mask, self.A) + sizes)
        return self.A

    def launch_backward(self, gA):
        xp = array_module(gA)
        gz, sizes = xp.empty_like(self.z_in), self._sizes(gA)
        launch_rows(xp, WEIGHTS_BACKWARD, int(sizes[0]),
                    (self.z_in, self.mask, self.A, xp.ascontiguousarray(gA), gz) + sizes)
        return gz


FORMS.extend([(DirectionalLogits, DirectionalLogitsKernel),
              (GeometricWeights, GeometricWeightsKernel)])
