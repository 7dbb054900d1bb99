"""A test-only device whose arrays refuse implicit host conversion, as CuPy's do (and more).

``StrictArray`` wraps a NumPy array. Arithmetic, ufuncs (``__array_ufunc__``) and NumPy functions
(``__array_function__``) work and return StrictArrays; but ``numpy.asarray(x)``, ``float(x)``,
``int(x)``, ``bool(x)``, ``x.item()`` and ``x.tolist()`` raise, and so does mixing a StrictArray with
a plain host ``ndarray`` in one operation (CuPy raises there too). The only way out is the explicit
``x.get()`` that ``backend.to_numpy`` uses. Running a model on this device proves, without a GPU, that
its forward and backward never silently move data between host and device.
"""
import numpy as np

from minattn import backend
from minattn.tools.counting import add_operators


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


def _wrap(r):
    if isinstance(r, (np.ndarray, np.generic)):
        return StrictArray(np.asarray(r))
    if isinstance(r, (list, tuple)):
        return type(r)(_wrap(v) for v in r)
    return r


def _refuse(what):
    def f(self, *a, **k):
        raise HostConversionError(f"implicit device-to-host conversion: {what} of a device array")
    return f


class StrictArray:
    __slots__ = ("_a",)

    def __init__(self, a):
        self._a = a

    shape = property(lambda self: self._a.shape)
    dtype = property(lambda self: self._a.dtype)
    ndim = property(lambda self: self._a.ndim)
    size = property(lambda self: self._a.size)
    T = property(lambda self: StrictArray(self._a.T))

    __array__ = _refuse("numpy.asarray()")
    __float__ = _refuse("float()")
    __int__ = _refuse("int()")
    __index__ = _refuse("operator.index()")
    __bool__ = _refuse("bool()")
    item = _refuse(".item()")
    tolist = _refuse(".tolist()")

    def get(self):
        """The explicit transfer to the host (cupy.ndarray.get)."""
        return self._a.copy()

    def __len__(self):
        return len(self._a)

    def __repr__(self):
        return f"StrictArray(shape={self.shape}, dtype={self.dtype})"

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        if "out" in kwargs:
            kwargs["out"] = tuple(_unwrap(o) for o in kwargs["out"])
        r = getattr(ufunc, method)(*_unwrap(inputs), **kwargs)
        return None if method == "at" else _wrap(r)

    def __array_function__(self, func, types, args, kwargs):
        return _wrap(func(*_unwrap(args), **{k: _unwrap(v) for k, v in kwargs.items()}))

    def __getattr__(self, name):  # methods: sum, max, reshape, astype, swapaxes, copy, ...
        if name.startswith("__"):  # __array_interface__, __array_struct__, ... would leak the data
            raise AttributeError(name)
        attr = getattr(self._a, name)
        if not callable(attr):
            return _wrap(attr)
        return lambda *a, **k: _wrap(attr(*_unwrap(a), **{n: _unwrap(v) for n, v in k.items()}))

    def __getitem__(self, index):
        return _wrap(self._a[_unwrap(index)])

    def __setitem__(self, index, value):
        self._a[_unwrap(index)] = _unwrap(value)


add_operators(StrictArray)


class _StrictRandomState:
    def __init__(self, seed):
        self._rs = np.random.RandomState(seed)

    def seed(self, seed):
        self._rs.seed(seed)

    def random_sample(self, size, dtype=np.float64):
        return StrictArray(self._rs.random_sample(size).astype(dtype))

    def standard_normal(self, size, dtype=np.float64):
        return StrictArray(self._rs.standard_normal(size).astype(dtype))


class _StrictModule:
    """The ``xp`` of the strict device: creation functions return StrictArrays; ufuncs and array
    functions are NumPy's own and dispatch to StrictArray through the NEP 13/18 protocols."""
    _CREATE = {"zeros", "ones", "empty", "full", "arange", "eye", "asarray", "array", "linspace"}

    class random:
        RandomState = _StrictRandomState

    def __getattr__(self, name):
        obj = getattr(np, name)
        if name in self._CREATE:
            def create(*a, **k):
                a = tuple(x._a if isinstance(x, StrictArray) else x for x in a)
                return StrictArray(np.array(obj(*a, **k)))
            return create
        return obj


strict_xp = _StrictModule()
backend.register_device("strict", strict_xp, StrictArray)
