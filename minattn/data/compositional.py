"""The Contextual Retrieval Task of Compositional Attention: fresh data every step, nothing on
disk."""
from __future__ import annotations

import numpy as np

from .base import Task, rng_for

# α_s weights search s in the label (Eq. 15): drawn once from U(−1, 1) by the paper's code
# (docs/compositional.md §7).
RETRIEVAL_ALPHAS = (-0.71347752, -0.6062312, 0.66062073, -0.61213017, -0.82631877, 0.75908621,
                    -0.36274866,
                    0.84383333)


def retrieval_combinations(searches: int, retrievals: int):
    """The deterministic OOD split of retrieval-choice combinations (docs/compositional.md §8):
    (train, test), int arrays of shape (n, searches) whose row t makes search s retrieve t[s].

    All retrievals^searches tuples in lexicographic order; even positions go to train, odd ones to
    test; then the first test tuples move to train until it holds floor(0.8 · all). For (2, 4): 12
    train tuples, test (2,1), (2,3), (3,1), (3,3) (paper Table 5).
    """
    # = itertools.product order
    combos = np.indices((retrievals,) * searches).reshape(searches, -1).T
    train, test = combos[0::2], combos[1::2]
    # floor(0.8·|all|) in integers
    move = max(0, 4 * len(combos) // 5 - len(train))
    return np.concatenate([train, test[:move]]), test[move:]


class RetrievalTask(Task):
    """Contextual Retrieval Task (Mittal et al. 2022, Appendix C.1, Eqs. 15–18;
    docs/compositional.md §7).

    Each of N objects has S search features z and R retrieval features z̃, all N(0, 1). Object i's
    search s finds its nearest neighbour j* along z[s], never i itself (Eq. 17; ties: lowest j), and
    retrieves z̃_j*[r*(i, s)], where the retrieval choice r*(i, s) is part of i's input (Eq. 18);
    the label is y_i = Σ_s α_s · retrieved_s (Eq. 15). Worked example, S = R = 2, N = 3 (integer
    retrieval features for readability):

        object   z (search 0, 1)   z̃ (retrieval 0, 1)   r* (search 0, 1)
          0        0.0   1.0           5    6             1   0
          1        0.3  -2.0           7    8             .   .
          2        1.0   0.8           9   10             .   .

    Object 0: search 0 finds object 1 (|0.3 − 0.0| < |1.0 − 0.0|) and retrieves z̃_1[1] = 8;
    search 1 finds object 2 (|0.8 − 1.0| = 0.2) and retrieves z̃_2[0] = 9; so
    y_0 = α_0·8 + α_1·9 = −11.1639. Its input row is
    [z_0, z̃_0, onehot(1), onehot(0)] = [0, 1, 5, 6, 0, 1, 1, 0] (in_dim = S + R + S·R).

    Modes: ``pool="all"`` draws every r*(i, s) uniformly (IID); ``"train"``/``"test"`` draw one
    combination per object from ``retrieval_combinations`` (OOD training/evaluation). There is no
    fixed dataset: every ``batch`` is fresh, a pure function of the generator passed in. For the
    common task interface, ``splits`` holds one ``RetrievalSample`` per pool: ``n_export`` samples
    drawn from ``seed`` only when read (``tasks.py stats/export``); training never reads them.
    """
    name = "retrieval"
    pools = ("all", "train", "test")

    def __init__(self, searches: int = 2, retrievals: int = 4, n_objects: int = 10, seed: int = 0,
                 cache_dir=None, n_export: int = 1_000):
        # cache_dir: accepted for get_task's interface; nothing is cached.
        if not 1 <= searches <= len(RETRIEVAL_ALPHAS):
            raise ValueError(f"searches must be in 1..{len(RETRIEVAL_ALPHAS)} (one α each), got "
                             f"{searches}")
        if retrievals < 1 or n_objects < 2:
            raise ValueError(f"need retrievals ≥ 1 and n_objects ≥ 2 (a neighbour other than "
                             f"oneself), got {retrievals} and {n_objects}")
        self.searches, self.retrievals, self.n_objects = searches, retrievals, n_objects
        self.in_dim = searches + retrievals + searches * retrievals
        self.alphas = np.array(RETRIEVAL_ALPHAS[:searches])
        # the OOD split, made on first use (R^S tuples: IID mode never needs it)
        self._combos = None
        self.splits = {pool: RetrievalSample(self, pool, n_export, seed) for pool in self.pools}

    def combinations(self, pool: str) -> np.ndarray:
        if self._combos is None:
            combos = retrieval_combinations(self.searches, self.retrievals)
            self._combos = dict(zip(("train", "test"), combos))
        if not len(self._combos[pool]):
            raise ValueError(f"searches={self.searches}, retrievals={self.retrievals} leave no "
                             "held-out combination for the OOD test pool")
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

    def batches(self, batch_size: int, rng: np.random.Generator, pool: str = "all"):
        """Endless training batches: a fresh ``batch`` of ``pool`` every step."""
        while True:
            yield self.batch(batch_size, rng, pool)

    def labels(self, z: np.ndarray, prefs: np.ndarray) -> np.ndarray:
        """y (B, N) from features z (B, N, S + R) and retrieval choices r* (B, N, S)
        (Eqs. 15–18)."""
        B, N, _ = z.shape
        S = self.searches
        dist = np.abs(z[:, :, None, :S] - z[:, None, :, :S])                # (B, i, j, S)
        dist[:, np.arange(N), np.arange(N)] = np.inf                        # j ≠ i
        # (B, N, S); argmin: lowest j on ties
        nearest = dist.argmin(axis=2)
        retrieved = z[np.arange(B)[:, None, None], nearest, S + prefs]      # z̃_j*[r*]   (B, N, S)
        return retrieved @ self.alphas


class RetrievalSample:
    """n samples of one pool drawn from seed, made on first use: the retrieval task's stand-in for a
    split, so that ``tasks.py stats/export`` treat it like every other task. One line per sample:
    the N input rows (objects separated by " | "), a TAB, the N labels."""

    def __init__(self, task: RetrievalTask, pool: str, n: int, seed: int):
        self.task, self.pool, self.n, self.seed = task, pool, n, seed

    def __len__(self):
        return self.n

    @property
    def lines(self) -> list:
        x, y, _ = self.task.batch(self.n, rng_for(self.seed, f"retrieval/{self.pool}"), self.pool)
        return [" | ".join(" ".join(f"{v:.4g}" for v in row)
                           for row in xs) + "\t" + " ".join(f"{v:.4g}" for v in ys)
                for xs, ys in zip(x.tolist(), y.tolist())]

    def describe(self) -> str:
        n_combos = self.task.retrievals ** self.task.searches if self.pool == "all" else len(
            self.task.combinations(self.pool))
        return f"seeded samples of {self.task.n_objects} objects, {n_combos} retrieval-choice combinations"
