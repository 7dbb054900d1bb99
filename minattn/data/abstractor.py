"""Relational tasks of the Abstractor paper (docs/abstractor.md §6): object sorting, pairwise order,
SET.

The inputs are vectors, not tokens: a task holds a table of object vectors (``objects``) and a split
holds rows of object indices, so a batch is objects[index]. Generation takes well under a second, so
nothing is cached on disk. The dataset is drawn once from the task seed (validation and test stay
fixed); a run's training set is a sample of the train pool drawn with the run's seed (``sample``).
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np

from .base import Task, rng_for


@dataclass
class ObjectSplit:
    """Sample i is the objects index[i] (rows of the task's object table) with targets labels[i]."""
    index: np.ndarray       # (N, m) int64
    labels: np.ndarray      # (N,) int64 class, or (N, m) int64 target sequence (sorting)

    def __len__(self):
        return len(self.labels)

    @property
    def lines(self) -> list:
        """Lines "object indices<TAB>labels" (the objects themselves:
        ``ObjectTask.export_files``)."""
        return [" ".join(map(str, idx)) + "\t" + " ".join(map(str, np.atleast_1d(y)))
                for idx, y in zip(self.index.tolist(), self.labels.tolist())]

    def describe(self) -> str:
        return f"samples of {self.index.shape[1]} objects"

    def subset(self, idx) -> "ObjectSplit":
        return ObjectSplit(self.index[idx], self.labels[idx])

    def sample(self, n: int, rng: np.random.Generator) -> "ObjectSplit":
        """n samples drawn without replacement (one trial's training set), in their original
        order."""
        if not 1 <= n <= len(self):
            raise ValueError(f"train size {n} is out of range: the train pool has {len(self)} "
                             "samples")
        return self.subset(np.sort(rng.choice(len(self), n, replace=False)))

    def batches(self, batch_size: int, rng: np.random.Generator):
        """Endless training batches (ObjectSplits) in Keras-style epochs: ``epoch_batches``."""
        for idx in epoch_batches(len(self), batch_size, rng):
            yield self.subset(idx)

    def chunks(self, batch_size: int):
        """One pass in order, the last chunk partial (evaluation)."""
        for s in range(0, len(self), batch_size):
            yield self.subset(slice(s, s + batch_size))


def epoch_batches(n: int, batch_size: int, rng: np.random.Generator):
    """Endless epochs of sample indices, as Keras' fit: a fresh permutation per epoch cut into
    batches of batch_size, the last one partial (so 500 samples at batch 512 are one step per
    epoch)."""
    if n < 1 or batch_size < 1:
        raise ValueError(f"need samples and batch_size ≥ 1, got {n} and {batch_size}")
    while True:
        perm = rng.permutation(n)
        for s in range(0, n, batch_size):
            yield perm[s:s + batch_size]


class ObjectTask(Task):
    """A table of object vectors (``objects``) and splits of rows of object indices into it."""
    objects: np.ndarray

    def export_files(self) -> dict:
        """DIR/objects.tsv (one object vector per line) and DIR/<split>.tsv (object
        indices<TAB>labels)."""
        table = ["\t".join(f"{v:.6g}" for v in row) for row in self.objects.tolist()]
        return {"objects.tsv": table, **super().export_files()}

    def __repr__(self):
        sizes = ", ".join(f"{k}={len(v)}" for k, v in self.splits.items())
        n, d = self.objects.shape
        return f"<{type(self).__name__} {self.name!r}: {n} objects of dimension {d}, {sizes}>"


def _object_splits(rng, index, labels, sizes) -> dict:
    """Shuffle, then cut consecutive splits of the given sizes (None: the rest)."""
    perm, out, start = rng.permutation(len(labels)), {}, 0
    for name, size in sizes.items():
        idx = perm[start:] if size is None else perm[start:start + size]
        out[name], start = ObjectSplit(index[idx], labels[idx]), start + len(idx)
    return out


class SortTask(ObjectTask):
    """Object sorting (docs/abstractor.md §6.1). Attributes a_0..a_3 ~ N(0, I_4) and b_0..b_11 ~
    N(0, I_8) give 48 objects o_{12i+j} = (a_i, b_j) ∈ R^12, ordered by i, then j: the order of
    their indices. A sample is 10 distinct objects in random order; its targets are the argsort
    (labels[t] = the input position of the t-th smallest object), decoded after a START token:

        index  = [17, 3, 40, 29, 5, 11, 46, 0, 33, 21]         source objects[index], 10 × 12
        labels = argsort(index) = [7, 1, 4, 5, 0, 9, 3, 8, 2, 6]
        decoder input = [10 (START), 7, 1, 4, 5, 0, 9, 3, 8, 2] (``decoder_inputs``)

    100,000 sequences (exact duplicates dropped), shuffled: test 20%, valid 10%, train pool the
    rest.
    """
    name = "sort"
    START = 10
    N_PRIMARY, N_SECONDARY, LENGTH = 4, 12, 10

    def __init__(self, seed: int = 0, cache_dir=None, n_sequences: int = 100_000):
        rng = rng_for(seed, "sort")
        a = rng.standard_normal((self.N_PRIMARY, 4))
        b = rng.standard_normal((self.N_SECONDARY, 8))
        # row 12i + j = (a_i, b_j)
        self.objects = np.concatenate([np.repeat(a, self.N_SECONDARY, axis=0),
                                       np.tile(b, (self.N_PRIMARY, 1))], axis=1).astype(np.float32)
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


class PairwiseOrderTask(ObjectTask):
    """Pairwise order (docs/abstractor.md §6.2). 64 objects o_i ~ N(0, I_32), ordered by index.
    Every ordered pair of distinct objects is a sample of 2 × 32 with label 1[i < j]: pair (5, 41)
    has label 1, pair (41, 5) label 0. The 4,032 pairs are shuffled and split with ceil rounding:
    test 35% (1,412), valid 15% (605), train 2,015. Test pairs never occur in training, so they must
    be answered by transitivity."""
    name = "pairwise"

    def __init__(self, seed: int = 0, cache_dir=None, n_objects: int = 64, dim: int = 32):
        rng = rng_for(seed, "pairwise")
        self.objects = rng.standard_normal((n_objects, dim)).astype(np.float32)
        i, j = np.nonzero(~np.eye(n_objects, dtype=bool))
        index, n = np.stack([i, j], axis=1), len(i)
        self.splits = _object_splits(rng, index, (i < j).astype(np.int64),
                                     {"test": math.ceil(0.35 * n), "valid": math.ceil(0.15 * n),
                                      "train": None})


def card_attributes() -> np.ndarray:
    """(81, 4): card c has attribute values (number, colour, pattern, shape) = base-3 digits of
    c."""
    return np.array(list(itertools.product(range(3), repeat=4)), dtype=np.int64)


def is_set(values: np.ndarray) -> np.ndarray:
    """values (..., 3, 4) attribute values of triples → (...) bool: every attribute all equal or all
    different, i.e. v1 + v2 + v3 ≡ 0 (mod 3) for each attribute."""
    return (values.sum(axis=-2) % 3 == 0).all(axis=-1)


class SetTask(ObjectTask):
    """SET (docs/abstractor.md §6.3) with non-image cards: a documented deviation (the paper embeds
    card images with a CNN), so results are not directly comparable with the paper's. 81 cards
    (``card_attributes``); three distinct cards form a SET iff every attribute is all equal or all
    different:

        cards 0 (0,0,0,0), 40 (1,1,1,1), 80 (2,2,2,2): a SET, label 1
        cards 0 (0,0,0,0), 1 (0,0,0,1), 5 (0,0,1,2): pattern 0,0,1 is neither, label 0

    10,000 triples, half SETs (two random distinct cards completed by the mod-3 rule), half random
    triples of distinct cards that are not SETs (``check_negatives``; the reference did not check,
    ≈1/79 label noise), each triple in random order. Splits: test 20%, valid 10%, train pool the
    rest. Card vectors (``cards``): "onehot" (12-d: 3 bits per attribute, the noise-free analogue of
    the paper's CNN attribute code) or "random64" (tanh(M b_card), M ∈ R^{64×12} ~ N(0, 1) drawn
    once).
    """
    name = "set"
    CARDS = ("onehot", "random64")

    def __init__(self, seed: int = 0, cache_dir=None, cards: str = "onehot",
                 n_triples: int = 10_000,
                 check_negatives: bool = True):
        if cards not in self.CARDS:
            raise ValueError(f"unknown card encoding {cards!r}; use one of {', '.join(self.CARDS)}")
        self.attributes = attrs = card_attributes()
        onehot = (attrs[:, :, None] == np.arange(3)).reshape(81, 12).astype(np.float32)
        M = np.random.default_rng(12345).standard_normal((64, 12))
        self.objects = onehot if cards == "onehot" else np.tanh(onehot @ M.T).astype(np.float32)
        rng = rng_for(seed, "set")
        n_pos = n_triples // 2
        pairs = np.argsort(rng.random((n_pos, 81)), axis=1)[:, :2]
        # the card completing the SET
        third = (-attrs[pairs].sum(axis=1)) % 3 @ np.array([27, 9, 3, 1])
        negatives = np.empty((0, 3), np.int64)
        # rejection sampling
        while len(negatives) < n_triples - n_pos:
            draw = np.argsort(rng.random((n_triples, 81)), axis=1)[:, :3]
            negatives = np.concatenate([negatives,
                                        draw[~is_set(attrs[draw])] if check_negatives else draw])
        index = np.concatenate([np.column_stack([pairs, third]), negatives[:n_triples - n_pos]])
        # shuffle cards
        index = np.take_along_axis(index, np.argsort(rng.random(index.shape), axis=1), axis=1)
        labels = np.repeat(np.array([1, 0]), [n_pos, n_triples - n_pos])
        n = n_triples
        self.splits = _object_splits(rng, index, labels,
                                     {"test": n // 5, "valid": n // 10, "train": None})
