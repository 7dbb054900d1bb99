"""The autograd engine: Tensor, Function, no_grad/eval_mode, sum_to and an iterative backward.

A ``Tensor`` wraps an array (``.data``, NumPy or CuPy) and remembers the ``Function`` that made it
(``.creator``). A ``Function`` computes on raw arrays in ``forward`` and maps the output gradient to
input gradients in ``backward``. Calling ``loss.backward()`` orders the graph
(``topological_order``), walks it once in reverse without recursion (an unrolled RNN is thousands of
nodes deep), reduces broadcast gradients with ``sum_to``, checks every gradient's shape and dtype,
adds them up (an ``Accumulation``) and frees the graph as it goes. Only leaf tensors (parameters,
inputs) keep ``.grad``. docs/engine.md works one small graph through it by hand.

Graph lifetime: a Function holds its inputs strongly and its output not at all, so there are no
reference cycles; a Tensor keeps its creator until backward has passed through it.

Read top to bottom: modes, ``sum_to``, ``Tensor`` and its ``backward``, ``topological_order``,
``Accumulation``, ``Function``, the seam to the speed annex (minattn/fast/: ``is_plain``, ``faster``),
and last the operators (``+``, ``@``, ``.sum()``...), attached to ``Tensor`` in one block.

Which path runs is decided per device, from the data: on the CPU (NumPy arrays), where people read
and debug, everything here runs as written and a debugger never leaves the library; on other devices
(CuPy), where speed is the point, the annex takes over parts of it (the first ``backward`` steps into
fast/accumulate.py). ``MINATTN_PLAIN=1`` or ``0`` in the environment (``plain(on)`` in code) forces
either path everywhere.
"""
import contextlib
import itertools
import os

import numpy as np

from . import backend


# --- modes ----------------------------------------------------------------------------------------
class _Mode:
    grad = True    # record the graph?
    train = True   # dropout and other training-only behaviour on?
    # the path, where forced: True the textbook one, False the annex (minattn/fast/); None: by device
    plain = {"": None, "0": False}.get(os.environ.get("MINATTN_PLAIN", ""), True)


@contextlib.contextmanager
def no_grad():
    """Record nothing: results have no creator and do not require grad (evaluation, updates)."""
    old, _Mode.grad = _Mode.grad, False
    try:
        yield
    finally:
        _Mode.grad = old


@contextlib.contextmanager
def eval_mode():
    """Switch off training-only behaviour (dropout, Gumbel noise) for everything in the block."""
    old, _Mode.train = _Mode.train, False
    try:
        yield
    finally:
        _Mode.train = old


def is_grad_enabled():
    return _Mode.grad


def is_training():
    return _Mode.train


# --- broadcasting, undone once --------------------------------------------------------------------
def sum_to(g, shape):
    """Sum a broadcast gradient ``g`` back down to ``shape`` (NumPy broadcasting rules)."""
    if g.shape == shape:
        return g
    lead = g.ndim - len(shape)   # axes broadcasting put in front; then the size-1 axes it stretched
    stretched = tuple(i + lead for i, n in enumerate(shape) if n == 1 and g.shape[i + lead] != 1)
    g = g.sum(axis=tuple(range(lead)) + stretched, keepdims=True)
    return g.reshape(shape) if lead else g


# --- Tensor ---------------------------------------------------------------------------------------
_seq = itertools.count(1)
_ARRAY_TYPES = backend.ARRAY_TYPES
_new_tensor = object.__new__  # creation order of recorded tensors (see Tensor.backward)


def _as_array(data):
    """Python scalars/lists -> NumPy arrays (floats in the default dtype); NumPy scalars -> 0-d."""
    if isinstance(data, np.generic):
        return np.asarray(data)
    if hasattr(data, "dtype") and hasattr(data, "shape"):
        return data
    data = np.asarray(data)
    return data.astype(backend.DEFAULT_DTYPE) if data.dtype.kind == "f" else data


def _data(x):
    return x.data if isinstance(x, Tensor) else x


class Tensor:
    """An array plus what autograd needs. ``requires_grad`` marks the tensors whose gradient we
    want. Its operators and array methods (``+``, ``@``, ``[]``, ``.sum()``...) are attached at the
    end of this file."""
    __slots__ = ("data", "grad", "requires_grad", "creator", "seq", "_g", "__weakref__")
    # Make ``array + Tensor`` call Tensor.__radd__: NumPy defers to types with
    # __array_ufunc__ = None (NEP 13), CuPy to types with a higher __array_priority__.
    __array_ufunc__ = None
    __array_priority__ = 1000

    def __init__(self, data, requires_grad=False):
        if type(data) not in _ARRAY_TYPES:
            data = _as_array(data)
        if requires_grad and data.dtype.kind != "f":
            raise TypeError(f"only floating-point tensors can require grad, got {data.dtype}")
        self.data = data
        self.grad = None
        self.requires_grad = requires_grad
        self.creator = None
        self.seq = 0      # 0 for leaves; recorded outputs get increasing numbers
        self._g = None    # gradient being accumulated during backward()

    # --- array-like properties -------------------------------------------------------------------
    shape = property(lambda self: self.data.shape)
    ndim = property(lambda self: self.data.ndim)
    dtype = property(lambda self: self.data.dtype)
    size = property(lambda self: self.data.size)
    device = property(lambda self: backend.device_of(self.data))

    def __len__(self):
        return len(self.data)

    def __repr__(self):
        return f"Tensor(shape={self.shape}, dtype={self.dtype}, device={self.device}" + \
               (", requires_grad=True)" if self.requires_grad else ")")

    __hash__ = object.__hash__  # comparisons return arrays, so keep identity hashing

    def numpy(self):
        """The data as a NumPy array on the host (an explicit copy for GPU data)."""
        return backend.to_numpy(self.data)

    def item(self):
        return self.numpy().item()

    # --- backward --------------------------------------------------------------------------------
    def backward(self, grad=None):
        """Add d(self)/d(leaf) · grad to each grad-requiring leaf's ``.grad``, then free the graph.

        Reverse-mode automatic differentiation, the textbook algorithm: (1) order the tensors that
        lead to ``self`` so that each comes before its inputs; (2) give ``self`` the gradient
        ``grad`` (ones for a scalar loss); (3) for each tensor in that order, call its creator's
        ``Function.backward`` on the sum of the gradients sent to it, sum each input gradient back
        to the input's shape where the forward broadcast it (``sum_to``), check its shape and dtype
        (naming the op), add it to that input's sum (an ``Accumulation``); a leaf keeps its sum as
        ``.grad``. (4) Each tensor drops its creator as we pass it: the graph is freed on the way.
        """
        if not self.requires_grad:
            raise RuntimeError("backward() on a tensor that does not require grad "
                               "(was it computed under no_grad(), or from constants only?)")
        grad = backend.array_module(self.data).ones_like(self.data) if grad is None else _data(grad)
        if grad.shape != self.shape or grad.dtype != self.data.dtype:   # named here, not in an op
            raise ValueError(f"backward: seed {grad.dtype}{grad.shape}, tensor {self.data.dtype}{self.shape}")
        nodes = topological_order(self)
        acc = faster(Accumulation, self)()
        self._g = grad
        try:
            for node in nodes:
                g, fn = acc.take(node), node.creator     # the sum of what node was sent (or None)
                if g is None:
                    continue
                if fn is None:                           # a leaf: keep its gradient as .grad
                    acc.keep(node, g)
                    continue
                if fn is _FREED:
                    raise RuntimeError("backward through a graph that an earlier backward() already freed")
                node.creator = _FREED                    # free the graph behind us (and mark it)
                gxs = fn.backward(g)
                for t, gx in zip(fn.inputs, gxs if type(gxs) is tuple else (gxs,)):
                    if gx is None or not t.requires_grad:
                        continue
                    if gx.shape != t.data.shape:         # t was broadcast: sum the copies back
                        gx = acc.sum_to(gx, t)
                    if gx.shape != t.data.shape or gx.dtype != t.data.dtype:
                        raise _mismatch(fn, gx, t)
                    acc.add(t, gx)
                fn.inputs = None
        except BaseException:
            for node in nodes:
                node._g = None
            raise


def topological_order(root):
    """The tensors that lead to ``root`` and require grad, each before its inputs.

    Collected without recursion (an unrolled RNN is thousands of tensors deep). Every recorded
    tensor is numbered at creation and an op's output is created after its inputs, so descending
    numbers are a topological order (leaves, numbered 0, come last)."""
    nodes, seen, i = [root], {id(root)}, 0
    while i < len(nodes):
        fn = nodes[i].creator
        for t in fn.inputs if fn is not None else ():
            if t.requires_grad and id(t) not in seen:
                seen.add(id(t))
                nodes.append(t)
        i += 1
    nodes.sort(key=_by_seq, reverse=True)
    return nodes


def _by_seq(t):
    return t.seq


class Accumulation:
    """How ``Tensor.backward`` adds up each tensor's gradients: the textbook way, out of place.

    An op may hand one array to several inputs (add's backward returns ``gy`` twice) and ``grad``
    belongs to the caller, so a sum never adds into an array it was given: ``prev + gx`` is a new
    one, and a leaf's ``.grad`` is an array of its own (clipping scales gradients in place). The
    annex (minattn/fast/accumulate.py) registers a faster policy, with the same four methods."""

    def take(self, t):
        """The sum of the gradients sent to ``t`` (None if none was); ``t`` keeps nothing."""
        g, t._g = t._g, None
        return g

    def add(self, t, gx):
        t._g = gx if t._g is None else t._g + gx

    def sum_to(self, gx, t):
        """``gx`` summed back to the shape of ``t``, the input the forward broadcast: here it is
        just ``sum_to``. A method so that the annex can defer a leaf's reduction (a parameter of a
        layer used n times per step then reduces its n gradients at once, fast/accumulate.py)."""
        return sum_to(gx, t.data.shape)

    def keep(self, leaf, g):
        """Add ``g`` to the leaf's ``.grad``, never storing an array that someone else holds."""
        leaf.grad = g.copy() if leaf.grad is None else leaf.grad + g


def _mismatch(fn, gx, t):
    what = (f"shape {gx.shape} for an input of shape {t.data.shape}" if gx.shape != t.data.shape
            else f"{gx.dtype} for a {t.data.dtype} input")
    return (ValueError if gx.shape != t.data.shape else TypeError)(
        f"{type(fn).__name__}.backward returned {what}")


class _FreedGraph:
    """Stands in for the creator of a non-leaf tensor whose graph backward() has freed."""
    inputs = ()


_FREED = _FreedGraph()


# --- Function -------------------------------------------------------------------------------------
class Function:
    """One differentiable operation. Subclasses define ``forward(*arrays) -> array`` and
    ``backward(gy) -> grad or tuple of grads`` (one per input, ``None`` for no gradient), on raw
    arrays, saving on ``self`` only what backward needs. Non-tensor arguments (axes, index arrays,
    targets) go to ``__init__``.

    ``__call__`` records the node only when grad mode is on and some input requires grad.
    """
    __slots__ = ("inputs",)

    def __call__(self, *inputs):
        inputs = [x if isinstance(x, Tensor) else Tensor(x) for x in inputs]
        y = self.forward(*[x.data for x in inputs])
        # Tensor(y) by hand, without __init__'s checks (y comes from an op): saves ~0.1 µs a node
        out = _new_tensor(Tensor)
        out.data = y if type(y) in _ARRAY_TYPES else _as_array(y)
        out.grad = out.creator = out._g = None
        out.requires_grad, out.seq = False, 0
        if _Mode.grad:
            for x in inputs:
                if x.requires_grad:
                    out.requires_grad = True
                    out.creator = self
                    out.seq = next(_seq)
                    self.inputs = inputs
                    break
        return out

    def forward(self, *xs):
        raise NotImplementedError

    def backward(self, gy):
        raise NotImplementedError


# --- the seam of the annex (minattn/fast/) --------------------------------------------------------
_FASTER = {}


def register_faster(plain_form, fast_form):
    """Let ``faster(plain_form, like)`` return ``fast_form``: how each file of the annex joins the core
    (a faster subclass of an op or of ``Accumulation``, a fused form of a mechanism's equation, ...)."""
    _FASTER[plain_form] = fast_form


def is_plain(device="cpu"):
    """Does the textbook path run on ``device``? As forced (MINATTN_PLAIN=1/0, ``plain(on)``), else
    on the CPU only: the one rule that decides the path."""
    return device == "cpu" if _Mode.plain is None else _Mode.plain


def faster(plain_form, like=None):
    """The annex's registered form of ``plain_form`` for the data ``like`` (a Tensor or an array,
    whose device decides: ``is_plain``), or ``plain_form`` itself on the textbook path or when the
    annex registered none. Without ``like``: the CPU's choice."""
    fast_form = _FASTER.get(plain_form)
    if fast_form is None or is_plain(backend.device_of(_data(like))):
        return plain_form
    return fast_form


@contextlib.contextmanager
def plain(on=True):
    """The block runs on the textbook path (``on=False``: the annex; ``None``: by device), whatever
    MINATTN_PLAIN says. A graph is backpropagated on the path it was built on (off NumPy the annex's
    ops hand the engine deferred gradients that only its accumulation adds)."""
    old, _Mode.plain = _Mode.plain, on
    try:
        yield
    finally:
        _Mode.plain = old


# --- the operators: Tensor's methods call the ops of minattn/ops/ (DeZero's setup_variable) -------
from . import ops as _ops  # noqa: E402  (ops needs Function and Tensor, defined above)

Tensor.__add__ = Tensor.__radd__ = _ops.add            # t + u and u + t are both add(t, u)
Tensor.__sub__ = _ops.sub
Tensor.__rsub__ = lambda self, other: _ops.sub(other, self)
Tensor.__mul__ = Tensor.__rmul__ = _ops.mul
Tensor.__truediv__ = _ops.div
Tensor.__rtruediv__ = lambda self, other: _ops.div(other, self)
Tensor.__matmul__ = _ops.matmul
Tensor.__rmatmul__ = lambda self, other: _ops.matmul(other, self)
Tensor.__pow__ = _ops.pow                              # scalar exponents only
Tensor.__neg__ = _ops.neg
Tensor.__getitem__ = _ops.getitem

# Comparisons give plain arrays (masks), never graph nodes.
Tensor.__lt__ = lambda self, other: self.data < _data(other)
Tensor.__le__ = lambda self, other: self.data <= _data(other)
Tensor.__gt__ = lambda self, other: self.data > _data(other)
Tensor.__ge__ = lambda self, other: self.data >= _data(other)
Tensor.__eq__ = lambda self, other: self.data == _data(other)
Tensor.__ne__ = lambda self, other: self.data != _data(other)

Tensor.sum, Tensor.mean, Tensor.max = _ops.sum, _ops.mean, _ops.max    # (t, axis, keepdims)
Tensor.exp, Tensor.log, Tensor.sqrt, Tensor.abs = _ops.exp, _ops.log, _ops.sqrt, _ops.abs
Tensor.tanh, Tensor.sigmoid, Tensor.relu = _ops.tanh, _ops.sigmoid, _ops.relu
Tensor.swapaxes = _ops.swapaxes


def _shape_args(args):
    """``t.reshape(2, 3)`` and ``t.reshape((2, 3))`` alike, as NumPy allows."""
    return args[0] if len(args) == 1 and isinstance(args[0], (tuple, list)) else args


Tensor.reshape = lambda self, *shape: _ops.reshape(self, _shape_args(shape))
Tensor.transpose = lambda self, *axes: _ops.transpose(self, _shape_args(axes))
Tensor.T = property(lambda self: _ops.transpose(self, ()))
