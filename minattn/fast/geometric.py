"""Annex: geometric attention's two equations as fused ops (NDR, Csordás et al. 2022, §3; the textbook
forms are ``geometric_weights`` and ``directional_logits`` in minattn/attention/geometric.py).

The one file of the annex that knows a mechanism (with its GPU kernels, kernels_geometric.py): every
other file imports only the core (engine, ops, nn, optim), and tests/repo/test_layout.py holds the annex to
that.

* ``GeometricWeights``, Eq. 7 in log space as one op. With m = log(1 − σ(z)) = −softplus(z) and
  ℓ = log σ(z) = z + m, log A_ij = ℓ_ij + Σ_{k∈S_ij} m_ik = z_ij + (the sum of m over the keys scanned
  up to j, j included): one cumulative sum in scan order. Backward, with g = ∂L/∂log A = ∂L/∂A ⊙ A:
  ∂L/∂m_ik is the sum of g over the keys scanned from k on, and ∂m/∂z = −σ(z) = −exp(ℓ). Masked keys
  get z = F.MASKED: σ = 0, m = 0, A = 0, and a gradient of exactly 0 with no mask in the backward.
* ``DirectionalLogits``, Eqs. 9–10 as one op. Off NumPy the NDR encoder's 14 applications give α and
  β 14 gradients each, Σ gz ⊙ qk and Σ gbs ⊙ s: ``GroupedDirectionalLogits`` hands them to the engine
  unevaluated (``ProductSum``, fast/grouped.py), which sums all 14 in one product of stacked inputs.

Each is registered for its textbook form; the GPU tier (kernels_geometric.py) registers a kernel for
each op here.
"""
from collections import namedtuple

import numpy as np

from .. import backend
from .. import functional as F
from ..attention.geometric import directional_logits, geometric_weights, scan_order
from ..engine import Function, faster, register_faster
from .grouped import ProductSum, _grouped

ScanIndices = namedtuple("ScanIndices", "scan unscan scan_back unscan_back")
_CONSTANTS = {}


def scan_indices(T, like):
    """The scan order as flat indices into a row-major (T, T) block, on the device of ``like``, made
    once per length: x.reshape(..., T·T)[..., i] for i in (scan, unscan, scan_back, unscan_back) is
    x[..., rows, perm], x[..., rows, inv], and the same for the scan from its far end
    (perm[:, ::-1], T − 1 − inv). One integer array is one gather (on CuPy one ``take``, where
    ``x[..., rows, perm]`` is several)."""
    key = (T, backend.device_of(like), "scan")
    if key not in _CONSTANTS:
        perm, inv = scan_order(T)
        row = T * np.arange(T)[:, None]
        host = (row + perm, row + inv, row + perm[:, ::-1], row + (T - 1 - inv))
        _CONSTANTS[key] = ScanIndices(*(backend.to_device(a, key[1]) for a in host))
    return _CONSTANTS[key]


def sides(T, like):
    """(T, 2, T) in like's dtype: [j ≤ i | j > i], the keys on each side of query i."""
    key = (T, backend.device_of(like), like.dtype)
    if key not in _CONSTANTS:
        i, j = np.arange(T)[:, None], np.arange(T)[None, :]
        host = np.stack([j <= i, j > i], axis=1).astype(like.dtype)
        _CONSTANTS[key] = backend.to_device(host, key[1])
    return _CONSTANTS[key]


class GeometricWeights(Function):
    """A = geometric attention weights of logits z (B, H, T, T), Eq. 7 in log space (header)."""

    def __init__(self, invalid, scan_indices):
        self.invalid, self.scan_indices = invalid, scan_indices

    def _scan_cumsum(self, x, reverse=False):
        """Cumulative sum along each query's scan order (from its end if ``reverse``), in key order:
        x is gathered into scan order (one gather each way), summed, and gathered back."""
        i = self.scan_indices
        scan, unscan = (i.scan_back, i.unscan_back) if reverse else (i.scan, i.unscan)
        flat = x.shape[:-2] + (-1,)
        y = backend.array_module(x).cumsum(x.reshape(flat)[..., scan], axis=-1)
        return y.reshape(flat)[..., unscan]

    def forward(self, z):
        xp = backend.array_module(z)
        self.z = xp.where(self.invalid, z.dtype.type(F.MASKED), z)
        self.softplus = xp.logaddexp(z.dtype.type(0), self.z)             # −m
        self.A = xp.exp(self.z - self._scan_cumsum(self.softplus))
        return self.A

    def backward(self, gA):
        g = gA * self.A
        return g - self._scan_cumsum(g, reverse=True) * backend.array_module(g).exp(self.z - self.softplus)


class DirectionalLogits(Function):
    """z_ij = α q_i·k_j + β D_ij + γ (Eqs. 9–10) for qk (B, H, T, T), s (B, H, T, 2), α, β, γ (1,)."""

    def __init__(self, right, sides):
        self.right, self.sides = right, sides

    def forward(self, qk, s, alpha, beta, gamma):
        self.qk, self.s, self.alpha, self.beta = qk, s, alpha, beta
        # (B, H, T, 2): β s + γ, small
        bs = s * beta + gamma
        return alpha * qk + backend.array_module(qk).where(self.right, bs[..., 1:], bs[..., :1])

    def side_sums(self, gz):
        """(B, H, T, 2): Σ_j of gz over each side of the query."""
        return (gz[..., None, :] * self.sides).sum(axis=-1)

    def backward(self, gz):
        gbs = self.side_sums(gz)
        # α, β, γ get their gradients unreduced: the engine sums them to shape (1,)
        return gz * self.alpha, gbs * self.beta, gz * self.qk, gbs * self.s, gbs


class GroupedDirectionalLogits(DirectionalLogits):
    """Off NumPy, α's and β's gradients go to the engine's accumulation as deferred products (header)."""

    def backward(self, gz):
        if not _grouped(gz):
            return super().backward(gz)
        gbs = self.side_sums(gz)
        return (gz * self.alpha, gbs * self.beta, ProductSum(gz, self.qk, self.alpha.shape),
                ProductSum(gbs, self.s, self.beta.shape), gbs)


def fused_geometric_weights(z, invalid):
    return faster(GeometricWeights, z)(invalid, scan_indices(z.shape[-1], z.data))(z)


def fused_directional_logits(qk, s, alpha, beta, gamma, right):
    return faster(DirectionalLogits, qk)(right, sides(qk.shape[-1], qk.data))(qk, s, alpha, beta, gamma)


register_faster(geometric_weights, fused_geometric_weights)
register_faster(directional_logits, fused_directional_logits)
register_faster(DirectionalLogits, GroupedDirectionalLogits)
