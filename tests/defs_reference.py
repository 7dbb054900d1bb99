"""Plain-NumPy statements of the papers' equations, for the definition tests
(tests/library/test_definitions.py and tests/papers/<paper>/test_definitions.py; issue 31 item 1).

Nothing here imports minattn's ops or functional: every function takes NumPy arrays (a module's parameters
read as arrays) and computes the paper's equation directly, with loops where that is clearest. The tests
compare a module's output with these on small random float64 inputs (``randomize``, ``X``) within ``TOL``.
"""
import contextlib
import math

import numpy as np


def arr(t):
    """A Tensor or Parameter (or array) as a host float64 NumPy array."""
    return np.array(getattr(t, "data", t), dtype=np.float64)


out = arr

TOL = dict(rtol=1e-9, atol=1e-11)


def randomize(module, seed=1, scale=0.5):
    """float64 and every parameter redrawn N(0, scale²): a definition must hold for any weights, and
    inits such as a zero u/v or a unit LayerNorm gain would hide a missing term."""
    module.double()
    rng = np.random.default_rng(seed)
    for _, p in module.named_parameters():
        p.data = rng.standard_normal(p.shape) * scale
    return module


def X(*shape, seed=0):
    """A random float64 input of that shape."""
    return np.random.default_rng(seed).standard_normal(shape)


@contextlib.contextmanager
def recorded_masks(dropout_class):
    """The list of every mask ``dropout_class`` draws inside the block, in order, as float64 arrays (its
    ``mask`` wrapped): a test then applies each mask where the paper puts that dropout and compares."""
    masks, original = [], dropout_class.mask

    def mask(self, rng, shape, dtype):
        drawn = original(self, rng, shape, dtype)
        masks.append(arr(drawn))
        return drawn

    dropout_class.mask = mask
    try:
        yield masks
    finally:
        dropout_class.mask = original


def check_optimizer(opt, cfg, kind, betas, eps, rate, steps=(1, 2, 3)):
    """The optimizer a run builds against the run's settings ``cfg`` and the paper: its class ``kind``,
    betas, eps and weight decay; then, step by step with zero gradients (Adam's update is then 0, so only
    the decoupled decay p ← p − lr_t·wd·p moves a parameter), the rate lr_t = ``rate(t)`` at each step t of
    ``steps`` (reached as --resume does, through the state's step count) and the decay at the run's wd."""
    assert type(opt) is kind, f"{type(opt).__name__}, not {kind.__name__}"
    assert tuple(opt.betas) == betas and opt.eps == eps, (opt.betas, opt.eps)
    assert opt.weight_decay == cfg.weight_decay,\
        f"weight decay {opt.weight_decay}, the run's {cfg.weight_decay}"
    for t in steps:
        opt.load_state_dict({"t": t - 1, "lr": opt.lr, "state": [{} for _ in opt.params]})
        before = [arr(p) for p in opt.params]
        for p in opt.params:
            p.grad = np.zeros_like(p.data)
        opt.step()
        assert math.isclose(opt.lr, rate(t), rel_tol=1e-12), f"step {t}: lr {opt.lr}, expected {rate(t)}"
        for p, b in zip(opt.params, before):
            np.testing.assert_allclose(arr(p), b * (1 - rate(t) * cfg.weight_decay), rtol=1e-12, atol=0)


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def softplus(x):
    return np.log1p(np.exp(x))


def softmax(x, axis=-1):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def layer_norm(x, w, b, eps):
    """Ba, Kiros & Hinton 2016, Eqs. 3-4 (biased variance over the features), then the gain and bias."""
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * w + b


def relu(x):
    return np.maximum(x, 0.0)


def sinusoid(positions, d, layout="interleaved"):
    """Vaswani et al. 2017 §3.5: PE(p, 2i) = sin(p / 10000^(2i/d)), PE(p, 2i+1) = cos(p / 10000^(2i/d)),
    written entry by entry; ``concat`` puts all the sines first, then all the cosines (the Abstractor code)."""
    positions = list(positions)
    pe = np.zeros((len(positions), d))
    for r, p in enumerate(positions):
        for i in range(d // 2):
            angle = p / 10000 ** (2 * i / d)
            if layout == "interleaved":
                pe[r, 2 * i], pe[r, 2 * i + 1] = math.sin(angle), math.cos(angle)
            else:
                pe[r, i], pe[r, d // 2 + i] = math.sin(angle), math.cos(angle)
    return pe


def linear(layer, x):
    """y = x W + b of an nn.Linear (weights stored (in, out))."""
    y = x @ arr(layer.weight)
    return y if layer.bias is None else y + arr(layer.bias)


def feed_forward(ff, x):
    """Vaswani et al. 2017 Eq. 2: FFN(x) = max(0, x W1 + b1) W2 + b2."""
    return linear(ff.fc2, relu(linear(ff.fc1, x)))


def gru(cell, x, h):
    """Cho et al. 2014 in PyTorch's form (gates [r | z | n]):
    r = σ(W_ir x + b_ir + W_hr h + b_hr), z = σ(W_iz x + b_iz + W_hz h + b_hz),
    n = tanh(W_in x + b_in + r ⊙ (W_hn h + b_hn)), h' = (1 − z) ⊙ n + z ⊙ h."""
    H = h.shape[-1]
    gi = x @ arr(cell.w_ih) + arr(cell.b_ih)
    gh = h @ arr(cell.w_hh) + arr(cell.b_hh)
    r = sigmoid(gi[:, :H] + gh[:, :H])
    z = sigmoid(gi[:, H:2 * H] + gh[:, H:2 * H])
    n = np.tanh(gi[:, 2 * H:] + r * gh[:, 2 * H:])
    return (1 - z) * n + z * h


def lstm(cell, x, h, c):
    """Hochreiter & Schmidhuber 1997 in PyTorch's form (gates [i | f | g | o]):
    c' = σ(f) ⊙ c + σ(i) ⊙ tanh(g), h' = σ(o) ⊙ tanh(c')."""
    H = h.shape[-1]
    a = x @ arr(cell.w_ih) + arr(cell.b_ih) + h @ arr(cell.w_hh) + arr(cell.b_hh)
    i, f, g, o = (a[:, k * H:(k + 1) * H] for k in range(4))
    c2 = sigmoid(f) * c + sigmoid(i) * np.tanh(g)
    return sigmoid(o) * np.tanh(c2), c2


def allowed(B, T, S, key_mask=None, causal=False):
    """(B, T, S) bool: query i may attend to key j."""
    ok = np.ones((B, T, S), bool)
    if key_mask is not None:
        ok &= np.asarray(key_mask, bool)[:, None, :]
    if causal:
        ok &= np.arange(S)[None, None, :] <= np.arange(T)[None, :, None]
    return ok


def masked_softmax_row(logits, ok):
    """softmax over the allowed keys of one row; forbidden keys get weight 0."""
    z = np.where(ok, logits, -np.inf)
    e = np.exp(z - z[ok].max())
    e = np.where(ok, e, 0.0)
    return e / e.sum()


def mha(m, x, context=None, key_mask=None, causal=False, drop=None):
    """Vaswani et al. 2017 Eqs. 1-2, head by head and query by query: head_h = softmax(Q_h K_hᵀ / √d_k) V_h,
    MultiHead = Concat(head_1..head_H) W_O (+ biases where the module has them). The module's fused [W_K | W_V]
    holds the key projection in its first n_head·d_head columns, head after head. ``drop`` (B, H, T, S): a
    dropout mask on the attention weights (the Keras layer's site)."""
    ctx = x if context is None else context
    B, T, _ = x.shape
    S = ctx.shape[1]
    H, dh = m.n_head, m.d_head
    inner = H * dh
    q = x @ arr(m.w_q) + (0 if m.b_q is None else arr(m.b_q))
    kv = ctx @ arr(m.w_kv) + (0 if m.b_kv is None else arr(m.b_kv))
    k, v = kv[..., :inner], kv[..., inner:]
    ok = allowed(B, T, S, key_mask, causal)
    heads = np.zeros((B, T, inner))
    for b in range(B):
        for h in range(H):
            sl = slice(h * dh, (h + 1) * dh)
            for i in range(T):
                logits = np.array([q[b, i, sl] @ k[b, j, sl] for j in range(S)]) / math.sqrt(dh)
                weights = masked_softmax_row(logits, ok[b, i]) * (1 if drop is None else drop[b, h, i])
                heads[b, i, sl] = weights @ v[b, :, sl]
    return linear(m.out, heads)


SIGMA_REL = {"sigmoid": sigmoid, "tanh": np.tanh, "linear": lambda r: r}


def rca(m, x, symbols, scale, key_mask=None, drop=None, causal=False):
    """Relational cross-attention, MHA form (Altabaa et al. 2024, Eq. 6; Algorithm 1): per head
    α_h = σ_rel(scale · (X W_q^h + b_q^h)(X W_k^h + b_k^h)ᵀ), A = concat_h(α_h (S W_v^h + b_v^h)) W_o + b_o;
    queries and keys from the objects X, values from the symbols S. σ_rel is the module's ``activation``:
    softmax over the allowed keys, or sigmoid, tanh or the identity entry by entry, forbidden keys 0.
    ``drop`` (B, H, T, T): a dropout mask on α_h (the code's site)."""
    B, T, _ = x.shape
    H, dh = m.n_head, m.d_head
    inner = H * dh
    qk = x @ arr(m.w_qk) + arr(m.b_qk)
    q, k = qk[..., :inner], (qk[..., :inner] if m.symmetric else qk[..., inner:])
    v = symbols @ arr(m.w_v) + arr(m.b_v)
    ok = allowed(B, T, T, key_mask, causal)
    heads = np.zeros((B, T, inner))
    for b in range(B):
        for h in range(H):
            sl = slice(h * dh, (h + 1) * dh)
            for i in range(T):
                logits = np.array([q[b, i, sl] @ k[b, j, sl] for j in range(T)]) * scale
                if m.activation == "softmax":
                    weights = masked_softmax_row(logits, ok[b, i])
                else:
                    weights = np.where(ok[b, i], SIGMA_REL[m.activation](logits), 0.0)
                weights = weights * (1 if drop is None else drop[b, h, i])
                heads[b, i, sl] = weights @ v[b, :, sl]
    return linear(m.out, heads)
