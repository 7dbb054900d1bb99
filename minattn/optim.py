"""Optimizers in textbook form, one parameter at a time, and global-norm gradient clipping.

All updates happen in place on ``p.data`` on the parameter's device; nothing is copied to the host
inside a step (``clip_grad_norm`` returns the norm as a device scalar). Off NumPy the annex
(minattn/fast/flat.py) joins here through ``faster``: it updates and clips all parameters as one flat
array, with the same arithmetic per element.
"""
import math

import numpy as np

from . import backend
from .backend import array_module
from .engine import faster


def _check(cls, name, value, ok, want):
    """A bad hyperparameter is refused where it is given, in one line (NaN fails every comparison)."""
    if not ok:
        raise ValueError(f"{cls.__name__}: {name} must be {want}, got {value!r}")


class Optimizer:
    def __init__(self, params, lr):
        self.params = list(params)
        if not self.params:
            raise ValueError("optimizer got an empty parameter list")
        _check(type(self), "lr", lr, 0 <= lr, "a number ≥ 0")   # as PyTorch: inf is allowed (and diverges)
        self.lr = lr
        self.t = 0          # number of steps taken
        self.state = [dict() for _ in self.params]

    def zero_grad(self):
        for p in self.params:
            p.grad = None

    def step(self):
        self.t += 1
        faster(Optimizer.update_each, self.params[0])(self)

    def update_each(self):
        """The update of every parameter that has a gradient, one parameter at a time."""
        for p, s in zip(self.params, self.state):
            if p.grad is not None:
                self.update(p, p.grad, s)

    def update(self, p, g, s):
        """Update parameter ``p`` (anything with ``.data``) from its gradient ``g`` and its state ``s``."""
        raise NotImplementedError

    def state_dict(self):
        return {"t": self.t, "lr": self.lr,
                "state": [{k: backend.to_numpy(v).copy() for k, v in s.items()} for s in self.state]}

    def load_state_dict(self, sd):
        if len(sd["state"]) != len(self.params):
            raise ValueError(f"optimizer state has {len(sd['state'])} parameters, "
                             f"the model {len(self.params)}")
        for i, (p, s) in enumerate(zip(self.params, sd["state"])):
            for k, v in s.items():
                if v.shape != p.shape:
                    raise ValueError(f"optimizer state {k} of parameter {i}: shape {v.shape} vs {p.shape}")
        self.t, self.lr = int(sd["t"]), float(sd["lr"])
        self.state = [{k: backend.to_device(v, backend.device_of(p.data), p.data.dtype) for k, v in s.items()}
                      for p, s in zip(self.params, sd["state"])]


class SGD(Optimizer):
    """p ← p − lr·g, with optional heavy-ball momentum (v ← μ·v + g; p ← p − lr·v)."""

    def __init__(self, params, lr=1e-2, momentum=0.0):
        super().__init__(params, lr)
        # μ > 1 makes the velocity grow without bound, and PyTorch refuses a negative one
        _check(type(self), "momentum", momentum, 0 <= momentum <= 1, "a number in [0, 1]")
        self.momentum = momentum

    def update(self, p, g, s):
        if self.momentum:
            if "v" not in s:
                s["v"] = g.copy()
            else:
                s["v"] *= self.momentum
                s["v"] += g
            g = s["v"]
        p.data -= self.lr * g


class Adam(Optimizer):
    """Adam (Kingma & Ba 2015, Algorithm 1); ``weight_decay`` is the coupled L2 term g ← g + wd·p
    as in PyTorch's Adam. AdamW below decouples it.

        m ← β1 m + (1−β1) g,  v ← β2 v + (1−β2) g²,  p ← p − lr · m̂ / (sqrt(v̂) + eps)
    with bias corrections m̂ = m/(1−β1^t), v̂ = v/(1−β2^t).
    """

    decoupled = False

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0):
        super().__init__(params, lr)
        _check(type(self), "betas", betas, len(betas) == 2 and all(0 <= b < 1 for b in betas),
               "two numbers in [0, 1)")
        _check(type(self), "eps", eps, 0 <= eps, "a number ≥ 0")
        _check(type(self), "weight_decay", weight_decay, 0 <= weight_decay < math.inf, "a finite number ≥ 0")
        self.betas, self.eps, self.weight_decay = betas, eps, weight_decay

    def update(self, p, g, s):
        b1, b2 = self.betas
        if self.weight_decay:
            if self.decoupled:
                p.data -= (self.lr * self.weight_decay) * p.data   # PyTorch AdamW: before the Adam step
            else:
                g = g + self.weight_decay * p.data
        if "m" not in s:
            xp = array_module(p.data)
            s["m"], s["v"] = xp.zeros_like(p.data), xp.zeros_like(p.data)
        m, v = s["m"], s["v"]
        m *= b1
        m += (1 - b1) * g
        v *= b2
        v += (1 - b2) * (g * g)
        bc1, bc2 = 1 - b1 ** self.t, 1 - b2 ** self.t
        # lr·m̂/(sqrt(v̂)+eps) = (lr/bc1)·m / (sqrt(v)/sqrt(bc2) + eps), with scalars in Python floats.
        denom = array_module(v).sqrt(v)
        denom *= 1 / math.sqrt(bc2)
        denom += self.eps
        p.data -= (self.lr / bc1) * (m / denom)


class AdamW(Adam):
    """AdamW (Loshchilov & Hutter 2019): decay p ← p − lr·wd·p applied before the Adam update."""

    decoupled = True

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01):
        super().__init__(params, lr, betas, eps, weight_decay)


def clip_grad_norm(params, max_norm):
    """Scale all gradients so their global L2 norm is at most ``max_norm``; returns the norm before
    clipping as a 0-d device array (no host sync). ``max_norm / max(norm + 1e-6, max_norm)`` is
    min(max_norm / (norm + 1e-6), 1) in one operation less and gives the same bits."""
    params = list(params)
    return faster(clip_grad_norm_each, params[0] if params else None)(params, max_norm)


def clip_grad_norm_each(params, max_norm):
    """``clip_grad_norm``, one gradient at a time."""
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return np.zeros(())
    xp = array_module(grads[0])
    norm = xp.sqrt(sum((g * g).sum() for g in grads))
    scale = max_norm / xp.maximum(norm + 1e-6, max_norm)
    for g in grads:
        g *= scale
    return norm
