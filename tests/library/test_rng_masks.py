"""backend.RNG.keep_mask on NumPy reads its 16-bit draws from the generator's raw 64-bit words where it
can: the masks must be exactly those of ``integers(0, 65536, dtype=uint16)``, the stream must end where
that draw leaves it (so the next mask, and every resumed run, is unchanged), shapes whose size is not a
multiple of 4 included (they leave half a word pending, and the next draw must fall back)."""
import numpy as np
import pytest

from minattn import backend

SHAPES = [[(128, 7, 256)], [(3,), (4, 5), (8,)], [(5,), (2, 2), (4,)], [(1,), (1,), (1,), (4,), (6, 2)],
          [(896, 384), (896, 1), (12,)]]


def integers_masks(seed, shapes, p):
    gen = np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed])))
    return [gen.integers(0, 65536, size=s, dtype=np.uint16) >= round(p * 65536) for s in shapes], gen


@pytest.mark.parametrize("shapes", SHAPES, ids=str)
def test_keep_masks_are_the_integers_draws_and_the_stream_ends_alike(shapes):
    rng = backend.RNG(3)
    expected, gen = integers_masks(3, shapes, 0.3)
    for shape, want in zip(shapes, expected):
        got = rng.keep_mask(shape, 0.3)
        assert got.shape == shape and got.dtype == bool
        np.testing.assert_array_equal(got, want)
    ours, theirs = rng._gen.bit_generator.state, gen.bit_generator.state
    assert (ours["state"], ours["has_uint32"]) == (theirs["state"], theirs["has_uint32"])


def test_the_comparison_sees_a_wrong_word_order(monkeypatch):
    """A planted bug (each word's 16-bit halves read high first) must fail the comparison above."""
    def swapped(self, shape, p_drop):
        words = self._gen.bit_generator.random_raw(int(np.prod(shape)) // 4)
        return words.byteswap().view(np.uint16).reshape(shape) >= round(p_drop * 65536)
    monkeypatch.setattr(backend.RNG, "keep_mask", swapped)
    with pytest.raises(AssertionError):
        test_keep_masks_are_the_integers_draws_and_the_stream_ends_alike(SHAPES[0])
