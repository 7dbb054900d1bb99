"""Data for the Neural Data Router tasks (spec ndr.md §7) behind one small interface (design guide §6).

Every task is a ClassificationTask: a vocabulary of input tokens, a list of classes, a readout column and
four named splits (spec names.md): ``train``, ``iid`` (reported IID), ``valid`` (deeper, model selection)
and ``test`` (deepest, reported "Test"/"Longer").

    task = get_task("ctl")                        # generated once, then cached on disk
    train = batches(task.splits["train"], 512, np.random.default_rng(0), "bucketed")   # endless
    x, lengths, y = next(train)                   # x: (B, T) rows [SOS, x_1..x_n, EOS] + 0-padding
    for x, lengths, y in eval_batches(task.splits["test"], 1024):
        ...

Token ids: the task's input tokens are 0..V-1 (V = len(task.vocab)); the model adds EOS = V and
SOS = V+1 (spec §1.1). Depths are given in the paper's convention: the number of operations
(CTL: composition length; arithmetic: code depth - 1; ListOps: dependency depth - 1).

Generated data is cached under ``cache_dir`` (default: $MINATTN_CACHE or ~/.cache/minattn) in an .npz
file named by a hash of every generation parameter; it is written atomically, and an unreadable file
is regenerated. Command line: ``python tasks.py export --task ctl --out DIR`` and
``python tasks.py stats --task ctl``.

Only NumPy, tqdm and the standard library are used: nothing in minattn/ depends on this file.
"""
from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import math
import os
import sys
import tempfile
import time
import warnings
import zlib
from dataclasses import dataclass

import numpy as np
from tqdm import tqdm

FORMAT_VERSION = 1  # bump whenever a generator or the file layout changes: old cache files are ignored


# ----------------------------------------------------------------------------------------------------
# Containers
# ----------------------------------------------------------------------------------------------------

class Ragged:
    """A read-only sequence of 1-D int64 arrays stored as one flat array plus offsets.

    Behaves like a list of arrays (``len``, ``x[i]``, iteration), but 1,000,000 ListOps samples cost
    one array instead of a million small objects. ``x[i]`` is a view of ``tokens``.
    """

    def __init__(self, tokens, offsets):
        self.tokens = np.asarray(tokens, dtype=np.int64)
        self.offsets = np.asarray(offsets, dtype=np.int64)

    @classmethod
    def from_list(cls, seqs):
        lengths = np.array([len(s) for s in seqs], dtype=np.int64)
        offsets = np.concatenate([[0], np.cumsum(lengths)])
        tokens = np.concatenate([np.asarray(s, dtype=np.int64) for s in seqs]) if len(seqs) else []
        return cls(tokens, offsets)

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)

    def __len__(self):
        return len(self.offsets) - 1

    def __getitem__(self, i):
        if not -len(self) <= i < len(self):
            raise IndexError(i)
        i %= len(self)
        return self.tokens[self.offsets[i]:self.offsets[i + 1]]

    def __iter__(self):
        return (self[i] for i in range(len(self)))

    def reversed_rows(self) -> "Ragged":
        """Every sequence reversed (used for the backward CTL presentation)."""
        lengths = self.lengths
        starts = np.repeat(self.offsets[:-1], lengths)
        pos = np.arange(len(self.tokens)) - starts
        return Ragged(self.tokens[starts + np.repeat(lengths, lengths) - 1 - pos], self.offsets)


@dataclass
class ClassificationSplit:
    """One split: ``inputs[i]`` (token ids, no SOS/EOS) has class ``labels[i]`` and paper depth ``depths[i]``."""
    inputs: Ragged          # N sequences of int64 ids in 0..V-1 (a list of arrays works too)
    labels: np.ndarray      # (N,) int64 class ids
    depths: np.ndarray      # (N,) int64 depth in the paper's convention (number of operations)
    vocab_size: int = None  # V of the task (EOS = V, SOS = V + 1); set by the task

    def __len__(self):
        return len(self.labels)


class ClassificationTask:
    """Base class: vocabulary, classes, readout column and the splits of one task.

    Subclasses set the class attributes and implement ``_params`` (every generation parameter, hashed
    into the cache file name) and ``_generate`` (returns {split: ClassificationSplit}).
    """
    name: str = ""
    vocab: list = []          # input tokens; id = index
    classes: list = []        # class names; class id = index
    readout: str = "eos"      # column read by the classifier: "eos" (index n+1) or "sos" (index 0), spec §1.4
    char_level = False        # True: one token per character; False: tokens separated by spaces
    cache_key = None          # tasks that share data (ctl, ctl-backward) share a cache file

    def __init__(self, seed: int = 0, cache_dir=None):
        self.seed = seed
        self._index = {t: i for i, t in enumerate(self.vocab)}
        params = {"seed": seed, "vocab": list(self.vocab), "classes": list(self.classes), **self._params()}
        self.splits = load_or_generate(self.cache_key or self.name, params, self._generate, cache_dir)
        for s in self.splits.values():
            s.vocab_size = len(self.vocab)

    def _params(self) -> dict:
        raise NotImplementedError

    def _generate(self) -> dict:
        raise NotImplementedError

    def tokenize(self, text: str) -> list:
        return [c for c in text if not c.isspace()] if self.char_level else text.split()

    def encode(self, text: str) -> np.ndarray:
        """Text -> int64 ids (no SOS/EOS). Raises ValueError naming the first unknown token."""
        ids = []
        for tok in self.tokenize(text):
            if tok not in self._index:
                raise ValueError(f"{self.name}: unknown token {tok!r} (vocabulary: {' '.join(self.vocab)})")
            ids.append(self._index[tok])
        return np.array(ids, dtype=np.int64)

    def decode(self, ids) -> str:
        """Ids -> text; the inverse of encode (ids V and V+1 are shown as <eos> and <sos>)."""
        names = list(self.vocab) + ["<eos>", "<sos>"]
        return ("" if self.char_level else " ").join(names[int(i)] for i in ids)

    def __repr__(self):
        sizes = ", ".join(f"{k}={len(v)}" for k, v in self.splits.items())
        return f"<{type(self).__name__} {self.name!r}: V={len(self.vocab)}, {len(self.classes)} classes, {sizes}>"


def _split(seqs, labels, depths) -> ClassificationSplit:
    inputs = seqs if isinstance(seqs, Ragged) else Ragged.from_list(seqs)
    return ClassificationSplit(inputs, np.asarray(labels, np.int64), np.asarray(depths, np.int64))


# ----------------------------------------------------------------------------------------------------
# Batching (spec §1.1 for the layout, §6.4 for the order)
# ----------------------------------------------------------------------------------------------------

def collate(seqs, V: int):
    """Sequences -> (x, lengths): x (B, T) int64 rows [SOS, x_1..x_n, EOS] right-padded with 0 to the
    longest row, lengths (B,) = n + 2. EOS = V, SOS = V + 1 (spec §1.1)."""
    if isinstance(seqs, Ragged):
        return _collate_ragged(seqs, np.arange(len(seqs)), V)
    lengths = np.array([len(s) for s in seqs], dtype=np.int64) + 2
    x = np.zeros((len(seqs), lengths.max(initial=2)), dtype=np.int64)
    x[:, 0] = V + 1
    for row, s in zip(x, seqs):
        row[1:len(s) + 1] = s
    x[np.arange(len(seqs)), lengths - 1] = V
    return x, lengths


def _collate_ragged(inputs: Ragged, idx, V: int):
    """collate() for rows idx of a Ragged, without a Python loop."""
    n = inputs.offsets[idx + 1] - inputs.offsets[idx]
    B = len(idx)
    x = np.zeros((B, n.max(initial=0) + 2), dtype=np.int64)
    x[:, 0] = V + 1
    rows = np.repeat(np.arange(B), n)
    cols = np.arange(n.sum()) - np.repeat(np.cumsum(n) - n, n)        # position inside each sequence
    x[rows, cols + 1] = inputs.tokens[np.repeat(inputs.offsets[idx], n) + cols]
    x[np.arange(B), n + 1] = V
    return x, n + 2


def _vocab_size(split: ClassificationSplit, V):
    V = split.vocab_size if V is None else V
    if V is None:
        raise TypeError("the split does not know its vocabulary size: pass V=len(task.vocab)")
    return V


def batches(split: ClassificationSplit, batch_size: int, rng: np.random.Generator, mode: str = "bucketed",
            V: int = None):
    """Endless training batches (x, lengths, y) of exactly batch_size samples (layout: see collate).

    mode "bucketed" (spec §6.4): each pass shuffles the split, drops the remainder, stable-sorts by input
    length, cuts consecutive batches and visits them in random order, so each sample appears at most
    once per pass and padding is rare. mode "random": batch_size indices uniformly with replacement.
    mode "balanced": each batch draws one depth uniformly and batch_size samples of it with replacement.
    mode "stratified": every sample draws its depth uniformly (then a sample of it), so batches mix depths.
    All randomness comes from rng, so a seeded Generator gives the same stream. V defaults to
    split.vocab_size. Bad arguments raise ValueError here, not at the first batch.
    """
    if mode not in ("bucketed", "random", "balanced", "stratified"):
        raise ValueError(f"unknown batching mode {mode!r} (valid: bucketed, random, balanced, stratified)")
    if batch_size < 1:
        raise ValueError(f"batch size must be ≥ 1, got {batch_size}")
    if mode == "bucketed" and len(split) < batch_size:
        raise ValueError(f"split of {len(split)} samples is smaller than one batch of {batch_size}")
    return _batches(split, batch_size, rng, mode, _vocab_size(split, V))


def _batches(split, batch_size, rng, mode, V):
    inputs, labels, N = split.inputs, split.labels, len(split)
    as_ragged = inputs if isinstance(inputs, Ragged) else Ragged.from_list(list(inputs))
    if mode == "random":
        while True:
            idx = rng.integers(0, N, batch_size)
            yield (*_collate_ragged(as_ragged, idx, V), labels[idx])
    if mode in ("balanced", "stratified"):
        # Not in the papers: cpu-budget choices. Depths are drawn uniformly, so shallow samples (1% of CTL's
        # train split) are seen as often as deep ones: one depth per batch ("balanced"), or one per sample
        # ("stratified": every batch mixes depths, padded to its deepest sample).
        by_depth = np.argsort(split.depths, kind="stable")                 # sample indices, grouped by depth
        sizes = np.unique(split.depths, return_counts=True)[1]
        starts = np.cumsum(sizes) - sizes
        while True:
            g = rng.integers(len(sizes)) if mode == "balanced" else rng.integers(0, len(sizes), batch_size)
            idx = by_depth[starts[g] + rng.integers(0, sizes[g], batch_size)]    # with replacement
            yield (*_collate_ragged(as_ragged, idx, V), labels[idx])
    lengths = as_ragged.lengths                                           # mode "bucketed"
    n_batches = N // batch_size
    while True:
        perm = rng.permutation(N)[:n_batches * batch_size]                # shuffle, drop the remainder
        perm = perm[np.argsort(lengths[perm], kind="stable")]             # stable sort by length
        for b in rng.permutation(n_batches):                              # batches in random order
            idx = perm[b * batch_size:(b + 1) * batch_size]
            yield (*_collate_ragged(as_ragged, idx, V), labels[idx])


def eval_batches(split: ClassificationSplit, batch_size: int, V: int = None, return_index: bool = False):
    """One deterministic pass over the split: (x, lengths, y) batches in order of input length (stable),
    the last one partial. With return_index=True each batch also carries the sample indices (e.g. to
    look up split.depths for per-depth accuracy)."""
    V = _vocab_size(split, V)
    inputs = split.inputs if isinstance(split.inputs, Ragged) else Ragged.from_list(list(split.inputs))
    order = np.argsort(inputs.lengths, kind="stable")
    for start in range(0, len(order), batch_size):
        idx = order[start:start + batch_size]
        out = (*_collate_ragged(inputs, idx, V), split.labels[idx])
        yield (*out, idx) if return_index else out


# ----------------------------------------------------------------------------------------------------
# Disk cache
# ----------------------------------------------------------------------------------------------------

def default_cache_dir() -> str:
    return os.environ.get("MINATTN_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "minattn")


def _meta(name: str, params: dict) -> str:
    return json.dumps({"format": FORMAT_VERSION, "task": name, **params}, sort_keys=True)


def cache_path(name: str, params: dict, cache_dir=None) -> str:
    """The cache file of a dataset: its name hashes the format version and every generation parameter."""
    digest = hashlib.sha256(_meta(name, params).encode()).hexdigest()[:16]
    return os.path.join(cache_dir or default_cache_dir(), f"{name}-{digest}.npz")


def load_or_generate(name: str, params: dict, generate, cache_dir=None) -> dict:
    """Load {split: ClassificationSplit} from the cache, or call generate() and cache its result.

    A missing, truncated, corrupted or mismatching file is regenerated (with a warning unless missing);
    failing to write the cache only warns.
    """
    path, meta = cache_path(name, params, cache_dir), _meta(name, params)
    if os.path.exists(path):
        try:
            return _load(path, meta, len(params["vocab"]), len(params["classes"]))
        except Exception as e:  # any damage (zip, CRC, header, shapes) just means "generate again"
            warnings.warn(f"unreadable cache file {path} ({type(e).__name__}: {e}); regenerating")
    # a line on stderr whether or not it is a terminal (the tqdm bars are shown only on one): ListOps takes minutes
    print(f"generating {name} (once: it is then cached in {path})...", file=sys.stderr, flush=True)
    start = time.perf_counter()
    splits = generate()
    print(f"generated {name} in {time.perf_counter() - start:.0f} s", file=sys.stderr, flush=True)
    try:
        _save(path, meta, splits)
    except OSError as e:
        warnings.warn(f"could not write cache file {path}: {e}")
    return splits


def _save(path: str, meta: str, splits: dict):
    arrays = {"meta": np.array(meta), "splits": np.array(json.dumps(list(splits)))}
    for k, s in splits.items():
        inputs = s.inputs if isinstance(s.inputs, Ragged) else Ragged.from_list(list(s.inputs))
        arrays[f"{k}.tokens"] = inputs.tokens.astype(np.uint8)   # every vocabulary here has < 256 tokens
        arrays[f"{k}.offsets"] = inputs.offsets
        arrays[f"{k}.labels"] = s.labels
        arrays[f"{k}.depths"] = s.depths
    os.makedirs(os.path.dirname(path), exist_ok=True)
    # Write a temporary file in the same directory, then rename: readers never see a half-written file.
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".tmp-", suffix=".npz")
    try:
        with os.fdopen(fd, "wb") as f:
            np.savez(f, **arrays)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _load(path: str, meta: str, V: int, n_classes: int) -> dict:
    with np.load(path, allow_pickle=False) as f:
        if str(f["meta"]) != meta:
            raise ValueError("parameters differ (hash collision or edited file)")
        splits = {}
        for k in json.loads(str(f["splits"])):
            tokens, offsets = f[f"{k}.tokens"].astype(np.int64), f[f"{k}.offsets"]
            labels, depths = f[f"{k}.labels"], f[f"{k}.depths"]
            n = len(labels)
            ok = (len(offsets) == n + 1 and len(depths) == n and offsets[0] == 0
                  and offsets[-1] == len(tokens) and np.all(np.diff(offsets) >= 0)
                  and np.all(tokens < V) and np.all((labels >= 0) & (labels < n_classes)))
            if not ok:
                raise ValueError(f"split {k!r} is inconsistent")
            splits[k] = ClassificationSplit(Ragged(tokens, offsets), labels.astype(np.int64), depths.astype(np.int64))
    return splits


def _rng(seed: int, name: str) -> np.random.Generator:
    """An independent, reproducible stream per (seed, task/split) pair."""
    return np.random.default_rng([seed, zlib.crc32(name.encode())])


# ----------------------------------------------------------------------------------------------------
# Compositional table lookup (spec §7.1)
# ----------------------------------------------------------------------------------------------------

CTL_SEED = 0x12345678


def ctl_tables() -> np.ndarray:
    """The 11 tables a..k: permutation(8) drawn in order from RandomState(0x12345678) (spec §7.1.2)."""
    rs = np.random.RandomState(CTL_SEED)
    return np.stack([rs.permutation(8) for _ in range(11)])


class CTLTask(ClassificationTask):
    """Compositional table lookup, forward presentation (spec §7.1; code ``ctl.reversed=1``).

    Eleven random bijections a..k of the 8 symbols 000..111 (ids 0..7; letters are ids 8..18). The
    input is the argument followed by the functions in the order they are applied; the answer (one of
    the 8 symbols) is read at EOS. Worked example, with d = [4,2,1,5,0,7,3,6], a = [6,1,5,7,0,4,2,3],
    b = [6,5,7,3,2,0,4,1]:

        "101 d a b"  means b(a(d(101))):  d(5) = 7, a(7) = 3, b(3) = 3  ->  class "011" (id 3)
        ids [5, 11, 8, 9]  ->  model input [SOS=20, 5, 11, 8, 9, EOS=19], depth 3

    Splits (names.md): train (53,704; depth 1-5), iid (the spec's valid-IID, 4,000; depth 2-5), valid
    (deeper_val, 1,000; depth 6-8), test (deeper, "Longer", 1,000; depth 9-10). The spec's test-IID
    (4,000) is held out of train but not exposed. ``seed`` only chooses which pool items become
    test-IID/valid-IID (the official code used an unseeded RNG there); everything else replays the
    fixed RandomState(0x12345678) draw order of spec §7.1.5.
    """
    name = "ctl"
    cache_key = "ctl"
    SYMBOLS = [f"{i:03b}" for i in range(8)]
    LETTERS = list("abcdefghijk")
    vocab = SYMBOLS + LETTERS
    classes = SYMBOLS
    readout = "eos"
    backward = False
    N_COMPOSED = 9          # only a..i appear in compositions (§7.1.2)

    def __init__(self, seed: int = 0, cache_dir=None):
        super().__init__(seed, cache_dir)
        if self.backward:  # the cache stores the forward presentation; backward is its mirror image
            self.splits = {k: ClassificationSplit(s.inputs.reversed_rows(), s.labels, s.depths, s.vocab_size)
                           for k, s in self.splits.items()}

    def _params(self):
        return {"rng": CTL_SEED, "n_tables": 11, "n_composed": self.N_COMPOSED, "max_depth": 5,
                "reserve_max": 200, "iid_pool": 61_136, "n_test_iid": 4_000, "deeper_val": [6, 8, 1_000],
                "deeper": [9, 10, 1_000], "repeats": 30, "presentation": "forward"}

    def encode_sample(self, arg: int, comp) -> list:
        """Forward ids of c_1(...c_n(arg)) for comp = (c_1..c_n): [arg, c_n, ..., c_1] (§7.1.4)."""
        return [arg] + [8 + c for c in reversed(comp)]

    def _generate(self):
        rs = np.random.RandomState(CTL_SEED)
        tables = np.stack([rs.permutation(8) for _ in range(11)])                    # §7.1.2

        def unique(n, draw):
            """Draw (arg, comp) pairs until n distinct ones exist (dict keeps first-seen order)."""
            out = {}
            while len(out) < n:
                arg, comp = draw()
                out.setdefault((int(arg), tuple(int(c) for c in comp)), None)
            return list(out)

        # §7.1.6 reserved compositions: ceil(min(200, 9^d / 4)) per depth 0..5 -> 1+3+21+183+200+200 = 608
        reserved = set()
        for d in range(6):
            target = len(reserved) + math.ceil(min(200, 0.25 * self.N_COMPOSED ** d))
            while len(reserved) < target:
                reserved.add(tuple(rs.randint(self.N_COMPOSED, size=d).tolist()))

        # §7.1.7 IID pool: composition (5 draws, then its length 2..5), redrawn while reserved; then argument
        def draw_iid():
            while True:
                comp = tuple(rs.randint(self.N_COMPOSED, size=5)[:rs.randint(2, 6)].tolist())
                if comp not in reserved:
                    return rs.randint(8), comp
        n_comps = sum(self.N_COMPOSED ** d for d in range(2, 6))                      # 66,420
        n_iid, n_test = 8 * n_comps // 10, 4_000                                     # 53,136 and 4,000
        pool = unique(n_iid + 2 * n_test, draw_iid)                                  # 61,136

        # §7.1.5: the two unreported "new primitive" sets use tables j (9) and k (10); they are drawn only
        # to keep the RandomState in step for deeper_val and deeper.
        def draw_new_primitive_1():
            arg = rs.randint(8)
            comp = rs.randint(10, size=5)[:rs.randint(2, 6)]
            comp[rs.randint(len(comp))] = 9
            return arg, comp

        def draw_new_primitive_2():
            arg = rs.randint(8)
            comp = rs.randint(10, size=5)[:rs.randint(2, 6)]
            comp[comp == 9] = 10
            comp[rs.randint(len(comp))] = 10
            return arg, comp
        unique(1_000, draw_new_primitive_1)
        unique(3_000, draw_new_primitive_2)

        # §7.1.10: argument first, then the composition (first randint(lo, hi+1) of `size` draws)
        deeper_val = unique(1_000, lambda: (rs.randint(8), rs.randint(9, size=8)[:rs.randint(6, 9)]))
        deeper = unique(1_000, lambda: (rs.randint(8), rs.randint(9, size=10)[:rs.randint(9, 11)]))

        # §7.1.8: 8,000 pool items go to test-IID (first 4,000) and valid-IID (= our "iid"); the rest train
        held = _rng(self.seed, "ctl/iid-split").choice(len(pool), 2 * n_test, replace=False)
        is_train = np.ones(len(pool), bool)
        is_train[held] = False
        iid = [pool[i] for i in np.sort(held[n_test:])]

        # §7.1.9 train = 88 single tables + 53,136 IID + tables j, k x 8 arguments x 30 repeats = 53,704
        basic = [(a, (t,)) for t in range(11) for a in range(8)]
        repeats = [(a, (t,)) for t in (9, 10) for _ in range(30) for a in range(8)]
        train = basic + [p for p, keep in zip(pool, is_train) if keep] + repeats

        def make(samples):
            labels = []
            for arg, comp in samples:
                y = arg
                for c in reversed(comp):        # c_1(c_2(...c_n(x))): apply c_n first (§7.1.3)
                    y = tables[c][y]
                labels.append(y)
            return _split([self.encode_sample(a, c) for a, c in samples], labels, [len(c) for _, c in samples])

        return {"train": make(train), "iid": make(iid), "valid": make(deeper_val), "test": make(deeper)}


class CTLBackwardTask(CTLTask):
    """CTL, backward presentation (spec §7.1.4; code ``ctl.reversed=0``): ordinary notation, functions
    first and the argument last. The same samples as ``ctl``, each sequence reversed:

        "b a d 101"  means b(a(d(101))) = 011 (class 3);  ids [9, 8, 11, 5]

    The answer is still read at EOS.
    """
    name = "ctl-backward"
    backward = True


# ----------------------------------------------------------------------------------------------------
# Simple arithmetic (spec §7.2)
# ----------------------------------------------------------------------------------------------------

def _uniform_stream(rng: np.random.Generator):
    """Endless U[0, 1) floats drawn from rng in blocks: a Python call per draw is the bottleneck of the
    recursive samplers. Integers use int(u * k) (bias below 1e-15)."""
    return itertools.chain.from_iterable(iter(lambda: rng.random(1 << 16).tolist(), None)).__next__


def arith_sample(u, min_depth: int, max_depth: int, p: float):
    """One draw of the get_one sampler of spec §7.2.3 (code depths); u() yields U[0, 1) floats.

    Returns (expression, value mod 10, code depth). Draw order as in the code: children before the
    operator; while too shallow, a fresh get(2) subtree becomes the LEFT operand of a new root. (The
    code also draws an unused rand() there; it does not change the distribution and is not drawn.)
    """
    def node(a, b):
        op = int(u() * 2)
        value = (a[1] + b[1]) % 10 if op == 0 else (a[1] * b[1]) % 10
        return f"({a[0]}{'+*'[op]}{b[0]})", value, 1 + max(a[2], b[2])

    def get(d):
        if d >= max_depth or u() > p:
            v = int(u() * 10)
            return str(v), v, 1
        a = get(d + 1)
        return node(a, get(d + 1))

    s = get(1)
    while s[2] < min_depth:
        s = node(get(2), s)
    return s


def balanced_bins(n: int, lo: int, hi: int) -> dict:
    """Split n over depths lo..hi as ceil(remaining / depths left) per depth (spec §7.2.4)."""
    bins, remaining = {}, n
    for d in range(lo, hi + 1):
        bins[d] = math.ceil(remaining / (hi - d + 1))
        remaining -= bins[d]
    return bins


class ArithTask(ClassificationTask):
    """Simple arithmetic mod 10 (spec §7.2): fully bracketed + and * over digits, one token per character.

    Worked example: "((3+4)*(5*2))": 3+4 = 7 and 5*2 = 10 -> 0 (every node is reduced mod 10), so the
    answer is 7*0 = 0 (class "0"). Code depth: leaf 1, node 1 + max(children) = 3, so its paper
    depth (what ``depths`` stores) is 3 - 1 = 2. Ids: "(" 0, ")" 1, "+" 2, "*" 3, digit k -> 4 + k:
    [0, 0, 7, 2, 8, 1, 3, 0, 9, 3, 6, 1, 1].

    Splits (code depths; p = probability of an operation; at most 50 characters):
      train  basic 200 "(a op b)" + 25,000 each at depths 3..6, p 0.2   (100,200; paper depth 1-5)
      iid    basic 200 + 250 each at depths 3..6, p 0.2                 (1,200; 1-5)
      valid  1,000 at depth 7, p 0.3                                    (6)
      test   500 each at depths 8 and 9, p 0.3                          (7-8)
    The basic set is in both train and iid; no other overlap is removed (§7.2.5). Sizes are the
    balanced part (the basic 200 come on top) and may be shrunk for tests.

    Readout: "eos" is the default, as for NDR and "+ abs/rel + gate"; the code's "Transformer" and
    "+ rel" arithmetic baselines read SOS instead (spec §1.4) -- the trainer chooses per model.
    """
    name = "arith"
    DIGITS = [str(i) for i in range(10)]
    vocab = ["(", ")", "+", "*"] + DIGITS
    classes = DIGITS
    readout = "eos"
    char_level = True
    SPLITS = {"train": (2, 6, 0.2), "iid": (2, 6, 0.2), "valid": (7, 7, 0.3), "test": (8, 9, 0.3)}

    def __init__(self, seed: int = 0, cache_dir=None, n_train: int = 100_000, n_iid: int = 1_000,
                 n_valid: int = 1_000, n_test: int = 1_000, max_length: int = 50):
        self.sizes = {"train": n_train, "iid": n_iid, "valid": n_valid, "test": n_test}
        self.max_length = max_length
        super().__init__(seed, cache_dir)

    def _params(self):
        return {"splits": self.SPLITS, "sizes": self.sizes, "max_length": self.max_length, "sampler": 1}

    def basic_set(self):
        """All 200 "(a op b)" (§7.2.5)."""
        return [(f"({a}{op}{b})", (a + b) % 10 if op == "+" else (a * b) % 10, 2)
                for op in "+*" for a in range(10) for b in range(10)]

    def _balanced(self, split: str, lo: int, hi: int, p: float, n: int):
        """Rejection-sample n distinct expressions with balanced code depths lo..hi (§7.2.3-4)."""
        u = _uniform_stream(_rng(self.seed, f"arith/{split}"))
        bins, seen, out = balanced_bins(n, lo, hi), set(), []
        with tqdm(total=n, desc=f"arith {split}", disable=None, leave=False) as bar:
            while len(out) < n:
                s = arith_sample(u, lo, hi, p)
                if len(s[0]) > self.max_length or s[0] in seen:   # too long: resample; repeats: rejected
                    continue
                seen.add(s[0])
                if bins.get(s[2], 0) > 0:
                    bins[s[2]] -= 1
                    out.append(s)
                    bar.update()
        return out

    def _generate(self):
        lut = np.zeros(256, np.int64)
        lut[[ord(t) for t in self.vocab]] = np.arange(len(self.vocab))
        splits = {}
        for split, (lo, hi, p) in self.SPLITS.items():
            samples = self.basic_set() if lo == 2 else []
            samples += self._balanced(split, max(lo, 3), hi, p, self.sizes[split])
            seqs = [lut[np.frombuffer(e.encode(), np.uint8)] for e, _, _ in samples]
            splits[split] = _split(seqs, [v for _, v, _ in samples], [d - 1 for _, _, d in samples])
        return splits


# ----------------------------------------------------------------------------------------------------
# ListOps with dependency depth (spec §7.3), vectorised
# ----------------------------------------------------------------------------------------------------
#
# The sampler of §7.3.3 is a recursive branching process, and the deep sets are rare events (about 1 in
# 15,000 draws reaches dependency depth 9 within 50 length units), so a one-tree-at-a-time Python sampler
# needs ~15 minutes for the spec's sets. Here a whole chunk of independent draws grows breadth-first with
# NumPy: every node makes the same independent choices as in §7.3.3 (leaf vs operation, argument count,
# digit, operation), only in a different order of the random stream, so the distribution is exactly the
# spec's. A draw whose length already exceeds the limit stops growing (its remaining nodes stay leaves):
# it is rejected either way, because the length only grows.

LISTOPS_OPS = ["[MIN", "[MAX", "[MED", "[SM"]
_CLOSE, _OP0, _DIGIT0 = 0, 1, 5   # ids of "]", the first operation and digit 0 in ListOpsTask.vocab


def _apply_ops(op, nargs, cval, ctd, cdd, clen):
    """Evaluate operations whose arguments are consecutive segments of the child arrays (§7.3.1, §7.3.4).

    op, nargs: (K,) operation ids (MIN, MAX, MED, SM) and argument counts (2..5); c*: value, tree depth,
    dependency depth and length of the sum(nargs) arguments. Returns the same four for the K results.
    """
    starts = np.cumsum(nargs) - nargs
    seg = np.repeat(np.arange(len(nargs)), nargs)
    pos = np.arange(len(cval)) - starts[seg]                       # argument position, < 8
    # MIN/MAX select the FIRST argument holding the extreme value: break ties by position in the key.
    i_min = starts + np.minimum.reduceat(cval * 8 + pos, starts) % 8
    i_max = starts + 7 - np.maximum.reduceat(cval * 8 + (7 - pos), starts) % 8
    # MED: sort each segment by value, ties in argument order (the keys are unique, so this is stable);
    # the middle one or two arguments decide both the value and the dependency depth.
    order = np.argsort(seg * 128 + cval * 8 + pos)
    i_lo, i_hi = order[starts + (nargs - 1) // 2], order[starts + nargs // 2]
    val = np.choose(op, [cval[i_min], cval[i_max], (cval[i_lo] + cval[i_hi]) // 2,
                         np.add.reduceat(cval, starts) % 10])
    dd = 1 + np.choose(op, [cdd[i_min], cdd[i_max], np.maximum(cdd[i_lo], cdd[i_hi]),
                            np.maximum.reduceat(cdd, starts)])
    return val, 1 + np.maximum.reduceat(ctd, starts), dd, 3 + np.add.reduceat(clen, starts)


def _grow(rng, owner, m, length, max_len, p_op, max_args):
    """Grow one tree(m) (§7.3.3) for each entry of owner (the draw it belongs to), level by level.

    length[draw] holds a running lower bound of the draw's length (3 per operation, 1 per leaf or
    pending node) and is updated in place. Returns levels [(nargs, digit, op)], root level first; the
    children of level l are level l+1 in parent order.
    """
    levels = []
    while len(owner):
        k = len(owner)
        grow = (rng.random(k) <= p_op) & (length[owner] <= max_len) if m > 1 else np.zeros(k, bool)
        nargs = np.where(grow, rng.integers(2, max_args + 1, k), 0)
        digit, op = rng.integers(0, 10, k), rng.integers(0, 4, k)
        np.add.at(length, owner[grow], 2 + nargs[grow])           # a leaf (1) becomes 3 + nargs
        levels.append((nargs, digit, op))
        owner, m = np.repeat(owner, nargs), m - 1
    return levels


def _evaluate(levels):
    """Bottom-up (value, tree depth, dependency depth, length) of the roots of a grown forest."""
    stats = None
    for nargs, digit, op in reversed(levels):
        one = np.ones(len(nargs), np.int64)
        val, td, dd, ln = digit.copy(), one, one.copy(), one.copy()
        is_op = nargs > 0
        if is_op.any():
            val[is_op], td[is_op], dd[is_op], ln[is_op] = _apply_ops(op[is_op], nargs[is_op], *stats)
        stats = (val, td, dd, ln)
    return stats


class _ListOpsDraws:
    """n independent draws of the §7.3.3 sampler for a depth range (lo, hi), made at once.

    Attributes value, tree_depth, dep_depth, length: (n,) arrays (length > max_len for rejected draws,
    whose trees were cut short). tokens(i) rebuilds the ids of draw i.
    """

    def __init__(self, rng, n, lo, hi, p_op=0.3, max_args=5, max_len=50):
        length = np.ones(n, np.int64)
        self.root = _grow(rng, np.arange(n), hi, length, max_len, p_op, max_args)
        val, td, dd, ln = _evaluate(self.root)
        # While the tree is shallower than lo: 2..max_args-1 fresh tree(hi-1) arguments, the old tree
        # inserted at randint(#args) (never last), under a random operation. Each round wraps a subset
        # of the previous round's draws, so draw i's wraps are rounds 0..k-1 for some k.
        self.wraps = []
        while True:
            w = np.flatnonzero((td < lo) & (length <= max_len))
            if not len(w):
                break
            k = len(w)
            nn = rng.integers(2, max_args, k)
            pos = rng.integers(0, nn)
            op = rng.integers(0, 4, k)
            length[w] += 3 + nn
            levels = _grow(rng, np.repeat(w, nn), hi - 1, length, max_len, p_op, max_args)
            aval, atd, add, aln = _evaluate(levels)
            # Argument lists of the new roots: fresh arguments with the old tree at position pos.
            total = nn + 1
            seg = np.repeat(np.arange(k), total)
            t = np.arange(total.sum()) - np.repeat(np.cumsum(total) - total, total)
            old = t == pos[seg]
            src = np.where(old, 0, np.repeat(np.cumsum(nn) - nn, total) + t - (t > pos[seg]))
            def args(fresh, current):
                return np.where(old, current[w][seg], fresh[src])
            val[w], td[w], dd[w], ln[w] = _apply_ops(op, total, args(aval, val), args(atd, td),
                                                     args(add, dd), args(aln, ln))
            self.wraps.append((w, nn, pos, op, levels, np.cumsum(nn) - nn))
        assert np.array_equal(ln, length)  # cut-short draws: the computed length is the bound, > max_len
        self.value, self.tree_depth, self.dep_depth, self.length = val, td, dd, ln
        self._lists = {}

    def _level_lists(self, levels):
        """Python lists (nargs, digit, op, first child) per level, for fast recursive emission."""
        key = id(levels)
        if key not in self._lists:
            self._lists[key] = [(n.tolist(), d.tolist(), o.tolist(), (np.cumsum(n) - n).tolist())
                                for n, d, o in levels]
        return self._lists[key]

    def _emit(self, levels, l, j, out):
        nargs, digit, op, first = levels[l]
        if nargs[j] == 0:
            out.append(_DIGIT0 + digit[j])
            return
        out.append(_OP0 + op[j])
        for c in range(first[j], first[j] + nargs[j]):
            self._emit(levels, l + 1, c, out)
        out.append(_CLOSE)

    def tokens(self, i: int) -> list:
        """Input ids of draw i (prefix order, as in "[MED 4 8 5 [MAX 8 4 9 ] ]")."""
        rounds = []                                    # (op, #fresh args, position, first arg, levels)
        for w, nn, pos, op, levels, first in self.wraps:
            j = int(np.searchsorted(w, i))
            if j == len(w) or w[j] != i:
                break
            rounds.append((int(op[j]), int(nn[j]), int(pos[j]), int(first[j]), self._level_lists(levels)))
        out = []
        self._emit_rounds(rounds, len(rounds) - 1, i, out)
        return out

    def _emit_rounds(self, rounds, r, i, out):
        """Emit draw i as it was after wrap round r (r = -1: the first tree). A method rather than a
        closure: a recursive closure is a reference cycle that would keep whole chunks alive."""
        if r < 0:
            return self._emit(self._level_lists(self.root), 0, i, out)
        op, nn, pos, first, lists = rounds[r]
        out.append(_OP0 + op)
        for t in range(nn + 1):
            if t == pos:
                self._emit_rounds(rounds, r - 1, i, out)
            else:
                self._emit(lists, 0, first + t - (t > pos), out)
        out.append(_CLOSE)


class ListOpsTask(ClassificationTask):
    """ListOps with dependency depth (spec §7.3, official variant "big"); the answer is read at SOS.

    Tokens are space-separated: "]" 0, "[MIN" 1, "[MAX" 2, "[MED" 3, "[SM" 4, digit k -> 5 + k. Worked example:

        "[MED 4 8 5 [MAX 8 4 9 ] ]":  MAX(8, 4, 9) = 9;  MED(4, 8, 5, 9): sorted 4 5 8 9, even count,
        floor((5 + 8) / 2) = 6  ->  class "6";  ids [3, 9, 13, 10, 2, 13, 9, 14, 0, 0]

    Tree depth 3, but the result depends only on the leaves 5 and 8 (the middle of the stable sort),
    so the dependency depth is 2 and the paper depth (``depths``) is 1. Length 3 + 3 + 6 leaves = 12.

    Splits (dependency depth; all with p_op 0.3, at most 5 arguments, length <= 50, distinct strings
    within a split, equal bins of ceil(n / #depths)): train 2-6 (1,000,000), iid 2-6 (1,000), valid 7
    (1,000), test 8-9 (1,000) -- paper depths 1-5, 1-5, 6, 7-8. As in the official code, train and iid
    are drawn independently, so short iid samples also occur in train. Generating the full train set
    takes a few minutes; it is cached. Sizes may be shrunk for tests.
    """
    name = "listops"
    DIGITS = [str(i) for i in range(10)]
    vocab = ["]"] + LISTOPS_OPS + DIGITS
    classes = DIGITS
    readout = "sos"
    SPLITS = {"train": (2, 6), "iid": (2, 6), "valid": (7, 7), "test": (8, 9)}
    CHUNK = 50_000   # draws per vectorised chunk (part of the generation parameters)

    def __init__(self, seed: int = 0, cache_dir=None, n_train: int = 1_000_000, n_iid: int = 1_000,
                 n_valid: int = 1_000, n_test: int = 1_000, p_op: float = 0.3, max_args: int = 5,
                 max_length: int = 50):
        self.sizes = {"train": n_train, "iid": n_iid, "valid": n_valid, "test": n_test}
        self.p_op, self.max_args, self.max_length = p_op, max_args, max_length
        super().__init__(seed, cache_dir)

    def _params(self):
        return {"splits": self.SPLITS, "sizes": self.sizes, "p_op": self.p_op, "max_args": self.max_args,
                "max_length": self.max_length, "chunk": self.CHUNK, "sampler": 1}

    def sample_set(self, split: str, lo: int, hi: int, n: int):
        """n distinct samples with dependency depth in lo..hi, at most ceil(n / #depths) per depth (§7.3.5).

        Returns (list of id lists, values, dependency depths).
        """
        rng = _rng(self.seed, f"listops/{split}")
        left = {d: math.ceil(n / (hi - lo + 1)) for d in range(lo, hi + 1)}
        seen, seqs, values, deps = set(), [], [], []
        with tqdm(total=n, desc=f"listops {split}", disable=None, leave=False) as bar:
            while len(seqs) < n:
                draws = _ListOpsDraws(rng, self.CHUNK, lo, hi, self.p_op, self.max_args, self.max_length)
                ok = (draws.length <= self.max_length) & (draws.dep_depth >= lo) & (draws.dep_depth <= hi)
                for i in np.flatnonzero(ok).tolist():
                    d = int(draws.dep_depth[i])
                    if left[d] == 0:             # bin full (checked first: building the string costs more)
                        continue
                    key = bytes(draws.tokens(i))
                    if key in seen:              # duplicate string
                        continue
                    seen.add(key)
                    left[d] -= 1
                    seqs.append(key)
                    values.append(int(draws.value[i]))
                    deps.append(d)
                    bar.update()
                    if len(seqs) == n:
                        break
        return seqs, values, deps

    def _generate(self):
        splits = {}
        for split, (lo, hi) in self.SPLITS.items():
            seqs, values, deps = self.sample_set(split, lo, hi, self.sizes[split])
            offsets = np.concatenate([[0], np.cumsum([len(s) for s in seqs])])
            tokens = np.frombuffer(b"".join(seqs), np.uint8).astype(np.int64)
            splits[split] = _split(Ragged(tokens, offsets), values, np.array(deps) - 1)
        return splits


# ----------------------------------------------------------------------------------------------------
# Registry and command line
# ----------------------------------------------------------------------------------------------------

TASKS = {"ctl": CTLTask, "ctl-backward": CTLBackwardTask, "arith": ArithTask, "listops": ListOpsTask}


def get_task(name: str, seed: int = 0, cache_dir=None, **sizes) -> ClassificationTask:
    """The task called name (see TASKS), generated from seed or loaded from the cache.

    sizes: optional overrides such as n_train=... for quick tests; the defaults are the spec's.
    """
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r} (valid: {', '.join(TASKS)})")
    return TASKS[name](seed=seed, cache_dir=cache_dir, **sizes)


def _main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="Generate, inspect and export the minattn tasks.")
    sub = parser.add_subparsers(dest="command", required=True)
    for cmd, text in [("export", "write DIR/<split>.tsv with input<TAB>label lines"),
                      ("stats", "print split sizes and depth histograms")]:
        p = sub.add_parser(cmd, help=text)
        p.add_argument("--task", required=True, help=f"one of: {', '.join(TASKS)}")
        p.add_argument("--seed", type=int, default=0)
        p.add_argument("--cache-dir", default=None)
        p.add_argument("--split", default="", help="scan only: the split (see SCAN_SPLITS), or 'all' to export "
                       "every command")
        if cmd == "export":
            p.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    if args.task in ("lookup", "scan", "mlu"):
        return _seq2seq_main(args)
    if args.task in ("sort", "pairwise", "set"):
        return _object_task_main(args)
    try:
        task = get_task(args.task, seed=args.seed, cache_dir=args.cache_dir)
        if args.command == "stats":
            print(task)
            for k, s in task.splits.items():
                hist = ", ".join(f"{d}: {c}" for d, c in zip(*np.unique(s.depths, return_counts=True)))
                n = s.inputs.lengths
                majority = np.bincount(s.labels).max() / len(s)   # what always answering one class scores
                print(f"{k:>6}: {len(s):>9,} samples, {n.min()}-{n.max()} tokens, paper depth {{{hist}}}, "
                      f"majority class {majority:.3f}")
        else:
            os.makedirs(args.out, exist_ok=True)
            for k, s in task.splits.items():
                with open(os.path.join(args.out, f"{k}.tsv"), "w") as f:
                    for seq, y in zip(s.inputs, s.labels.tolist()):
                        f.write(" ".join(task.vocab[t] for t in seq.tolist()) + "\t" + task.classes[y] + "\n")
            print(f"wrote {', '.join(f'{k}.tsv' for k in task.splits)} to {args.out}")
    except (ValueError, OSError) as e:
        print(f"tasks.py: error: {e}", file=sys.stderr)
        return 2
    return 0


# ----------------------------------------------------------------------------------------------------
# Contextual Retrieval Task (spec compositional.md §7–8): fresh data every step, nothing on disk
# ----------------------------------------------------------------------------------------------------

# α_s weights search s in the label (Eq. 15): drawn once from U(−1, 1) by the paper's code (spec §7.5).
RETRIEVAL_ALPHAS = (-0.71347752, -0.6062312, 0.66062073, -0.61213017, -0.82631877, 0.75908621, -0.36274866,
                    0.84383333)


def retrieval_combinations(searches: int, retrievals: int):
    """The deterministic OOD split of retrieval-choice combinations (spec §8): (train, test), int arrays
    of shape (n, searches) whose row t makes search s retrieve t[s].

    All retrievals^searches tuples in lexicographic order; even positions go to train, odd ones to test;
    then the first test tuples move to train until it holds floor(0.8 · all). For (2, 4): 12 train
    tuples, test (2,1), (2,3), (3,1), (3,3) (paper Table 5).
    """
    combos = np.indices((retrievals,) * searches).reshape(searches, -1).T    # = itertools.product order
    train, test = combos[0::2], combos[1::2]
    move = max(0, 4 * len(combos) // 5 - len(train))                          # floor(0.8·|all|) in integers
    return np.concatenate([train, test[:move]]), test[move:]


class RetrievalTask:
    """Contextual Retrieval Task (Mittal et al. 2022, Appendix C.1, Eqs. 15–18; spec §7–8).

    Each of N objects has S search features z and R retrieval features z̃, all N(0, 1). Object i's
    search s finds its nearest neighbour j* along z[s], never i itself (Eq. 17; ties: lowest j),
    and retrieves z̃_j*[r*(i, s)], where the retrieval choice r*(i, s) is part of i's input (Eq. 18);
    the label is y_i = Σ_s α_s · retrieved_s (Eq. 15). Worked example, S = R = 2, N = 3 (integer
    retrieval features for readability):

        object   z (search 0, 1)   z̃ (retrieval 0, 1)   r* (search 0, 1)
          0        0.0   1.0           5    6             1   0
          1        0.3  -2.0           7    8             .   .
          2        1.0   0.8           9   10             .   .

    Object 0: search 0 finds object 1 (|0.3 − 0.0| < |1.0 − 0.0|) and retrieves z̃_1[1] = 8; search 1
    finds object 2 (|0.8 − 1.0| = 0.2) and retrieves z̃_2[0] = 9; so y_0 = α_0·8 + α_1·9 = −11.1639.
    Its input row is [z_0, z̃_0, onehot(1), onehot(0)] = [0, 1, 5, 6, 0, 1, 1, 0] (in_dim = S + R + S·R).

    Modes: ``pool="all"`` draws every r*(i, s) uniformly (IID); ``"train"``/``"test"`` draw one
    combination per object from ``retrieval_combinations`` (OOD training/evaluation). There is no
    fixed dataset: every ``batch`` is fresh, a pure function of the generator passed in.
    """
    pools = ("all", "train", "test")

    def __init__(self, searches: int = 2, retrievals: int = 4, n_objects: int = 10):
        if not 1 <= searches <= len(RETRIEVAL_ALPHAS):
            raise ValueError(f"searches must be in 1..{len(RETRIEVAL_ALPHAS)} (one α each), got {searches}")
        if retrievals < 1 or n_objects < 2:
            raise ValueError(f"need retrievals ≥ 1 and n_objects ≥ 2 (a neighbour other than oneself), "
                             f"got {retrievals} and {n_objects}")
        self.searches, self.retrievals, self.n_objects = searches, retrievals, n_objects
        self.in_dim = searches + retrievals + searches * retrievals
        self.alphas = np.array(RETRIEVAL_ALPHAS[:searches])
        self._combos = None  # the OOD split, made on first use (R^S tuples: IID mode never needs it)

    def combinations(self, pool: str) -> np.ndarray:
        if self._combos is None:
            self._combos = dict(zip(("train", "test"), retrieval_combinations(self.searches, self.retrievals)))
        if not len(self._combos[pool]):
            raise ValueError(f"searches={self.searches}, retrievals={self.retrievals} leave no held-out "
                             "combination for the OOD test pool")
        return self._combos[pool]

    def batch(self, batch_size: int, rng: np.random.Generator, pool: str = "all"):
        """(x (B, N, in_dim) float32, y (B, N) float32, r* (B, N, S) int64), fresh from ``rng``."""
        if pool not in self.pools:
            raise ValueError(f"unknown pool {pool!r}; valid pools: {', '.join(self.pools)}")
        S, R, N = self.searches, self.retrievals, self.n_objects
        z = rng.standard_normal((batch_size, N, S + R))
        if pool == "all":
            prefs = rng.integers(0, R, (batch_size, N, S))
        else:
            combos = self.combinations(pool)
            prefs = combos[rng.integers(0, len(combos), (batch_size, N))]
        onehot = (prefs[..., None] == np.arange(R)).reshape(batch_size, N, S * R)   # search-major
        x = np.concatenate([z, onehot], axis=-1).astype(np.float32)
        return x, self.labels(z, prefs).astype(np.float32), prefs

    def labels(self, z: np.ndarray, prefs: np.ndarray) -> np.ndarray:
        """y (B, N) from features z (B, N, S + R) and retrieval choices r* (B, N, S) (Eqs. 15–18)."""
        B, N, _ = z.shape
        S = self.searches
        dist = np.abs(z[:, :, None, :S] - z[:, None, :, :S])                # (B, i, j, S)
        dist[:, np.arange(N), np.arange(N)] = np.inf                        # j ≠ i
        nearest = dist.argmin(axis=2)                                       # (B, N, S); argmin: lowest j on ties
        retrieved = z[np.arange(B)[:, None, None], nearest, S + prefs]      # z̃_j*[r*]   (B, N, S)
        return retrieved @ self.alphas


# ----------------------------------------------------------------------------------------------------
# Sequence-to-sequence tasks of seq2attn (spec seq2attn.md §2–3): lookup-table composition and SCAN
# ----------------------------------------------------------------------------------------------------
# Both are generated from rules in well under a second, so nothing is cached on disk. Vocabularies
# keep the reference's special tokens (spec §1.1) only so that parameter counts match the paper's.

IN_SPECIALS = ("<unk>", "<pad>")
OUT_SPECIALS = ("<unk>", "<pad>", "<sos>", "<eos>")


def _pad(seqs: Ragged, idx, pad: int):
    """Rows idx of seqs right-padded with ``pad``: (x (B, T) int64, lengths (B,) int64)."""
    lengths = seqs.lengths[idx]
    x = np.full((len(idx), lengths.max(initial=0)), pad, dtype=np.int64)
    x[np.arange(x.shape[1]) < lengths[:, None]] = np.concatenate([seqs[i] for i in idx] or [[]])
    return x, lengths


@dataclass
class Seq2SeqSplit:
    """One split: ``inputs[i]`` (ids in in_vocab) maps to ``targets[i]`` (ids in out_vocab, ending with
    <eos>); ``lines[i]`` is the example's canonical text line (see ``python tasks.py export``)."""
    inputs: Ragged
    targets: Ragged
    lines: list
    in_vocab: list
    out_vocab: list

    def __len__(self):
        return len(self.lines)

    def _batch(self, idx):
        return (*_pad(self.inputs, idx, self.in_vocab.index("<pad>")),
                *_pad(self.targets, idx, self.out_vocab.index("<pad>")))

    def batches(self, batch_size: int, rng: np.random.Generator, mode: str = "shuffled"):
        """Endless training batches (src, src_lengths, tgt, tgt_lengths), padded with <pad>.

        Each epoch visits every example once, in a fresh permutation drawn from rng (a seeded Generator
        replays the stream); the last batch of an epoch may be smaller. mode "bucketed" then stable-sorts
        the epoch by target length and visits the batches in random order (little padding)."""
        if mode not in ("shuffled", "bucketed"):
            raise ValueError(f"unknown batching mode {mode!r} for a seq2seq task (valid: shuffled, bucketed)")
        if batch_size < 1 or not len(self):
            raise ValueError(f"need batch_size ≥ 1 and a non-empty split, got {batch_size} and {len(self)} examples")
        return self._epochs(batch_size, rng, mode == "bucketed")

    def _epochs(self, batch_size, rng, bucketed):
        while True:
            perm, starts = rng.permutation(len(self)), np.arange(0, len(self), batch_size)
            if bucketed:
                perm = perm[np.argsort(self.targets.lengths[perm], kind="stable")]
                starts = rng.permutation(starts)
            for s in starts:
                yield self._batch(perm[s:s + batch_size])

    def eval_batches(self, batch_size: int):
        """One pass in order of target length (stable), so a batch decodes few steps beyond its rows."""
        order = np.argsort(self.targets.lengths, kind="stable")
        for s in range(0, len(order), batch_size):
            yield self._batch(order[s:s + batch_size])


class Seq2SeqTask:
    """Splits of (input, target) token sequences; subclasses fill ``self.splits`` through ``_make``."""
    name = ""
    in_tokens: list = []
    out_tokens: list = []

    def __init__(self):
        self.in_vocab = list(IN_SPECIALS) + list(self.in_tokens)
        self.out_vocab = list(OUT_SPECIALS) + list(self.out_tokens)
        self.sos, self.eos = self.out_vocab.index("<sos>"), self.out_vocab.index("<eos>")

    def _make(self, examples) -> Seq2SeqSplit:
        """examples: (input tokens, target tokens, line) triples -> a split (<eos> appended)."""
        ids_in, ids_out = ({t: i for i, t in enumerate(v)} for v in (self.in_vocab, self.out_vocab))
        return Seq2SeqSplit(Ragged.from_list([[ids_in[t] for t in x] for x, _, _ in examples]),
                            Ragged.from_list([[ids_out[t] for t in y] + [self.eos] for _, y, _ in examples]),
                            [line for _, _, line in examples], self.in_vocab, self.out_vocab)

    def decode(self, ids) -> str:
        return " ".join(self.out_vocab[int(i)] for i in ids)

    def __repr__(self):
        sizes = ", ".join(f"{k}={len(v)}" for k, v in self.splits.items())
        return f"<{type(self).__name__} {self.name!r}: V_in={len(self.in_vocab)}, V_out={len(self.out_vocab)}, {sizes}>"


# --- lookup tables ------------------------------------------------------------------------------------

BITS = [f"{i:03b}" for i in range(8)]
# t(000), t(001), ..., t(111) for each table (spec §2.1; identical in all five public samples)
LOOKUP_TABLES = {
    "t1": "110 001 101 010 011 000 111 100", "t2": "101 001 010 111 110 011 000 100",
    "t3": "111 101 010 100 011 000 001 110", "t4": "000 100 010 101 111 001 110 011",
    "t5": "001 000 110 100 101 010 011 111", "t6": "011 010 101 111 110 000 001 100",
    "t7": "011 110 000 100 001 111 101 010", "t8": "010 100 110 000 001 011 101 111",
}
LOOKUP_HELDOUT_COMPOSITIONS = "t1t6 t3t3 t3t5 t5t3 t5t6 t6t2 t6t3 t6t4"    # sample1 (spec §2.3.2)
# sample1's held-out inputs of the 28 seen compositions: V = validation, H = heldout_inputs (§2.3.3)
LOOKUP_HELDOUT_INPUTS = (
    "t1t1 H 000,111; t1t2 V 110 / H 001; t1t3 H 010,100; t1t4 H 001,100; t1t5 V 001 / H 000; "
    "t2t1 H 110,111; t2t2 V 011,111; t2t3 H 001,010; t2t4 V 100 / H 000; t2t5 H 000,010; t2t6 H 000,101; "
    "t3t1 V 100,111; t3t2 V 110,111; t3t4 H 000,001; t3t6 V 111 / H 101; t4t1 V 001 / H 111; "
    "t4t2 V 010 / H 001; t4t3 H 010,100; t4t4 V 001 / H 010; t4t5 H 000,001; t4t6 V 010 / H 011; "
    "t5t1 V 011 / H 111; t5t2 H 001,010; t5t4 V 110 / H 100; t5t5 H 110,111; t6t1 H 001,011; "
    "t6t5 H 011,110; t6t6 H 000,111")


def lookup_example(bits: str, tables) -> tuple:
    """(input tokens, target tokens, line) for applying ``tables`` left to right to ``bits`` (§2.2):

        lookup_example("100", ["t3", "t1"])[2] == "100 t3 t1 .\\t100 011 010\\t0 1 2 3"

    since t3(100) = 011 and t1(011) = 010. The target copies the input, then every intermediate
    result; the third column has one attention index per output step including <eos>."""
    outs = [bits]
    for t in tables:
        outs.append(LOOKUP_TABLES[t].split()[int(outs[-1], 2)])
    x = [bits, *tables, "."]
    return x, outs, f"{' '.join(x)}\t{' '.join(outs)}\t{' '.join(map(str, range(len(tables) + 2)))}"


class LookupTask(Seq2SeqTask):
    """Lookup-table composition, sample1 (Liška et al. 2018; spec seq2attn.md §2). Eight bijections
    t1..t8 of 3-bit strings; "100 t3 t1 ." asks for t1(t3(100)), target "100 011 010 <eos>".

    Splits: train (232: all unary + 28 seen compositions of t1..t6 on 6 inputs each), validation (16)
    and heldout_inputs (40) (the other 2 inputs of the seen compositions), heldout_compositions (64),
    heldout_tables (192: one of t7/t8 composed with t1..t6), new_compositions (32: t7/t8 only), all
    line-for-line equal (as sets) to sample1; and longer_compositions_{seen,incremental,new}
    (544/1084/32: three tables on 4 inputs each), random in the original, so here drawn from ``seed``
    with the same structure (§2.3.6)."""
    name = "lookup"
    in_tokens = BITS + list(LOOKUP_TABLES) + ["."]
    out_tokens = BITS

    def __init__(self, seed: int = 0, cache_dir=None):
        super().__init__()  # cache_dir: accepted for get_task's interface; nothing is cached
        S6, new = [f"t{i}" for i in range(1, 7)], ["t7", "t8"]
        held_comps = [(c[:2], c[2:]) for c in LOOKUP_HELDOUT_COMPOSITIONS.split()]
        held = {}  # (a, b) -> {"V": [inputs], "H": [inputs]}
        for entry in LOOKUP_HELDOUT_INPUTS.split("; "):
            comp, rest = entry.split(" ", 1)
            held[comp[:2], comp[2:]] = {p[0]: p[2:].split(",") for p in rest.split(" / ")}
        ex = lookup_example
        splits = {
            "train": [ex(b, [t]) for t in LOOKUP_TABLES for b in BITS]
                     + [ex(b, c) for c, h in held.items() for b in BITS if b not in h.get("V", []) + h.get("H", [])],
            "validation": [ex(b, c) for c, h in held.items() for b in h.get("V", [])],
            "heldout_inputs": [ex(b, c) for c, h in held.items() for b in h.get("H", [])],
            "heldout_compositions": [ex(b, c) for c in held_comps for b in BITS],
            "heldout_tables": [ex(b, c) for t in S6 for n in new for c in ([t, n], [n, t]) for b in BITS],
            "new_compositions": [ex(b, [m, n]) for m in new for n in new for b in BITS],
        }
        rng = _rng(seed, "lookup/longer")
        pick = lambda pool, k: [pool[i] for i in np.sort(rng.choice(len(pool), k, replace=False))]  # noqa: E731
        s6 = list(itertools.product(S6, repeat=3))
        seen = pick(s6, 136)
        unseen = [c for c in s6 if c not in set(seen)]
        product = lambda *parts: list(itertools.product(*parts))  # noqa: E731
        incremental = (pick(seen, 96) + pick(unseen, 54) + pick(product(new, S6, S6), 56)    # t7/t8 never last
                       + pick(product(S6, new, S6), 50) + pick(product(new, new, S6), 15))
        for name, comps in [("seen", seen), ("incremental", incremental),
                            ("new", list(itertools.product(new, repeat=3)))]:
            splits[f"longer_compositions_{name}"] = [ex(b, list(c)) for c in comps for b in pick(BITS, 4)]
        self.splits = {k: self._make(v) for k, v in splits.items()}


# --- SCAN ----------------------------------------------------------------------------------------------

SCAN_PRIMITIVES = ("walk", "look", "run", "jump")
SCAN_SPLITS = ("simple", "length", "addprim_jump", "addprim_turn_left", "around_right", "opposite_right", "right",
               "jump_around_right", "filler0", "filler1", "filler2", "filler3", "length_cutoff_K")
SCAN_CUTOFFS = (22, 24, 25, 26, 27, 28, 30, 32, 33, 36, 40)  # the cutoffs of Csordás et al. (spec §3.5)


def scan_commands() -> list:
    """All 20,910 SCAN commands as (command, actions) string pairs, from the grammar of spec §3.1."""
    verbs = []  # V: (words, meaning)
    for x in SCAN_PRIMITIVES + ("turn",):
        act = [] if x == "turn" else [f"I_{x.upper()}"]
        for d in ("left", "right"):
            turn = [f"I_TURN_{d.upper()}"]
            verbs += [(f"{x} {d}", turn + act), (f"{x} opposite {d}", turn * 2 + act),
                      (f"{x} around {d}", (turn + act) * 4)]
    verbs += [(x, [f"I_{x.upper()}"]) for x in SCAN_PRIMITIVES]
    phrases = [(f"{w}{s}", a * k) for w, a in verbs for s, k in (("", 1), (" twice", 2), (" thrice", 3))]  # S
    return phrases + [(f"{w1} {c} {w2}", a1 + a2 if c == "and" else a2 + a1)
                      for c in ("and", "after") for w1, a1 in phrases for w2, a2 in phrases]


def _contains(command: str, phrase: str) -> bool:
    return f" {phrase} " in f" {command} "


def scan_split(split: str, seed: int = 0) -> dict:
    """{"train": [...], "test": [...] (, "iid": [...])} of (command, actions) pairs for a SCAN split
    (spec §3.3, §3.5); see ``SCAN_SPLITS``, where K is an output-length cutoff."""
    pairs, P = scan_commands(), SCAN_PRIMITIVES
    if split == "simple":       # random 80/20, seeded (the reference membership is not derivable)
        perm = _rng(seed, "scan/simple").permutation(len(pairs))
        n_train = round(0.8 * len(pairs))
        return {"train": [pairs[i] for i in np.sort(perm[:n_train])],
                "test": [pairs[i] for i in np.sort(perm[n_train:])]}
    if split == "length":
        return {"train": [p for p in pairs if len(p[1]) <= 22], "test": [p for p in pairs if len(p[1]) >= 24]}
    if split.startswith("addprim_"):  # the primitive alone, repeated to be 10% of train (spec §3.3.3-4)
        prim = split[len("addprim_"):].replace("_", " ")
        if prim not in ("jump", "turn left"):
            raise ValueError(f"unknown SCAN split {split!r}: add_prim splits are addprim_jump and addprim_turn_left")
        rest = [p for p in pairs if not _contains(p[0], prim)]
        alone = [p for p in pairs if p[0] == prim]
        return {"train": rest + alone * (len(rest) // 9),
                "test": [p for p in pairs if _contains(p[0], prim) and p[0] != prim]}
    if split.startswith("length_cutoff_"):
        k = split[len("length_cutoff_"):]
        if not k.isdigit():
            raise ValueError(f"unknown SCAN split {split!r}: use length_cutoff_K with an integer K (e.g. 26)")
        k = int(k)
        pool = sorted((p for p in pairs if len(p[1]) <= k), key=lambda p: scan_line(p).encode())  # C-sorted (§3.5)
        iid = np.random.RandomState(1234).choice(len(pool), int(len(pool) * (1 - 0.9)), replace=False)
        is_iid = np.zeros(len(pool), bool)
        is_iid[iid] = True
        splits = {"train": [p for p, i in zip(pool, is_iid) if not i], "iid": [p for p, i in zip(pool, is_iid) if i],
                  "test": [p for p in pairs if len(p[1]) > k]}
        empty = [name for name, part in splits.items() if not part]   # K = 1 and K ≥ 49 (the longest output)
        if empty:
            raise ValueError(f"SCAN split {split!r} leaves no {' and no '.join(empty)} examples: choose K from 2 to 47")
        return splits
    fillers = {"filler0": 0, "filler1": 1, "filler2": 2, "filler3": 3, "jump_around_right": 3}
    if split in fillers:  # Loula et al. exp. 2: the first k of look, walk, run are seen in "X around right"
        pairs = [p for p in pairs if not _contains(p[0], "turn around right")]
        held = [x for x in P if x not in ("look", "walk", "run")[:fillers[split]]]
        return {"train": [p for p in pairs if not any(_contains(p[0], f"{x} around right") for x in held)],
                "test": [p for p in pairs if _contains(p[0], "jump around right")]}
    if split in ("around_right", "opposite_right", "right"):  # Loula et al. template splits (spec §3.3.5)
        phrase = split.replace("_", " ")
        pairs = [p for p in pairs if not _contains(p[0], f"turn {phrase}")]
        is_test = [any(_contains(c, f"{x} {phrase}") for x in P) for c, _ in pairs]
        return {"train": [p for p, t in zip(pairs, is_test) if not t],
                "test": [p for p, t in zip(pairs, is_test) if t]}
    raise ValueError(f"unknown SCAN split {split!r}; valid: {', '.join(SCAN_SPLITS)}")


def scan_line(pair) -> str:
    """The canonical line: "IN: jump twice OUT: I_JUMP I_JUMP" (spec §3.2)."""
    return f"IN: {pair[0]} OUT: {' '.join(pair[1])}"


class ScanTask(Seq2SeqTask):
    """SCAN (Lake & Baroni 2018), generated from its grammar (spec seq2attn.md §3), one split at a time:

        "jump around left twice"  ->  (I_TURN_LEFT I_JUMP) × 4, twice: 16 actions, then <eos>

    Splits (``SCAN_SPLITS``): simple (seeded 80/20), length, addprim_jump, addprim_turn_left, the
    template splits around_right, opposite_right, right, jump_around_right, filler0..filler3 (the
    paper's "k fillers": 0..3 of look/walk/run also seen in "X around right"), and length_cutoff_K
    (Csordás et al. 2021; adds an "iid" split). No "." is appended to inputs (spec §3.6)."""
    name = "scan"
    in_tokens = ["after", "and", "around", "jump", "left", "look", "opposite", "right", "run", "thrice", "turn",
                 "twice", "walk"]
    out_tokens = ["I_WALK", "I_LOOK", "I_RUN", "I_JUMP", "I_TURN_LEFT", "I_TURN_RIGHT"]

    def __init__(self, seed: int = 0, cache_dir=None, split: str = ""):
        super().__init__()
        if not split:
            raise ValueError(f"scan needs a split; valid: {', '.join(SCAN_SPLITS)}")
        self.split = split
        self.splits = {k: self._make([(c.split(), a, scan_line((c, a))) for c, a in v])
                       for k, v in scan_split(split, seed).items()}


TASKS.update(lookup=LookupTask, scan=ScanTask)


def _seq2seq_main(args) -> int:
    """``python tasks.py export|stats`` for lookup and scan. Export writes the canonical lines: one
    DIR/<split>.tsv per lookup split; DIR/train.txt and DIR/test.txt (and iid.txt) for a SCAN split, or
    DIR/all.txt with every command for ``--split all``."""
    try:
        if args.task == "lookup" and args.split:
            raise ValueError("lookup has one split structure (sample1): drop --split")
        if args.task == "scan" and args.split == "all":
            files = {"all": [scan_line(p) for p in scan_commands()]}
        else:
            task = get_task(args.task, seed=args.seed, **({"split": args.split} if args.task == "scan" else {}))
            files = {k: s.lines for k, s in task.splits.items()}
        if args.command == "stats":
            for k, lines in files.items():
                print(f"{k:>32}: {len(lines):>6,} examples")
            return 0
        ext = "tsv" if args.task == "lookup" else "txt"
        os.makedirs(args.out, exist_ok=True)
        for k, lines in files.items():
            with open(os.path.join(args.out, f"{k}.{ext}"), "w") as f:
                f.writelines(line + "\n" for line in lines)
        print(f"wrote {', '.join(f'{k}.{ext}' for k in files)} to {args.out}")
    except (ValueError, OSError) as e:
        print(f"tasks.py: error: {e}", file=sys.stderr)
        return 2
    return 0


# ----------------------------------------------------------------------------------------------------
# Relational tasks of the Abstractor paper (spec abstractor.md §6): object sorting, pairwise order, SET
# ----------------------------------------------------------------------------------------------------
# The inputs are vectors, not tokens: a task holds a table of object vectors (``objects``) and a split
# holds rows of object indices, so a batch is objects[index]. Generation takes well under a second, so
# nothing is cached on disk. The dataset is drawn once from the task seed (validation and test stay
# fixed); a run's training set is a sample of the train pool drawn with the run's seed (``sample``).

@dataclass
class ObjectSplit:
    """Sample i is the objects index[i] (rows of the task's object table) with targets labels[i]."""
    index: np.ndarray       # (N, m) int64
    labels: np.ndarray      # (N,) int64 class, or (N, m) int64 target sequence (sorting)

    def __len__(self):
        return len(self.labels)

    def subset(self, idx) -> "ObjectSplit":
        return ObjectSplit(self.index[idx], self.labels[idx])

    def sample(self, n: int, rng: np.random.Generator) -> "ObjectSplit":
        """n samples drawn without replacement (one trial's training set), in their original order."""
        if not 1 <= n <= len(self):
            raise ValueError(f"train size {n} is out of range: the train pool has {len(self)} samples")
        return self.subset(np.sort(rng.choice(len(self), n, replace=False)))

    def chunks(self, batch_size: int):
        """One pass in order, the last chunk partial (evaluation)."""
        for s in range(0, len(self), batch_size):
            yield self.subset(slice(s, s + batch_size))


def epoch_batches(n: int, batch_size: int, rng: np.random.Generator):
    """Endless epochs of sample indices, as Keras' fit: a fresh permutation per epoch cut into batches of
    batch_size, the last one partial (so 500 samples at batch 512 are one step per epoch)."""
    if n < 1 or batch_size < 1:
        raise ValueError(f"need samples and batch_size ≥ 1, got {n} and {batch_size}")
    while True:
        perm = rng.permutation(n)
        for s in range(0, n, batch_size):
            yield perm[s:s + batch_size]


def _object_splits(rng, index, labels, sizes) -> dict:
    """Shuffle, then cut consecutive splits of the given sizes (None: the rest)."""
    perm, out, start = rng.permutation(len(labels)), {}, 0
    for name, size in sizes.items():
        idx = perm[start:] if size is None else perm[start:start + size]
        out[name], start = ObjectSplit(index[idx], labels[idx]), start + len(idx)
    return out


class SortTask:
    """Object sorting (§6.1). Attributes a_0..a_3 ~ N(0, I_4) and b_0..b_11 ~ N(0, I_8) give 48 objects
    o_{12i+j} = (a_i, b_j) ∈ R^12, ordered by i, then j: the order of their indices. A sample is 10
    distinct objects in random order; its targets are the argsort (labels[t] = the input position of the
    t-th smallest object), decoded after a START token:

        index  = [17, 3, 40, 29, 5, 11, 46, 0, 33, 21]         source objects[index], 10 × 12
        labels = argsort(index) = [7, 1, 4, 5, 0, 9, 3, 8, 2, 6]
        decoder input = [10 (START), 7, 1, 4, 5, 0, 9, 3, 8, 2] (``decoder_inputs``)

    100,000 sequences (exact duplicates dropped), shuffled: test 20%, valid 10%, train pool the rest.
    """
    name = "sort"
    START = 10
    N_PRIMARY, N_SECONDARY, LENGTH = 4, 12, 10

    def __init__(self, seed: int = 0, cache_dir=None, n_sequences: int = 100_000):
        rng = _rng(seed, "sort")
        a = rng.standard_normal((self.N_PRIMARY, 4))
        b = rng.standard_normal((self.N_SECONDARY, 8))
        self.objects = np.concatenate([np.repeat(a, self.N_SECONDARY, axis=0), np.tile(b, (self.N_PRIMARY, 1))],
                                      axis=1).astype(np.float32)                       # row 12i + j = (a_i, b_j)
        # The first 10 of a random permutation of the 48 objects: uniform over ordered 10-subsets.
        index = np.argsort(rng.random((n_sequences, len(self.objects))), axis=1)[:, :self.LENGTH]
        _, first = np.unique(index, axis=0, return_index=True)
        index = index[np.sort(first)]
        n = len(index)
        self.splits = _object_splits(rng, index, np.argsort(index, axis=1),
                                     {"test": n // 5, "valid": n // 10, "train": None})

    @classmethod
    def decoder_inputs(cls, labels: np.ndarray) -> np.ndarray:
        """Teacher forcing: [START, labels[0..m−2]] per row."""
        return np.concatenate([np.full((len(labels), 1), cls.START, labels.dtype), labels[:, :-1]], axis=1)


class PairwiseOrderTask:
    """Pairwise order (§6.4). 64 objects o_i ~ N(0, I_32), ordered by index. Every ordered pair of distinct
    objects is a sample of 2 × 32 with label 1[i < j]: pair (5, 41) has label 1, pair (41, 5) label 0.
    The 4,032 pairs are shuffled and split with ceil rounding: test 35% (1,412), valid 15% (605), train
    2,015. Test pairs never occur in training, so they must be answered by transitivity."""
    name = "pairwise"

    def __init__(self, seed: int = 0, cache_dir=None, n_objects: int = 64, dim: int = 32):
        rng = _rng(seed, "pairwise")
        self.objects = rng.standard_normal((n_objects, dim)).astype(np.float32)
        i, j = np.nonzero(~np.eye(n_objects, dtype=bool))
        index, n = np.stack([i, j], axis=1), len(i)
        self.splits = _object_splits(rng, index, (i < j).astype(np.int64),
                                     {"test": math.ceil(0.35 * n), "valid": math.ceil(0.15 * n), "train": None})


def card_attributes() -> np.ndarray:
    """(81, 4): card c has attribute values (number, colour, pattern, shape) = base-3 digits of c."""
    return np.array(list(itertools.product(range(3), repeat=4)), dtype=np.int64)


def is_set(values: np.ndarray) -> np.ndarray:
    """values (..., 3, 4) attribute values of triples → (...) bool: every attribute all equal or all
    different, i.e. v1 + v2 + v3 ≡ 0 (mod 3) for each attribute."""
    return (values.sum(axis=-2) % 3 == 0).all(axis=-1)


class SetTask:
    """SET (§6.5) with non-image cards: a documented deviation (the paper embeds card images with a CNN),
    so results are not directly comparable with the paper's. 81 cards (``card_attributes``); three
    distinct cards form a SET iff every attribute is all equal or all different:

        cards 0 (0,0,0,0), 40 (1,1,1,1), 80 (2,2,2,2): a SET, label 1
        cards 0 (0,0,0,0), 1 (0,0,0,1), 5 (0,0,1,2): pattern 0,0,1 is neither, label 0

    10,000 triples, half SETs (two random distinct cards completed by the mod-3 rule), half random
    triples of distinct cards that are not SETs (``check_negatives``; the reference did not check, ≈1/79
    label noise), each triple in random order. Splits: test 20%, valid 10%, train pool the rest.
    Card vectors (``cards``): "onehot" (12-d: 3 bits per attribute, the noise-free analogue of the
    paper's CNN attribute code) or "random64" (tanh(M b_card), M ∈ R^{64×12} ~ N(0, 1) drawn once).
    """
    name = "set"
    CARDS = ("onehot", "random64")

    def __init__(self, seed: int = 0, cache_dir=None, cards: str = "onehot", n_triples: int = 10_000,
                 check_negatives: bool = True):
        if cards not in self.CARDS:
            raise ValueError(f"unknown card encoding {cards!r}; use one of {', '.join(self.CARDS)}")
        self.attributes = attrs = card_attributes()
        onehot = (attrs[:, :, None] == np.arange(3)).reshape(81, 12).astype(np.float32)
        M = np.random.default_rng(12345).standard_normal((64, 12))
        self.objects = onehot if cards == "onehot" else np.tanh(onehot @ M.T).astype(np.float32)
        rng = _rng(seed, "set")
        n_pos = n_triples // 2
        pairs = np.argsort(rng.random((n_pos, 81)), axis=1)[:, :2]
        third = (-attrs[pairs].sum(axis=1)) % 3 @ np.array([27, 9, 3, 1])       # the card completing the SET
        negatives = np.empty((0, 3), np.int64)
        while len(negatives) < n_triples - n_pos:                                   # rejection sampling
            draw = np.argsort(rng.random((n_triples, 81)), axis=1)[:, :3]
            negatives = np.concatenate([negatives, draw[~is_set(attrs[draw])] if check_negatives else draw])
        index = np.concatenate([np.column_stack([pairs, third]), negatives[:n_triples - n_pos]])
        index = np.take_along_axis(index, np.argsort(rng.random(index.shape), axis=1), axis=1)  # shuffle cards
        labels = np.repeat(np.array([1, 0]), [n_pos, n_triples - n_pos])
        n = n_triples
        self.splits = _object_splits(rng, index, labels, {"test": n // 5, "valid": n // 10, "train": None})


TASKS.update(sort=SortTask, pairwise=PairwiseOrderTask, set=SetTask)


def _object_task_main(args) -> int:
    """``python tasks.py stats|export`` for sort, pairwise and set: export writes DIR/objects.tsv (one
    object vector per line) and DIR/<split>.tsv (object indices<TAB>labels)."""
    task = TASKS[args.task](seed=args.seed)
    if args.command == "stats":
        print(f"{args.task}: {len(task.objects)} objects of dimension {task.objects.shape[1]}")
        for k, s in task.splits.items():
            print(f"{k:>6}: {len(s):>7,} samples of {s.index.shape[1]} objects")
        return 0
    os.makedirs(args.out, exist_ok=True)
    np.savetxt(os.path.join(args.out, "objects.tsv"), task.objects, delimiter="\t", fmt="%.6g")
    for k, s in task.splits.items():
        with open(os.path.join(args.out, f"{k}.tsv"), "w") as f:
            for idx, y in zip(s.index.tolist(), s.labels.tolist()):
                f.write(" ".join(map(str, idx)) + "\t" + " ".join(map(str, np.atleast_1d(y))) + "\n")
    print(f"wrote objects.tsv, {', '.join(f'{k}.tsv' for k in task.splits)} to {args.out}")
    return 0


# ----------------------------------------------------------------------------------------------------
# Mathematical Language Understanding (spec coda.md §5): two-variable arithmetic, character by character
# ----------------------------------------------------------------------------------------------------
# Generated vectorised (a million examples in about a second), so nothing is cached on disk.

MLU_SHAPE = (2000, 2000, 2, 4, 3)   # a, b, assignment order, (u, w), op: 96M distinct inputs (spec §5.8)


def mlu_strings(keys: np.ndarray):
    """(inputs, targets), arrays of str, of the examples numbered ``keys`` in [0, 96M) (``MLU_SHAPE``)."""
    a, b, order, uw, op = np.unravel_index(keys, MLU_SHAPE)
    x, y = a - 1000, b - 1000
    sx, sy = np.char.add("x=", x.astype(str)), np.char.add("y=", y.astype(str))
    u, w = np.where(uw // 2 == 0, x, y), np.where(uw % 2 == 0, x, y)
    expr = np.char.add(np.char.add(np.array(["x", "y"])[uw // 2], np.array(["+", "-", "*"])[op]),
                       np.array(["x", "y"])[uw % 2])
    inputs = np.char.add(np.char.add(np.where(order == 0, sx, sy), ","), np.where(order == 0, sy, sx))
    inputs = np.char.add(np.char.add(inputs, ","), expr)
    targets = np.choose(op, [u + w, u - w, u * w]).astype(str)
    return (inputs.astype(f"U{np.char.str_len(inputs).max(initial=1)}"),
            targets.astype(f"U{np.char.str_len(targets).max(initial=1)}"))


def _char_ids(strings: np.ndarray, vocab: list, end: int = None) -> Ragged:
    """The characters of each string as ids in ``vocab`` (single characters), optionally followed by ``end``."""
    n = len(strings)
    codes = np.zeros((n, strings.dtype.itemsize // 4 + 1), np.uint32)     # one spare column for ``end``
    codes[:, :-1] = strings.view(np.uint32).reshape(n, -1)                 # unicode code points, 0-padded
    lengths = (codes != 0).sum(axis=1)
    lut = np.zeros(128, np.int64)
    lut[[ord(c) for c in vocab if len(c) == 1]] = [i for i, c in enumerate(vocab) if len(c) == 1]
    ids = lut[codes]
    if end is not None:
        ids[np.arange(n), lengths] = end
        lengths = lengths + 1
    return Ragged(ids[np.arange(codes.shape[1]) < lengths[:, None]], np.concatenate([[0], np.cumsum(lengths)]))


class MLUTask(Seq2SeqTask):
    """Mathematical Language Understanding (Wangperawong 2018; CoDA paper Table 6; spec coda.md §5). x and y
    get integers a, b in [−1000, 1000), assigned in random order; the question is u op w with u, w ∈ {x, y}
    and op ∈ {+, −, *}, each uniform; the answer is the exact integer, character by character:

        "x=85,y=-523,x*y"  →  "-44455" <eos>         (in_vocab ids 11 13 9 6 14 ...; out_vocab ids 13 7 7 7 8 8 2)

    Every choice is uniform, so an example is a uniform key in [0, 96M) (``MLU_SHAPE``). Keys are drawn in
    fixed chunks from the seed and deduplicated (same key = same input string) in order of first
    appearance; that stream is cut into ``test`` (the first n_test), ``valid`` (the next n_valid) and
    ``train`` (the next n_train), so the held-out sets are disjoint from train by input string and do
    not change with n_train, and a smaller train set is a prefix of a larger one. Vocabularies: the 17
    input and 11 output characters, plus <pad> (and <sos>, <eos> for the output). Lines "input:target"."""
    name = "mlu"
    in_tokens = list("0123456789xy=,+-*")
    out_tokens = list("0123456789-")

    def __init__(self, seed: int = 0, cache_dir=None, n_train: int = 200_000, n_valid: int = 2_000,
                 n_test: int = 5_000, chunk: int = 1 << 20):
        # cache_dir: accepted for get_task's interface; nothing is cached. No <unk>: every character is known.
        self.in_vocab = ["<pad>"] + self.in_tokens
        self.out_vocab = ["<pad>", "<sos>", "<eos>"] + self.out_tokens
        self.sos, self.eos = 1, 2
        sizes = {"test": n_test, "valid": n_valid, "train": n_train}
        total = sum(sizes.values())
        if min(sizes.values()) < 1 or total > np.prod(MLU_SHAPE) // 2:
            raise ValueError(f"mlu: split sizes must be ≥ 1 and total at most 48M (half the space), got {sizes}")
        rng, keys = _rng(seed, "mlu"), np.empty(0, np.int64)
        while len(keys) < total:
            keys = np.concatenate([keys, rng.integers(0, np.prod(MLU_SHAPE), chunk)])
            keys = keys[np.sort(np.unique(keys, return_index=True)[1])]          # first appearances, in order
        self.splits, start = {}, 0
        for name, size in sizes.items():
            inputs, targets = mlu_strings(keys[start:start + size])
            start += size
            self.splits[name] = Seq2SeqSplit(_char_ids(inputs, self.in_vocab), _char_ids(targets, self.out_vocab,
                                             self.eos), np.char.add(np.char.add(inputs, ":"), targets),
                                             self.in_vocab, self.out_vocab)


TASKS.update(mlu=MLUTask)


if __name__ == "__main__":
    sys.exit(_main())
