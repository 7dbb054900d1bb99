"""A test device that counts what a GPU would be asked to do: kernel launches and host syncs.

On a GPU every CuPy call costs ~10–15 µs of host time, so a small model's step time is its number of
launches. ``CountingArray`` wraps a NumPy array (as ``tests/strict.py`` does) and tallies, per phase
of a training step (``with phase("backward"): ...``), what CuPy would do:

* one **launch** for each ufunc call (elementwise op, in-place op, ``ufunc.at``), reduction, matmul,
  array function (where, concatenate, cumsum, clip, take, ...), copy, ``astype`` to another dtype,
  ``__setitem__``, array creation that fills memory (zeros, ones, arange, eye, ...), random draw,
  and upload of host data (``xp.asarray(numpy_array)``);
* advanced indexing as CuPy serves it (cupy/_core/_routines_indexing.pyx): one integer array is one
  ``take``; n integer arrays (``x[..., rows, perm]``) are 2 + n launches (fill the flat index, fold
  in each array, then the take);
* one more launch (a copy) for each matmul operand cuBLAS cannot read in place, by CuPy's rules
  (cupy/_core/_routines_linalg.pyx): a batched product (an operand of 3 or more dimensions) copies
  each operand that is not C-contiguous, transposed views included; a 2-D product (``dot``) each
  operand that is neither C- nor F-contiguous (a column slice);
* nothing for what CuPy does without a kernel: views (reshape of a contiguous array, transpose,
  swapaxes, basic slicing, broadcast_to, split, flip, expand_dims), ``empty``, shapes and dtypes;
  a reshape or ravel that has to copy counts 1;
* one **sync** for each device-to-host transfer: ``float()``, ``int()``, ``bool()``, ``.item()``,
  ``.tolist()``, ``numpy.asarray()``, ``.get()``, and boolean-mask indexing (CuPy must learn the
  result's size on the host).

It is an estimate, not CuPy: a CuPy cumsum or concatenate of many arrays can be 2–3 kernels. Mixing
device data with a host NumPy array raises, as on the strict device. ``python -m
minattn.tools.counting`` prints launches per training step of each model family, and the autograd
nodes its forward records (``make bench`` runs it).
"""
import collections
import contextlib
import os
import sys
import traceback

import numpy as np

from minattn import backend
from minattn.fast import kernels


def _inplace(name):
    def iop(self, other):  # returns the array itself, as NumPy and CuPy do (``a -= b`` keeps ``a``)
        getattr(np, name)(self, other, out=(self,))
        return self
    return iop


def _binop(name):
    ufunc = getattr(np, name)

    def op(self, other):
        if getattr(other, "__array_ufunc__", False) is None:
            return NotImplemented  # let e.g. Tensor.__rmul__ handle it, as NumPy and CuPy do
        return ufunc(self, other)

    def rop(self, other):
        return ufunc(other, self)
    return op, rop


def add_operators(cls):
    """Give a wrapper class with ``__array_ufunc__`` Python's operators, each one NumPy ufunc call
    (so the wrapper sees it). Shared with the strict test device (tests/strict.py)."""
    for op, uf in [("add", "add"), ("sub", "subtract"), ("mul", "multiply"),
                   ("truediv", "true_divide"),
                   ("matmul", "matmul"), ("pow", "power"), ("mod", "remainder"),
                   ("and", "logical_and"),
                   ("or", "logical_or")]:
        f, rf = _binop(uf)
        setattr(cls, f"__{op}__", f)
        setattr(cls, f"__r{op}__", rf)
        setattr(cls, f"__i{op}__", _inplace(uf))
    for op, uf in [("lt", "less"), ("le", "less_equal"), ("gt", "greater"), ("ge", "greater_equal"),
                   ("eq", "equal"), ("ne", "not_equal")]:
        setattr(cls, f"__{op}__", lambda self, other, _uf=uf: getattr(np, _uf)(self, other))
    cls.__neg__ = lambda self: np.negative(self)
    cls.__abs__ = lambda self: np.abs(self)
    cls.__invert__ = lambda self: np.invert(self)
    cls.__hash__ = None


class HostConversionError(TypeError):
    pass


class Counter:
    """Launches and syncs per phase; ``sites`` (when ``detail``) attributes launches to source
    lines."""

    def __init__(self):
        self.reset()
        self.detail = False

    def reset(self):
        self.phase = "other"
        self.nodes = collections.Counter()   # count_step: the autograd nodes of the forward, by op
        self.launches = collections.Counter()
        self.syncs = collections.Counter()
        self.sites = collections.Counter()

    def launch(self, n=1, what=""):
        self.launches[self.phase] += n
        if self.detail:
            self.sites[(self.phase, _site(), what)] += n

    def sync(self, what):
        self.syncs[self.phase] += 1
        if self.detail:
            self.sites[(self.phase, _site(), "SYNC " + what)] += 1


COUNTER = Counter()
_HERE = os.path.abspath(__file__)
_SKIP = {_HERE}   # add_operators (below) wraps operators here


def _site():
    """file:line of the innermost minattn (or caller) frame that is not this file."""
    for fr in reversed(traceback.extract_stack(limit=14)[:-2]):
        if os.path.abspath(fr.filename) not in _SKIP and "numpy" not in fr.filename:
            return f"{os.path.basename(fr.filename)}:{fr.lineno} {fr.name}"
    return "?"


@contextlib.contextmanager
def phase(name):
    old, COUNTER.phase = COUNTER.phase, name
    try:
        yield
    finally:
        COUNTER.phase = old


def _unwrap(x):
    if isinstance(x, CountingArray):
        return x._a
    if isinstance(x, np.ndarray):
        raise HostConversionError(f"a host numpy array of shape {x.shape} was mixed with device "
                                  "data")
    if isinstance(x, (list, tuple)):
        return type(x)(_unwrap(v) for v in x)
    return x


def _wrap(r):
    if isinstance(r, (np.ndarray, np.generic)):
        return CountingArray(np.asarray(r))
    if isinstance(r, (list, tuple)):
        return type(r)(_wrap(v) for v in r)
    return r


def _sync(what):
    def f(self, *a, **k):
        COUNTER.sync(what)
        r = getattr(self._a, what)(*a, **k) if what in ("item", "tolist") else None
        return r if r is not None else {"__float__": float, "__int__": int, "__index__": int,
                                         "__bool__": bool}.get(what, np.asarray)(self._a)
    return f


# Array functions and methods that CuPy serves with a view (no kernel) when it can.
_VIEWS = {"reshape", "ravel", "transpose", "swapaxes", "moveaxis", "squeeze", "expand_dims",
          "broadcast_to",
          "flip", "split", "array_split", "view", "diagonal", "atleast_1d", "atleast_2d", "T"}
# ... and those that never touch the data.
_FREE = {"shape", "ndim", "result_type", "may_share_memory", "shares_memory", "broadcast_shapes"}


def _operand_copies(a, b):
    """The copies CuPy makes before a cuBLAS product of a and b (see the module docstring)."""
    ab = [x._a if isinstance(x, CountingArray) else x for x in (a, b)]
    if max(x.ndim for x in ab) > 2:
        return sum(not x.flags.c_contiguous for x in ab)
    return sum(not (x.flags.c_contiguous or x.flags.f_contiguous) for x in ab)


def _count_call(name, args, r):
    if name in _FREE:
        return
    if name == "dot" and len(args) == 2:
        copies = _operand_copies(*args)
        if copies:
            COUNTER.launch(copies, "matmul operand copy")
    if name in _VIEWS:
        srcs = [a._a for a in args if isinstance(a, CountingArray)]
        outs = r if isinstance(r, (list, tuple)) else [r]
        for o in outs:
            if isinstance(o, np.ndarray) and not any(np.may_share_memory(o, s) for s in srcs):
                COUNTER.launch(1, name + " (copy)")
        return
    COUNTER.launch(1, name)


class CountingArray:
    __slots__ = ("_a",)

    def __init__(self, a):
        self._a = a

    shape = property(lambda self: self._a.shape)
    dtype = property(lambda self: self._a.dtype)
    ndim = property(lambda self: self._a.ndim)
    size = property(lambda self: self._a.size)
    T = property(lambda self: CountingArray(self._a.T))

    __array__ = _sync("__array__")
    __float__ = _sync("__float__")
    __int__ = _sync("__int__")
    __index__ = _sync("__index__")
    __bool__ = _sync("__bool__")
    item = _sync("item")
    tolist = _sync("tolist")

    def get(self):
        COUNTER.sync("get")
        return self._a.copy()

    def __len__(self):
        return len(self._a)

    def __repr__(self):
        return f"CountingArray(shape={self.shape}, dtype={self.dtype})"

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        if "out" in kwargs:
            kwargs["out"] = tuple(_unwrap(o) for o in kwargs["out"])
        COUNTER.launch(1, ufunc.__name__ + ("" if method == "__call__" else "." + method))
        if ufunc is np.matmul and method == "__call__":
            copies = _operand_copies(*inputs)
            if copies:
                COUNTER.launch(copies, "matmul operand copy")
        r = getattr(ufunc, method)(*_unwrap(inputs), **kwargs)
        return None if method == "at" else _wrap(r)

    def __array_function__(self, func, types, args, kwargs):
        r = func(*_unwrap(args), **{k: _unwrap(v) for k, v in kwargs.items()})
        _count_call(func.__name__, args, r)
        return _wrap(r)

    def __getattr__(self, name):  # methods: sum, max, reshape, astype, swapaxes, copy, ...
        if name.startswith("__"):
            raise AttributeError(name)
        attr = getattr(self._a, name)
        if not callable(attr):
            return _wrap(attr)

        def method(*a, **k):
            r = attr(*_unwrap(a), **{n: _unwrap(v) for n, v in k.items()})
            if name == "astype" and r is self._a:
                pass                      # same dtype, copy=False: CuPy returns the array itself
            else:
                _count_call(name, (self,) + a, r)
            return _wrap(r)
        return method

    def __getitem__(self, index):
        idx = _unwrap(index)
        parts = idx if isinstance(idx, tuple) else (idx,)
        if any(isinstance(i, np.ndarray) and i.dtype == bool for i in parts):
            COUNTER.sync("boolean-mask indexing")
            COUNTER.launch(1, "getitem[bool]")
        else:
            arrays = sum(isinstance(i, (np.ndarray, list)) for i in parts)
            if arrays == 1:
                COUNTER.launch(1, "getitem[int array]")
            elif arrays:
                COUNTER.launch(2 + arrays, f"getitem[{arrays} int arrays]")
        return _wrap(self._a[idx])

    def __setitem__(self, index, value):
        COUNTER.launch(1, "setitem")
        self._a[_unwrap(index)] = _unwrap(value)


add_operators(CountingArray)


class _CountingRandomState:
    """cupy.random.RandomState: creating one sets up a cuRAND generator (counted as a launch)."""

    def __init__(self, seed):
        COUNTER.launch(1, "RandomState()")
        self._rs = np.random.RandomState(seed)

    def random_sample(self, size, dtype=np.float64):
        COUNTER.launch(1, "random_sample")
        return CountingArray(self._rs.random_sample(size).astype(dtype))

    def standard_normal(self, size, dtype=np.float64):
        COUNTER.launch(1, "standard_normal")
        return CountingArray(self._rs.standard_normal(size).astype(dtype))


class _CountingModule:
    """The ``xp`` of the counting device: creation functions return CountingArrays and count a
    launch (``empty`` none; ``asarray`` of device data none unless it converts); the rest is NumPy's
    own and dispatches to CountingArray through the NEP 13/18 protocols."""
    _CREATE = {"zeros", "ones", "full", "arange", "eye", "linspace", "zeros_like", "ones_like",
               "full_like",
               "empty", "empty_like", "asarray", "array", "ascontiguousarray"}

    class random:
        RandomState = _CountingRandomState

    def __getattr__(self, name):
        obj = getattr(np, name)
        if name not in self._CREATE:
            return obj

        def create(*a, **k):
            src = a[0] if a else None
            if name in ("asarray", "ascontiguousarray") and isinstance(src, CountingArray):
                r = getattr(np, name)(src._a, **k)
                if r is not src._a:
                    COUNTER.launch(1, name + " (convert)")
                return CountingArray(r)
            if not name.startswith("empty"):
                COUNTER.launch(1, name)
            a = tuple(x._a if isinstance(x, CountingArray) else x for x in a)
            return CountingArray(np.array(obj(*a, **k)))
        return create


counting_xp = _CountingModule()
backend.register_device("counting", counting_xp, CountingArray)


@contextlib.contextmanager
def one_launch(what):
    """A GPU kernel's NumPy definition (minattn/fast/kernels.py), counted as the one launch it is on
    CuPy."""
    launches, sites = COUNTER.launches.copy(), COUNTER.sites.copy()
    try:
        yield
    finally:
        COUNTER.launches, COUNTER.sites = launches, sites
        COUNTER.launch(1, "kernel " + what)


kernels.count_as_one_launch("counting", one_launch)   # used where the kernels are on (--kernels)


# ------------------------------------------------------------------------------------------------------
# One training step of each model family, counted per phase
# ------------------------------------------------------------------------------------------------------

PHASES = ("forward", "backward", "clipping", "optimizer")


def count_step(model, loss_fn, opt, clip=None, rng=None, steps=2):
    """Run ``steps`` training steps on the counting device as train.py does (set_rng → loss →
    backward → clip → step) and return the counts of the last one: ({phase: launches}, {phase:
    syncs}); its forward's autograd nodes by op are left in ``COUNTER.nodes``. The first step is a
    warm-up (optimizer state and per-shape caches are made once per run, not per step)."""
    from minattn import optim
    from minattn.engine import topological_order
    for _ in range(steps):
        COUNTER.reset()
        with phase("forward"):
            if rng is not None:
                model.set_rng(rng)
            loss = loss_fn()
        COUNTER.nodes.update(type(t.creator).__name__ for t in topological_order(loss)
                             if t.creator is not None)
        with phase("backward"):
            opt.zero_grad()
            loss.backward()
        if clip:
            with phase("clipping"):
                optim.clip_grad_norm(model.parameters(), clip)
        with phase("optimizer"):
            opt.step()
    return dict(COUNTER.launches), dict(COUNTER.syncs)


DEVICE = "counting"   # where families() builds its models (a benchmark may build them on "cpu")


def _up(a):
    return backend.to_device(np.asarray(a), DEVICE)


def ndr_ctl_step(model_name="ndr"):
    """(model, loss_fn, opt, clip, rng) for one CTL training step at train.py's cpu preset: its
    config, model builder, optimizer and first training batch (the launch count does not depend on
    its size)."""
    from minattn.lab.recipes import recipe_for
    from minattn.lab.recipes.base import optimizer
    from minattn.lab.settings import make_config
    cfg = make_config("ctl", model_name, "cpu")
    recipe = recipe_for("ctl")(cfg)
    recipe.load_task()
    model = recipe.build_model().to(DEVICE)
    x, lengths, y = (_up(a) for a in next(recipe.batches(np.random.default_rng([cfg.seed, 1]))))
    opt = optimizer(cfg, model.parameters())
    from minattn import functional as F
    return model, lambda: F.cross_entropy(model(x, lengths), y), opt, cfg.grad_clip, backend.RNG(0, DEVICE)


def families():
    """(label, builder) for the model families of ``make bench``, at its sizes."""
    from minattn import functional as F
    from minattn import optim

    def crt(name):
        from minattn.models.compositional import CRTConfig, CRTModel
        r = np.random.default_rng(0)
        x, y = (_up(r.standard_normal(shape).astype(np.float32))
                for shape in ((256, 10, 14), (256, 10)))
        model = CRTModel(name, 14, CRTConfig(searches=2, retrievals=4)).to(DEVICE)
        opt = optim.AdamW(model.parameters(), 1e-4, weight_decay=0.0)
        return model, lambda: F.abs(model(x) - y).mean(), opt, None, None

    def seq2attn():
        from minattn.models.seq2attn import Seq2Attn, model_config
        r = np.random.default_rng(0)
        model = Seq2Attn(model_config("seq2attn"), 19, 12, sos_id=2).to(DEVICE)
        src, tgt = _up(r.integers(2, 19, (64, 4))), _up(r.integers(4, 12, (64, 4)))
        lengths = _up(np.full(64, 4))
        opt = optim.AdamW(model.parameters(), 1e-3, weight_decay=0.0)
        return model, lambda: model.loss(src, lengths, tgt, lengths), opt, 5.0, backend.RNG(0, DEVICE)

    def abstractor(name):
        from minattn.models.abstractor import AbstractorConfig, build_seq2seq
        r = np.random.default_rng(0)
        B, T = 512, 10
        y = r.permuted(np.tile(np.arange(T), (B, 1)), axis=1)
        x = _up(r.standard_normal((B, T, 12)).astype(np.float32))
        tgt_in = _up(np.concatenate([np.full((B, 1), 10), y[:, :-1]], axis=1))
        layers = {} if name == "abstractor" else dict(n_encoder_layers=4, n_decoder_layers=4)
        model = build_seq2seq(name, 11, 10, AbstractorConfig(**layers), d_src=12).to(DEVICE)
        yd, opt = _up(y), optim.AdamW(model.parameters(), 1e-3, weight_decay=0.0)
        return model, lambda: F.cross_entropy(model(x, tgt_in), yd), opt, None, backend.RNG(0, DEVICE)

    return [("ndr (CTL, cpu preset)", lambda: ndr_ctl_step("ndr")),
            ("transformer (CTL, cpu preset)", lambda: ndr_ctl_step("transformer")),
            ("transformer-rel-gate (CTL)", lambda: ndr_ctl_step("transformer-rel-gate")),
            ("transformer-coda (CTL)", lambda: ndr_ctl_step("transformer-coda")),
            ("crt mha", lambda: crt("mha")), ("crt compositional", lambda: crt("compositional")),
            ("seq2attn (batch 64)", seq2attn),
            ("abstractor", lambda: abstractor("abstractor")),
            ("transformer-seq2seq", lambda: abstractor("transformer-seq2seq"))]


def table(only=None):
    """Rows of launches per training step by phase, and syncs, for each family."""
    print("launches per training step on the counting device (minattn/tools/counting.py), and the "
          "autograd")
    print("nodes its forward records (the engine's Python work per step; backward visits each once "
          "more)")
    print(f"        {'model':32s} {'forward':>8s} {'backward':>9s} {'clipping':>9s} "
          f"{'optimizer':>10s} {'total':>7s} {'syncs':>6s} {'nodes':>6s}")
    for label, build in families():
        if only and only not in label:
            continue
        model, loss_fn, opt, clip, rng = build()
        launches, syncs = count_step(model, loss_fn, opt, clip, rng)
        cells = " ".join(f"{launches.get(p, 0):{w}d}" for p, w in zip(PHASES, (8, 9, 9, 10)))
        print(f"        {label:32s} {cells} {sum(launches.values()):7d} {sum(syncs.values()):6d} "
              f"{sum(COUNTER.nodes.values()):6d}")


if __name__ == "__main__":
    # the GPU tier on (MINATTN_KERNELS=1): each kernel counts one launch
    if "--kernels" in sys.argv:
        sys.argv.remove("--kernels")
        kernels.switch(True)
    # where the launches of one family come from
    if len(sys.argv) > 1 and sys.argv[1] == "--detail":
        COUNTER.detail = True
        build = dict(families())[sys.argv[2]] if len(sys.argv) > 2 else ndr_ctl_step
        model, loss_fn, opt, clip, rng = build()
        count_step(model, loss_fn, opt, clip, rng)
        top = sorted(COUNTER.sites.items(), key=lambda kv: -kv[1])[:int(os.environ.get("TOP", 60))]
        for (ph, site, what), n in top:
            print(f"{n:6d}  {ph:9s} {site:50s} {what}")
        print(dict(COUNTER.launches), dict(COUNTER.syncs))
        print("forward nodes:", sum(COUNTER.nodes.values()), dict(COUNTER.nodes.most_common()))
    else:
        table(sys.argv[1] if len(sys.argv) > 1 else None)
