"""The NDR paper's tasks (docs/ndr.md §7), batching (§1, §6), the disk cache and the tasks.py CLI.

Answers are re-derived by evaluators written independently of the generators: permutation matrices for
CTL, Python's eval for arithmetic (mod 10 commutes with + and *), and a recursive-descent parser for
ListOps. ListOps and arithmetic use shrunken sizes; CTL is generated at full size (a few seconds).
Section numbers (§) without "paper" are those of docs/ndr.md.
"""
import math
import os
import random
import statistics
import subprocess
import sys
import warnings

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))))
import tasks  # noqa: E402
from minattn.data import listops as listops_data, ndr  # noqa: E402

SPLITS = ["train", "iid", "valid", "test"]
SMALL_ARITH = dict(n_train=2_000, n_iid=200, n_valid=100, n_test=100)
SMALL_LISTOPS = dict(n_train=1_000, n_iid=100, n_valid=50, n_test=20)


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return str(tmp_path_factory.mktemp("cache"))


@pytest.fixture(scope="module")
def ctl(cache):
    return tasks.get_task("ctl", cache_dir=cache)


@pytest.fixture(scope="module")
def ctl_back(cache, ctl):
    return tasks.get_task("ctl-backward", cache_dir=cache)   # shares ctl's cache file


@pytest.fixture(scope="module")
def arith(cache):
    return tasks.get_task("arith", cache_dir=cache, **SMALL_ARITH)


@pytest.fixture(scope="module")
def listops(cache):
    return tasks.get_task("listops", cache_dir=cache, **SMALL_LISTOPS)


def texts(task, split, idx=None):
    s = task.splits[split]
    idx = range(len(s)) if idx is None else idx
    return [[task.vocab[t] for t in s.inputs[i].tolist()] for i in idx]


# ---------------------------------------------------------------------------------------------------
# Independent evaluators
# ---------------------------------------------------------------------------------------------------

def _ctl_matrices():
    rs = np.random.RandomState(0x12345678)
    tables = [rs.permutation(8) for _ in range(11)]
    return {chr(97 + t): np.eye(8)[:, tables[t]] for t in range(11)}   # column x is e_{table[x]}


CTL_MATRICES = _ctl_matrices()


def ctl_eval(tokens, backward=False):
    """Compose one-hot permutation matrices: M_t[y, x] = 1 iff table t maps x to y."""
    mats = CTL_MATRICES
    if backward:
        tokens = tokens[::-1]                                   # "b a d 101" -> "101 d a b"
    x = np.eye(8)[int(tokens[0], 2)]
    for f in tokens[1:]:                                        # functions in application order
        x = mats[f] @ x
    return int(np.argmax(x)), len(tokens) - 1


def arith_eval(expr):
    """Value via Python's eval (mod 10 is a ring homomorphism), paper depth = deepest bracket nesting."""
    depth = max(np.cumsum([{"(": 1, ")": -1}.get(c, 0) for c in expr]))
    return eval(expr) % 10, int(depth)


def listops_eval(tokens):
    """Recursive-descent parse -> (value, dependency depth, tree depth, length in §7.3 units)."""
    pos = 0

    def node():
        nonlocal pos
        tok = tokens[pos]
        pos += 1
        if tok.isdigit():
            return int(tok), 1, 1, 1
        args = []
        while tokens[pos] != "]":
            args.append(node())
        pos += 1
        vals = [a[0] for a in args]
        if tok == "[MIN":
            value = min(vals)
            dep = args[vals.index(value)][1]                     # first argument holding the minimum
        elif tok == "[MAX":
            value = max(vals)
            dep = args[vals.index(value)][1]
        elif tok == "[MED":
            value = math.floor(statistics.median(vals))
            ranked = sorted(range(len(vals)), key=lambda i: vals[i])   # Python's sort is stable
            mid = {ranked[(len(vals) - 1) // 2], ranked[len(vals) // 2]}
            dep = max(args[i][1] for i in mid)
        else:
            assert tok == "[SM"
            value, dep = sum(vals) % 10, max(a[1] for a in args)
        return value, dep + 1, 1 + max(a[2] for a in args), 3 + sum(a[3] for a in args)

    out = node()
    assert pos == len(tokens)
    return out


def listops_reference_draw(r: random.Random, lo, hi, p_op=0.3, max_args=5):
    """The §7.3 sampler written literally, one recursive tree at a time -> token list."""
    ops = ["[MIN", "[MAX", "[MED", "[SM"]

    def wrap(args):
        return ([r.choice(ops)] + [t for a in args for t in a[0]] + ["]"], 1 + max(a[1] for a in args))

    def tree(m):
        if m == 1 or r.random() > p_op:
            return [str(r.randrange(10))], 1
        return wrap([tree(m - 1) for _ in range(r.randint(2, max_args))])

    t = tree(hi)
    while t[1] < lo:
        args = [tree(hi - 1) for _ in range(r.randint(2, max_args - 1))]
        args.insert(r.randrange(len(args)), t)
        t = wrap(args)
    return t[0]


# ---------------------------------------------------------------------------------------------------
# CTL (§7.1)
# ---------------------------------------------------------------------------------------------------

def test_ctl_tables_check_values():
    t = ndr.ctl_tables()
    assert t[0].tolist() == [6, 1, 5, 7, 0, 4, 2, 3]
    assert t[1].tolist() == [6, 5, 7, 3, 2, 0, 4, 1]


def test_ctl_sizes_vocab_and_depths(ctl):
    assert len(ctl.vocab) == 19 and ctl.classes == ctl.vocab[:8]
    assert {k: len(v) for k, v in ctl.splits.items()} == {"train": 53_704, "iid": 4_000, "valid": 1_000,
                                                          "test": 1_000}
    ranges = {"train": (1, 5), "iid": (2, 5), "valid": (6, 8), "test": (9, 10)}
    for k, (lo, hi) in ranges.items():
        d = ctl.splits[k].depths
        assert d.min() == lo and d.max() == hi, k
        assert np.array_equal(ctl.splits[k].inputs.lengths, d + 1)       # argument + one letter per table
    counts = np.bincount(ctl.splits["train"].depths)
    assert counts[1] == 88 + 480                                          # 11 tables x 8 + (j, k) x 8 x 30


def test_ctl_pool_replay_histogram(ctl):
    """Replay draws 2-3 of §7.1 independently: the pool's depth histogram is 480/4,350/24,010/32,296,
    and train (depth >= 2) and iid are disjoint parts of it that leave 4,000 out (test-IID)."""
    rs = np.random.RandomState(0x12345678)
    for _ in range(11):
        rs.permutation(8)
    reserved = set()
    for d, n in enumerate([1, 3, 21, 183, 200, 200]):
        while len(reserved) < sum([1, 3, 21, 183, 200, 200][:d + 1]):
            reserved.add(tuple(rs.randint(9, size=d).tolist()))
    assert len(reserved) == 608
    pool = set()
    while len(pool) < 61_136:
        comp = tuple(rs.randint(9, size=5)[:rs.randint(2, 6)].tolist())
        if comp in reserved:
            continue
        pool.add(" ".join([f"{rs.randint(8):03b}"] + ["abcdefghi"[c] for c in reversed(comp)]))
    assert np.bincount([len(p.split()) - 1 for p in pool]).tolist() == [0, 0, 480, 4_350, 24_010, 32_296]
    train = {" ".join(t) for t, d in zip(texts(ctl, "train"), ctl.splits["train"].depths) if d >= 2}
    iid = {" ".join(t) for t in texts(ctl, "iid")}
    assert len(train) == 53_136 and len(iid) == 4_000 and not train & iid
    assert train | iid <= pool


@pytest.mark.parametrize("split", SPLITS)
def test_ctl_answers_and_presentations(ctl, ctl_back, split):
    fwd, back = ctl.splits[split], ctl_back.splits[split]
    assert np.array_equal(fwd.labels, back.labels) and np.array_equal(fwd.depths, back.depths)
    for i, (f, b) in enumerate(zip(texts(ctl, split), texts(ctl_back, split))):
        assert b == f[::-1]
        assert ctl_eval(f) == ctl_eval(b, backward=True) == (fwd.labels[i], fwd.depths[i])
    if split != "train":                 # deeper sets use a..i only and are unique
        joined = [" ".join(t) for t in texts(ctl, split)]
        assert len(set(joined)) == len(joined) and not set("jk") & set(" ".join(joined).split())


def test_ctl_worked_example(ctl, ctl_back):
    x = ctl.encode("101 d a b")
    assert x.tolist() == [5, 11, 8, 9] and ctl_eval("101 d a b".split()) == (3, 3)
    assert ctl_back.encode("b a d 101").tolist() == [9, 8, 11, 5]


def test_ctl_no_overlap(ctl):
    train = {" ".join(t) for t in texts(ctl, "train")}
    for split in ["iid", "valid", "test"]:
        assert not train & {" ".join(t) for t in texts(ctl, split)}, split


# ---------------------------------------------------------------------------------------------------
# Arithmetic (§7.2)
# ---------------------------------------------------------------------------------------------------

def test_arith_sizes_depths_answers(arith):
    assert len(arith.vocab) == 14 and len(arith.classes) == 10
    sizes = {"train": 2_200, "iid": 400, "valid": 100, "test": 100}
    depth_counts = {"train": {1: 200, 2: 500, 3: 500, 4: 500, 5: 500}, "iid": {1: 200, 2: 50, 3: 50, 4: 50, 5: 50},
                    "valid": {6: 100}, "test": {7: 50, 8: 50}}
    for split in SPLITS:
        s = arith.splits[split]
        assert len(s) == sizes[split]
        assert dict(zip(*map(np.ndarray.tolist, np.unique(s.depths, return_counts=True)))) == depth_counts[split]
        exprs = ["".join(t) for t in texts(arith, split)]
        assert len(set(exprs)) == len(exprs) and max(map(len, exprs)) <= 50
        for e, y, d in zip(exprs, s.labels, s.depths):
            assert arith_eval(e) == (y, d), e
    basic = {"".join(t) for t in texts(arith, "train")[:200]}
    assert len(basic) == 200 and basic == {"".join(t) for t in texts(arith, "iid")[:200]}
    train = {"".join(t) for t in texts(arith, "train")}
    for split in ["valid", "test"]:
        assert not train & {"".join(t) for t in texts(arith, split)}


def test_arith_full_size_bins():
    assert ndr.balanced_bins(100_000, 3, 6) == {3: 25_000, 4: 25_000, 5: 25_000, 6: 25_000}
    assert ndr.balanced_bins(1_000, 8, 9) == {8: 500, 9: 500}
    assert ndr.balanced_bins(10, 3, 6) == {3: 3, 4: 3, 5: 2, 6: 2}


def test_arith_sampler_depth_range():
    u = ndr._uniform_stream(np.random.default_rng(1))
    for lo, hi, p in [(3, 6, 0.2), (7, 7, 0.3), (8, 9, 0.3)]:
        for _ in range(300):
            expr, value, depth = ndr.arith_sample(u, lo, hi, p)
            assert lo <= depth <= hi and arith_eval(expr) == (value, depth - 1)


def test_arith_worked_example(arith):
    x = arith.encode("((3+4)*(5*2))")
    assert x.tolist() == [0, 0, 7, 2, 8, 1, 3, 0, 9, 3, 6, 1, 1]
    assert arith.decode(x) == "((3+4)*(5*2))" and arith_eval("((3+4)*(5*2))") == (0, 2)


def test_arith_deterministic_and_seeded(tmp_path, arith):
    again = tasks.get_task("arith", cache_dir=str(tmp_path), **SMALL_ARITH)       # fresh generation
    other = tasks.get_task("arith", seed=1, cache_dir=str(tmp_path), **SMALL_ARITH)
    for split in SPLITS:
        a, b = arith.splits[split], again.splits[split]
        assert np.array_equal(a.inputs.tokens, b.inputs.tokens) and np.array_equal(a.labels, b.labels)
    assert not np.array_equal(arith.splits["valid"].inputs.tokens, other.splits["valid"].inputs.tokens)


# ---------------------------------------------------------------------------------------------------
# ListOps (§7.3)
# ---------------------------------------------------------------------------------------------------

def test_listops_sizes_depths_answers(listops):
    assert len(listops.vocab) == 15
    expected = {"train": {1: 200, 2: 200, 3: 200, 4: 200, 5: 200}, "iid": {1: 20, 2: 20, 3: 20, 4: 20, 5: 20},
                "valid": {6: 50}, "test": {7: 10, 8: 10}}
    for split in SPLITS:
        s = listops.splits[split]
        assert dict(zip(*map(np.ndarray.tolist, np.unique(s.depths, return_counts=True)))) == expected[split]
        toks = texts(listops, split)
        assert len({" ".join(t) for t in toks}) == len(toks)
        for t, y, d in zip(toks, s.labels, s.depths):
            value, dep, _, length = listops_eval(t)
            assert (value, dep - 1) == (y, d) and length <= 50, t
    train = {" ".join(t) for t in texts(listops, "train")}
    for split in ["valid", "test"]:
        assert not train & {" ".join(t) for t in texts(listops, split)}


def test_listops_worked_example(listops):
    x = listops.encode("[MED 4 8 5 [MAX 8 4 9 ] ]")
    assert x.tolist() == [3, 9, 13, 10, 2, 13, 9, 14, 0, 0]
    assert listops_eval(listops.decode(x).split()) == (6, 2, 3, 12)


def test_listops_ops_tie_breaks():
    # MIN/MAX pick the first extreme argument; MED the middle of a stable sort (ties in argument order).
    val = np.array([3, 1, 1, 7, 7, 2, 5, 5, 5, 5])
    dd = np.array([1, 4, 1, 2, 1, 1, 1, 6, 1, 3])
    nargs, ones = np.array([3, 2, 5]), np.ones(10, np.int64)
    for op, want_val, want_dd in [(0, [1, 7, 2], [5, 3, 2]), (1, [3, 7, 5], [2, 3, 2]),
                                  (2, [1, 7, 5], [2, 3, 7]), (3, [5, 4, 2], [5, 3, 7])]:
        v, td, d, ln = listops_data._apply_ops(np.full(3, op), nargs, val, ones, dd, ones)
        assert v.tolist() == want_val and d.tolist() == want_dd, op
        assert td.tolist() == [2, 2, 2] and ln.tolist() == [6, 5, 8]


def _profile(draws):
    """Frequencies of: rejected for length, and (dependency depth, tree depth, length/10, value) when kept."""
    out = {}
    for key in draws:
        out[key] = out.get(key, 0) + 1
    return out, len(draws)


@pytest.mark.parametrize("lo,hi", [(2, 6), (4, 5)])
def test_listops_vectorised_sampler_matches_reference(lo, hi):
    """The breadth-first sampler has the distribution of the literal recursive one (§7.3)."""
    r = random.Random(0)
    ref = []
    for _ in range(20_000):
        v, dep, td, ln = listops_eval(listops_reference_draw(r, lo, hi))
        ref.append(("long",) if ln > 50 else (dep, td, (ln - 1) // 10))
    d = listops_data._ListOpsDraws(np.random.default_rng(0), 100_000, lo, hi)
    vec = [("long",) if ln > 50 else (dep, td, (ln - 1) // 10)
           for dep, td, ln in zip(d.dep_depth.tolist(), d.tree_depth.tolist(), d.length.tolist())]
    (pa, na), (pb, nb) = _profile(ref), _profile(vec)
    for key in set(pa) | set(pb):
        fa, fb = pa.get(key, 0) / na, pb.get(key, 0) / nb
        p = (pa.get(key, 0) + pb.get(key, 0)) / (na + nb)
        z = abs(fa - fb) / math.sqrt(p * (1 - p) * (1 / na + 1 / nb))
        assert z < 5, (key, fa, fb)
    again = listops_data._ListOpsDraws(np.random.default_rng(0), 100_000, lo, hi)       # deterministic
    assert np.array_equal(again.value, d.value) and np.array_equal(again.length, d.length)
    # and the vectorised draws are internally consistent with the parser
    for i in np.flatnonzero(d.length <= 50)[:500].tolist():
        value, dep, td, ln = listops_eval([listops_data.ListOpsTask.vocab[t] for t in d.tokens(i)])
        assert (value, dep, td, ln) == (d.value[i], d.dep_depth[i], d.tree_depth[i], d.length[i])


# ---------------------------------------------------------------------------------------------------
# Interface: encode/decode, collate, batches
# ---------------------------------------------------------------------------------------------------

def test_encode_decode_round_trip_and_oov(ctl, arith, listops):
    for task in (ctl, arith, listops):
        s = task.splits["valid"]
        for i in range(0, len(s), 97):
            assert np.array_equal(task.encode(task.decode(s.inputs[i])), s.inputs[i])
    with pytest.raises(ValueError, match="'z'"):
        ctl.encode("101 a z")
    with pytest.raises(ValueError, match="'-'"):
        arith.encode("(3-4)")
    with pytest.raises(ValueError, match="AVG"):
        listops.encode("[AVG 1 2 ]")


def test_get_task_unknown():
    with pytest.raises(ValueError, match="ctl-backward"):
        tasks.get_task("nope")
    assert {"ctl", "ctl-backward", "arith", "listops"} <= set(tasks.TASKS)


def test_collate():
    x, lengths = tasks.collate([np.array([3, 4, 5]), np.array([7])], V=10)
    assert x.tolist() == [[11, 3, 4, 5, 10], [11, 7, 10, 0, 0]] and lengths.tolist() == [5, 3]
    r = tasks.Ragged.from_list([[3, 4, 5], [7]])
    x2, l2 = tasks.collate(r, V=10)
    assert np.array_equal(x, x2) and np.array_equal(lengths, l2) and x.dtype == np.int64


def test_bucketed_batches_cover_each_sample_at_most_once(arith):
    s, B = arith.splits["train"], 64
    n_batches = len(s) // B
    gen = tasks.batches(s, B, np.random.default_rng(0), "bucketed")
    seen, padding = [], 0
    V = len(arith.vocab)
    for _ in range(n_batches):
        x, lengths, y = next(gen)
        assert x.shape == (B, lengths.max()) and y.shape == (B,)
        assert (x[:, 0] == V + 1).all() and (x[np.arange(B), lengths - 1] == V).all()
        # identify samples by their row (inputs are unique within the split)
        seen += [tuple(row[1:n - 1]) for row, n in zip(x.tolist(), lengths.tolist())]
        padding += (lengths.max() - lengths).sum()
    assert len(seen) == len(set(seen)) == n_batches * B
    assert padding < 2 * n_batches * B        # bucketed: < 2 pad tokens per sample (random batches: ~20)
    again = next(tasks.batches(s, B, np.random.default_rng(0), "bucketed"))
    first = next(tasks.batches(s, B, np.random.default_rng(0), "bucketed"))
    assert all(np.array_equal(a, b) for a, b in zip(again, first))


def test_random_batches_and_labels(ctl):
    s = ctl.splits["iid"]
    x, lengths, y = next(tasks.batches(s, 32, np.random.default_rng(1), "random"))
    assert x.shape[0] == 32 and lengths.min() >= 4
    for row, n, label in zip(x, lengths, y):
        assert ctl_eval(ctl.decode(row[1:n - 1]).split())[0] == label
    with pytest.raises(ValueError):
        next(tasks.batches(s, 32, np.random.default_rng(1), "nope"))


@pytest.mark.parametrize("mode", ["balanced", "stratified"])
def test_depth_balanced_batches(ctl, mode):
    """Both cpu-budget modes see every train depth equally often (depth 1 is ~1% of the split); "balanced"
    takes one depth per batch, "stratified" mixes them in every batch. A CTL input of depth d has d + 1 symbols."""
    s = ctl.splits["train"]
    gen = tasks.batches(s, 32, np.random.default_rng(0), mode)
    counts, mixed = np.zeros(6), 0
    for _ in range(500):
        x, lengths, y = next(gen)
        depth = lengths - 3                              # SOS + (depth + 1 symbols) + EOS
        counts += np.bincount(depth, minlength=6)
        mixed += len(np.unique(depth)) > 1
    for row, n, label in zip(x, lengths, y):
        assert ctl_eval(ctl.decode(row[1:n - 1]).split())[0] == label
    share = counts[1:] / counts.sum()
    assert counts[0] == 0 and np.all(np.abs(share - 0.2) < 0.06), share   # 500 draws of a depth: s.d. 0.018
    assert mixed == (0 if mode == "balanced" else 500)
    again = next(tasks.batches(s, 64, np.random.default_rng(0), mode))
    first = next(tasks.batches(s, 64, np.random.default_rng(0), mode))
    assert all(np.array_equal(a, b) for a, b in zip(again, first))


def test_eval_batches_aligned(listops):
    s = listops.splits["iid"]
    seen = []
    for x, lengths, y, idx in tasks.eval_batches(s, 30, return_index=True):
        for row, n, label, i in zip(x, lengths, y, idx):
            assert np.array_equal(row[1:n - 1], s.inputs[i]) and label == s.labels[i]
        seen += idx.tolist()
    assert sorted(seen) == list(range(len(s)))
    assert [len(b[2]) for b in tasks.eval_batches(s, 30)] == [30, 30, 30, 10]


# ---------------------------------------------------------------------------------------------------
# Cache
# ---------------------------------------------------------------------------------------------------

def test_cache_round_trip_and_corruption(tmp_path, recwarn):
    kw = dict(cache_dir=str(tmp_path), **SMALL_ARITH)
    first = tasks.get_task("arith", **kw)
    files = os.listdir(tmp_path)
    assert len(files) == 1 and files[0].startswith("arith-") and files[0].endswith(".npz")   # no temp left
    path = tmp_path / files[0]
    loaded = tasks.get_task("arith", **kw)
    for split in SPLITS:
        a, b = first.splits[split], loaded.splits[split]
        assert np.array_equal(a.inputs.tokens, b.inputs.tokens) and np.array_equal(a.inputs.offsets, b.inputs.offsets)
        assert np.array_equal(a.labels, b.labels) and np.array_equal(a.depths, b.depths)
    assert not recwarn.list
    good = path.read_bytes()
    for bad in (good[: len(good) // 2], good[:3000] + bytes(500) + good[3500:], b"junk"):
        path.write_bytes(bad)
        with pytest.warns(UserWarning, match="regenerating"):
            again = tasks.get_task("arith", **kw)
        assert np.array_equal(again.splits["test"].inputs.tokens, first.splits["test"].inputs.tokens)
        with warnings.catch_warnings():
            warnings.simplefilter("error")                                   # rewritten: loads cleanly
            tasks.get_task("arith", **kw)
    tasks.get_task("arith", cache_dir=str(tmp_path), n_train=40, n_iid=4, n_valid=2, n_test=2)
    assert len(os.listdir(tmp_path)) == 2                                    # other parameters, other file


# ---------------------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------------------

def test_cli_export_and_stats(ctl, cache, tmp_path, capsys):
    assert tasks.main(["export", "--task", "ctl-backward", "--out", str(tmp_path), "--cache-dir", cache]) == 0
    lines = (tmp_path / "test.tsv").read_text().splitlines()
    assert len(lines) == 1_000
    inp, label = lines[0].split("\t")
    assert ctl_eval(inp.split(), backward=True)[0] == int(label, 2)
    assert sorted(os.listdir(tmp_path)) == ["iid.tsv", "test.tsv", "train.tsv", "valid.tsv"]
    assert tasks.main(["stats", "--task", "ctl", "--cache-dir", cache]) == 0
    out = capsys.readouterr().out
    assert "53,704" in out
    iid = ctl.splits["iid"]
    assert f"majority class {np.bincount(iid.labels).max() / len(iid):.3f}" in next(
        line for line in out.splitlines() if line.strip().startswith("iid:"))


def test_cli_unknown_task():
    script = os.path.join(os.path.dirname(tasks.__file__), "tasks.py")
    p = subprocess.run([sys.executable, script, "stats", "--task", "nope"], capture_output=True, text=True)
    assert p.returncode == 2 and "unknown task 'nope'" in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1 and "Traceback" not in p.stderr


def test_cli_unknown_task_option_names_the_valid_ones(capsys):
    assert tasks.main(["stats", "--task", "arith", "--set", "n_trian=100"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no option 'n_trian'" in err and "n_train" in err.split("valid:")[1]
