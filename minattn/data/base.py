"""The base class of every task (the interface: see minattn/data/__init__.py), the ragged sequence
container and the seeded random streams the generators draw from."""
from __future__ import annotations

import zlib

import numpy as np


class Task:
    """Base class of every task: ``name``, ``splits`` and the export every split supports."""
    name: str = ""
    export_ext = "tsv"        # the extension of each split's export file

    def export_files(self) -> dict:
        """{file name: text lines} for ``tasks.py export``: one file per split."""
        return {f"{k}.{self.export_ext}": s.lines for k, s in self.splits.items()}

    def __repr__(self):
        sizes = ", ".join(f"{k}={len(v)}" for k, v in self.splits.items())
        return f"<{type(self).__name__} {self.name!r}: {sizes}>"


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


def rng_for(seed: int, name: str) -> np.random.Generator:
    """An independent, reproducible stream per (seed, task/split) pair."""
    return np.random.default_rng([seed, zlib.crc32(name.encode())])


