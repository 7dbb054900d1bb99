"""The autograd engine: Tensor, Function, no_grad/eval_mode, sum_to and an iterative backward.

A ``Tensor`` wraps an array (``.data``, NumPy or CuPy) and remembers the ``Function`` that made it
(``.creator``). A ``Function`` computes on raw arrays in ``forward`` and maps the output gradient to
input gradients in ``backward``. Calling ``loss.backward()`` walks the graph once in reverse
topological order, without recursion (an unrolled RNN is thousands of nodes deep), reduces
broadcast gradients with ``sum_to``, checks every gradient's shape and dtype, and frees the graph
as it goes. Only leaf tensors (parameters, inputs) keep ``.grad``.

Graph lifetime: a Function holds its inputs strongly and its output not at all, so there are no
reference cycles; a Tensor keeps its creator until backward has passed through it.
"""
import contextlib
import itertools

import numpy as np

from . import backend


class _Mode:
    grad = True    # record the graph?
    train = True   # dropout and other training-only behaviour on?


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

    def detach(self):
        return Tensor(self.data)

    # --- backward --------------------------------------------------------------------------------
    def backward(self, grad=None):
        """Accumulate d(self)/d(leaf) · grad into every leaf's ``.grad`` and free the graph.

        ``grad`` defaults to ones (the usual case: a scalar loss). Gradient buffers are shared
        freely: an op that passes its gradient through (add, reshape, broadcast...) hands one array
        to several inputs, and ``grad`` itself belongs to the caller. So the engine never adds into
        an incoming gradient. On NumPy it adds a tensor's gradients as they arrive, in place only into
        a buffer it made for that tensor (a Deferred one, a slice's, is collected as below); on other
        devices (CuPy) it collects them and sums them when
        it reaches the tensor, two with one add, more with one stack and one sum: 2 array operations
        instead of one per use, which matters for a shared layer applied 14 times (on a GPU each is a
        kernel launch; see ``_sum_in_order`` for the bits). A leaf keeps a gradient as its ``.grad``
        only if the engine made that array, else a copy: no array is the ``.grad`` of two leaves.
        """
        if not self.requires_grad:
            raise RuntimeError("backward() on a tensor that does not require grad "
                               "(was it computed under no_grad(), or from constants only?)")
        xp = backend.array_module(self.data)
        if grad is None:
            grad = xp.ones_like(self.data)
        elif isinstance(grad, Tensor):
            grad = grad.data
        if grad.shape != self.shape:
            raise ValueError(f"backward: grad shape {grad.shape} != tensor shape {self.shape}")

        # Collect the graph without recursion. Every recorded tensor is numbered at creation and an
        # op's output is always created after its inputs, so descending numbers are a topological
        # order (leaves, numbered 0, come last).
        nodes, seen, i = [self], {id(self)}, 0
        while i < len(nodes):
            for t in nodes[i].creator.inputs if nodes[i].creator is not None else ():
                if t.requires_grad and id(t) not in seen:
                    seen.add(id(t))
                    nodes.append(t)
            i += 1
        nodes.sort(key=_by_seq, reverse=True)

        # On NumPy each gradient is added as it arrives (cache-hot, little memory held); elsewhere
        # they are collected and summed once (fewer kernel launches). ``owns``: the tensors (alive in
        # ``nodes`` until we return, so their ids stay theirs) whose ``_g`` the engine made for them.
        self._g = grad
        cpu, owns = xp is np, set()
        try:
            for node in nodes:
                g, node._g = node._g, None
                if g is None:
                    continue
                if type(g) is list or isinstance(g, Deferred):
                    g, owned = _total(xp, g if type(g) is list else [g]), True
                else:
                    owned = id(node) in owns  # a buffer the engine made for this tensor alone
                fn = node.creator
                if fn is None:  # a leaf: store or accumulate, never aliasing an array held elsewhere
                    if node.grad is None:
                        node.grad = g if owned else g.copy()
                    else:
                        node.grad = node.grad + g
                    continue
                if fn is _FREED:
                    raise RuntimeError("backward through a graph that an earlier backward() already freed")
                node.creator = _FREED  # free the graph behind us (and remember that we did)
                gxs = fn.backward(g)
                if type(gxs) is not tuple:
                    gxs = (gxs,)
                for t, gx in zip(fn.inputs, gxs):
                    if gx is None or not t.requires_grad:
                        continue
                    data = t.data
                    if gx.shape != data.shape:
                        # off NumPy a leaf (a parameter, maybe of a shared layer) reduces all at once
                        gx = sum_to(gx, data.shape) if cpu or t.creator is not None else SumTo(gx, data.shape)
                        if gx.shape != data.shape:
                            raise ValueError(f"{type(fn).__name__}.backward returned shape {gx.shape} "
                                             f"for an input of shape {data.shape}")
                    if gx.dtype != data.dtype:
                        raise TypeError(f"{type(fn).__name__}.backward returned {gx.dtype} "
                                        f"for a {data.dtype} input")
                    prev = t._g      # arrays here may be shared with other inputs: never written into
                    if prev is None:
                        t._g = gx
                    elif cpu and type(prev) is np.ndarray and type(gx) is np.ndarray:
                        # a buffer of t's own, made by the first sum, takes the rest in place
                        if id(t) in owns:
                            prev += gx
                        else:
                            t._g = prev + gx
                            owns.add(id(t))
                    elif type(prev) is list:
                        prev.append(gx)
                    else:
                        t._g = [prev, gx]
                fn.inputs = None
        except BaseException:
            for node in nodes:
                node._g = None
            raise

    # --- operators (the ops themselves live in ops.py) ------------------------------------------
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


class Deferred:
    """A gradient a backward hands to the engine unevaluated, so that it can evaluate all gradients of
    one kind of a tensor together: a parameter of a layer applied n times per step gets n of them, and
    n matrix products (or reductions) cost n array operations where one on concatenated inputs costs
    two or three (ops.Outer, ops.Slices, SumTo). ``total(items)`` evaluates a list of them; the sum is
    then taken in another order than one by one (the last bits may differ). NumPy launches no kernels,
    and there concatenating the inputs costs more than it saves: ops make them only off NumPy, where
    the gradient is not an ``np.ndarray``, except ``ops.Slices``, which saves passes over memory on NumPy
    too (slices that tile an axis: one concatenate instead of a zeros array per slice and the adds)."""
    __slots__ = ("shape", "dtype")


class SumTo(Deferred):
    """``sum_to(g, shape)``: a broadcast gradient reduced to a leaf's shape (a bias, a scalar)."""
    __slots__ = ("g",)

    def __init__(self, g, shape):
        lead = g.ndim - len(shape)
        fits = lead >= 0 and all(n in (1, m) for n, m in zip(shape, g.shape[lead:]))
        self.g, self.shape, self.dtype = g, tuple(shape) if fits else g.shape, g.dtype

    @staticmethod
    def total(items):
        shape, gs = items[0].shape, [i.g for i in items]
        if len(gs) > 1 and all(g.shape == gs[0].shape for g in gs):
            return sum_to(backend.array_module(gs[0]).stack(gs), shape)   # one reduction over all of them
        return _sum_arrays([sum_to(g, shape) for g in gs])


def _total(xp, items):
    """The sum of a tensor's gradients: arrays and Deferred ones, each kind evaluated together."""
    arrays, kinds = [], {}
    for item in items:
        if isinstance(item, Deferred):
            kinds.setdefault(type(item), []).append(item)
        else:
            arrays.append(item)
    return _sum_arrays(arrays + [kind.total(group) for kind, group in kinds.items()])


def _sum_arrays(arrays):
    if len(arrays) == 1:
        return arrays[0]
    return arrays[0] + arrays[1] if len(arrays) == 2 else _sum_in_order(backend.array_module(arrays[0]), arrays)


def _sum_in_order(xp, arrays):
    """g0 + g1 + g2 + ... in two array operations. NumPy (under the strict and counting test devices)
    sums a stack along axis 0 left to right, the bits of adding one by one, except for one-element
    arrays, where the axis is contiguous and it sums pairwise: there a cumulative sum keeps the order.
    A GPU reduction may add in another order."""
    stacked = xp.stack(arrays)
    return stacked.sum(axis=0) if arrays[0].size > 1 else xp.cumsum(stacked, axis=0)[-1]


def _by_seq(t):
    return t.seq


def _data(x):
    return x.data if isinstance(x, Tensor) else x


def as_tensor(x):
    return x if isinstance(x, Tensor) else Tensor(x)


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
