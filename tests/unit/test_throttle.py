"""The sign-in limits' arithmetic: the sliding estimate, Retry-After, and the keys counted."""

from __future__ import annotations

import pytest

from auth.throttle import Count, Limit, account_key, address_key

LIMIT = Limit("test", 10, 300)


def count(attempts: int, previous: int, elapsed: float) -> Count:
    return Count(LIMIT, "k", 0.0, attempts, previous, elapsed)


@pytest.mark.parametrize(
    ("attempts", "previous", "elapsed"),
    [(11, 0, 10), (11, 30, 299), (5, 40, 100), (1, 11, 1), (50, 50, 150), (10, 10, 0)],
)
def test_after_retry_after_one_more_attempt_is_within_the_limit(
    attempts: int, previous: int, elapsed: float
) -> None:
    now = count(attempts, previous, elapsed)
    assert now.over
    later = elapsed + now.retry_after
    if later < LIMIT.window_s:  # the same window: this one's attempts stay, the last slides out
        then = count(attempts + 1, previous, later)
    else:  # the next window: this one is the last
        then = count(1, attempts, later - LIMIT.window_s)
    assert not then.over
    # And a second earlier it would still have been over (Retry-After is not padded).
    if now.retry_after > 1:
        sooner = later - 1.001
        early = (
            count(attempts + 1, previous, sooner)
            if sooner < LIMIT.window_s
            else count(1, attempts, sooner - LIMIT.window_s)
        )
        assert early.over


def test_a_window_boundary_does_not_reset_the_count() -> None:
    # Ten guesses at the end of one window, the eleventh just after it: still over.
    assert count(1, 10, 0.5).over
    assert not count(1, 10, 31).over


@pytest.mark.parametrize(
    ("given", "key"),
    [
        ("198.51.100.7", "198.51.100.7"),
        ("2001:db8:1:2:3:4:5:6", "2001:db8:1:2::/64"),
        ("2001:db8:1:2::ffff", "2001:db8:1:2::/64"),
        ("::ffff:198.51.100.7", "198.51.100.7"),
        ("unknown", "unknown"),
    ],
)
def test_an_ipv6_client_counts_by_its_64(given: str, key: str) -> None:
    assert address_key(given) == key


def test_an_account_counts_as_its_canonical_name() -> None:
    assert account_key(" Alice ") == account_key("alice") == "alice"
    assert account_key("NOT A NAME!" * 10) == ("not a name!" * 10)[:64]
