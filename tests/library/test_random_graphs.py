"""Graph-level gradient checks: seeded random DAGs, every leaf gradient against central differences.

The op table (test_gradcheck.py) checks each op on its own; bugs in how the ENGINE combines their
gradients only show on graphs: a node read by several consumers, an op that hands one gradient
buffer to several inputs (add, reshape, broadcast_to, straight-through, ...), several outputs.
Each test graph here is a random program over a few float64 leaves, built from

- pass-through ops: add, sub, scalar add, reshape, transpose, swapaxes, basic and advanced
  indexing, one element by an all-int index, concat, stack, broadcast_to, straight-through;
- and ops that change the gradient: mul, matmul, tanh, sigmoid, softmax, scalar mul,

with broadcasting and heavy reuse of earlier nodes. Several nodes are flattened and concatenated
into one output ``y``; ``y.backward(u)`` with a random ``u`` gives the gradient of L = Σ u ⊙ y, which
is checked entry by entry against [L(θ + εe) − L(θ − εe)] / 2ε. On every graph we also check that

- each leaf's ``.grad`` is its own array (shares no memory with another leaf's, or with ``u``);
- ``backward(u)`` leaves ``u`` untouched;
- a second backward through a rebuilt graph adds exactly the same gradient again;
- ``clip_grad_norm`` scales each gradient exactly once.

Every graph runs on both paths, forced with ``engine.plain``: the textbook one (``engine.Accumulation``,
plain ops: NumPy's default, and what MINATTN_PLAIN=1 forces) and the annex's (fast/accumulate.py's in-place
and grouped sums, fast/slices.py).

On failure the message prints the program (ops and wiring) and its seed, so the case can be
replayed with ``Program(seed)``.
"""
import re

import numpy as np
import pytest

from minattn import backend, optim
from minattn import functional as F
from minattn import engine
from minattn.engine import Tensor, plain
from minattn.fast.accumulate import Deferred
from minattn.nn import Parameter

MAX_SIZE = 48  # entries per node: keeps the central differences cheap

# A straight-through node's forward is a step function of its input, so finite differences cannot see
# the gradient it passes on. Its estimator (Bengio et al. 2013) is the derivative of
#   y(θ) = x(θ) + [hard(x(θ₀)) − x(θ₀)],
# the identity plus a constant frozen at the point of evaluation θ₀. The reference graph uses exactly
# that function, with the constant recorded by the graph under test.


def _broadcastable(a, b):
    try:
        np.broadcast_shapes(a, b)
        return True
    except ValueError:
        return False


class Program:
    """A random DAG over ``n_leaves`` leaves, generated from ``seed`` and replayable on any leaves."""

    def __init__(self, seed, n_ops=24):
        rng = np.random.default_rng(seed)
        self.seed = seed
        shapes = [(2, 3), (3,), (2, 1), (4, 3), (1, 3), (3, 2)]
        n_leaves = int(rng.integers(2, 5))
        self.leaf_shapes = [shapes[i] for i in rng.choice(len(shapes), n_leaves, replace=False)]
        self.leaf_values = [rng.standard_normal(s) for s in self.leaf_shapes]
        self.steps = []          # (op name, input node ids, params)
        node_shapes = list(self.leaf_shapes)
        ops = list(BUILDERS)
        weights = np.array([WEIGHTS.get(name, 1.0) for name in ops])
        while len(self.steps) < n_ops:
            name = ops[rng.choice(len(ops), p=weights / weights.sum())]
            # Prefer recent nodes (deep graphs) but reuse old ones too (several consumers per node).
            made = BUILDERS[name](node_shapes, rng)
            if made is None:
                continue
            ins, params = made
            out_shape = _run_op(name, [np.zeros(node_shapes[i]) for i in ins], params).shape
            if int(np.prod(out_shape)) > MAX_SIZE or not 1 <= len(out_shape) <= 4 or 0 in out_shape:
                continue
            self.steps.append((name, ins, params))
            node_shapes.append(out_shape)
        n = len(node_shapes)
        # Several outputs: the last node, and a few others (a leaf is allowed: its gradient is u itself).
        extra = rng.choice(n - 1, size=int(rng.integers(1, 4)), replace=False).tolist()
        self.outputs = sorted(set(extra + [n - 1]))
        self.out_size = sum(int(np.prod(node_shapes[i])) for i in self.outputs)
        self.u = rng.standard_normal(self.out_size)
        self.node_shapes = node_shapes

    def __str__(self):
        lines = [f"Program(seed={self.seed}):"]
        lines += [f"  n{i} = leaf{list(s)}" for i, s in enumerate(self.leaf_shapes)]
        k = len(self.leaf_shapes)
        for j, (name, ins, params) in enumerate(self.steps):
            args = ", ".join(f"n{i}" for i in ins)
            extra = f"; {params}" if params is not None else ""
            lines.append(f"  n{k + j} = {name}({args}{extra})  -> {list(self.node_shapes[k + j])}")
        lines.append(f"  y = concat({', '.join(f'n{i}.reshape(-1)' for i in self.outputs)})")
        return "\n".join(lines)

    def run(self, leaves, st_consts=None):
        """The output y (a Tensor) on the given leaf tensors. ``st_consts`` (a list) switches
        straight-through nodes to their reference function, with the recorded constants."""
        nodes = list(leaves)
        record = [] if st_consts is None else None
        consts = iter(st_consts or ())
        for name, ins, params in self.steps:
            xs = [nodes[i] for i in ins]
            if name == "straight_through" and st_consts is not None:
                nodes.append(xs[0] + next(consts))
                continue
            y = _run_op(name, xs, params)
            if name == "straight_through":
                record.append(y.data - xs[0].data)
            nodes.append(y)
        y = F.concat([nodes[i].reshape(-1) for i in self.outputs], axis=0)
        return y, record


def _run_op(name, xs, params):
    """Apply op ``name``: on Tensors (the graph) or on plain arrays (shape inference only)."""
    if not isinstance(xs[0], Tensor):
        xs = [Tensor(x) for x in xs]
    return OPS[name](*xs, params)


def _hard(x):
    """The forward value of a straight-through node: a step function of x (as Gumbel's one-hot is)."""
    return (x.data > 0).astype(x.dtype) - 0.5


OPS = {
    "add": lambda a, b, p: a + b,
    "sub": lambda a, b, p: a - b,
    "mul": lambda a, b, p: a * b,
    "add_scalar": lambda a, p: a + p,
    "rsub_scalar": lambda a, p: p - a,
    "mul_scalar": lambda a, p: a * p,
    "matmul": lambda a, b, p: a @ b.swapaxes(-1, -2),
    "tanh": lambda a, p: a.tanh(),
    "sigmoid": lambda a, p: a.sigmoid(),
    "softmax": lambda a, p: F.softmax(a, axis=-1),
    "reshape": lambda a, p: a.reshape(p),
    "transpose": lambda a, p: a.transpose(p),
    "swapaxes": lambda a, p: a.swapaxes(0, -1),
    "getitem_basic": lambda a, p: a[p],
    "getitem_advanced": lambda a, p: a[backend.to_device(np.array(p), a.device)],
    "getitem_element": lambda a, p: a[p].reshape(1),       # all ints: NumPy gives a 0-d copy, not a view
    "concat": lambda *xs: F.concat(list(xs[:-1]), axis=xs[-1]),
    "stack": lambda *xs: F.stack(list(xs[:-1]), axis=xs[-1]),
    "broadcast_to": lambda a, p: F.broadcast_to(a, p),
    "straight_through": lambda a, p: F.straight_through(a, _hard(a)),
}


def _pick(rng, n):
    """A node index, biased towards recent nodes."""
    return int(n - 1 - min(rng.geometric(0.25) - 1, n - 1))


def _binary(shapes, rng):
    a = _pick(rng, len(shapes))
    cands = [i for i in range(len(shapes)) if _broadcastable(shapes[a], shapes[i])]
    return [a, int(rng.choice(cands))], None   # may be a itself: x + x


def _unary(shapes, rng):
    return [_pick(rng, len(shapes))], None


def _scalar(shapes, rng):
    return [_pick(rng, len(shapes))], round(float(rng.uniform(-2, 2)), 3)


def _matmul(shapes, rng):
    a = _pick(rng, len(shapes))
    if len(shapes[a]) < 2:
        return None
    cands = [i for i in range(len(shapes)) if len(shapes[i]) >= 2 and shapes[i][-1] == shapes[a][-1]
             and _broadcastable(shapes[a][:-2], shapes[i][:-2])]
    return [a, int(rng.choice(cands))], None   # a @ bᵀ, often a @ aᵀ


def _reshape(shapes, rng):
    a = _pick(rng, len(shapes))
    n = int(np.prod(shapes[a]))
    options = [(n,), (1, n)] + [(d, n // d) for d in (2, 3, 4) if n % d == 0 and n // d > 1]
    return [a], options[rng.integers(len(options))]


def _transpose(shapes, rng):
    a = _pick(rng, len(shapes))
    return [a], tuple(int(i) for i in rng.permutation(len(shapes[a])))


def _swapaxes(shapes, rng):
    a = _pick(rng, len(shapes))
    return ([a], None) if len(shapes[a]) >= 2 else None


def _getitem_basic(shapes, rng):
    a = _pick(rng, len(shapes))
    if shapes[a][0] < 2:
        return None
    return [a], [slice(1, None), slice(None, None, 2), (slice(None), None), 0][rng.integers(4)]


def _getitem_advanced(shapes, rng):
    a = _pick(rng, len(shapes))
    n = shapes[a][0]
    return [a], rng.integers(0, n, size=int(rng.integers(2, 5))).tolist()   # repeats accumulate


def _getitem_element(shapes, rng):
    a = _pick(rng, len(shapes))
    return [a], tuple(int(i) for i in rng.choice([0, -1], size=len(shapes[a])))   # few: the same one twice


def _concat(shapes, rng):
    a = _pick(rng, len(shapes))
    same_tail = [i for i in range(len(shapes)) if shapes[i][1:] == shapes[a][1:] and len(shapes[i]) == len(shapes[a])]
    return [a, int(rng.choice(same_tail)), a], 0


def _stack(shapes, rng):
    a = _pick(rng, len(shapes))
    same = [i for i in range(len(shapes)) if shapes[i] == shapes[a]]
    return [a, int(rng.choice(same))], int(rng.integers(0, len(shapes[a]) + 1))


def _broadcast_to(shapes, rng):
    a = _pick(rng, len(shapes))
    s = shapes[a]
    target = tuple(2 if d == 1 else d for d in s)
    return [a], ((2,) + s if target == s else target)


BUILDERS = {
    "add": _binary, "sub": _binary, "mul": _binary, "matmul": _matmul,
    "add_scalar": _scalar, "rsub_scalar": _scalar, "mul_scalar": _scalar,
    "tanh": _unary, "sigmoid": _unary, "softmax": _unary,
    "reshape": _reshape, "transpose": _transpose, "swapaxes": _swapaxes,
    "getitem_basic": _getitem_basic, "getitem_advanced": _getitem_advanced, "getitem_element": _getitem_element,
    "concat": _concat, "stack": _stack, "broadcast_to": _broadcast_to, "straight_through": _unary,
}
assert set(BUILDERS) == set(OPS)
# Ops that hand one gradient buffer to two inputs (add, x + x, concat of a node with itself) and slices of
# one node (whose gradients the annex puts together: fast.slices.Slices) are where the engine's accumulation is
# most easily wrong: draw them more often.
WEIGHTS = {"add": 6.0, "sub": 2.0, "concat": 2.0, "stack": 1.5, "mul": 2.0, "getitem_basic": 2.0,
           "getitem_element": 2.0}


def _leaves(prog, device):
    return [Parameter(backend.to_device(v, device)) for v in prog.leaf_values]


def _shares_memory(a, b):
    a, b = getattr(a, "_a", a), getattr(b, "_a", b)   # the strict device's wrapped ndarray
    if isinstance(a, np.ndarray):
        return np.shares_memory(a, b)
    return a.data.ptr == b.data.ptr                   # CuPy: the same device buffer


def check_program(prog, device="cpu", eps=1e-6, rtol=1e-5, atol=1e-7):
    """Raise AssertionError (with the program) if any gradient or invariant is wrong."""
    def fail(msg):
        raise AssertionError(f"{msg}\n{prog}")

    leaves = _leaves(prog, device)
    u = backend.to_device(prog.u, device)
    u_before = prog.u.copy()
    y, st_consts = prog.run(leaves)
    y.backward(u)
    if not np.array_equal(backend.to_numpy(u), u_before):
        fail("backward(u) changed the upstream gradient u")
    grads = [backend.to_numpy(p.grad) if p.grad is not None else np.zeros(p.shape) for p in leaves]

    # Each leaf's .grad is its own array.
    arrays = [(f"leaf{i}.grad", p.grad) for i, p in enumerate(leaves) if p.grad is not None] + [("u", u)]
    for i, (na, a) in enumerate(arrays):
        for nb, b in arrays[i + 1:]:
            if a is b or _shares_memory(a, b):
                fail(f"{na} and {nb} share memory")

    # Central differences of the same graph (straight-through nodes as their reference function).
    def loss(values):
        y_ref, _ = prog.run([Tensor(backend.to_device(v, device)) for v in values], st_consts)
        return float(np.dot(backend.to_numpy(y_ref.data), prog.u))

    for k, (v, g) in enumerate(zip(prog.leaf_values, grads)):
        numeric = np.zeros_like(v)
        for idx in np.ndindex(v.shape):
            plus, minus = [w.copy() for w in prog.leaf_values], [w.copy() for w in prog.leaf_values]
            plus[k][idx] += eps
            minus[k][idx] -= eps
            numeric[idx] = (loss(plus) - loss(minus)) / (2 * eps)
        # Central differences lose ~1e-16 · |L| / eps to cancellation on every entry, so a leaf whose other
        # entries reach 1e6 (deep products of tanh'd and matmul'd nodes) widens its atol by 1e-10 of them.
        if not np.allclose(g, numeric, rtol=rtol, atol=atol + 1e-10 * np.abs(numeric).max()):
            fail(f"leaf{k} {v.shape}: analytic gradient\n{g}\n!= central differences\n{numeric}")

    # A second backward through a rebuilt graph accumulates the same gradient again.
    y2, _ = prog.run(leaves)
    y2.backward(u)
    for k, (p, g) in enumerate(zip(leaves, grads)):
        if p.grad is not None and not np.allclose(backend.to_numpy(p.grad), 2 * g, rtol=1e-12, atol=0):
            fail(f"leaf{k}: a second backward did not add the same gradient")

    # clip_grad_norm scales every gradient exactly once (a shared array would be scaled twice).
    with_grad = [p for p in leaves if p.grad is not None]
    before = [backend.to_numpy(p.grad).copy() for p in with_grad]
    norm = np.sqrt(sum((b * b).sum() for b in before))
    if norm > 0:
        optim.clip_grad_norm(with_grad, norm / 3)
        for k, (p, b) in enumerate(zip(with_grad, before)):
            # 1e-3: clip's ε in max_norm/(norm + ε); a second scaling would give 1/9
            if not np.allclose(backend.to_numpy(p.grad), b / 3, rtol=1e-3, atol=1e-12):
                fail(f"clip_grad_norm scaled leaf{k}'s gradient by "
                     f"{np.linalg.norm(backend.to_numpy(p.grad)) / max(np.linalg.norm(b), 1e-300):.4f}, not 1/3")


N_GRAPHS = {"cpu": 300, "strict": 40, "gpu": 40}


@pytest.mark.parametrize("path", ["textbook", "annex"])
def test_random_graphs_have_the_gradients_of_central_differences(device, path):
    with plain(path == "textbook"):
        assert (engine.faster(engine.Accumulation) is engine.Accumulation) == (path == "textbook")
        for seed in range(N_GRAPHS[device]):
            check_program(Program(seed), device)


def test_random_graphs_use_every_pass_through_op():
    """The generator really exercises what it claims (a generator that never builds, say, concat
    would pass the test above vacuously)."""
    used = {name for seed in range(N_GRAPHS["cpu"]) for name, _, _ in Program(seed).steps}
    assert used == set(OPS)
    def most_consumers(prog):   # how many ops read the most-read node
        return max(np.bincount([i for _, ins, _ in prog.steps for i in set(ins)]))
    assert sum(most_consumers(Program(s)) > 1 for s in range(50)) >= 45   # several consumers, almost always


class OldAccumulation(engine.Accumulation):
    """The bug this test exists for, as an accumulation policy: in-place adds into any buffer the engine
    made, keyed on the array's id(), even when a pass-through op has handed that buffer to another
    input too."""

    def __init__(self):
        self.owned = set()

    def add(self, t, gx):
        if isinstance(gx, Deferred):          # a slice's gradient (fast/slices.py), evaluated at once here
            gx = gx.total([gx])
        if t._g is None:
            t._g = gx
        elif id(t._g) in self.owned:
            t._g += gx
        else:
            t._g = t._g + gx
            self.owned.add(id(t._g))

    def keep(self, leaf, g):
        leaf.grad = (g if id(g) in self.owned else g.copy()) if leaf.grad is None else leaf.grad + g


def test_the_random_graphs_catch_the_old_accumulation_rule(monkeypatch):
    """Plant the old rule through the annex's seam; the random graphs must find it."""
    monkeypatch.setitem(engine._FASTER, engine.Accumulation, OldAccumulation)
    caught = []
    with plain(False):
        for seed in range(N_GRAPHS["cpu"]):
            try:
                check_program(Program(seed))
            except AssertionError as e:
                caught.append(str(e))
                break
    assert caught, "the random graphs did not catch the planted accumulation bug"


def test_a_failing_graph_is_printed_for_replay(monkeypatch):
    monkeypatch.setattr(F, "straight_through", lambda soft, hard: soft * 2.0 + Tensor(hard) - soft.data * 2.0)
    def st_feeds_the_output(prog):
        live = set(prog.outputs)
        k = len(prog.leaf_shapes)
        for j in reversed(range(len(prog.steps))):
            if k + j in live:
                if prog.steps[j][0] == "straight_through":
                    return True
                live.update(prog.steps[j][1])
        return False
    for seed in [s for s in range(100) if st_feeds_the_output(Program(s))][:10]:
        try:
            check_program(Program(seed))
        except AssertionError as e:   # the message replays the case: seed, ops and wiring
            assert re.search(rf"(?s)Program\(seed={seed}\):.*= straight_through\(n\d+\)", str(e))
            return
    pytest.fail("a straight-through node with a wrong backward was not caught in 10 graphs that use it")


# --- the two cases of the bug report, as plain regression tests --------------------------------

def test_pass_through_add_does_not_leak_one_inputs_gradient_into_the_other():
    a, b = Parameter(np.ones(3, np.float32)), Parameter(np.ones(3, np.float32))
    x, y = a * 1.0, b * 1.0
    z = x * 7.0
    t = x + y
    (t * 2.0 + t * 3.0 + z).sum().backward()
    np.testing.assert_array_equal(a.grad, np.full(3, 12.0))
    np.testing.assert_array_equal(b.grad, np.full(3, 5.0))


def test_two_leaves_never_share_a_gradient_array_and_clipping_scales_each_once():
    a, b = Parameter(np.ones(3, np.float32)), Parameter(np.ones(3, np.float32))
    t = a + b
    (t * 2.0 + t * 3.0).sum().backward()
    assert a.grad is not b.grad and not np.shares_memory(a.grad, b.grad)
    optim.clip_grad_norm([a, b], 1.0)
    # ‖(5,5,5,5,5,5)‖ = 5√6: each gradient scaled once, to 5/(5√6) = 1/√6 per entry
    np.testing.assert_allclose(a.grad, np.full(3, 1 / 6 ** 0.5), rtol=1e-5)
    np.testing.assert_allclose(b.grad, np.full(3, 1 / 6 ** 0.5), rtol=1e-5)
