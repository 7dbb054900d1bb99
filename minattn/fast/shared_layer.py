"""Annex: a layer applied n times in one pass builds its derived weights once and draws its dropout
masks at once (the seam: ``faster(nn.applied_each_time)``, behind ``Module.repeated(n)``).

The NDR encoder (models/transformer.py ``UniversalEncoder``) applies one layer ``n_steps`` times. On the
textbook path every application rebuilds what the layer derives from its parameters (``Module.once``:
[W_q | W_k | W_v | W_s] side by side, the feed-forward's and the gate's first layers side by side) and
draws a fresh dropout mask for each of its dropouts. Inside ``repeated(layer, n)``:

* ``once(name, make)`` returns what ``make()`` gave the first time (what it made belongs to this pass's
  graph; the cache is dropped at the end of the block, so a parameter changed in place, by an
  optimizer step or a gradient check, is always seen);
* each ``Dropout`` of the layer draws the masks of its next n calls as one array (one draw of three
  array operations instead of n) and hands them out in turn. The random stream is read in the same
  order, so the masks are the textbook path's bits whenever a mask's size is even (NumPy draws 16-bit
  numbers two per 32-bit word: an odd-sized draw leaves half a word unused, a joint draw does not).

On a GPU each saved operation is a kernel launch. Measured with ``make bench`` (NDR on CTL, cpu preset,
one run with and without): launches per step (tests/counting.py) 1,755 with, 1,963 without (shared
weights 52, dropout draws 156); CPU ms/step: see the README's table.
"""
import contextlib

from ..engine import register_faster
from ..nn import Dropout, applied_each_time


class MaskPlan:
    """The masks of a dropout's next n calls, drawn together when the first is asked for."""

    def __init__(self, n):
        self.n, self.masks, self.key, self.used = max(1, n), None, None, 0

    def next(self, dropout, shape, dtype):
        key = (shape, dtype)
        if self.masks is None or self.rng is not dropout.rng or self.key != key or self.used == self.n:
            self.masks, self.rng, self.key, self.used = dropout.mask((self.n,) + shape, dtype), dropout.rng, key, 0
        self.used += 1
        return self.masks[self.used - 1]


@contextlib.contextmanager
def applied_together(module, n):
    modules = [m for _, m in module.named_modules()]
    fresh = [m for m in modules if "_once" not in vars(m)]   # nested blocks: the outer one's cache is kept
    planned = [m for m in modules if isinstance(m, Dropout) and "_plan" not in vars(m)]
    for m in fresh:
        m._once = {}
    for m in planned:
        m._plan = MaskPlan(n)
    try:
        yield module
    finally:
        for m in fresh:
            del m._once
        for m in planned:
            del m._plan


register_faster(applied_each_time, applied_together)
