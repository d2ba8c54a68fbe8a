"""`sim.forecast._KeyIndex`: the forecast cache's vectorised key lookup."""

import numpy as np

from sim.forecast import _KeyIndex


def test_each_key_finds_its_own_row_and_an_unknown_key_none() -> None:
    rng = np.random.default_rng(0)
    keys = rng.integers(-(2**62), 2**62, size=(500, 3), dtype=np.int64)
    index = _KeyIndex()
    assert (index.find(keys) == -1).all()
    index.add(keys[:300])
    index.add(keys[300:])  # a second batch lands after the first
    assert np.array_equal(index.find(keys), np.arange(500))
    assert np.array_equal(index.find(keys[::-1]), np.arange(500)[::-1])
    other = keys.copy()
    other[:, 2] += 1  # the same job seen one step later is another key
    assert (index.find(other) == -1).all()


def test_two_keys_of_one_mix_never_return_each_others_row() -> None:
    a = np.array([[123, 456, 7]], dtype=np.int64)
    b = a + np.array([[0, int(_KeyIndex._MIX[2]), -1]])  # k1 + C and k2 - 1: the same 64-bit mix
    index = _KeyIndex()
    assert index._mixed(a)[0] == index._mixed(b)[0]
    index.add(a)
    assert index.find(b)[0] == -1
    index.add(b)
    assert index.find(a)[0] == 0
    assert index.find(b)[0] in (-1, 1)  # held but shadowed by a: computed again, never a's row
