"""ListOps with dependency depth (docs/ndr.md §7.3), the NDR paper's third task, by a vectorised
sampler.

The official sampler (item 3 of docs/ndr.md §7.3) is a recursive branching process, and the deep
sets are rare events (about 1 in 15,000 draws reaches dependency depth 9 within 50 length units), so
a one-tree-at-a-time Python sampler needs ~15 minutes for the paper's sets. Here a whole chunk of
independent draws grows breadth-first with NumPy: every node makes the same independent choices as
the recursive sampler (leaf vs operation, argument count, digit, operation), only in a different
order of the random stream, so the distribution is exactly the official one's. A draw whose length
already exceeds the limit stops growing (its remaining nodes stay leaves): it is rejected either
way, because the length only grows.
"""
from __future__ import annotations

import math

import numpy as np
from tqdm import tqdm

from .base import Ragged, rng_for
from .classification import ClassificationTask, make_split

LISTOPS_OPS = ["[MIN", "[MAX", "[MED", "[SM"]
_CLOSE, _OP0, _DIGIT0 = 0, 1, 5   # ids of "]", the first operation and digit 0 in ListOpsTask.vocab


def _apply_ops(op, nargs, cval, ctd, cdd, clen):
    """Evaluate operations whose arguments are consecutive segments of the child arrays (the rules:
    docs/ndr.md §7.3).

    op, nargs: (K,) operation ids (MIN, MAX, MED, SM) and argument counts (2..5); c*: value, tree
    depth, dependency depth and length of the sum(nargs) arguments. Returns the same four for the K
    results.
    """
    starts = np.cumsum(nargs) - nargs
    seg = np.repeat(np.arange(len(nargs)), nargs)
    pos = np.arange(len(cval)) - starts[seg]                       # argument position, < 8
    # MIN/MAX select the FIRST argument holding the extreme value: break ties by position in the
    # key.
    i_min = starts + np.minimum.reduceat(cval * 8 + pos, starts) % 8
    i_max = starts + 7 - np.maximum.reduceat(cval * 8 + (7 - pos), starts) % 8
    # MED: sort each segment by value, ties in argument order (the keys are unique, so this is
    # stable); the middle one or two arguments decide both the value and the dependency depth.
    order = np.argsort(seg * 128 + cval * 8 + pos)
    i_lo, i_hi = order[starts + (nargs - 1) // 2], order[starts + nargs // 2]
    val = np.choose(op, [cval[i_min], cval[i_max], (cval[i_lo] + cval[i_hi]) // 2,
                         np.add.reduceat(cval, starts) % 10])
    dd = 1 + np.choose(op, [cdd[i_min], cdd[i_max], np.maximum(cdd[i_lo], cdd[i_hi]),
                            np.maximum.reduceat(cdd, starts)])
    return val, 1 + np.maximum.reduceat(ctd, starts), dd, 3 + np.add.reduceat(clen, starts)


def _grow(rng, owner, m, length, max_len, p_op, max_args):
    """Grow one tree(m) of the sampler for each entry of owner (the draw it belongs to), level by
    level.

    length[draw] holds a running lower bound of the draw's length (3 per operation, 1 per leaf or
    pending node) and is updated in place. Returns levels [(nargs, digit, op)], root level first;
    the children of level l are level l+1 in parent order.
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
    """n independent draws of the official sampler for a depth range (lo, hi), made at once.

    Attributes value, tree_depth, dep_depth, length: (n,) arrays (length > max_len for rejected
    draws, whose trees were cut short). tokens(i) rebuilds the ids of draw i.
    """

    def __init__(self, rng, n, lo, hi, p_op=0.3, max_args=5, max_len=50):
        length = np.ones(n, np.int64)
        self.root = _grow(rng, np.arange(n), hi, length, max_len, p_op, max_args)
        val, td, dd, ln = _evaluate(self.root)
        # While the tree is shallower than lo: 2..max_args-1 fresh tree(hi-1) arguments, the old
        # tree inserted at randint(#args) (never last), under a random operation. Each round wraps a
        # subset of the previous round's draws, so draw i's wraps are rounds 0..k-1 for some k.
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
        # cut-short draws: the computed length is the bound, > max_len
        assert np.array_equal(ln, length)
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
        # (op, #fresh args, position, first arg, levels)
        rounds = []
        for w, nn, pos, op, levels, first in self.wraps:
            j = int(np.searchsorted(w, i))
            if j == len(w) or w[j] != i:
                break
            rounds.append((int(op[j]), int(nn[j]), int(pos[j]), int(first[j]),
                           self._level_lists(levels)))
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
    """ListOps with dependency depth (docs/ndr.md §7.3; the official code's variant "big"); read at
    SOS.

    Tokens are space-separated: "]" 0, "[MIN" 1, "[MAX" 2, "[MED" 3, "[SM" 4, digit k -> 5 + k.
    Worked example:

        "[MED 4 8 5 [MAX 8 4 9 ] ]":  MAX(8, 4, 9) = 9;  MED(4, 8, 5, 9): sorted 4 5 8 9, even count,
        floor((5 + 8) / 2) = 6  ->  class "6";  ids [3, 9, 13, 10, 2, 13, 9, 14, 0, 0]

    Tree depth 3, but the result depends only on the leaves 5 and 8 (the middle of the stable sort),
    so the dependency depth is 2 and the paper depth (``depths``) is 1. Length: 3 + 3 + 6 leaves
    = 12.

    Splits (dependency depth; all with p_op 0.3, at most 5 arguments, length <= 50, distinct strings
    within a split, equal bins of ceil(n / #depths)): train 2-6 (1,000,000), iid 2-6 (1,000), valid
    7 (1,000), test 8-9 (1,000) -- paper depths 1-5, 1-5, 6, 7-8. As in the official code, train and
    iid are drawn independently, so short iid samples also occur in train. Generating the full train
    set takes a few minutes; it is cached. Sizes may be shrunk for tests.
    """
    name = "listops"
    DIGITS = [str(i) for i in range(10)]
    vocab = ["]"] + LISTOPS_OPS + DIGITS
    classes = DIGITS
    SPLITS = {"train": (2, 6), "iid": (2, 6), "valid": (7, 7), "test": (8, 9)}
    CHUNK = 50_000   # draws per vectorised chunk (part of the generation parameters)
    IDLE_CHUNKS = 100   # chunks in a row without a new sample before a too-tight max_length is refused

    def __init__(self, seed: int = 0, cache_dir=None, n_train: int = 1_000_000, n_iid: int = 1_000,
                 n_valid: int = 1_000, n_test: int = 1_000, p_op: float = 0.3, max_args: int = 5,
                 max_length: int = 50):
        self.sizes = {"train": n_train, "iid": n_iid, "valid": n_valid, "test": n_test}
        self.p_op, self.max_args, self.max_length = p_op, max_args, max_length
        super().__init__(seed, cache_dir)

    def _params(self):
        return {"splits": self.SPLITS, "sizes": self.sizes, "p_op": self.p_op,
                "max_args": self.max_args,
                "max_length": self.max_length, "chunk": self.CHUNK, "sampler": 1}

    def sample_set(self, split: str, lo: int, hi: int, n: int):
        """n distinct samples with dependency depth in lo..hi, at most ceil(n / #depths) per depth.

        Returns (list of id lists, values, dependency depths).
        """
        rng = rng_for(self.seed, f"listops/{split}")
        left = {d: math.ceil(n / (hi - lo + 1)) for d in range(lo, hi + 1)}
        seen, seqs, values, deps = set(), [], [], []
        with tqdm(total=n, desc=f"listops {split}", disable=None, leave=False) as bar:
            idle = 0   # chunks in a row that added nothing: a max_length too short never ends
            while len(seqs) < n:
                if idle > self.IDLE_CHUNKS:
                    raise ValueError(f"listops: no new {split} sample of depth {lo}-{hi} within "
                                     f"max_length={self.max_length} in {idle * self.CHUNK:,} draws: "
                                     "raise max_length")
                before = len(seqs)
                draws = _ListOpsDraws(rng, self.CHUNK, lo, hi, self.p_op, self.max_args,
                                      self.max_length)
                ok = (draws.length <= self.max_length) & (draws.dep_depth >= lo) & (draws.dep_depth <= hi)
                for i in np.flatnonzero(ok).tolist():
                    d = int(draws.dep_depth[i])
                    # bin full (checked first: building the string costs more)
                    if left[d] == 0:
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
                idle = idle + 1 if len(seqs) == before else 0
        return seqs, values, deps

    def _generate(self):
        splits = {}
        for split, (lo, hi) in self.SPLITS.items():
            seqs, values, deps = self.sample_set(split, lo, hi, self.sizes[split])
            offsets = np.concatenate([[0], np.cumsum([len(s) for s in seqs])])
            tokens = np.frombuffer(b"".join(seqs), np.uint8).astype(np.int64)
            splits[split] = make_split(Ragged(tokens, offsets), values, np.array(deps) - 1)
        return splits
