"""hunks: split two contents into zero-context hunks; apply any subset of them."""

from __future__ import annotations

import itertools
import random

import pytest

from envbisect.model.errors import EnvBisectError
from envbisect.model.hunks import Hunk, HunkError, apply, decode, split

OLD = "a\nb\nc\nd\ne\nf\ng\n"
NEW = "a\nB\nc\nd\ne2\ne3\nf\n"  # b→B, e→e2 e3, g removed


def test_split_gives_one_hunk_per_run_of_changed_lines_with_git_headers() -> None:
    hunks = split(OLD, NEW)
    assert [h.header for h in hunks] == ["@@ -2,1 +2,1 @@", "@@ -5,1 +5,2 @@", "@@ -7,1 +7,0 @@"]
    assert [h.number for h in hunks] == [1, 2, 3]
    assert hunks[0].lines == ("@@ -2,1 +2,1 @@", "-b", "+B")
    assert hunks[2].text == "@@ -7,1 +7,0 @@\n-g\n"
    assert hunks[1].as_dict() == {"number": 2, "header": "@@ -5,1 +5,2 @@", "text": hunks[1].text}


def test_an_insertion_names_the_line_before_it_as_unified_diff_does() -> None:
    (hunk,) = split("x\ny\n", "x\nnew\ny\n")
    assert hunk.header == "@@ -1,0 +2,1 @@"
    (first,) = split("x\n", "top\nx\n")
    assert first.header == "@@ -0,0 +1,1 @@"
    assert apply("x\n", [first]) == "top\nx\n"


def test_every_subset_applies_and_the_full_set_gives_the_new_content() -> None:
    hunks = split(OLD, NEW)
    assert apply(OLD, hunks) == NEW
    assert apply(OLD, ()) == OLD
    for k in range(len(hunks) + 1):
        for subset in itertools.combinations(hunks, k):
            out = apply(OLD, reversed(subset))  # order does not matter
            assert out == apply(OLD, subset)
            for h in hunks:
                # each hunk's new lines are there exactly when it is applied
                assert ("".join(h.new) in out or not h.new) or h not in subset


def test_random_edits_round_trip() -> None:
    rng = random.Random(21)
    for _ in range(200):
        old = [f"line {rng.randrange(12)}\n" for _ in range(rng.randrange(0, 15))]
        new = [x for x in old if rng.random() > 0.2]
        for _ in range(rng.randrange(4)):
            new.insert(rng.randrange(len(new) + 1), f"added {rng.randrange(99)}\n")
        a, b = "".join(old), "".join(new)
        hunks = split(a, b)
        assert apply(a, hunks) == b
        assert apply(a, []) == a


def test_line_endings_and_a_missing_final_newline_are_kept() -> None:
    old, new = "a\r\nb\r\nc\r\nd", "a\r\nB\r\nc\r\nd!"
    hunks = split(old, new)
    assert apply(old, hunks) == new
    assert apply(old, hunks[1:]) == "a\r\nb\r\nc\r\nd!"
    assert hunks[0].lines == ("@@ -2,1 +2,1 @@", "-b", "+B")


def test_a_hunk_that_does_not_match_its_place_does_not_apply() -> None:
    hunks = split(OLD, NEW)
    with pytest.raises(HunkError, match=r"@@ -2,1 \+2,1 @@ does not apply"):
        apply("other\ncontent\n", hunks[:1])
    overlapping = Hunk(9, 1, ("b\n",), 1, ("X\n",))
    with pytest.raises(HunkError, match="overlaps"):
        apply(OLD, [hunks[0], overlapping])
    assert issubclass(HunkError, EnvBisectError)


def test_binary_content_has_no_text() -> None:
    assert decode(b"\xff\xfe\x00") is None
    assert decode("π\n".encode()) == "π\n"
    assert split("same\n", "same\n") == ()
