"""Sequence-to-sequence tasks of seq2attn: lookup-table composition and SCAN, and the seq2seq split
they share with MLU (mlu.py).

Both are generated from rules in well under a second, so nothing is cached on disk. Vocabularies
keep the reference's special tokens (docs/seq2attn.md §1.1) only so that parameter counts match the
paper's.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

from .base import Ragged, Task, rng_for


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
    """One split: ``inputs[i]`` (ids in in_vocab) maps to ``targets[i]`` (ids in out_vocab, ending
    with <eos>); ``lines[i]`` is the example's canonical text line (see ``python tasks.py
    export``)."""
    inputs: Ragged
    targets: Ragged
    lines: list
    in_vocab: list
    out_vocab: list

    def __len__(self):
        return len(self.lines)

    def describe(self) -> str:
        n, m = self.inputs.lengths, self.targets.lengths - 1
        return f"examples, inputs {n.min()}-{n.max()} tokens, targets {m.min()}-{m.max()} tokens (+ <eos>)"

    def _batch(self, idx):
        return (*_pad(self.inputs, idx, self.in_vocab.index("<pad>")),
                *_pad(self.targets, idx, self.out_vocab.index("<pad>")))

    def batches(self, batch_size: int, rng: np.random.Generator, mode: str = "shuffled"):
        """Endless training batches (src, src_lengths, tgt, tgt_lengths), padded with <pad>.

        Each epoch visits every example once, in a fresh permutation drawn from rng (a seeded
        Generator replays the stream); the last batch of an epoch may be smaller. mode "bucketed"
        then stable-sorts the epoch by target length and visits the batches in random order (little
        padding)."""
        if mode not in ("shuffled", "bucketed"):
            raise ValueError(f"unknown batching mode {mode!r} for a seq2seq task (valid: shuffled, "
                             "bucketed)")
        if batch_size < 1 or not len(self):
            raise ValueError(f"need batch_size ≥ 1 and a non-empty split, got {batch_size} and "
                             f"{len(self)} examples")
        return self._epochs(batch_size, rng, mode == "bucketed")

    def _epochs(self, batch_size, rng, bucketed):
        while True:
            perm, starts = rng.permutation(len(self)), np.arange(0, len(self), batch_size)
            if bucketed:
                perm = perm[np.argsort(self.targets.lengths[perm], kind="stable")]
                starts = rng.permutation(starts)
            for s in starts:
                yield self._batch(perm[s:s + batch_size])

    def head(self, n: int) -> "Seq2SeqSplit":
        """The first n examples (generation order is random, so a fair sample)."""
        n = min(n, len(self))
        return Seq2SeqSplit(Ragged(self.inputs.tokens, self.inputs.offsets[:n + 1]),
                            Ragged(self.targets.tokens, self.targets.offsets[:n + 1]),
                            self.lines[:n],
                            self.in_vocab, self.out_vocab)

    def eval_batches(self, batch_size: int, rows=None):
        """One pass over the split (or over its ``rows``) in order of target length (stable), so a
        batch decodes few steps beyond its rows."""
        rows = np.arange(len(self)) if rows is None else np.asarray(rows, dtype=np.intp)
        order = rows[np.argsort(self.targets.lengths[rows], kind="stable")]
        for s in range(0, len(order), batch_size):
            yield self._batch(order[s:s + batch_size])


class Seq2SeqTask(Task):
    """Splits of (input, target) token sequences; subclasses fill ``self.splits`` through
    ``_make``."""
    name = ""
    export_ext = "txt"
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
                            Ragged.from_list([[ids_out[t] for t in y] + [self.eos]
                                              for _, y, _ in examples]),
                            [line for _, _, line in examples], self.in_vocab, self.out_vocab)

    def decode(self, ids) -> str:
        return " ".join(self.out_vocab[int(i)] for i in ids)

    def __repr__(self):
        sizes = ", ".join(f"{k}={len(v)}" for k, v in self.splits.items())
        return (f"<{type(self).__name__} {self.name!r}: V_in={len(self.in_vocab)}, "
                f"V_out={len(self.out_vocab)}, {sizes}>")


# --- lookup tables --------------------------------------------------------------------------------

BITS = [f"{i:03b}" for i in range(8)]
# t(000), t(001), ..., t(111) for each table (docs/seq2attn.md §2.1; identical in all five public
# samples)
LOOKUP_TABLES = {
    "t1": "110 001 101 010 011 000 111 100", "t2": "101 001 010 111 110 011 000 100",
    "t3": "111 101 010 100 011 000 001 110", "t4": "000 100 010 101 111 001 110 011",
    "t5": "001 000 110 100 101 010 011 111", "t6": "011 010 101 111 110 000 001 100",
    "t7": "011 110 000 100 001 111 101 010", "t8": "010 100 110 000 001 011 101 111",
}
LOOKUP_HELDOUT_COMPOSITIONS = "t1t6 t3t3 t3t5 t5t3 t5t6 t6t2 t6t3 t6t4"    # sample1's
# sample1's held-out inputs of the 28 seen compositions: V = validation, H = heldout_inputs
LOOKUP_HELDOUT_INPUTS = (
    "t1t1 H 000,111; t1t2 V 110 / H 001; t1t3 H 010,100; t1t4 H 001,100; t1t5 V 001 / H 000; "
    "t2t1 H 110,111; t2t2 V 011,111; t2t3 H 001,010; t2t4 V 100 / H 000; t2t5 H 000,010; t2t6 H "
    "000,101; t3t1 V 100,111; t3t2 V 110,111; t3t4 H 000,001; t3t6 V 111 / H 101; t4t1 V 001 / H "
    "111; t4t2 V 010 / H 001; t4t3 H 010,100; t4t4 V 001 / H 010; t4t5 H 000,001; t4t6 V 010 / H "
    "011; t5t1 V 011 / H 111; t5t2 H 001,010; t5t4 V 110 / H 100; t5t5 H 110,111; t6t1 H 001,011; "
    "t6t5 H 011,110; t6t6 H 000,111")


def lookup_example(bits: str, tables) -> tuple:
    """(input tokens, target tokens, line) for applying ``tables`` left to right to ``bits``
    (docs/seq2attn.md §2.2):

        lookup_example("100", ["t3", "t1"])[2] == "100 t3 t1 .\\t100 011 010\\t0 1 2 3"

    since t3(100) = 011 and t1(011) = 010. The target copies the input, then every intermediate
    result; the third column has one attention index per output step including <eos>."""
    outs = [bits]
    for t in tables:
        outs.append(LOOKUP_TABLES[t].split()[int(outs[-1], 2)])
    x = [bits, *tables, "."]
    return x, outs, f"{' '.join(x)}\t{' '.join(outs)}\t{' '.join(map(str, range(len(tables) + 2)))}"


class LookupTask(Seq2SeqTask):
    """Lookup-table composition, sample1 (Liška et al. 2018; docs/seq2attn.md §2). Eight bijections
    t1..t8 of 3-bit strings; "100 t3 t1 ." asks for t1(t3(100)), target "100 011 010 <eos>".

    Splits: train (232: all unary + 28 seen compositions of t1..t6 on 6 inputs each), validation
    (16) and heldout_inputs (40) (the other 2 inputs of the seen compositions), heldout_compositions
    (64), heldout_tables (192: one of t7/t8 composed with t1..t6), new_compositions (32: t7/t8
    only), all line-for-line equal (as sets) to sample1; and
    longer_compositions_{seen,incremental,new} (544/1084/32: three tables on 4 inputs each), random
    in the original, so here drawn from ``seed`` with the same structure."""
    name = "lookup"
    export_ext = "tsv"
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
                     + [ex(b, c) for c, h in held.items() for b in BITS
                        if b not in h.get("V", []) + h.get("H", [])],
            "validation": [ex(b, c) for c, h in held.items() for b in h.get("V", [])],
            "heldout_inputs": [ex(b, c) for c, h in held.items() for b in h.get("H", [])],
            "heldout_compositions": [ex(b, c) for c in held_comps for b in BITS],
            "heldout_tables": [ex(b, c) for t in S6 for n in new for c in ([t, n], [n, t])
                               for b in BITS],
            "new_compositions": [ex(b, [m, n]) for m in new for n in new for b in BITS],
        }
        rng = rng_for(seed, "lookup/longer")
        pick = lambda pool, k: [pool[i] for i in np.sort(rng.choice(len(pool), k,
                                                                    replace=False))]  # noqa: E731
        s6 = list(itertools.product(S6, repeat=3))
        seen = pick(s6, 136)
        unseen = [c for c in s6 if c not in set(seen)]
        product = lambda *parts: list(itertools.product(*parts))  # noqa: E731
        # t7/t8 never last
        incremental = (pick(seen, 96) + pick(unseen, 54) + pick(product(new, S6, S6), 56)
                       + pick(product(S6, new, S6), 50) + pick(product(new, new, S6), 15))
        for name, comps in [("seen", seen), ("incremental", incremental),
                            ("new", list(itertools.product(new, repeat=3)))]:
            splits[f"longer_compositions_{name}"] = [ex(b, list(c)) for c in comps for b in pick(BITS, 4)]
        self.splits = {k: self._make(v) for k, v in splits.items()}


# --- SCAN -----------------------------------------------------------------------------------------

SCAN_PRIMITIVES = ("walk", "look", "run", "jump")
SCAN_SPLITS = ("simple", "length", "addprim_jump", "addprim_turn_left", "around_right",
               "opposite_right", "right",
               "jump_around_right", "filler0", "filler1", "filler2", "filler3", "length_cutoff_K")
SCAN_CUTOFFS = (22, 24, 25, 26, 27, 28, 30, 32, 33, 36, 40)  # the cutoffs of Csordás et al. 2021


def scan_commands() -> list:
    """All 20,910 SCAN commands as (command, actions) string pairs, from the grammar
    (docs/seq2attn.md §3.1)."""
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
    (docs/seq2attn.md §3.3, §3.5); see ``SCAN_SPLITS``, where K is an output-length cutoff."""
    pairs, P = scan_commands(), SCAN_PRIMITIVES
    if split == "simple":       # random 80/20, seeded (the reference membership is not derivable)
        perm = rng_for(seed, "scan/simple").permutation(len(pairs))
        n_train = round(0.8 * len(pairs))
        return {"train": [pairs[i] for i in np.sort(perm[:n_train])],
                "test": [pairs[i] for i in np.sort(perm[n_train:])]}
    if split == "length":
        return {"train": [p for p in pairs if len(p[1]) <= 22],
                "test": [p for p in pairs if len(p[1]) >= 24]}
    if split.startswith("addprim_"):  # the primitive alone, repeated to be 10% of train
        prim = split[len("addprim_"):].replace("_", " ")
        if prim not in ("jump", "turn left"):
            raise ValueError(f"unknown SCAN split {split!r}: add_prim splits are addprim_jump and "
                             "addprim_turn_left")
        rest = [p for p in pairs if not _contains(p[0], prim)]
        alone = [p for p in pairs if p[0] == prim]
        return {"train": rest + alone * (len(rest) // 9),
                "test": [p for p in pairs if _contains(p[0], prim) and p[0] != prim]}
    if split.startswith("length_cutoff_"):
        k = split[len("length_cutoff_"):]
        if not k.isdigit():
            raise ValueError(f"unknown SCAN split {split!r}: use length_cutoff_K with an integer K "
                             "(e.g. 26)")
        k = int(k)
        # The pool in C order of the lines: the reference's shuffled order is not derivable
        # (docs/seq2attn.md §3.5).
        pool = sorted((p for p in pairs if len(p[1]) <= k), key=lambda p: scan_line(p).encode())
        iid = np.random.RandomState(1234).choice(len(pool), int(len(pool) * (1 - 0.9)), replace=False)
        is_iid = np.zeros(len(pool), bool)
        is_iid[iid] = True
        splits = {"train": [p for p, i in zip(pool, is_iid) if not i],
                  "iid": [p for p, i in zip(pool, is_iid) if i],
                  "test": [p for p in pairs if len(p[1]) > k]}
        # K = 1 and K ≥ 48 (the longest output)
        empty = [name for name, part in splits.items() if not part]
        if empty:
            raise ValueError(f"SCAN split {split!r} leaves no {' and no '.join(empty)} examples: "
                             "choose K from 2 to 47")
        return splits
    fillers = {"filler0": 0, "filler1": 1, "filler2": 2, "filler3": 3, "jump_around_right": 3}
    # Loula et al. exp. 2: the first k of look, walk, run are seen in "X around right"
    if split in fillers:
        pairs = [p for p in pairs if not _contains(p[0], "turn around right")]
        held = [x for x in P if x not in ("look", "walk", "run")[:fillers[split]]]
        return {"train": [p for p in pairs
                          if not any(_contains(p[0], f"{x} around right") for x in held)],
                "test": [p for p in pairs if _contains(p[0], "jump around right")]}
    if split in ("around_right", "opposite_right", "right"):  # Loula et al.'s template splits
        phrase = split.replace("_", " ")
        pairs = [p for p in pairs if not _contains(p[0], f"turn {phrase}")]
        is_test = [any(_contains(c, f"{x} {phrase}") for x in P) for c, _ in pairs]
        return {"train": [p for p, t in zip(pairs, is_test) if not t],
                "test": [p for p, t in zip(pairs, is_test) if t]}
    raise ValueError(f"unknown SCAN split {split!r}; valid: {', '.join(SCAN_SPLITS)}")


def scan_line(pair) -> str:
    """The canonical line: "IN: jump twice OUT: I_JUMP I_JUMP", as in the reference files."""
    return f"IN: {pair[0]} OUT: {' '.join(pair[1])}"


class ScanTask(Seq2SeqTask):
    """SCAN (Lake & Baroni 2018), generated from its grammar (docs/seq2attn.md §3), one split at a
    time:

        "jump around left twice"  ->  (I_TURN_LEFT I_JUMP) × 4, twice: 16 actions, then <eos>

    Splits (``SCAN_SPLITS``): simple (seeded 80/20), length, addprim_jump, addprim_turn_left, the
    template splits around_right, opposite_right, right, jump_around_right, filler0..filler3 (the
    paper's "k fillers": 0..3 of look/walk/run also seen in "X around right"), and length_cutoff_K
    (Csordás et al. 2021; adds an "iid" split). No "." is appended to inputs
    (docs/seq2attn.md §3.6)."""
    name = "scan"
    in_tokens = ["after", "and", "around", "jump", "left", "look", "opposite", "right", "run",
                 "thrice", "turn",
                 "twice", "walk"]
    out_tokens = ["I_WALK", "I_LOOK", "I_RUN", "I_JUMP", "I_TURN_LEFT", "I_TURN_RIGHT"]

    def __init__(self, seed: int = 0, cache_dir=None, split: str = ""):
        super().__init__()
        if not split:
            raise ValueError(f"scan needs a split; valid: {', '.join(SCAN_SPLITS)}")
        self.split = split
        self.splits = {k: self._make([(c.split(), a, scan_line((c, a))) for c, a in v])
                       for k, v in scan_split(split, seed).items()}


class ScanGrammar(ScanTask):
    """Every SCAN command, as one split "all" (``tasks.py export --task scan --split all``); not a
    training task."""

    def __init__(self, seed: int = 0, cache_dir=None):
        Seq2SeqTask.__init__(self)
        self.split = "all"
        self.splits = {"all": self._make([(c.split(), a, scan_line((c, a)))
                                          for c, a in scan_commands()])}
