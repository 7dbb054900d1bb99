"""The Neural Data Router paper's tasks: compositional table lookup (both presentations) and simple
arithmetic. ListOps, the third, is in listops.py. Each is a ClassificationTask (classification.py).
"""
from __future__ import annotations

import dataclasses
import itertools
import math

import numpy as np
from tqdm import tqdm

from .base import rng_for
from .classification import ClassificationTask, make_split


# ----------------------------------------------------------------------------------------------------
# Compositional table lookup (docs/ndr.md §7.1)
# ----------------------------------------------------------------------------------------------------

CTL_SEED = 0x12345678


def ctl_tables() -> np.ndarray:
    """The 11 tables a..k: permutation(8) drawn in order from RandomState(0x12345678) (the official
    code's seed)."""
    rs = np.random.RandomState(CTL_SEED)
    return np.stack([rs.permutation(8) for _ in range(11)])


class CTLTask(ClassificationTask):
    """Compositional table lookup, forward presentation (docs/ndr.md §7.1; official code
    ``ctl.reversed=1``).

    Eleven random bijections a..k of the 8 symbols 000..111 (ids 0..7; letters are ids 8..18). The
    input is the argument followed by the functions in the order they are applied; the answer (one
    of the 8 symbols) is read at EOS. Worked example, with
    d = [4,2,1,5,0,7,3,6], a = [6,1,5,7,0,4,2,3], b = [6,5,7,3,2,0,4,1]:

        "101 d a b"  means b(a(d(101))):  d(5) = 7, a(7) = 3, b(3) = 3  ->  class "011" (id 3)
        ids [5, 11, 8, 9]  ->  model input [SOS=20, 5, 11, 8, 9, EOS=19], depth 3

    Splits: train (53,704; depth 1-5), iid (the official code's valid-IID, 4,000; depth 2-5), valid
    (deeper_val, 1,000; depth 6-8), test (deeper, "Longer", 1,000; depth 9-10). Its test-IID (4,000)
    is held out of train but not exposed. ``seed`` only chooses which pool items become
    test-IID/valid-IID (the official code used an unseeded RNG there); everything else replays the
    fixed RandomState(0x12345678) draw order of the official code (numbered 1-5 in
    docs/ndr.md §7.1).
    """
    name = "ctl"
    cache_key = "ctl"
    SYMBOLS = [f"{i:03b}" for i in range(8)]
    LETTERS = list("abcdefghijk")
    vocab = SYMBOLS + LETTERS
    classes = SYMBOLS
    backward = False
    N_COMPOSED = 9          # only a..i appear in compositions

    def __init__(self, seed: int = 0, cache_dir=None):
        super().__init__(seed, cache_dir)
        if self.backward:  # the cache stores the forward presentation; backward is its mirror image
            self.splits = {k: dataclasses.replace(s, inputs=s.inputs.reversed_rows())
                           for k, s in self.splits.items()}

    def _params(self):
        return {"rng": CTL_SEED, "n_tables": 11, "n_composed": self.N_COMPOSED, "max_depth": 5,
                "reserve_max": 200, "iid_pool": 61_136, "n_test_iid": 4_000,
                "deeper_val": [6, 8, 1_000],
                "deeper": [9, 10, 1_000], "repeats": 30, "presentation": "forward"}

    def encode_sample(self, arg: int, comp) -> list:
        """Forward ids of c_1(...c_n(arg)) for comp = (c_1..c_n): [arg, c_n, ..., c_1]."""
        return [arg] + [8 + c for c in reversed(comp)]

    def _generate(self):
        rs = np.random.RandomState(CTL_SEED)
        tables = np.stack([rs.permutation(8) for _ in range(11)])                    # draw 1

        def unique(n, draw):
            """Draw (arg, comp) pairs until n distinct ones exist (dict keeps first-seen order)."""
            out = {}
            while len(out) < n:
                arg, comp = draw()
                out.setdefault((int(arg), tuple(int(c) for c in comp)), None)
            return list(out)

        # draw 2, reserved compositions: ceil(min(200, 9^d / 4)) per depth 0..5 ->
        # 1+3+21+183+200+200 = 608
        reserved = set()
        for d in range(6):
            target = len(reserved) + math.ceil(min(200, 0.25 * self.N_COMPOSED ** d))
            while len(reserved) < target:
                reserved.add(tuple(rs.randint(self.N_COMPOSED, size=d).tolist()))

        # draw 3, the IID pool: composition (5 draws, then its length 2..5), redrawn while reserved;
        # then argument
        def draw_iid():
            while True:
                comp = tuple(rs.randint(self.N_COMPOSED, size=5)[:rs.randint(2, 6)].tolist())
                if comp not in reserved:
                    return rs.randint(8), comp
        n_comps = sum(self.N_COMPOSED ** d for d in range(2, 6))                      # 66,420
        # 53,136 and 4,000
        n_iid, n_test = 8 * n_comps // 10, 4_000
        pool = unique(n_iid + 2 * n_test, draw_iid)                                  # 61,136

        # draw 4: the two unreported "new primitive" sets use tables j (9) and k (10); they are
        # drawn only to keep the RandomState in step for deeper_val and deeper.
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

        # draw 5: argument first, then the composition (first randint(lo, hi+1) of `size` draws)
        deeper_val = unique(1_000,
                            lambda: (rs.randint(8), rs.randint(9, size=8)[:rs.randint(6, 9)]))
        deeper = unique(1_000, lambda: (rs.randint(8), rs.randint(9, size=10)[:rs.randint(9, 11)]))

        # 8,000 pool items go to test-IID (first 4,000) and valid-IID (= our "iid"); the rest train
        held = rng_for(self.seed, "ctl/iid-split").choice(len(pool), 2 * n_test, replace=False)
        is_train = np.ones(len(pool), bool)
        is_train[held] = False
        iid = [pool[i] for i in np.sort(held[n_test:])]

        # train = 88 single tables + 53,136 IID + tables j, k x 8 arguments x 30 repeats = 53,704
        basic = [(a, (t,)) for t in range(11) for a in range(8)]
        repeats = [(a, (t,)) for t in (9, 10) for _ in range(30) for a in range(8)]
        train = basic + [p for p, keep in zip(pool, is_train) if keep] + repeats

        def make(samples):
            labels = []
            for arg, comp in samples:
                y = arg
                for c in reversed(comp):        # c_1(c_2(...c_n(x))): apply c_n first
                    y = tables[c][y]
                labels.append(y)
            return make_split([self.encode_sample(a, c) for a, c in samples], labels,
                              [len(c) for _, c in samples])

        return {"train": make(train), "iid": make(iid), "valid": make(deeper_val),
                "test": make(deeper)}


class CTLBackwardTask(CTLTask):
    """CTL, backward presentation (docs/ndr.md §7.1; official code ``ctl.reversed=0``): ordinary
    notation, functions first and the argument last. The same samples as ``ctl``, each sequence
    reversed:

        "b a d 101"  means b(a(d(101))) = 011 (class 3);  ids [9, 8, 11, 5]

    The answer is still read at EOS.
    """
    name = "ctl-backward"
    backward = True


# ----------------------------------------------------------------------------------------------------
# Simple arithmetic (docs/ndr.md §7.2)
# ----------------------------------------------------------------------------------------------------

def _uniform_stream(rng: np.random.Generator):
    """Endless U[0, 1) floats drawn from rng in blocks: a Python call per draw is the bottleneck of
    the recursive samplers. Integers use int(u * k) (bias below 1e-15)."""
    return itertools.chain.from_iterable(iter(lambda: rng.random(1 << 16).tolist(), None)).__next__


# Draws in a row that a generator may reject before it gives up (a length bound too tight for its depths).
STALL = 200_000

def arith_sample(u, min_depth: int, max_depth: int, p: float):
    """One draw of the official code's get_one sampler (code depths; docs/ndr.md §7.2); u() yields
    U[0, 1) floats.

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
    """Split n over depths lo..hi as ceil(remaining / depths left) per depth."""
    bins, remaining = {}, n
    for d in range(lo, hi + 1):
        bins[d] = math.ceil(remaining / (hi - d + 1))
        remaining -= bins[d]
    return bins


class ArithTask(ClassificationTask):
    """Simple arithmetic mod 10 (docs/ndr.md §7.2): fully bracketed + and * over digits, one token
    per character.

    Worked example: "((3+4)*(5*2))": 3+4 = 7 and 5*2 = 10 -> 0 (every node is reduced mod 10), so
    the answer is 7*0 = 0 (class "0"). Code depth: leaf 1, node 1 + max(children) = 3, so its paper
    depth (what ``depths`` stores) is 3 - 1 = 2. Ids: "(" 0, ")" 1, "+" 2, "*" 3, digit k -> 4 + k:
    [0, 0, 7, 2, 8, 1, 3, 0, 9, 3, 6, 1, 1].

    Splits (code depths; p = probability of an operation; at most 50 characters):
      train  basic 200 "(a op b)" + 25,000 each at depths 3..6, p 0.2   (100,200; paper depth 1-5)
      iid    basic 200 + 250 each at depths 3..6, p 0.2                 (1,200; 1-5)
      valid  1,000 at depth 7, p 0.3                                    (6)
      test   500 each at depths 8 and 9, p 0.3                          (7-8)
    The basic set is in both train and iid; no other overlap is removed, as in the official code.
    Sizes are the balanced part (the basic 200 come on top) and may be shrunk for tests.

    Readout: NDR and "+ abs/rel + gate" read EOS; the official code's "Transformer" and "+ rel"
    arithmetic baselines read SOS instead (docs/ndr.md §1) -- the preset chooses per model
    (``readout`` in minattn/lab/recipes/ndr.py).
    """
    name = "arith"
    DIGITS = [str(i) for i in range(10)]
    vocab = ["(", ")", "+", "*"] + DIGITS
    classes = DIGITS
    char_level = True
    SPLITS = {"train": (2, 6, 0.2), "iid": (2, 6, 0.2), "valid": (7, 7, 0.3), "test": (8, 9, 0.3)}

    def __init__(self, seed: int = 0, cache_dir=None, n_train: int = 100_000, n_iid: int = 1_000,
                 n_valid: int = 1_000, n_test: int = 1_000, max_length: int = 50):
        self.sizes = {"train": n_train, "iid": n_iid, "valid": n_valid, "test": n_test}
        self.max_length = max_length
        super().__init__(seed, cache_dir)

    def _params(self):
        return {"splits": self.SPLITS, "sizes": self.sizes, "max_length": self.max_length,
                "sampler": 1}

    def basic_set(self):
        """All 200 "(a op b)": in both train and iid."""
        return [(f"({a}{op}{b})", (a + b) % 10 if op == "+" else (a * b) % 10, 2)
                for op in "+*" for a in range(10) for b in range(10)]

    def _balanced(self, split: str, lo: int, hi: int, p: float, n: int):
        """Rejection-sample n distinct expressions with balanced code depths lo..hi."""
        u = _uniform_stream(rng_for(self.seed, f"arith/{split}"))
        bins, seen, out, misses = balanced_bins(n, lo, hi), set(), [], 0
        with tqdm(total=n, desc=f"arith {split}", disable=None, leave=False) as bar:
            while len(out) < n:
                s = arith_sample(u, lo, hi, p)
                misses += 1
                # too long: resample; repeats: rejected; a depth whose bin is full: skipped
                if len(s[0]) <= self.max_length and s[0] not in seen:
                    seen.add(s[0])
                    if bins.get(s[2], 0) > 0:
                        bins[s[2]] -= 1
                        out.append(s)
                        bar.update()
                        misses = 0
                if misses > STALL:   # a max_length too short for (some of) these depths: never ends
                    raise ValueError(f"arith: no new {split} expression of depth {lo}-{hi} within "
                                     f"max_length={self.max_length} in {STALL:,} draws: raise max_length")
        return out

    def _generate(self):
        lut = np.zeros(256, np.int64)
        lut[[ord(t) for t in self.vocab]] = np.arange(len(self.vocab))
        splits = {}
        for split, (lo, hi, p) in self.SPLITS.items():
            samples = self.basic_set() if lo == 2 else []
            samples += self._balanced(split, max(lo, 3), hi, p, self.sizes[split])
            seqs = [lut[np.frombuffer(e.encode(), np.uint8)] for e, _, _ in samples]
            splits[split] = make_split(seqs, [v for _, v, _ in samples],
                                       [d - 1 for _, _, d in samples])
        return splits
