"""The fit's alignment of two sizes' op sequences (launcher/estimate/_fit.py): a batch of 1 makes
views where a larger batch makes copies, so the sequences differ in a stretch and the points
between them are paired run by run."""

from __future__ import annotations

import random
from difflib import SequenceMatcher

from launcher.estimate._fit import _align_sequences, _opcodes


def _tiles(ref: list[str], seq: list[str], codes: list[tuple[str, int, int, int, int]]) -> bool:
    """Whether ``codes`` cover both sequences in order, with every equal run really equal."""
    i = j = 0
    for tag, i1, i2, j1, j2 in codes:
        if (i1, j1) != (i, j) or (tag == "equal" and ref[i1:i2] != seq[j1:j2]):
            return False
        i, j = i2, j2
    return (i, j) == (len(ref), len(seq))


def test_a_stretch_that_differs_inside_repeated_blocks_aligns_as_difflib_aligns_it() -> None:
    """The shape of a depth-scaled trace: blocks of the same ops, one block's ops differing
    (views at size 1): the head and tail are equal runs, and the stretch between them is what
    difflib's matcher makes of it."""
    block = ["mm", "add", "view", "softmax", "mm", "gelu", "mm", "add"]
    ref = ["embedding"] + block * 4 + ["loss"]
    seq = ["embedding"] + block * 2 + ["mm", "clone", "add", "view", "softmax", "mm"] + \
        block[5:] + block + ["loss"]
    codes = _opcodes(ref, seq)
    assert codes == SequenceMatcher(None, ref, seq, autojunk=False).get_opcodes()
    assert codes[0][:3] == ("equal", 0, 1 + 2 * len(block) + 1)
    assert codes[-1][0] == "equal" and codes[-1][2] == len(ref)
    assert _opcodes(ref, ref) == [("equal", 0, len(ref), 0, len(ref))]
    assert _opcodes([], []) == []


def test_any_two_sequences_get_an_alignment_that_covers_both() -> None:
    rng = random.Random(0)
    for _ in range(2000):
        ref = [rng.choice("abc") for _ in range(rng.randint(0, 12))]
        seq = list(ref)
        for _ in range(rng.randint(0, 3)):
            k = rng.randint(0, len(seq))
            if rng.random() < 0.5:
                seq.insert(k, rng.choice("abcd"))
            elif seq:
                del seq[min(k, len(seq) - 1)]
        assert _tiles(ref, seq, _opcodes(ref, seq)), (ref, seq)


def test_a_stretch_that_differs_is_one_unit_of_every_sequence() -> None:
    """An op one size has and the other not: the ops around it merge into one unit (its
    maximum is one point of the fit), the rest pair op by op."""
    ref = ["a", "b", "c", "d"]
    units, ranges = _align_sequences(ref, [["a", "b", "x", "c", "d"], ref])
    assert units == 3
    assert ranges == [[(0, 1), (1, 4), (4, 5)], [(0, 1), (1, 3), (3, 4)]]
