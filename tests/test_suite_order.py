"""The suite's own order: the files tests/conftest.py sends to the xdist workers first exist."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import LONGEST_FIRST


def test_the_longest_first_list_names_test_files_that_exist():
    here = Path(__file__).parent
    gone = [name for name in LONGEST_FIRST if not (here / name).is_file()]
    assert not gone, f"LONGEST_FIRST (tests/conftest.py) names files gone: {gone}"
    assert len(set(LONGEST_FIRST)) == len(LONGEST_FIRST)
