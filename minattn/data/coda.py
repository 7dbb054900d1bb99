"""Mathematical Language Understanding (docs/coda.md §5), the CoDA paper's task: two-variable
arithmetic, character by character.

Generated vectorised (a million examples in about a second), so nothing is cached on disk.
"""
from __future__ import annotations

import numpy as np

from .base import Ragged, rng_for
from .seq2attn import Seq2SeqSplit, Seq2SeqTask

MLU_SHAPE = (2000, 2000, 2, 4, 3)   # a, b, assignment order, (u, w), op: 96M distinct inputs


def mlu_strings(keys: np.ndarray):
    """(inputs, targets), arrays of str, of the examples numbered ``keys`` in [0, 96M)
    (``MLU_SHAPE``)."""
    a, b, order, uw, op = np.unravel_index(keys, MLU_SHAPE)
    x, y = a - 1000, b - 1000
    sx, sy = np.char.add("x=", x.astype(str)), np.char.add("y=", y.astype(str))
    u, w = np.where(uw // 2 == 0, x, y), np.where(uw % 2 == 0, x, y)
    expr = np.char.add(np.char.add(np.array(["x", "y"])[uw // 2], np.array(["+", "-", "*"])[op]),
                       np.array(["x", "y"])[uw % 2])
    inputs = np.char.add(np.char.add(np.where(order == 0, sx, sy), ","),
                         np.where(order == 0, sy, sx))
    inputs = np.char.add(np.char.add(inputs, ","), expr)
    targets = np.choose(op, [u + w, u - w, u * w]).astype(str)
    return (inputs.astype(f"U{np.char.str_len(inputs).max(initial=1)}"),
            targets.astype(f"U{np.char.str_len(targets).max(initial=1)}"))


def _char_ids(strings: np.ndarray, vocab: list, end: int = None) -> Ragged:
    """The characters of each string as ids in ``vocab`` (single characters), optionally followed by
    ``end``."""
    n = len(strings)
    # one spare column for ``end``
    codes = np.zeros((n, strings.dtype.itemsize // 4 + 1), np.uint32)
    # unicode code points, 0-padded
    codes[:, :-1] = strings.view(np.uint32).reshape(n, -1)
    lengths = (codes != 0).sum(axis=1)
    lut = np.zeros(128, np.int64)
    lut[[ord(c) for c in vocab if len(c) == 1]] = [i for i, c in enumerate(vocab) if len(c) == 1]
    ids = lut[codes]
    if end is not None:
        ids[np.arange(n), lengths] = end
        lengths = lengths + 1
    return Ragged(ids[np.arange(codes.shape[1]) < lengths[:, None]],
                  np.concatenate([[0], np.cumsum(lengths)]))


class MLUTask(Seq2SeqTask):
    """Mathematical Language Understanding (Wangperawong 2018; CoDA paper Table 6; docs/coda.md §5).
    x and y get integers a, b in [−1000, 1000), assigned in random order; the question is u op w
    with u, w ∈ {x, y} and op ∈ {+, −, *}, each uniform; the answer is the exact integer, character
    by character:

        "x=85,y=-523,x*y"  →  "-44455" <eos>
        (in_vocab ids 11 13 9 6 14 ...; out_vocab ids 13 7 7 7 8 8 2)

    Every choice is uniform, so an example is a uniform key in [0, 96M) (``MLU_SHAPE``). Keys are
    drawn in fixed chunks from the seed and deduplicated (same key = same input string) in order of
    first appearance; that stream is cut into ``test`` (the first n_test), ``valid`` (the next
    n_valid) and ``train`` (the next n_train), so the held-out sets are disjoint from train by input
    string and do not change with n_train, and a smaller train set is a prefix of a larger one.
    Vocabularies: the 17 input and 11 output characters, plus <pad> (and <sos>, <eos> for the
    output). Lines "input:target"."""
    name = "mlu"
    in_tokens = list("0123456789xy=,+-*")
    out_tokens = list("0123456789-")

    def __init__(self, seed: int = 0, cache_dir=None, n_train: int = 200_000, n_valid: int = 2_000,
                 n_test: int = 5_000, chunk: int = 1 << 20):
        # cache_dir: accepted for get_task's interface; nothing is cached. No <unk>: every character
        # is known.
        self.in_vocab = ["<pad>"] + self.in_tokens
        self.out_vocab = ["<pad>", "<sos>", "<eos>"] + self.out_tokens
        self.sos, self.eos = 1, 2
        sizes = {"test": n_test, "valid": n_valid, "train": n_train}
        total = sum(sizes.values())
        if min(sizes.values()) < 1 or total > np.prod(MLU_SHAPE) // 2:
            raise ValueError(f"mlu: split sizes must be ≥ 1 and total at most 48M (half the "
                             f"space), got {sizes}")
        rng, keys = rng_for(seed, "mlu"), np.empty(0, np.int64)
        while len(keys) < total:
            keys = np.concatenate([keys, rng.integers(0, np.prod(MLU_SHAPE), chunk)])
            # first appearances, in order
            keys = keys[np.sort(np.unique(keys, return_index=True)[1])]
        self.splits, start = {}, 0
        for name, size in sizes.items():
            inputs, targets = mlu_strings(keys[start:start + size])
            start += size
            lines = np.char.add(np.char.add(inputs, ":"), targets)
            self.splits[name] = Seq2SeqSplit(_char_ids(inputs, self.in_vocab),
                                             _char_ids(targets, self.out_vocab, self.eos), lines,
                                             self.in_vocab, self.out_vocab)
