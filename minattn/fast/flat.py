"""Annex: the optimizer update and gradient clipping of all parameters as one flat array (off
NumPy).

The seam: ``faster(Optimizer.update_each, data)`` and ``faster(clip_grad_norm_each, data)``
(minattn/optim.py).
At its first step an optimizer moves its parameters into one flat buffer (``FlatParameters``: each
``p.data`` becomes a view into it), so the update of all parameters is a dozen array operations, not
a dozen per parameter: on a GPU each is a kernel launch (~10 µs of host time). The arithmetic per
element is unchanged, so results are the same bits. Clipping then takes the norm with one dot
product (summed in another order than parameter by parameter: the last bits of a clipped step may
differ).

On NumPy an operation is a function call, not a launch, and a dozen operations over a large model's
whole flat state stream it through memory a dozen times, where one parameter at a time stays in
cache: there the optimizer updates one parameter at a time.
"""
import weakref

import numpy as np

from ..backend import array_module
from ..engine import register_faster
from ..optim import Optimizer, clip_grad_norm_each

# id(parameter) -> (weak reference to it, the FlatParameters it lives in), for clip_grad_norm. Not a
# WeakKeyDictionary: that compares keys with ==, which on tensors gives arrays.
_FLAT = {}


def _flat_of(p):
    ref, flat = _FLAT.get(id(p), (None, None))
    return flat if ref is not None and ref() is p else None


class FlatParameters:
    """One buffer holding the data of ``params`` (each ``p.data`` becomes a view into it, in order),
    and the optimizer's state as flat arrays (``state``) whose per-parameter views are the
    optimizer's.

    ``grads()`` gathers their gradients into one flat array with one concatenation; ``intact()``
    says whether every ``p.data`` is still its view (``Module.to`` or ``load_state_dict`` may have
    replaced it: the optimizer then builds a new buffer from the current data)."""

    def __init__(self, params):
        xp = array_module(params[0].data)
        self.params = list(params)
        self.bounds, n = [], 0
        for p in self.params:
            self.bounds.append((n, n + p.size))
            n += p.size
        self.data = xp.empty(n, dtype=params[0].dtype)
        for p, (a, b) in zip(self.params, self.bounds):
            self.data[a:b] = p.data.reshape(-1)
            p.data = self.data[a:b].reshape(p.shape)
            _FLAT[id(p)] = (weakref.ref(p), self)
        self.views = [p.data for p in self.params]
        self.grad, self.grad_views = None, ()
        self.state, self.split_of = {}, None   # flat state; the per-parameter list made from it

    @staticmethod
    def possible(params):
        """All parameters on one device (not NumPy's, see above) in one float dtype."""
        return (bool(params) and type(params[0].data) is not np.ndarray and params[0].dtype.kind == "f"
                and len({(type(p.data), p.dtype) for p in params}) == 1)

    def intact(self):
        return all(p.data is v for p, v in zip(self.params, self.views))

    def split(self, flat):
        """Views of a flat array, one per parameter, shaped like it."""
        return [flat[a:b].reshape(p.shape) for p, (a, b) in zip(self.params, self.bounds)]

    def grads(self):
        """The gradients as one flat array (the parameters' ``.grad`` become views into it), or None
        when some parameter has no gradient."""
        if self.grad is not None and all(p.grad is g for p, g in zip(self.params, self.grad_views)):
            return self.grad
        grads = [p.grad for p in self.params]
        if any(g is None for g in grads):
            return None
        # A new array each time (not a reused buffer): an earlier step's gradients stay what they
        # were.
        self.grad = array_module(grads[0]).concatenate([g.reshape(-1) for g in grads])
        self.grad_views = self.split(self.grad)
        for p, g in zip(self.params, self.grad_views):
            p.grad = g
        return self.grad

    def join_state(self, opt):
        """Flat state from the optimizer's per-parameter state (after loading it, or at the first
        step)."""
        # A parameter that has had no gradient yet has no state: zeros, which is what Adam's moments
        # and SGD's momentum start from anyway.
        keys = set().union(*opt.state)
        xp = array_module(self.data)
        self.state = {k: xp.concatenate([s[k].reshape(-1) if k in s else xp.zeros(p.size, p.dtype)
                                         for p, s in zip(self.params, opt.state)]) for k in keys}
        self.split_state(opt)

    def split_state(self, opt):
        views = {k: self.split(v) for k, v in self.state.items()}
        opt.state = self.split_of = [{k: views[k][i] for k in views}
                                     for i in range(len(self.params))]


class _FlatView:
    """Stands in for one parameter whose ``data`` is the whole flat buffer (for
    ``Optimizer.update``)."""
    __slots__ = ("data",)

    def __init__(self, data):
        self.data = data


def update_flat(opt):
    """``Optimizer.update_each`` as one update of the flat buffer, where
    ``FlatParameters.possible``."""
    if not FlatParameters.possible(opt.params):
        return Optimizer.update_each(opt)
    flat = vars(opt).get("_flat")
    if flat is None or not flat.intact():
        flat = opt._flat = FlatParameters(opt.params)
        flat.join_state(opt)
    elif opt.state is not flat.split_of:      # load_state_dict replaced the state
        flat.join_state(opt)
    g = flat.grads()
    # some parameter without a gradient: one at a time, then the flat state again
    if g is None:
        Optimizer.update_each(opt)
        return flat.join_state(opt)
    keys = set(flat.state)
    opt.update(_FlatView(flat.data), g, flat.state)
    if set(flat.state) != keys:               # the first step made the state
        flat.split_state(opt)


def clip_grad_norm_flat(params, max_norm):
    """``clip_grad_norm_each`` as one dot product and one multiply, when ``params`` are exactly the
    parameters of an optimizer's flat buffer (after its first step)."""
    flat = _flat_of(params[0]) if params else None
    if not (flat is not None and len(flat.params) == len(params)
            and all(a is b for a, b in zip(flat.params, params)) and flat.intact()):
        return clip_grad_norm_each(params, max_norm)
    g = flat.grads()
    if g is None:
        return clip_grad_norm_each(params, max_norm)
    xp = array_module(g)
    norm = xp.sqrt(g.dot(g))
    g *= max_norm / xp.maximum(norm + 1e-6, max_norm)
    return norm


register_faster(Optimizer.update_each, update_flat)
register_faster(clip_grad_norm_each, clip_grad_norm_flat)
