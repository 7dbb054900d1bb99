"""The plain forms in the design notes (docs/*.md) are the code the tests trust: each Python block of a
note is run here and must agree with the fast implementation, or with the test's own naive loop, so a
note cannot drift from the code it explains."""
import os
import re

import numpy as np
import pytest

from minattn.attention.coda import l1_distance
from minattn.attention.compositional import CompositionalAttention
from minattn.attention.geometric import geometric_attention_weights
from minattn.attention.relational import RelationalCrossAttention
from minattn.data import compositional as retrieval
from minattn.engine import Tensor

from tests.papers.abstractor.test_mechanisms_and_models import naive_rca, randomize, x_and_s
from tests.papers.compositional.test_mechanism_models_and_task import reference_forward

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def note_code(name, **namespace) -> dict:
    """Run every ```python block of the note called name; returns the names it defines."""
    with open(os.path.join(ROOT, "docs", f"{name}.md")) as f:
        blocks = re.findall(r"```python\n(.*?)```", f.read(), re.S)
    assert blocks, f"docs/{name}.md has no python block"
    namespace = {"np": np, **namespace}
    for block in blocks:
        exec(block, namespace)
    return namespace


def test_ndr_note_geometric_loop_matches_the_fused_weights():
    naive = note_code("ndr")["naive_geometric"]
    z = np.random.default_rng(0).uniform(-4, 4, (2, 2, 6, 6))
    key_mask = np.ones((2, 6), bool)
    key_mask[1, 4:] = False
    for normalize in (False, True):
        got = geometric_attention_weights(Tensor(z), key_mask, normalize).data
        np.testing.assert_allclose(got, naive(z, key_mask, normalize), rtol=1e-9, atol=1e-12)


def test_coda_note_plain_forms():
    code = note_code("coda")
    rng = np.random.default_rng(1)
    q, k, v = rng.standard_normal((5, 4)), rng.standard_normal((6, 4)), rng.standard_normal((6, 3))
    np.testing.assert_allclose(l1_distance(Tensor(q[None]), Tensor(k[None])).data[0], code["l1_distance_naive"](q, k),
                               rtol=1e-10)
    mask = np.tril(np.ones((5, 6), bool))
    out = code["coda_naive"](q, k, v, mask)
    E, N = q @ k.T / 2, -np.abs(q[:, None] - k[None]).sum(-1) / 2                # d_k = 4: √d_k = 2
    np.testing.assert_allclose(out, (np.tanh(E) * 2 / (1 + np.exp(-N)) * mask) @ v, rtol=1e-12)


def test_compositional_note_matches_the_tests_reference():
    naive = note_code("compositional")["compositional_naive"]
    rng = np.random.default_rng(4)
    ca = CompositionalAttention(6, 2, 3, search_dim=8, value_dim=15, rng=rng, concat=True, mask_diagonal=True).double()
    for p in ca.parameters():
        p.data = p.data + 0.1 * rng.standard_normal(p.shape)
    x = rng.standard_normal((2, 5, 6))
    key_mask = np.array([[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]], bool)
    for got, want in zip(naive(ca, x, key_mask), reference_forward(ca, x, key_mask)):
        np.testing.assert_allclose(got, want, rtol=1e-12)


def test_compositional_note_retrieval_labels_match_the_generator():
    naive = note_code("compositional")["retrieval_labels_naive"]
    task = retrieval.RetrievalTask(2, 4, n_objects=7)
    x, y, _ = task.batch(8, np.random.default_rng(2), "all")
    np.testing.assert_allclose(y, naive(x.astype(np.float64), 2, 4, retrieval.RETRIEVAL_ALPHAS), rtol=1e-5, atol=1e-5)


def test_abstractor_note_rca_matches_the_module():
    naive = note_code("abstractor")["naive_rca"]
    x, s = x_and_s()
    for activation, symmetric in [("softmax", False), ("sigmoid", True)]:
        m = randomize(RelationalCrossAttention(8, 2, d_head=3, activation=activation, symmetric=symmetric))
        np.testing.assert_allclose(naive(m, x, s), naive_rca(m, x, s), rtol=1e-12)
        np.testing.assert_allclose(m(Tensor(x), Tensor(s)).data, naive(m, x, s), rtol=1e-4, atol=1e-5)


def test_engine_note_works_its_graph_through_the_engine(monkeypatch):
    code = note_code("engine")
    assert code["order"] == ["Sum", "Tanh", "Add", "Mul", "b", "x", "w"]
    v = np.array([[0.3, -1.2], [2.0, 0.5]])
    np.testing.assert_allclose(code["numeric_grad"](lambda a: (a ** 3).sum(), v), 3 * v ** 2, rtol=1e-6)
    # the note's checks catch a wrong backward: tanh's derivative taken as 1 - t instead of 1 - t²
    from minattn.ops import elementwise
    monkeypatch.setattr(elementwise.Tanh, "backward", lambda self, gy: gy * (1 - self.y))
    with pytest.raises(AssertionError):
        note_code("engine")


def test_the_readmes_reading_path_points_at_whole_pieces_of_the_engine():
    """README's "Read the engine in ten minutes" gives line ranges of engine.py: each starts a piece (the
    file's first line, a section comment, a def or a class) and ends one, and together they hold the
    algorithm, so that a change of engine.py that leaves them stale fails here."""
    import inspect

    from minattn import engine
    with open(os.path.join(ROOT, "README.md")) as f:
        ranges = [(int(a), int(b)) for a, b in re.findall(r"`minattn/engine\.py:(\d+)–(\d+)`", f.read())]
    lines = inspect.getsource(engine).splitlines()
    assert len(ranges) >= 4
    for a, b in ranges:
        starts = a == 1 or lines[a - 1].startswith(("# ---", "def ", "class "))
        assert starts, f"README: engine.py:{a} starts no piece"
        assert b == len(lines) or not lines[b].strip(), f"README: engine.py:{b} ends no piece"
    for obj in (engine.sum_to, engine.Tensor.backward, engine.topological_order, engine.Accumulation,
                engine.Function):
        src, start = inspect.getsourcelines(obj)
        assert any(a <= start and start + len(src) - 1 <= b for a, b in ranges), f"README's path misses {obj}"
