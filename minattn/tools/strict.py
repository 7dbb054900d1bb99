"""The strict test device: NumPy arrays that behave as CuPy's do, and an optional counter of what CuPy
would do with them.

``StrictArray`` wraps a NumPy array. Arithmetic, ufuncs and NumPy functions (NEP 13/18) work and
return StrictArrays; ``numpy.asarray(x)``, ``float(x)``, ``int(x)``, ``bool(x)``, ``x.item()``,
``x.tolist()`` and mixing in a host ``ndarray`` raise, as on CuPy: the only way out is the explicit
``x.get()`` of ``backend.to_numpy``. A model that runs here never moves data between host and device
unasked.

A subclass that sets ``counter`` (minattn/tools/counting.py) is told of each operation as CuPy would
run it, ``counter.launch(n, what)``, and of each device-to-host transfer, ``counter.sync(what)``,
which it then allows. CuPy's rules: one launch per ufunc call, reduction, matmul, array function,
copy, ``astype`` to another dtype, ``__setitem__``, creation that fills memory, random draw and
upload; one integer index array is one ``take``, n of them 2 + n launches
(cupy/_core/_routines_indexing.pyx); a matmul operand cuBLAS cannot read in place costs a copy (a
batched product's operand that is not C-contiguous, a 2-D product's that is neither C- nor
F-contiguous: cupy/_core/_routines_linalg.pyx); views, ``empty``, shapes and dtypes cost nothing, a
reshape that has to copy one; a sync for each transfer to the host, boolean-mask indexing included
(the result's size is learned there). An estimate: a CuPy cumsum or a concatenate of many arrays can
be 2–3 kernels.
"""
import types

import numpy as np

from minattn import backend


class HostConversionError(TypeError):
    pass


def _unwrap(x):
    if isinstance(x, StrictArray):
        return x._a
    if isinstance(x, np.ndarray):
        raise HostConversionError(f"a host numpy array of shape {x.shape} was mixed with device data")
    if isinstance(x, (list, tuple)):
        return type(x)(_unwrap(v) for v in x)
    return x


def _transfer(what, convert):
    def f(self, *a, **k):
        if self.counter is None:
            raise HostConversionError(f"implicit device-to-host conversion: {what} of a device array")
        self.counter.sync(what)
        return convert(self._a, *a, **k)
    return f


# Array functions and methods that CuPy serves with a view (no kernel) when it can.
_VIEWS = {"reshape", "ravel", "transpose", "swapaxes", "moveaxis", "squeeze", "expand_dims", "broadcast_to",
          "flip", "split", "array_split", "view", "diagonal", "atleast_1d", "atleast_2d", "T"}


def _operand_copies(a, b):
    """The copies CuPy makes before a cuBLAS product of the host arrays a and b (see above)."""
    if max(a.ndim, b.ndim) > 2:
        return (not a.flags.c_contiguous) + (not b.flags.c_contiguous)
    return sum(not (x.flags.c_contiguous or x.flags.f_contiguous) for x in (a, b))


class StrictArray:
    __slots__ = ("_a",)
    counter = None   # the hook (see above); None: count nothing, refuse implicit transfers

    def __init__(self, a):
        self._a = a

    @classmethod
    def _launch(cls, n, what):
        if cls.counter is not None and n:
            cls.counter.launch(n, what)

    def _wrap(self, r):
        if isinstance(r, (np.ndarray, np.generic)):
            return type(self)(np.asarray(r))
        if isinstance(r, (list, tuple)):
            return type(r)(self._wrap(v) for v in r)
        return r

    def _count(self, name, args, r):
        """The launches of the array function or method ``name`` with result ``r``."""
        if self.counter is None:
            return
        if name == "dot" and len(args) == 2:
            self._launch(_operand_copies(*_unwrap(args)), "matmul operand copy")
        if name in _VIEWS:
            srcs = [a._a for a in args if isinstance(a, StrictArray)]
            outs = r if isinstance(r, (list, tuple)) else [r]
            self._launch(sum(isinstance(o, np.ndarray) and not any(np.may_share_memory(o, s) for s in srcs)
                             for o in outs), name + " (copy)")
        else:
            self._launch(1, name)

    shape = property(lambda self: self._a.shape)
    dtype = property(lambda self: self._a.dtype)
    ndim = property(lambda self: self._a.ndim)
    size = property(lambda self: self._a.size)
    T = property(lambda self: self._wrap(self._a.T))

    __array__ = _transfer("numpy.asarray()", lambda a, *_, **__: a)
    __float__ = _transfer("float()", float)
    __int__ = _transfer("int()", int)
    __index__ = _transfer("operator.index()", int)
    __bool__ = _transfer("bool()", bool)
    item = _transfer(".item()", np.ndarray.item)
    tolist = _transfer(".tolist()", np.ndarray.tolist)

    def get(self):
        """The explicit transfer to the host (cupy.ndarray.get)."""
        if self.counter is not None:
            self.counter.sync("get")
        return self._a.copy()

    def __len__(self):
        return len(self._a)

    def __repr__(self):
        return f"{type(self).__name__}(shape={self.shape}, dtype={self.dtype})"

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        if "out" in kwargs:
            kwargs["out"] = tuple(_unwrap(o) for o in kwargs["out"])
        inputs = _unwrap(inputs)
        self._launch(1, ufunc.__name__ + ("" if method == "__call__" else "." + method))
        if ufunc is np.matmul and method == "__call__":
            self._launch(_operand_copies(*inputs), "matmul operand copy")
        r = getattr(ufunc, method)(*inputs, **kwargs)
        return None if method == "at" else self._wrap(r)

    def __array_function__(self, func, _types, args, kwargs):
        r = func(*_unwrap(args), **{k: _unwrap(v) for k, v in kwargs.items()})
        self._count(func.__name__, args, r)
        return self._wrap(r)

    def __getattr__(self, name):  # methods: sum, max, reshape, astype, swapaxes, copy, ...
        if name.startswith("__"):  # __array_interface__, __array_struct__, ... would leak the data
            raise AttributeError(name)
        attr = getattr(self._a, name)
        if not callable(attr):
            return self._wrap(attr)

        def method(*a, **k):
            r = attr(*_unwrap(a), **{n: _unwrap(v) for n, v in k.items()})
            if r is not self._a:   # e.g. astype to its own dtype, copy=False: the array itself, no work
                self._count(name, (self,) + a, r)
            return self._wrap(r)
        return method

    def __getitem__(self, index):
        idx = _unwrap(index)
        parts = idx if isinstance(idx, tuple) else (idx,)
        if any(isinstance(i, np.ndarray) and i.dtype == bool for i in parts):
            if self.counter is not None:
                self.counter.sync("boolean-mask indexing")
            self._launch(1, "getitem[bool]")
        else:
            arrays = sum(isinstance(i, (np.ndarray, list)) for i in parts)
            if arrays == 1:
                self._launch(1, "getitem[int array]")
            elif arrays:
                self._launch(2 + arrays, f"getitem[{arrays} int arrays]")
        return self._wrap(self._a[idx])

    def __setitem__(self, index, value):
        self._launch(1, "setitem")
        self._a[_unwrap(index)] = _unwrap(value)


def _inplace(ufunc):
    def iop(self, other):  # returns the array itself, as NumPy and CuPy do (``a -= b`` keeps ``a``)
        ufunc(self, other, out=(self,))
        return self
    return iop


def _binop(ufunc):
    def op(self, other):
        if getattr(other, "__array_ufunc__", False) is None:
            return NotImplemented  # let e.g. Tensor.__rmul__ handle it, as NumPy and CuPy do
        return ufunc(self, other)
    return op, lambda self, other: ufunc(other, self)


# Python's operators, each one NumPy ufunc call (so __array_ufunc__ sees it).
for _op, _uf in [("add", np.add), ("sub", np.subtract), ("mul", np.multiply), ("truediv", np.true_divide),
                 ("matmul", np.matmul), ("pow", np.power), ("mod", np.remainder), ("and", np.logical_and),
                 ("or", np.logical_or)]:
    _f, _rf = _binop(_uf)
    setattr(StrictArray, f"__{_op}__", _f)
    setattr(StrictArray, f"__r{_op}__", _rf)
    setattr(StrictArray, f"__i{_op}__", _inplace(_uf))
for _op, _uf in [("lt", np.less), ("le", np.less_equal), ("gt", np.greater), ("ge", np.greater_equal),
                 ("eq", np.equal), ("ne", np.not_equal)]:
    setattr(StrictArray, f"__{_op}__", lambda self, other, _uf=_uf: _uf(self, other))
StrictArray.__neg__ = lambda self: np.negative(self)
StrictArray.__abs__ = lambda self: np.abs(self)
StrictArray.__invert__ = lambda self: np.invert(self)
StrictArray.__hash__ = None


class _RandomState:
    """cupy.random.RandomState: creating one sets up a cuRAND generator (a launch); reseeding none."""

    def __init__(self, array, seed):
        self.array, self._rs = array, np.random.RandomState(seed)
        array._launch(1, "RandomState()")

    def seed(self, seed):
        self._rs.seed(seed)

    def random_sample(self, size, dtype=np.float64):
        self.array._launch(1, "random_sample")
        return self.array(self._rs.random_sample(size).astype(dtype))


class Module:
    """The ``xp`` of a device whose arrays are ``array``: creation functions make such arrays (and
    count a launch, as above); the rest is NumPy's own, dispatching to the array (NEP 13/18)."""
    _CREATE = {"zeros", "ones", "full", "arange", "eye", "linspace", "zeros_like", "ones_like", "full_like",
               "empty", "empty_like", "asarray", "array", "ascontiguousarray"}

    def __init__(self, array):
        self.array = array
        self.random = types.SimpleNamespace(RandomState=lambda seed: _RandomState(array, seed))

    def __getattr__(self, name):
        obj = getattr(np, name)
        if name not in self._CREATE:
            return obj

        def create(*a, **k):
            src = a[0] if a else None
            if name in ("asarray", "ascontiguousarray") and isinstance(src, StrictArray):
                r = obj(src._a, **k)
                if r is not src._a:
                    self.array._launch(1, name + " (convert)")
                return self.array(r)
            if not name.startswith("empty"):
                self.array._launch(1, name)
            return self.array(np.array(obj(*(x._a if isinstance(x, StrictArray) else x for x in a), **k)))
        return create


backend.register_device("strict", Module(StrictArray), StrictArray)
