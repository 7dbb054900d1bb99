"""Token-sequence classification (the NDR paper's tasks): splits, batching and the disk cache.

Every task here is a ClassificationTask: a vocabulary of input tokens, a list of classes and four
named splits: ``train``, ``iid`` (reported IID), ``valid`` (deeper, model selection) and ``test``
(deepest, reported "Test"/"Longer").

    task = get_task("ctl")                        # generated once, then cached on disk
    train = batches(task.splits["train"], 512, np.random.default_rng(0), "bucketed")   # endless
    x, lengths, y = next(train)                   # x: (B, T) rows [SOS, x_1..x_n, EOS] + 0-padding
    for x, lengths, y in eval_batches(task.splits["test"], 1024):
        ...

Token ids: the task's input tokens are 0..V-1 (V = len(task.vocab)); the model adds EOS = V and
SOS = V+1 (docs/ndr.md §1). Depths are given in the paper's convention: the number of operations
(CTL: composition length; arithmetic: code depth - 1; ListOps: dependency depth - 1).

Generated data is cached under ``cache_dir`` (default: $MINATTN_CACHE or ~/.cache/minattn) in an
.npz file named by a hash of every generation parameter; it is written atomically, and an unreadable
file is regenerated.
"""
from __future__ import annotations

import hashlib
import json
import os
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass

import numpy as np

from .base import Ragged, Task

# bump whenever a generator or the file layout changes: old cache files are ignored
FORMAT_VERSION = 1


@dataclass
class ClassificationSplit:
    """One split: ``inputs[i]`` (token ids, no SOS/EOS) has class ``labels[i]`` and paper depth
    ``depths[i]``."""
    inputs: Ragged          # N sequences of int64 ids in 0..V-1 (a list of arrays works too)
    labels: np.ndarray      # (N,) int64 class ids
    depths: np.ndarray      # (N,) int64 depth in the paper's convention (number of operations)
    vocab_size: int = None  # V of the task (EOS = V, SOS = V + 1); set by the task
    # the task's input tokens and class names (set by the task), for ``lines``
    vocab: list = None
    classes: list = None

    def __len__(self):
        return len(self.labels)

    @property
    def lines(self) -> list:
        """Lines "input tokens<TAB>class", tokens separated by spaces."""
        return [" ".join(self.vocab[t] for t in seq.tolist()) + "\t" + self.classes[y]
                for seq, y in zip(self.inputs, self.labels.tolist())]

    def describe(self) -> str:
        hist = ", ".join(f"{d}: {c}" for d, c in zip(*np.unique(self.depths, return_counts=True)))
        n = self.inputs.lengths
        # what always answering one class scores
        majority = np.bincount(self.labels).max() / len(self)
        return f"samples, {n.min()}-{n.max()} tokens, paper depth {{{hist}}}, majority class {majority:.3f}"

    def batches(self, batch_size: int, rng: np.random.Generator, mode: str = "bucketed"):
        """Endless training batches (x, lengths, y): ``batches`` below."""
        return batches(self, batch_size, rng, mode)


class ClassificationTask(Task):
    """Base class: vocabulary, classes and the splits of one task.

    Subclasses set the class attributes and implement ``_params`` (every generation parameter,
    hashed into the cache file name) and ``_generate`` (returns {split: ClassificationSplit}).
    """
    name: str = ""
    vocab: list = []          # input tokens; id = index
    classes: list = []        # class names; class id = index
    char_level = False        # True: one token per character; False: tokens separated by spaces
    cache_key = None          # tasks that share data (ctl, ctl-backward) share a cache file

    def __init__(self, seed: int = 0, cache_dir=None):
        self.seed = seed
        self._index = {t: i for i, t in enumerate(self.vocab)}
        params = {"seed": seed, "vocab": list(self.vocab), "classes": list(self.classes),
                  **self._params()}
        self.splits = load_or_generate(self.cache_key or self.name, params, self._generate, cache_dir)
        for s in self.splits.values():
            s.vocab_size, s.vocab, s.classes = len(self.vocab), self.vocab, self.classes

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
                raise ValueError(f"{self.name}: unknown token {tok!r} (vocabulary: "
                                 f"{' '.join(self.vocab)})")
            ids.append(self._index[tok])
        return np.array(ids, dtype=np.int64)

    def decode(self, ids) -> str:
        """Ids -> text; the inverse of encode (ids V and V+1 are shown as <eos> and <sos>)."""
        names = list(self.vocab) + ["<eos>", "<sos>"]
        return ("" if self.char_level else " ").join(names[int(i)] for i in ids)

    def __repr__(self):
        sizes = ", ".join(f"{k}={len(v)}" for k, v in self.splits.items())
        return (f"<{type(self).__name__} {self.name!r}: V={len(self.vocab)}, {len(self.classes)} "
                f"classes, {sizes}>")


def make_split(seqs, labels, depths) -> ClassificationSplit:
    inputs = seqs if isinstance(seqs, Ragged) else Ragged.from_list(seqs)
    return ClassificationSplit(inputs, np.asarray(labels, np.int64), np.asarray(depths, np.int64))


# ----------------------------------------------------------------------------------------------------
# Batching (the layout: docs/ndr.md §1; the order: docs/ndr.md §6)
# ----------------------------------------------------------------------------------------------------

def collate(seqs, V: int):
    """Sequences -> (x, lengths): x (B, T) int64 rows [SOS, x_1..x_n, EOS] right-padded with 0 to
    the longest row, lengths (B,) = n + 2. EOS = V, SOS = V + 1."""
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
    # position inside each sequence
    cols = np.arange(n.sum()) - np.repeat(np.cumsum(n) - n, n)
    x[rows, cols + 1] = inputs.tokens[np.repeat(inputs.offsets[idx], n) + cols]
    x[np.arange(B), n + 1] = V
    return x, n + 2


def _vocab_size(split: ClassificationSplit, V):
    V = split.vocab_size if V is None else V
    if V is None:
        raise TypeError("the split does not know its vocabulary size: pass V=len(task.vocab)")
    return V


def batches(split: ClassificationSplit, batch_size: int, rng: np.random.Generator,
            mode: str = "bucketed",
            V: int = None):
    """Endless training batches (x, lengths, y) of exactly batch_size samples (layout: see collate).

    mode "bucketed" (the official code's, docs/ndr.md §6): each pass shuffles the split, drops the
    remainder, stable-sorts by input length, cuts consecutive batches and visits them in random
    order, so each sample appears at most once per pass and padding is rare. mode "random":
    batch_size indices uniformly with replacement. mode "balanced": each batch draws one depth
    uniformly and batch_size samples of it with replacement. mode "stratified": every sample draws
    its depth uniformly (then a sample of it), so batches mix depths. All randomness comes from rng,
    so a seeded Generator gives the same stream. V defaults to split.vocab_size. Bad arguments raise
    ValueError here, not at the first batch.
    """
    if mode not in ("bucketed", "random", "balanced", "stratified"):
        raise ValueError(f"unknown batching mode {mode!r} (valid: bucketed, random, balanced, "
                         "stratified)")
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
        # Not in the papers: cpu-budget choices. Depths are drawn uniformly, so shallow samples (1%
        # of CTL's train split) are seen as often as deep ones: one depth per batch ("balanced"), or
        # one per sample ("stratified": every batch mixes depths, padded to its deepest sample).
        # sample indices, grouped by depth
        by_depth = np.argsort(split.depths, kind="stable")
        sizes = np.unique(split.depths, return_counts=True)[1]
        starts = np.cumsum(sizes) - sizes
        while True:
            g = rng.integers(len(sizes)) if mode == "balanced" else rng.integers(0, len(sizes), batch_size)
            idx = by_depth[starts[g] + rng.integers(0, sizes[g], batch_size)]    # with replacement
            yield (*_collate_ragged(as_ragged, idx, V), labels[idx])
    lengths = as_ragged.lengths                                           # mode "bucketed"
    n_batches = N // batch_size
    while True:
        # shuffle, drop the remainder
        perm = rng.permutation(N)[:n_batches * batch_size]
        perm = perm[np.argsort(lengths[perm], kind="stable")]             # stable sort by length
        for b in rng.permutation(n_batches):                              # batches in random order
            idx = perm[b * batch_size:(b + 1) * batch_size]
            yield (*_collate_ragged(as_ragged, idx, V), labels[idx])


def eval_batches(split: ClassificationSplit, batch_size: int, V: int = None,
                 return_index: bool = False):
    """One deterministic pass over the split: (x, lengths, y) batches in order of input length
    (stable), the last one partial. With return_index=True each batch also carries the sample
    indices (e.g. to look up split.depths for per-depth accuracy)."""
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
    """The cache file of a dataset: its name hashes the format version and every generation
    parameter."""
    digest = hashlib.sha256(_meta(name, params).encode()).hexdigest()[:16]
    return os.path.join(cache_dir or default_cache_dir(), f"{name}-{digest}.npz")


def load_or_generate(name: str, params: dict, generate, cache_dir=None) -> dict:
    """Load {split: ClassificationSplit} from the cache, or call generate() and cache its result.

    A missing, truncated, corrupted or mismatching file is regenerated (with a warning unless
    missing); failing to write the cache only warns.
    """
    path, meta = cache_path(name, params, cache_dir), _meta(name, params)
    if os.path.exists(path):
        try:
            return _load(path, meta, len(params["vocab"]), len(params["classes"]))
        except Exception as e:  # any damage (zip, CRC, header, shapes) just means "generate again"
            warnings.warn(f"unreadable cache file {path} ({type(e).__name__}: {e}); regenerating")
    # a line on stderr whether or not it is a terminal (the tqdm bars are shown only on one):
    # ListOps takes minutes
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
        # every vocabulary here has < 256 tokens
        arrays[f"{k}.tokens"] = inputs.tokens.astype(np.uint8)
        arrays[f"{k}.offsets"] = inputs.offsets
        arrays[f"{k}.labels"] = s.labels
        arrays[f"{k}.depths"] = s.depths
    os.makedirs(os.path.dirname(path), exist_ok=True)
    # Write a temporary file in the same directory, then rename: readers never see a half-written
    # file.
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
            splits[k] = ClassificationSplit(Ragged(tokens, offsets), labels.astype(np.int64),
                                            depths.astype(np.int64))
    return splits


