"""Annex, GPU tier: the three hottest chains of NDR's step as CUDA kernels beside their NumPy
definitions.

    file                  chain (2 kernels each)          seam
    kernels_geometric.py  directional logits, Eqs. 9–10   faster(geometric.DirectionalLogits)
                          geometric weights, Eq. 7        faster(geometric.GeometricWeights)
    kernels_layer.py      LayerNorm (a warp per row)      faster(ops.LayerNorm)
                          residual + dropout + LayerNorm  faster(CopyGateLayer.forward): all three
                          bias + ReLU + dropout
                          copy gate: bias, σ, dropout, mix

Each kernel is a ``KernelFunction``: on CuPy (float32) its forward and backward launch the kernel;
anywhere else they run its NumPy definition, the op the annex already has (the class it subclasses,
or the layer's own forward). The definition is also the kernel's test oracle
(tests/library/test_gpu_kernels.py, ``make gpu-check``'s ``kernels`` part). Dropout masks are drawn
by the same ``Dropout`` calls in the same order (``Dropout.draw``), so a run's random stream does not
change. No kernel uses atomics
(a sum is one thread's loop or one warp's butterfly, in a fixed order), so a GPU run stays
deterministic and ``--resume`` bit-exact.

OFF BY DEFAULT: a kernel stays only if a GPU measures its saving (RESULTS.md). ``MINATTN_KERNELS=1``
in the environment (or ``switch(True)``) turns them on; MINATTN_PLAIN=1 turns them off with the rest
of the annex. ``python -m minattn.tools.counting --kernels`` counts each kernel as one device
operation.
"""
import contextlib
import os

import numpy as np

from .. import backend
from ..engine import Function, faster, plain, register_faster


class _Switch:
    on = os.environ.get("MINATTN_KERNELS", "") not in ("", "0")


# Where the counting device (minattn/tools/counting.py) counts a definition as ONE device operation:
# a device name -> a context manager factory ``one_launch(what)`` (the library never imports tools).
_ONE_LAUNCH = {}


def count_as_one_launch(device, one_launch):
    """Let ``device`` (a counting test device) run each kernel's definition in ``one_launch()``."""
    _ONE_LAUNCH[device] = one_launch


KERNEL_DEVICES = {"gpu"}   # whose arrays the kernels run on: CuPy's (tests add "cpu", emulated)


def mode(x):
    """How a kernel form runs on the data ``x``: "kernel" (CuPy, float32), "count" (a counting
    device), or None (its definition, as if there were no kernel)."""
    device = backend.device_of(x)
    if device in KERNEL_DEVICES and x.dtype == np.float32:
        return "kernel"
    return "count" if device in _ONE_LAUNCH else None


def _as_one_launch(x, what):
    one_launch = _ONE_LAUNCH.get(backend.device_of(x))
    return one_launch(what) if one_launch else contextlib.nullcontext()


class KernelFunction(Function):
    """A Function whose forward and backward launch kernels on CuPy, elsewhere run its definition.

    Subclasses give ``define(*xs)`` / ``define_backward(gy)`` (any array module: the definition) and
    ``launch(*xs)`` / ``launch_backward(gy)`` (CuPy). ``SOURCES`` holds their kernels' CUDA."""

    def forward(self, *xs):
        self.mode = mode(xs[0])
        if self.mode == "kernel":
            return self.launch(*xs)
        with _as_one_launch(xs[0], type(self).__name__):
            return self.define(*xs)

    def backward(self, gy):
        if self.mode == "kernel":
            return self.launch_backward(gy)
        with _as_one_launch(gy, type(self).__name__ + ".backward"):
            return self.define_backward(gy)


# name -> ("raw", CUDA source) or ("elementwise", (in_params, out_params, operation)): every kernel
# source of the GPU tier, for the NVRTC compile check (tests/library/test_gpu_kernels.py).
SOURCES = {}


def raw_source(name, code):
    SOURCES[name] = ("raw", code)
    return name


def elementwise_source(name, in_params, out_params, operation):
    SOURCES[name] = ("elementwise", (in_params, out_params, operation))
    return name


_COMPILED = {}


def kernel(name, xp):
    """The CuPy kernel ``name`` of SOURCES, made once (NVRTC compiles it at its first launch)."""
    if name not in _COMPILED:
        kind, src = SOURCES[name]
        make = xp.RawKernel(src, name) if kind == "raw" else xp.ElementwiseKernel(*src, name=name)
        _COMPILED[name] = make
    return _COMPILED[name]


def launch_rows(xp, name, rows, args, per_block=128):
    """One thread per row: a 1-D grid of blocks of ``per_block`` threads."""
    kernel(name, xp)(((rows + per_block - 1) // per_block,), (per_block,), args)


# --- the switch ----------------------------------------------------------------------------------

FORMS = []      # (plain form, kernel form), filled by the kernels_* files
_saved = {}


def switch(on=True):
    """Register the kernel forms (``faster(plain form)`` returns them) or put back what was."""
    _Switch.on = on
    for plain_form, kernel_form in FORMS:
        if on and plain_form not in _saved:
            with plain(False):
                _saved[plain_form] = faster(plain_form)
            register_faster(plain_form, kernel_form)
        elif not on and plain_form in _saved:
            register_faster(plain_form, _saved.pop(plain_form))


@contextlib.contextmanager
def switched(on=True):
    """The block runs with the kernels on (or off), whatever MINATTN_KERNELS says."""
    old = _Switch.on
    switch(on)
    try:
        yield
    finally:
        switch(old)


def is_on():
    return _Switch.on


from . import kernels_geometric, kernels_layer  # noqa: E402,F401  (each adds its FORMS)

if _Switch.on:
    switch(True)
