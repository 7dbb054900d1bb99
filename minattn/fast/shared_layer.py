"""Annex: a layer applied n times in one pass builds its derived weights once (the seam:
``faster(nn.applied_each_time)``, inside ``Module.repeated(n)``).

The NDR encoder (models/encoder.py ``UniversalEncoder``) applies one layer ``n_steps`` times. On the
textbook path every application rebuilds what the layer derives from its parameters
(``Module.once``: [W_q | W_k | W_v | W_s] side by side in geometric attention, the feed-forward's
and the gate's first layers side by side in the copy-gate layer): two concatenations forward and two
splits back per application. Here ``once(name, make)`` returns what ``make()`` gave the first time
in the block. What it made belongs to this pass's graph, and the cache is dropped at the end of the
block, so a parameter changed in place (an optimizer step, a gradient check) is always seen.

Measured with ``make bench`` (NDR on CTL, cpu preset, one run with and without): launches per step
(minattn/tools/counting.py) 1,755 with, 1,807 without. CPU time per step (median of 5 runs
alternating with the others on this shared 2-core machine, where runs vary by ~2%): 249.9 ms with,
259.4 ms without (+3.8%).
"""
import contextlib

from ..engine import register_faster
from ..nn import applied_each_time


@contextlib.contextmanager
def applied_together(module, n):
    # nested: the outer cache is kept
    fresh = [m for _, m in module.named_modules() if "_once" not in vars(m)]
    for m in fresh:
        m._once = {}
    try:
        yield module
    finally:
        for m in fresh:
            del m._once


register_faster(applied_each_time, applied_together)
