"""The retrieval eval's splits: held-out v2 stays as written, and the splits never share a user."""

from __future__ import annotations

import hashlib

from evals.memory import HELDOUT2_DATA, HELDOUT_DATA, RETRIEVAL_DATA
from graphs.memory.evaluation.retrieval import load_retrieval_set

HELDOUT2_SHA256 = "f8eba418558db777a1e0b9ec2daf28fdfd1d27c2852307c073dd245689152833"
"""As committed before any method change it could inform (issue 15, second pass). Never edit
the file to make a figure better; write a fresh split instead."""


def test_held_out_v2_is_unchanged_since_it_was_written() -> None:
    assert hashlib.sha256(HELDOUT2_DATA.read_bytes()).hexdigest() == HELDOUT2_SHA256


def test_the_splits_have_no_user_in_common_and_v2_is_big_enough() -> None:
    users = [
        {m.user for m in load_retrieval_set(path).memories}
        for path in (RETRIEVAL_DATA, HELDOUT_DATA, HELDOUT2_DATA)
    ]
    assert not users[0] & users[1]
    assert not users[0] & users[2]
    assert not users[1] & users[2]
    v2 = load_retrieval_set(HELDOUT2_DATA)
    assert len(users[2]) >= 5
    assert len(v2.queries) >= 70
    assert sum(not q.expected for q in v2.queries) >= 0.1 * len(v2.queries)
