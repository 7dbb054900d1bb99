"""The autograd engine: Tensor, Function, no_grad/eval_mode, sum_to and an iterative backward.

A ``Tensor`` wraps an array (``.data``, NumPy or CuPy) and remembers the ``Function`` that made it
(``.creator``). A ``Function`` computes on raw arrays in ``forward`` and maps the output gradient to
input gradients in ``backward``. Calling ``loss.backward()`` orders the graph (``topological_order``),
walks it once in reverse without recursion (an unrolled RNN is thousands of nodes deep), reduces
broadcast gradients with ``sum_to``, checks every gradient's shape and dtype, adds them up (an
``Accumulation``) and frees the graph as it goes. Only leaf tensors (parameters, inputs) keep ``.grad``.

Graph lifetime: a Function holds its inputs strongly and its output not at all, so there are no
reference cycles; a Tensor keeps its creator until backward has passed through it.

Everything here is the textbook algorithm. The speed annex (minattn/fast/) joins it through
``faster(plain_form)`` (bottom of this file); ``MINATTN_PLAIN=1`` or ``plain()`` switches it off.
"""
import contextlib
import itertools
import os

import numpy as np

from . import backend


class _Mode:
    grad = True    # record the graph?
    train = True   # dropout and other training-only behaviour on?
    # the textbook path: every annex of minattn/fast/ off, fused ops in their composed form (README)
    plain = os.environ.get("MINATTN_PLAIN", "") not in ("", "0")


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


@contextlib.contextmanager
def plain(on=True):
    """Run the block on the textbook path (``on=False``: with the annex), whatever MINATTN_PLAIN says."""
    old, _Mode.plain = _Mode.plain, on
    try:
        yield
    finally:
        _Mode.plain = old


def is_plain():
    return _Mode.plain


def is_grad_enabled():
    return _Mode.grad


def is_training():
    return _Mode.train


def sum_to(g, shape):
    """Sum a broadcast gradient ``g`` back down to ``shape`` (NumPy broadcasting rules)."""
    if g.shape == shape:
        return g
    lead = g.ndim - len(shape)
    axes = tuple(range(lead)) + tuple(i + lead for i, n in enumerate(shape) if n == 1 and g.shape[i + lead] != 1)
    g = g.sum(axis=axes, keepdims=True)
    return g.reshape(shape) if lead else g


_seq = itertools.count(1)
_ARRAY_TYPES = backend.ARRAY_TYPES
_new_tensor = object.__new__  # creation order of recorded tensors (see Tensor.backward)


def _as_array(data):
    """Python scalars/lists -> NumPy arrays (floats in the default dtype); NumPy scalars -> 0-d arrays."""
    if isinstance(data, np.generic):
        return np.asarray(data)
    if hasattr(data, "dtype") and hasattr(data, "shape"):
        return data
    data = np.asarray(data)
    return data.astype(backend.DEFAULT_DTYPE) if data.dtype.kind == "f" else data


class Tensor:
    """An array plus what autograd needs. ``requires_grad`` marks the tensors whose gradient we want."""
    __slots__ = ("data", "grad", "requires_grad", "creator", "seq", "_g", "__weakref__")
    # Make ``array + Tensor`` call Tensor.__radd__: NumPy defers to types with __array_ufunc__ = None
    # (NEP 13), CuPy to types with a higher __array_priority__.
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
        """Add d(self)/d(leaf) · grad to the ``.grad`` of every leaf that requires grad, then free the graph.

        Reverse-mode automatic differentiation, the textbook algorithm: (1) collect the tensors that lead
        to ``self`` and order them so that each comes before its inputs; (2) give ``self`` the gradient
        ``grad`` (ones for a scalar loss); (3) for each tensor in that order, call its creator's
        ``Function.backward`` on the sum of the gradients its consumers sent it, sum each input gradient
        back to the input's shape where the forward broadcast it (``sum_to``), check its shape and dtype
        (naming the op), and add it to that input's sum (an ``Accumulation``); a leaf keeps its sum as
        ``.grad``. (4) Each tensor lets go of its creator as we pass it: the graph is freed on the way.
        """
        if not self.requires_grad:
            raise RuntimeError("backward() on a tensor that does not require grad "
                               "(was it computed under no_grad(), or from constants only?)")
        grad = backend.array_module(self.data).ones_like(self.data) if grad is None else _data(grad)
        if grad.shape != self.shape:
            raise ValueError(f"backward: grad shape {grad.shape} != tensor shape {self.shape}")
        nodes = topological_order(self)
        acc = faster(Accumulation)()
        self._g = grad
        try:
            for node in nodes:
                g, fn = acc.take(node), node.creator     # the sum of the gradients sent to node (or None)
                if g is None:
                    continue
                if fn is None:                           # a leaf: keep its gradient as .grad
                    acc.keep(node, g)
                    continue
                if fn is _FREED:
                    raise RuntimeError("backward through a graph that an earlier backward() already freed")
                node.creator = _FREED                    # free the graph behind us (and remember that we did)
                gxs = fn.backward(g)
                for t, gx in zip(fn.inputs, gxs if type(gxs) is tuple else (gxs,)):
                    if gx is None or not t.requires_grad:
                        continue
                    if gx.shape != t.data.shape:         # the forward broadcast t: sum the copies back
                        gx = acc.sum_to(gx, t)
                    if gx.shape != t.data.shape or gx.dtype != t.data.dtype:
                        raise _mismatch(fn, gx, t)
                    acc.add(t, gx)
                fn.inputs = None
        except BaseException:
            for node in nodes:
                node._g = None
            raise

    # --- operators (the ops themselves live in minattn/ops/) ----------------------------------
    def __add__(self, other):
        return _ops.add(self, other)

    def __radd__(self, other):
        return _ops.add(self, other)

    def __sub__(self, other):
        return _ops.sub(self, other)

    def __rsub__(self, other):
        return _ops.sub(other, self)

    def __mul__(self, other):
        return _ops.mul(self, other)

    def __rmul__(self, other):
        return _ops.mul(self, other)

    def __truediv__(self, other):
        return _ops.div(self, other)

    def __rtruediv__(self, other):
        return _ops.div(other, self)

    def __matmul__(self, other):
        return _ops.matmul(self, other)

    def __rmatmul__(self, other):
        return _ops.matmul(other, self)

    def __pow__(self, exponent):
        return _ops.pow(self, exponent)

    def __neg__(self):
        return _ops.neg(self)

    def __getitem__(self, index):
        return _ops.getitem(self, index)

    # Comparisons give plain arrays (masks), never graph nodes.
    def __lt__(self, other):
        return self.data < _data(other)

    def __le__(self, other):
        return self.data <= _data(other)

    def __gt__(self, other):
        return self.data > _data(other)

    def __ge__(self, other):
        return self.data >= _data(other)

    def __eq__(self, other):
        return self.data == _data(other)

    def __ne__(self, other):
        return self.data != _data(other)

    def sum(self, axis=None, keepdims=False):
        return _ops.sum(self, axis, keepdims)

    def mean(self, axis=None, keepdims=False):
        return _ops.mean(self, axis, keepdims)

    def max(self, axis=None, keepdims=False):
        return _ops.max(self, axis, keepdims)

    def reshape(self, *shape):
        return _ops.reshape(self, shape[0] if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else shape)

    def transpose(self, *axes):
        return _ops.transpose(self, axes[0] if len(axes) == 1 and isinstance(axes[0], (tuple, list)) else axes)

    def swapaxes(self, a, b):
        return _ops.swapaxes(self, a, b)

    @property
    def T(self):
        return _ops.transpose(self, ())

    def exp(self):
        return _ops.exp(self)

    def log(self):
        return _ops.log(self)

    def sqrt(self):
        return _ops.sqrt(self)

    def abs(self):
        return _ops.abs(self)

    def tanh(self):
        return _ops.tanh(self)

    def sigmoid(self):
        return _ops.sigmoid(self)

    def relu(self):
        return _ops.relu(self)


def topological_order(root):
    """The tensors that lead to ``root`` and require grad, each before its inputs.

    Collected without recursion (an unrolled RNN is thousands of tensors deep). Every recorded tensor
    is numbered at creation and an op's output is created after its inputs, so descending numbers are
    a topological order (leaves, numbered 0, come last)."""
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


class Accumulation:
    """How ``Tensor.backward`` adds up each tensor's gradients: the textbook way, out of place.

    An op may hand one array to several inputs (add's backward returns ``gy`` twice) and ``grad``
    belongs to the caller, so a sum never adds into an array it was given: ``prev + gx`` is a new one,
    and a leaf's ``.grad`` is an array of its own (clipping scales gradients in place). The annex
    (minattn/fast/accumulate.py) registers a faster policy, with the same four methods."""

    def take(self, t):
        """The sum of the gradients sent to ``t`` (None if none was); ``t`` keeps nothing."""
        g, t._g = t._g, None
        return g

    def add(self, t, gx):
        t._g = gx if t._g is None else t._g + gx

    def sum_to(self, gx, t):
        return sum_to(gx, t.data.shape)

    def keep(self, leaf, g):
        """Add ``g`` to the leaf's ``.grad``, never storing an array that someone else holds."""
        leaf.grad = g.copy() if leaf.grad is None else leaf.grad + g


def _mismatch(fn, gx, t):
    what = (f"shape {gx.shape} for an input of shape {t.data.shape}" if gx.shape != t.data.shape
            else f"{gx.dtype} for a {t.data.dtype} input")
    return (ValueError if gx.shape != t.data.shape else TypeError)(f"{type(fn).__name__}.backward returned {what}")


# --- the seam of the annex (minattn/fast/) ---------------------------------------------------------
_FASTER = {}


def register_faster(plain_form, fast_form):
    """Let ``faster(plain_form)`` return ``fast_form``: how each file of the annex joins the core (a
    faster subclass of an op or of ``Accumulation``, a flat-buffer optimizer step, ...)."""
    _FASTER[plain_form] = fast_form


def faster(plain_form):
    """The annex's registered form of ``plain_form``, or ``plain_form`` itself on the textbook path
    (MINATTN_PLAIN=1, ``plain()``) or when the annex registered none."""
    return plain_form if _Mode.plain else _FASTER.get(plain_form, plain_form)


def _by_seq(t):
    return t.seq


def _data(x):
    return x.data if isinstance(x, Tensor) else x


class _FreedGraph:
    """Stands in for the creator of a non-leaf tensor whose graph backward() has freed."""
    inputs = ()


_FREED = _FreedGraph()


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
        out = _new_tensor(Tensor)  # Tensor.__init__ without its checks: this is the hot path
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


from . import ops as _ops  # noqa: E402  (ops needs Function and Tensor defined above)
