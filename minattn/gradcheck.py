"""Finite-difference gradient checking (float64, central differences). It RAISES on mismatch.

For a function y = fn(*inputs) we draw a random upstream gradient u (an all-ones seed would pass a
softmax whose backward returns zeros, since Σ softmax = 1) and check, for every tensor t that
requires grad, the directional derivative along a random unit direction v:

    numeric  = [L(t + εv) − L(t − εv)] / 2ε,   L = Σ u ⊙ fn(...)
    analytic = Σ v ⊙ ∂L/∂t   (from backward)

One direction per tensor costs two forward passes, so a whole module is cheap; ``elementwise=True``
checks every entry separately instead (for debugging a failing op).

Defaults: eps = 1e-6, rtol = 1e-4, atol = 1e-6. A direction fails when
|numeric − analytic| > atol + rtol·|numeric|, or when either value is NaN or ±inf
(tests/library/test_gradcheck_checker.py pins all of this: a gradient wrong by 1% fails at these tolerances).
"""
import numpy as np

from . import backend
from .engine import Tensor, no_grad


class GradcheckError(AssertionError):
    pass


def _as_input(x):
    if isinstance(x, Tensor):
        if x.dtype.kind == "f":
            x.data = x.data.astype(np.float64)
        return x
    if hasattr(x, "dtype") and x.dtype.kind == "f":
        return Tensor(x.astype(np.float64), requires_grad=True)
    return x  # integer arrays and other arguments are passed through untouched


def check_backward(fn, inputs, params=(), eps=1e-6, atol=1e-6, rtol=1e-4, seed=0,
                   n_directions=2, elementwise=False):
    """Check the backward of ``fn(*inputs)`` against central differences; raise ``GradcheckError``.

    ``inputs``: arrays or Tensors; float ones become float64 Tensors that require grad (a Tensor
    with ``requires_grad=False`` stays a constant); integer arrays are passed as they are.
    ``params``: a Module or a list of (name, Parameter) pairs / Parameters; they are converted to
    float64 in place. ``fn`` must be deterministic (dropout off, fixed noise).
    """
    rng = np.random.default_rng(seed)
    if hasattr(params, "named_parameters"):
        params.double()
        named = list(params.named_parameters())
    else:
        named = [p if isinstance(p, tuple) else (f"param{i}", p) for i, p in enumerate(params)]
        for _, p in named:
            p.data = p.data.astype(np.float64)
    args = [_as_input(x) for x in inputs]
    int_tensors = [a for a in args if isinstance(a, Tensor) and a.dtype.kind != "f"]
    targets = [(f"input{i}", a) for i, a in enumerate(args)
               if isinstance(a, Tensor) and a.requires_grad] + named
    if not targets:
        raise ValueError("check_backward: nothing requires grad")

    for _, t in targets:
        t.grad = None
    y = fn(*args)
    if not isinstance(y, Tensor):
        raise TypeError(f"check_backward: fn must return a Tensor, got {type(y).__name__}")
    if y.dtype != np.float64:
        raise GradcheckError(f"output dtype is {y.dtype}, expected float64: something casts the "
                             "computation down")
    u = backend.to_device(rng.standard_normal(y.shape), backend.device_of(y.data))
    y.backward(u)

    def loss():
        with no_grad():
            return float(backend.to_numpy((fn(*args).data * u).sum()))

    failures = []
    for name, t in targets:
        grad = t.grad if t.grad is not None else backend.array_module(t.data).zeros_like(t.data)
        if grad.dtype != np.float64:
            failures.append(f"{name}: gradient dtype {grad.dtype}, expected float64")
            continue
        grad_np = backend.to_numpy(grad)
        if elementwise:
            directions = [np.eye(1, t.size, k).reshape(t.shape) for k in range(t.size)]
        else:
            directions = [d / max(np.linalg.norm(d), 1e-12) for d in
                          (rng.standard_normal(t.shape) for _ in range(n_directions))]
        orig = t.data.copy()
        for k, d in enumerate(directions):
            d_dev = backend.to_device(d, backend.device_of(orig))
            t.data = orig + eps * d_dev
            lp = loss()
            t.data = orig - eps * d_dev
            lm = loss()
            t.data = orig
            numeric = (lp - lm) / (2 * eps)
            analytic = float((grad_np * d).sum())
            finite = np.isfinite(analytic) and np.isfinite(numeric)
            if not finite or abs(numeric - analytic) > atol + rtol * abs(numeric):
                where = f"entry {np.unravel_index(k, t.shape)}" if elementwise else f"direction {k}"
                failures.append(f"{name} {tuple(t.shape)} {where}: numeric {numeric:.8g} vs "
                                f"analytic {analytic:.8g} (|diff| {abs(numeric - analytic):.3g} > "
                                f"atol {atol} + rtol {rtol}·|numeric|)")
                break
    for a in int_tensors:
        if a.grad is not None:
            failures.append(f"integer input of shape {a.shape} received a gradient")
    if failures:
        raise GradcheckError("gradient check failed:\n  " + "\n  ".join(failures))
