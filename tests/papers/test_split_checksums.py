"""Checksums of every task's splits: the safety net that proves a refactoring left the data unchanged.

Each row of ``CASES`` builds one task (every name train.py and tasks.py accept, every SCAN split) and
hashes the arrays of each split with sha256; the digests must equal those in
``tests/golden/split_checksums.json``. Sizes are shrunk where a full split is slow to generate
(arithmetic, ListOps, object sorting, SET, MLU), never the vocabularies, depths or rules; CTL, lookup,
SCAN and pairwise are hashed at full size. ``retrieval`` has no fixed data: its rows hash a few batches
drawn from a seeded generator in each pool.

After a deliberate change to a generator, regenerate the golden file and review its diff:

    make golden        (MINATTN_REGEN_GOLDEN=1 on this file, then a plain run that must pass)

With MINATTN_REGEN_GOLDEN=1 each case writes its checksums and then FAILS, so a regeneration run never passes.
"""
import hashlib
import json
import os
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
import tasks  # noqa: E402

GOLDEN = os.path.join(ROOT, "tests", "golden", "split_checksums.json")
REGEN = os.environ.get("MINATTN_REGEN_GOLDEN") == "1"


def _digest(*arrays) -> str:
    h = hashlib.sha256()
    for a in arrays:
        a = np.ascontiguousarray(a)
        h.update(f"{a.dtype.str}{a.shape}".encode())   # so a change of dtype or shape shows too
        h.update(a.tobytes())
    return h.hexdigest()[:24]


def _split_arrays(s) -> tuple:
    """The arrays that define one split, whatever its kind (token classification, seq2seq, objects)."""
    if hasattr(s, "depths"):                                  # CTL, arithmetic, ListOps
        return s.inputs.tokens, s.inputs.offsets, s.labels, s.depths
    if hasattr(s, "targets"):                                 # lookup, SCAN, MLU
        return (s.inputs.tokens, s.inputs.offsets, s.targets.tokens, s.targets.offsets,
                np.array(list(s.lines)), np.array(s.in_vocab), np.array(s.out_vocab))
    return s.index, s.labels                                  # sort, pairwise, set


def _task_checksums(task) -> dict:
    out = {k: _digest(*_split_arrays(s)) for k, s in task.splits.items()}
    if hasattr(task, "objects"):
        out["objects"] = _digest(task.objects)
    if hasattr(task, "vocab"):
        out["vocab"] = _digest(np.array(task.vocab), np.array(task.classes))
    return out


def _retrieval_checksums(searches, retrievals, n_objects=10) -> dict:
    task = tasks.RetrievalTask(searches, retrievals, n_objects)
    out = {}
    for pool in task.pools:
        rng = np.random.default_rng([7, len(pool)])
        out[pool] = _digest(*(a for _ in range(3) for a in task.batch(16, rng, pool)))
    return out


def _classification(name, **kw):
    return lambda cache: _task_checksums(tasks.get_task(name, cache_dir=cache, **kw))


def _plain(name, **kw):
    return lambda cache: _task_checksums(tasks.get_task(name, **kw))


SMALL_ARITH = dict(n_train=300, n_iid=100, n_valid=50, n_test=50)
SMALL_LISTOPS = dict(n_train=200, n_iid=50, n_valid=10, n_test=10)

CASES = {
    "ctl": _classification("ctl"),
    "ctl/seed1": _classification("ctl", seed=1),
    "ctl-backward": _classification("ctl-backward"),
    "arith/small": _classification("arith", **SMALL_ARITH),
    "listops/small": _classification("listops", **SMALL_LISTOPS),
    "lookup": _plain("lookup"),
    "lookup/seed1": _plain("lookup", seed=1),
    **{f"scan/{s}": _plain("scan", split=s) for s in tasks.SCAN_SPLITS if s != "length_cutoff_K"},
    "scan/simple/seed1": _plain("scan", split="simple", seed=1),
    "scan/length_cutoff_22": _plain("scan", split="length_cutoff_22"),
    "scan/length_cutoff_26": _plain("scan", split="length_cutoff_26"),
    "scan/length_cutoff_36": _plain("scan", split="length_cutoff_36"),
    "sort/small": _plain("sort", n_sequences=5_000),
    "pairwise": _plain("pairwise"),
    "set/small": _plain("set", n_triples=1_000),
    "set/random64/small": _plain("set", cards="random64", n_triples=1_000),
    "mlu/small": _plain("mlu", n_train=2_000, n_valid=200, n_test=300),
    "retrieval/2x4": lambda cache: _retrieval_checksums(2, 4),
    "retrieval/3x2": lambda cache: _retrieval_checksums(3, 2, n_objects=5),
}


def _golden() -> dict:
    if not os.path.exists(GOLDEN):
        return {}
    with open(GOLDEN) as f:
        return json.load(f)


def _train_py_tasks() -> set:
    """The --task names train.py accepts (read from its source: importing it is slow and not needed)."""
    import ast
    with open(os.path.join(ROOT, "train.py")) as f:
        tree = ast.parse(f.read())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            for stmt in node.body:
                if (isinstance(stmt, ast.Assign) and any(getattr(t, "id", "") == "tasks" for t in stmt.targets)
                        and isinstance(stmt.value, ast.Tuple)):
                    names |= {e.value for e in stmt.value.elts}
    return names


def test_every_task_has_a_checksum_case():
    covered = {case.split("/")[0] for case in CASES}
    accepted = _train_py_tasks() | set(tasks.TASKS)
    assert accepted and accepted <= covered, f"no checksum case for {sorted(accepted - covered)}"
    assert {f"scan/{s}" for s in tasks.SCAN_SPLITS if s != "length_cutoff_K"} <= set(CASES)


@pytest.mark.parametrize("case", list(CASES))
def test_split_checksums(case, tmp_path):
    got = CASES[case](str(tmp_path))          # a fresh cache: the generator runs, nothing is read back
    if REGEN:
        golden = _golden()
        golden[case] = got
        os.makedirs(os.path.dirname(GOLDEN), exist_ok=True)
        with open(GOLDEN, "w") as f:
            json.dump(dict(sorted(golden.items())), f, indent=1)
            f.write("\n")
        pytest.fail(f"MINATTN_REGEN_GOLDEN=1: wrote the checksums of {case} instead of comparing; review the diff "
                    "and run the tests without it", pytrace=False)
    want = _golden().get(case)
    assert want is not None, f"no golden checksums for {case!r}: see this file's docstring to regenerate"
    assert got == want, f"{case}: the split data changed (split: got vs golden) " + ", ".join(
        f"{k}: {got.get(k)} vs {want.get(k)}" for k in sorted(set(got) | set(want)) if got.get(k) != want.get(k))
