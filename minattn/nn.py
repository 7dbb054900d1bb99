"""Modules: a parameter registry plus the layers every model here is built from.

A ``Module`` finds its parameters by walking its attributes (Parameters, sub-Modules, and lists or
tuples of them), in definition order, so names are stable: ``layers.0.attn.w_q``. Arrays stored as
attributes are buffers (e.g. a position table) and move with ``.to(device)``.

Weights are created on the host from an explicit ``numpy.random.Generator`` and then moved, so a
model initialises identically on CPU and GPU. Linear weights are stored (in, out):
``y = x @ W + b``.
"""
import contextlib
import math

import numpy as np

from . import backend
from . import functional as F
from .engine import Tensor, faster, is_grad_enabled, is_training


class Parameter(Tensor):
    """A leaf tensor that an optimizer updates."""
    __slots__ = ()

    def __init__(self, data):
        super().__init__(data, requires_grad=True)


def _is_array(v):
    return isinstance(v, np.ndarray) or backend.device_of(v) != "cpu"


class Module:
    training = True
    device = "cpu"
    # when True, attention modules keep ``last_weights`` (and gated layers ``last_gate``)
    record = False

    def __call__(self, *args, **kwargs):
        # the seam of a whole forward: the annex may register a faster form of a class's forward (the
        # GPU tier's copy-gate layer, minattn/fast/kernels_layer.py); a forward set on the instance
        # (a wrapper that records, lab/viz.py) runs as it is
        fast = faster(type(self).forward, args[0] if args else next(iter(kwargs.values()), None))
        if fast is type(self).forward or "forward" in vars(self):
            return self.forward(*args, **kwargs)
        return fast(self, *args, **kwargs)

    # --- the registry ----------------------------------------------------------------------------
    def named_modules(self, prefix=""):
        yield prefix, self
        for name, v in vars(self).items():
            for sub_name, m in _children(name, v, Module):
                yield from m.named_modules(f"{prefix}{sub_name}.")

    def named_parameters(self, prefix="", seen=None):
        """(name, Parameter) pairs in definition order; a shared parameter is listed once."""
        seen = set() if seen is None else seen
        for name, v in vars(self).items():
            for sub_name, item in _children(name, v, (Parameter, Module)):
                if isinstance(item, Module):
                    yield from item.named_parameters(f"{prefix}{sub_name}.", seen)
                elif id(item) not in seen:
                    seen.add(id(item))
                    yield prefix + sub_name, item

    def parameters(self):
        return [p for _, p in self.named_parameters()]

    def zero_grad(self):
        for p in self.parameters():
            p.grad = None

    def num_parameters(self):
        return sum(p.size for p in self.parameters())

    # --- modes and devices -----------------------------------------------------------------------
    def train(self, mode=True):
        for _, m in self.named_modules():
            m.training = mode
        return self

    def eval(self):
        return self.train(False)

    def to(self, device=None, dtype=None):
        """Move (and optionally cast) all parameters and buffers, in place. ``device`` is "cpu",
        "gpu" or a registered test device; a missing GPU raises ``backend.DeviceError``."""
        if device is not None:
            backend.get_xp(device)  # fail early with the install hint
        for _, m in self.named_modules():
            for name, v in list(vars(m).items()):
                if _is_array(v):
                    setattr(m, name, backend.to_device(v, device or m.device,
                                                       dtype if dtype and v.dtype.kind == "f" else None))
            if device is not None:
                m.device = device
        for p in self.parameters():
            p.data = backend.to_device(p.data, device or backend.device_of(p.data), dtype)
            p.grad = None
        return self

    def double(self):
        return self.to(dtype=np.float64)

    def set_rng(self, rng):
        """Give every random module (Dropout, Gumbel attention, ...) the stream ``rng``; the
        training loop reseeds it with the step number so a resumed run replays the same noise."""
        for _, m in self.named_modules():
            if "rng" in vars(m):
                m.rng = rng
        return self

    # --- a module applied n times in one pass -----------------------------------------------------
    @contextlib.contextmanager
    def repeated(self, n):
        """A block that applies this module n times in one forward pass (a shared layer).

        Each of its dropouts draws the masks of its n applications at once, at the first
        (``MaskPlan``). That fixes the order in which the run's one random stream is read (the first
        dropout's n masks, then the next one's, ...), which resumed runs and the golden runs rely
        on; it is the same on both paths. The seam of the shared-layer annex
        (minattn/fast/shared_layer.py): its form of ``applied_each_time`` makes the weights the
        module derives from its parameters once for all n applications."""
        planned = [m for _, m in self.named_modules()
                   if isinstance(m, Dropout) and "_plan" not in vars(m)]
        for m in planned:
            m._plan = MaskPlan(n)
        params = self.parameters()
        try:
            with faster(applied_each_time, params[0] if params else None)(self, n):
                yield self
        finally:
            for m in planned:
                del m._plan

    # --- (de)serialisation ------------------------------------------------------------------------
    def state_dict(self):
        """Host (NumPy) copies of every parameter, by name."""
        return {name: backend.to_numpy(p.data).copy() for name, p in self.named_parameters()}

    def load_state_dict(self, state):
        """Copy arrays into the parameters; any missing or unexpected key or shape mismatch raises a
        ``ValueError`` naming them, before anything is changed."""
        params = dict(self.named_parameters())
        missing = sorted(set(params) - set(state))
        unexpected = sorted(set(state) - set(params))
        bad = [f"{k}: checkpoint {tuple(np.shape(state[k]))} vs model {params[k].shape}"
               for k in params if k in state and tuple(np.shape(state[k])) != params[k].shape]
        if missing or unexpected or bad:
            parts = ([f"missing keys {missing}"] if missing else []) + \
                    ([f"unexpected keys {unexpected}"] if unexpected else []) + \
                    ([f"shape mismatch ({'; '.join(bad)})"] if bad else [])
            raise ValueError("state_dict does not match the model: " + ", ".join(parts))
        for k, p in params.items():
            p.data = backend.to_device(np.asarray(state[k]), backend.device_of(p.data),
                                       p.data.dtype)


def applied_each_time(module, n):
    """In ``Module.repeated``, on the textbook path: nothing shared, every application builds its
    own."""
    return contextlib.nullcontext(module)


def _children(name, v, kind):
    if isinstance(v, kind):
        yield name, v
    elif isinstance(v, (list, tuple)):
        for i, item in enumerate(v):
            if isinstance(item, kind):
                yield f"{name}.{i}", item


# --- initialisers (host NumPy; fans as in PyTorch) ------------------------------------------------

def head_size(d_model, n_head):
    """The width d_model / n_head of one attention head; a clear error where the heads do not
    fit."""
    if n_head < 1 or d_model < 1 or d_model % n_head:
        raise ValueError(f"d_model {d_model} must be a positive multiple of n_head {n_head}")
    return d_model // n_head


def uniform(rng, shape, bound):
    return rng.uniform(-bound, bound, size=shape).astype(backend.DEFAULT_DTYPE)


def xavier_uniform(rng, fan_in, fan_out, gain=1.0, shape=None):
    """Glorot & Bengio (2010): U(±gain·sqrt(6/(fan_in + fan_out)))."""
    return uniform(rng, shape or (fan_in, fan_out), gain * math.sqrt(6.0 / (fan_in + fan_out)))


class Linear(Module):
    """y = x @ W + b, W: (d_in, d_out). Default init is PyTorch's: U(±1/sqrt(d_in)) for W and b;
    pass ``weight`` to override it (e.g. ``xavier_uniform(rng, d_in, d_out, gain)``)."""

    def __init__(self, d_in, d_out, bias=True, rng=None, weight=None):
        rng = rng or np.random.default_rng(0)
        if d_in < 1 or d_out < 1:
            raise ValueError(f"Linear({d_in}, {d_out}): sizes must be ≥ 1")
        bound = 1 / math.sqrt(d_in)
        self.weight = Parameter(weight if weight is not None else uniform(rng, (d_in, d_out), bound))
        self.bias = Parameter(uniform(rng, (d_out,), bound)) if bias else None

    def forward(self, x):
        if x.dtype != self.weight.dtype:
            # else the weights' gradient comes back in another dtype, and backward() fails in an op the
            # caller never called: data (np.random.rand's float64, integers) is cast to the parameters'
            # dtype; a leaf tensor that wants its own gradient is refused here, by name
            if getattr(x, "requires_grad", False) and x.creator is None and is_grad_enabled():
                raise TypeError(f"nn.Linear: the input is {x.dtype} and requires grad, the parameters are "
                                f"{self.weight.dtype}: cast the input, or the model with .to(dtype=...)")
            x = Tensor((x.data if isinstance(x, Tensor) else x).astype(self.weight.dtype))
        # x (..., d_in): the op folds leading axes into rows
        return F.linear(x, self.weight, self.bias)


class Embedding(Module):
    """A lookup table (n, d); N(0, 1) init as PyTorch's (pass ``weight`` to override it)."""

    def __init__(self, n, d, rng=None, weight=None):
        rng = rng or np.random.default_rng(0)
        if n < 1 or d < 1:
            raise ValueError(f"Embedding({n}, {d}): sizes must be ≥ 1")
        if weight is None:
            weight = rng.standard_normal((n, d)).astype(backend.DEFAULT_DTYPE)
        self.weight = Parameter(weight)

    def forward(self, ids):
        return F.embedding(self.weight, ids)


class LayerNorm(Module):
    def __init__(self, d, eps=1e-5):
        self.weight = Parameter(np.ones(d, dtype=backend.DEFAULT_DTYPE))
        self.bias = Parameter(np.zeros(d, dtype=backend.DEFAULT_DTYPE))
        self.eps = eps

    def forward(self, x):
        return F.layer_norm(x, self.weight, self.bias, self.eps)


class Dropout(Module):
    """Inverted dropout drawing from ``self.rng`` (set by ``Module.set_rng``; until then
    ``backend.default_rng``); off in eval.

    ``scale=False`` keeps the kept entries as they are (a gate that closes, not a rescaled
    activation); ``shared_axes`` share one draw along those axes (e.g. (-1,): a whole column at
    once). A mask is ``mask()``'s fresh draw, or inside ``Module.repeated`` the next of the masks
    drawn ahead (``_plan``).
    """

    def __init__(self, p, rng=None, scale=True, shared_axes=()):
        if not 0 <= p < 1:   # checked here too, so a bad setting fails when the model is built
            raise ValueError(f"dropout probability must be in [0, 1), got {p}")
        self.p, self.rng, self.scale, self.shared_axes = p, rng, scale, tuple(shared_axes)

    def forward(self, x):
        keep = self.draw(x)
        return x if keep is None else x * keep

    def draw(self, x):
        """The mask this call multiplies ``x`` by (None where dropout is off). A GPU kernel that
        fuses the dropout (minattn/fast/kernels.py) draws it here too, so the random stream is the
        same."""
        if not (self.training and is_training()) or self.p == 0:
            return None
        shape = tuple(1 if a in self.shared_axes or a - x.ndim in self.shared_axes else n
                      for a, n in enumerate(x.shape))
        rng = self.rng if self.rng is not None else backend.default_rng(backend.device_of(x.data))
        plan = vars(self).get("_plan")
        return self.mask(rng, shape, x.dtype) if plan is None else plan.next(self, rng, shape, x.dtype)

    def mask(self, rng, shape, dtype):
        """Entries 1/(1 − p) (or 1 without ``scale``) with probability 1 − p, else 0, drawn from
        ``rng``."""
        keep = rng.keep_mask(shape, self.p)
        return keep * dtype.type(1 / (1 - self.p)) if self.scale else keep.astype(dtype)


class MaskPlan:
    """The masks of a dropout's next n calls, drawn together (one draw: on a GPU three kernel
    launches instead of 3n) when the first is asked for, and handed out in turn."""

    def __init__(self, n):
        self.n, self.masks, self.key, self.used = max(1, n), None, None, 0

    def next(self, dropout, rng, shape, dtype):
        if self.masks is None or self.key != (rng, shape, dtype) or self.used == self.n:
            self.masks = dropout.mask(rng, (self.n,) + shape, dtype)
            self.key, self.used = (rng, shape, dtype), 0
        self.used += 1
        return self.masks[self.used - 1]


class FeedForward(Module):
    """W2 · Drop(ReLU(W1 x + b1)) + b2 (Vaswani et al. 2017, Eq. 2) with the hidden dropout."""

    def __init__(self, d_model, d_ff, dropout=0.0, rng=None, gain1=1.0, gain2=1.0, xavier=False):
        rng = rng or np.random.default_rng(0)
        w1 = xavier_uniform(rng, d_model, d_ff, gain1) if xavier else None
        w2 = xavier_uniform(rng, d_ff, d_model, gain2) if xavier else None
        self.fc1 = Linear(d_model, d_ff, rng=rng, weight=w1)
        self.fc2 = Linear(d_ff, d_model, rng=rng, weight=w2)
        self.dropout = Dropout(dropout)

    def forward(self, x):
        return self.fc2(self.dropout(F.relu(self.fc1(x))))


class GRUCell(Module):
    """PyTorch's GRU cell (Cho et al. 2014):
        r = σ(W_ir x + b_ir + W_hr h + b_hr),  z = σ(W_iz x + b_iz + W_hz h + b_hz)
        n = tanh(W_in x + b_in + r ⊙ (W_hn h + b_hn)),  h' = (1 − z) ⊙ n + z ⊙ h
    The three gates share one input matmul and one hidden matmul (fewer ops per time step).
    """

    def __init__(self, d_in, d_hidden, rng=None):
        rng = rng or np.random.default_rng(0)
        bound = 1 / math.sqrt(d_hidden)
        self.d_hidden = d_hidden
        self.w_ih = Parameter(uniform(rng, (d_in, 3 * d_hidden), bound))      # [r | z | n]
        self.w_hh = Parameter(uniform(rng, (d_hidden, 3 * d_hidden), bound))
        self.b_ih = Parameter(uniform(rng, (3 * d_hidden,), bound))
        self.b_hh = Parameter(uniform(rng, (3 * d_hidden,), bound))

    def forward(self, x, h):
        H = self.d_hidden
        gi = F.linear(x, self.w_ih, self.b_ih)   # (B, 3H)
        gh = F.linear(h, self.w_hh, self.b_hh)   # (B, 3H)
        rz = F.sigmoid(gi[:, :2 * H] + gh[:, :2 * H])
        r, z = rz[:, :H], rz[:, H:]
        n = F.tanh(gi[:, 2 * H:] + r * gh[:, 2 * H:])
        return n + z * (h - n)           # = (1 − z) ⊙ n + z ⊙ h


class LSTMCell(Module):
    """PyTorch's LSTM cell (Hochreiter & Schmidhuber 1997), gates [i | f | g | o]:
        c' = σ(f) ⊙ c + σ(i) ⊙ tanh(g),  h' = σ(o) ⊙ tanh(c').  State is the pair (h, c)."""

    def __init__(self, d_in, d_hidden, rng=None):
        rng = rng or np.random.default_rng(0)
        bound = 1 / math.sqrt(d_hidden)
        self.d_hidden = d_hidden
        self.w_ih = Parameter(uniform(rng, (d_in, 4 * d_hidden), bound))
        self.w_hh = Parameter(uniform(rng, (d_hidden, 4 * d_hidden), bound))
        self.b_ih = Parameter(uniform(rng, (4 * d_hidden,), bound))
        self.b_hh = Parameter(uniform(rng, (4 * d_hidden,), bound))

    def forward(self, x, state):
        h, c = state
        H = self.d_hidden
        gates = x @ self.w_ih + self.b_ih + h @ self.w_hh + self.b_hh   # (B, 4H)
        ifo = F.sigmoid(gates[:, :2 * H])
        i, f = ifo[:, :H], ifo[:, H:]
        g = F.tanh(gates[:, 2 * H:3 * H])
        o = F.sigmoid(gates[:, 3 * H:])
        c = f * c + i * g
        return o * F.tanh(c), c


def sinusoidal_positions(positions, d, layout="interleaved", dtype=None):
    """Sinusoidal position encodings (Vaswani et al. 2017, §3.5), one row per position.

    ``positions``: an int n (positions 0..n−1) or an array of (possibly negative) positions.
    ``layout="interleaved"``: PE[p, 2i] = sin(p/10000^(2i/d)), PE[p, 2i+1] = cos(...) (NDR paper);
    ``layout="concat"``: [sin(...) for all i | cos(...) for all i] (the Abstractor's code).
    """
    pos = np.arange(positions) if np.isscalar(positions) else np.asarray(positions)
    freq = 10000.0 ** (-np.arange(0, d, 2) / d)          # (d/2,)
    angle = pos[:, None].astype(np.float64) * freq       # (P, d/2)
    if layout == "interleaved":
        pe = np.zeros((len(pos), d))
        pe[:, 0::2] = np.sin(angle)
        pe[:, 1::2] = np.cos(angle)[:, :d // 2]
    elif layout == "concat":
        pe = np.concatenate([np.sin(angle), np.cos(angle)], axis=1)[:, :d]
    else:
        raise ValueError(f"unknown layout {layout!r}; use 'interleaved' or 'concat'")
    return pe.astype(dtype or backend.DEFAULT_DTYPE)


def keras_fans(shape):
    """(fan_in, fan_out) of a kernel as Keras computes them for glorot_uniform (keras/initializers
    ``_compute_fans``): (in, out) for a 2-D kernel; an N-D kernel is read as a convolution's
    (..., in, out), so fan_in = shape[−2]·∏shape[:−2] and fan_out = shape[−1]·∏shape[:−2]. Keras'
    MultiHeadAttention keeps q/k/v as (d_model, n_head, d_head) kernels and o as (n_head, d_head,
    d_model), so their Glorot limits differ from those of the flattened matrices
    (docs/abstractor.md §5.1)."""
    if len(shape) < 3:
        return (shape[0], shape[-1]) if shape else (1, 1)
    receptive = math.prod(shape[:-2])
    return shape[-2] * receptive, shape[-1] * receptive
