"""Shape and indexing ops: reshape, transpose, slicing and gathers, concatenation, stacking,
broadcasting, and the embedding lookup. A gather's backward is a segment sum (``segment_sum``):
deterministic on every device, unlike a scatter-add with float atomics."""
import numpy as np

from ..backend import array_module, device_of, to_device
from ..engine import Function, Tensor, faster

# ---------------------------------------------------------------------------------------------
# Shape and indexing
# ---------------------------------------------------------------------------------------------

class Reshape(Function):
    def __init__(self, shape):
        self.shape = tuple(shape)

    def forward(self, x):
        self.in_shape = x.shape
        return x.reshape(self.shape)

    def backward(self, gy):
        return gy.reshape(self.in_shape)


class Transpose(Function):
    def __init__(self, axes):
        self.axes = tuple(axes) or None

    def forward(self, x):
        if self.axes is None:
            self.axes = tuple(reversed(range(x.ndim)))
        return x.transpose(self.axes)

    def backward(self, gy):
        return gy.transpose(tuple(np.argsort(self.axes)))


class SwapAxes(Function):
    def __init__(self, a, b):
        self.a, self.b = a, b

    def forward(self, x):
        return x.swapaxes(self.a, self.b)

    def backward(self, gy):
        return gy.swapaxes(self.a, self.b)


class SplitHeads(Function):
    """Columns [start, start + H·dh) of x (B, T, n) as H heads (B, H, T, dh): a slice, a reshape and
    a transpose (minGPT's ``.view(B, T, nh, hs).transpose(1, 2)``; ``split_heads_composed``) as one
    view and one node, not three. The backward is the inverse view, then the slice's own
    (``faster(GetItem, x)``: on the annex path the gradients of all of x's slices land side by side in
    one concatenate). Attention cuts q, k, v (and NDR's s) out of one projection: 4 nodes per
    application instead of 9."""

    def __init__(self, start, n_head, d_head):
        self.start, self.n_head, self.d_head = start, n_head, d_head

    def forward(self, x):
        B, T, _ = x.shape
        columns = slice(self.start, self.start + self.n_head * self.d_head)
        self.cut = faster(GetItem, x)((slice(None), slice(None), columns))
        return self.cut.forward(x).reshape(B, T, self.n_head, self.d_head).transpose(0, 2, 1, 3)

    def backward(self, gy):
        B, H, T, dh = gy.shape
        return self.cut.backward(gy.transpose(0, 2, 1, 3).reshape(B, T, H * dh))


class MergeHeads(Function):
    """(B, H, T, dh) → (B, T, H·dh), the heads side by side again: ``merge_heads_composed``'s
    transpose and reshape as one node."""

    def forward(self, x):
        B, H, T, dh = self.shape = x.shape
        return x.transpose(0, 2, 1, 3).reshape(B, T, H * dh)

    def backward(self, gy):
        B, H, T, dh = self.shape
        return gy.reshape(B, T, H, dh).transpose(0, 2, 1, 3)


def _array_kind(i):
    """'b' for a boolean mask, 'i'/'u' for integer indices (arrays or lists), None for basic
    entries."""
    if hasattr(i, "shape"):
        return i.dtype.kind
    return np.asarray(i).dtype.kind if isinstance(i, list) else None


# On CPU (one BLAS thread, NumPy 2.4) a one-hot matmul beats sort-and-segment-sum up to some 32–128
# targets: an embedding of 896 ids × 128 over 19 rows took 0.08 ms vs 1.0 ms with add.at, over 200
# rows 0.5 ms (sorted) vs 2.8 ms; the cost of the one-hot grows with the rows, that of the sort does
# not.
ONEHOT_MAX_ROWS = 64


def segment_sum(g, k, K):
    """out[p, j, q] = Σ_{i: k[i] = j} g[p, i, q] for g (P, m, Q) and integer k (m,) in [0, K):
    (P, K, Q).

    The backward of every gather. It is the same on every run, unlike ``xp.add.at``, whose CUDA
    version adds with float atomics in whatever order the threads arrive. A device other than NumPy
    (CuPy) uses a one-hot matmul: cuBLAS gives the same bits on every run and nothing is read back
    to the host (chosen for determinism; not measured on a GPU). NumPy uses the one-hot matmul for a few
    targets and a stable sort + ``add.reduceat`` per segment beyond (measured; see ONEHOT_MAX_ROWS).
    Both sum in another order than ``add.at`` did, so results differ from it in the last bits.
    """
    xp = array_module(g)
    if xp is not np or K <= ONEHOT_MAX_ROWS:
        onehot = (xp.arange(K)[:, None] == k).astype(g.dtype)           # (K, m)
        return onehot @ g                                                 # (K, m) @ (P, m, Q)
    order = np.argsort(k, kind="stable")
    k_sorted = k[order]
    # where each distinct k starts
    first = np.flatnonzero(np.r_[True, k_sorted[1:] != k_sorted[:-1]])
    out = np.zeros((g.shape[0], K, g.shape[2]), dtype=g.dtype)
    out[:, k_sorted[first]] = np.add.reduceat(g[:, order], first, axis=1)
    return out


def _gathered_axes(index, ndim):
    """(first axis, index arrays) when ``index`` is integer arrays on adjacent axes and ``:``
    elsewhere (x[:, idx], w[ids], h[rows, cols], x[..., idx]), the form whose gradient is a segment
    sum; else None."""
    if any(i is Ellipsis for i in index):
        at = index.index(Ellipsis)
        index = index[:at] + (slice(None),) * (ndim - len(index) + 1) + index[at + 1:]
    arrays = [n for n, i in enumerate(index) if _array_kind(i) is not None]
    rest_full = all(isinstance(i, slice) and i == slice(None) for n, i in enumerate(index)
                    if n not in arrays)
    adjacent = arrays == list(range(arrays[0], arrays[0] + len(arrays)))
    integer = all(_array_kind(index[n]) in ("i", "u") for n in arrays)
    if len(index) <= ndim and rest_full and adjacent and integer:
        return arrays[0], [index[n] for n in arrays]
    return None


class GetItem(Function):
    """x[index] with basic (slices, ints, None, ...) or integer/boolean-array indexing."""

    def __init__(self, index):
        index = index if isinstance(index, tuple) else (index,)
        self.index = tuple(i.data if isinstance(i, Tensor) else i for i in index)

    def forward(self, x):
        self.shape, self.dtype = x.shape, x.dtype
        return x[self.index]

    def backward(self, gy):
        xp = array_module(gy)
        if all(_array_kind(i) in (None, "b") for i in self.index):
            gx = xp.zeros(self.shape, dtype=self.dtype)
            # slices and masks pick each element at most once: no sum needed
            gx[self.index] = gy
            return gx
        axes = _gathered_axes(self.index, len(self.shape))
        if axes is None:
            # Any other mix (an int or a partial slice beside an array, arrays apart): sum over the
            # flat positions of x, x.size targets (on a GPU a one-hot of x.size × gy.size: small
            # inputs only; the library's own gathers all take the path below).
            size = int(np.prod(self.shape))
            flat = xp.arange(size).reshape(self.shape)[self.index]
            return segment_sum(gy.reshape(1, -1, 1), flat.reshape(-1), size).reshape(self.shape)
        a, arrays = axes
        sizes = self.shape[a:a + len(arrays)]
        k = 0
        # row-major position within the gathered axes
        for i, size in zip(arrays, sizes):
            # % size: negative indices count from the end
            k = k * size + xp.asarray(i) % size
        P, K, Q = (int(np.prod(s)) for s in (self.shape[:a], sizes, self.shape[a + len(arrays):]))
        g = segment_sum(gy.reshape(P, k.size, Q), k.reshape(-1), K)                  # (P, K, Q)
        return g.reshape(self.shape)


class Concat(Function):
    def __init__(self, axis):
        self.axis = axis

    def forward(self, *xs):
        self.sizes = [x.shape[self.axis] for x in xs]
        return array_module(xs[0]).concatenate(xs, axis=self.axis)

    def backward(self, gy):
        xp = array_module(gy)
        return tuple(xp.split(gy, np.cumsum(self.sizes)[:-1].tolist(), axis=self.axis))


class Stack(Function):
    def __init__(self, axis):
        self.axis = axis

    def forward(self, *xs):
        return array_module(xs[0]).stack(xs, axis=self.axis)

    def backward(self, gy):
        n = gy.shape[self.axis]
        return tuple(gy.take(i, axis=self.axis) for i in range(n))


class BroadcastTo(Function):
    def __init__(self, shape):
        self.shape = tuple(shape)

    def forward(self, x):
        return array_module(x).broadcast_to(x, self.shape)

    def backward(self, gy):
        return gy  # the engine sums it back to the input's shape


def reshape(x, shape):
    return Reshape(shape)(x)


def transpose(x, axes=()):
    return Transpose(axes)(x)


def swapaxes(x, a, b):
    return SwapAxes(a, b)(x)


def getitem(x, index):
    return faster(GetItem, x)(index)(x)


def split_heads_composed(x, start, n_head, d_head):
    """x[..., start:start + H·dh] of x (B, T, n) as (B, H, T, dh), composed of three view ops."""
    B, T, _ = x.shape
    return x[:, :, start:start + n_head * d_head].reshape(B, T, n_head, d_head).transpose(0, 2, 1, 3)


def split_heads(x, start, n_head, d_head):
    return SplitHeads(start, n_head, d_head)(x)


def merge_heads_composed(x):
    """(B, H, T, dh) → (B, T, H·dh), composed of two view ops."""
    B, H, T, dh = x.shape
    return x.transpose(0, 2, 1, 3).reshape(B, T, H * dh)


def merge_heads(x):
    return MergeHeads()(x)


def concat(xs, axis=0):
    return Concat(axis)(*xs)


def stack(xs, axis=0):
    return Stack(axis)(*xs)


def broadcast_to(x, shape):
    return BroadcastTo(shape)(x)


# ---------------------------------------------------------------------------------------------
# Embedding lookup and straight-through
# ---------------------------------------------------------------------------------------------

class Embedding(Function):
    """weight[ids]; the backward sums the rows of repeated ids (``segment_sum``, no atomics)."""

    def __init__(self, ids):
        self.ids = ids

    def forward(self, weight):
        self.shape = weight.shape
        return weight[self.ids]

    def backward(self, gy):
        V, d = self.shape
        return segment_sum(gy.reshape(1, -1, d), self.ids.reshape(-1), V)[0]



def check_ids(ids, n, what="id", ignore_index=None):
    """Raise ValueError unless the integer HOST array ``ids`` lies in [0, n) (``ignore_index``
    aside).

    Out-of-range ids must be caught on the host: CuPy's indexing wraps them around silently, and
    checking a device array would cost a host sync per batch. So check a batch before uploading it
    (``embedding`` and ``cross_entropy`` do it themselves for host arrays they are given)."""
    if ids.dtype.kind not in "iu":
        raise TypeError(f"{what}s must be integers, got {ids.dtype}")
    valid = ids[ids != ignore_index] if ignore_index is not None else ids
    if valid.size and (valid.min() < 0 or valid.max() >= n):
        raise ValueError(f"{what} out of range: must lie in [0, {n}), got [{valid.min()}, "
                         f"{valid.max()}]")


def _checked_ids(ids, n, what, like, ignore_index=None):
    """Host ids: checked, then moved to the device of ``like``. Device ids pass unchecked."""
    if type(ids) is not np.ndarray:
        return ids
    check_ids(ids, n, what, ignore_index)
    # a no-op on the host
    return to_device(ids, device_of(like.data if isinstance(like, Tensor) else like))


def embedding(weight, ids):
    """weight[ids]. ``ids`` may be a host array whatever the weight's device (checked, then
    uploaded)."""
    ids = _checked_ids(ids.data if isinstance(ids, Tensor) else ids, weight.shape[0],
                       "embedding: token id", weight)
    return Embedding(ids)(weight)


