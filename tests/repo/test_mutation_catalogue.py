"""The mutant catalogue (tests/mutants.py, run by ``make mutation``, not in CI) stays plantable: every
mutant's anchor occurs exactly once in its file, so a refactor that moves or rewraps the code it mutates
fails here, in CI, not silently at the next mutation run."""
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests"))
from mutants import CORE, DEFINITIONS  # noqa: E402


@pytest.mark.parametrize("mutant", CORE + DEFINITIONS, ids=lambda m: f"{m.file}: {m.description}")
def test_every_anchor_occurs_once(mutant):
    path = os.path.join(ROOT, mutant.file)
    assert os.path.isfile(path), f"{mutant.file} does not exist (moved?): {mutant.description}"
    with open(path, encoding="utf-8") as f:
        n = f.read().count(mutant.original)
    assert n == 1, f"{mutant.file}: the anchor of {mutant.description!r} occurs {n} times: {mutant.original!r}"
