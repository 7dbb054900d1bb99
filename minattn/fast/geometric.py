"""Annex: geometric attention's α and β get their gradients as deferred products (the seam:
``faster(DirectionalLogits)``, minattn/attention/geometric.py).

The one file of the annex that knows a mechanism: every other file imports only the core (engine,
ops, nn, optim), and tests/test_layout.py holds the annex to that. It is here, not in grouped.py, so
that the annex sits below the attention modules but for this one named file.

The NDR encoder applies geometric attention 14 times per pass, so its scalars α and β (Eqs. 9–10)
get 14 gradients each, Σ gz ⊙ qk and Σ gbs ⊙ s. Off NumPy they go to the engine unevaluated
(``ProductSum``, fast/grouped.py), which sums all 14 in one product of stacked inputs (4 array
operations, not n + 2); on NumPy the plain backward runs. Measured with grouped.py's forms (its
docstring).
"""
from ..attention.geometric import DirectionalLogits
from ..engine import register_faster
from .grouped import ProductSum, _grouped


class GroupedDirectionalLogits(DirectionalLogits):
    def backward(self, gz):
        if not _grouped(gz):
            return super().backward(gz)
        # (B, H, T, 2), as the plain form
        gbs = (gz[..., None, :] * self.sides).sum(axis=-1)
        return (gz * self.alpha, gbs * self.beta, ProductSum(gz, self.qk, self.alpha.shape),
                ProductSum(gbs, self.s, self.beta.shape), gbs)


register_faster(DirectionalLogits, GroupedDirectionalLogits)
