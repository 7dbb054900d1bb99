"""Annex: a layer applied n times in one pass builds its derived weights once (the seam:
``faster(nn.applied_each_time, ...)``, inside ``Module.repeated(n)``).

The NDR encoder (models/encoder.py ``UniversalEncoder``) applies one layer ``n_steps`` times. On the
textbook path every application rebuilds what the layer derives from its parameters (the methods
named in ``DERIVED``: [W_q | W_k | W_v | W_s] side by side in geometric attention, the feed-forward's
and the gate's first layers side by side in the copy-gate layer): two concatenations forward and two
splits back per application. Here each such method returns what it made at its first call in the
block. What it made belongs to this pass's graph, and the cache is dropped at the end of the block,
so a parameter changed in place (an optimizer step, a gradient check) is always seen.
"""
import contextlib
import functools

from ..engine import register_faster
from ..nn import applied_each_time

# methods that make weights from their module's parameters alone (GeometricAttention.in_projection,
# CopyGateLayer.first_layers), called without arguments
DERIVED = ("in_projection", "first_layers")


@contextlib.contextmanager
def applied_together(module, n):
    # each module's bound method, cached for the block (an instance attribute hides the class's);
    # nested: the outer cache is kept
    made_once = [(m, name) for _, m in module.named_modules() for name in DERIVED
                 if hasattr(type(m), name) and name not in vars(m)]
    for m, name in made_once:
        setattr(m, name, functools.cache(getattr(m, name)))
    try:
        yield module
    finally:
        for m, name in made_once:
            delattr(m, name)


register_faster(applied_each_time, applied_together)
