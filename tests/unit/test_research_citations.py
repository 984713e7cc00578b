"""The deterministic citation check: fetched URL of this thread + quote in the stored snapshot."""

from __future__ import annotations

from graphs.research.citations import (
    NEVER_FETCHED,
    QUOTE_NOT_FOUND,
    QUOTE_TOO_SHORT,
    UNCITED,
    check_report,
    normalise_text,
    remove_failing,
)
from graphs.tools.fetchlog import FetchRecord, new_record

VAULT = "https://example.org/vault"


def record(url: str, content: str, *, thread: str = "t1", rid: int = 1, status: int = 200):
    r = new_record(
        thread_id=thread, url=url, final_url=url, status=status, title="t", content=content
    )
    return FetchRecord(**{**r.__dict__, "id": rid})


PAGE = record(
    VAULT,
    "The Svalbard Global Seed Vault opened on 26 February 2008.\nIt stores  duplicate seed samples.",
    rid=7,
)


def test_quote_present_in_the_fetched_snapshot_passes():
    report = f'The vault opened in 2008 ["The Svalbard Global Seed Vault opened on 26 February 2008"]({VAULT}).'
    result = check_report(report, [PAGE])
    assert result.ok
    assert result.citations[0].fetch_log_id == 7
    assert result.precision == 1.0


def test_whitespace_quotes_and_case_are_normalised():
    report = f"- It keeps copies [“it stores duplicate SEED samples”]({VAULT}#top)"
    assert check_report(report, [PAGE]).ok
    assert normalise_text("a\u00a0“b”  —  c") == 'a "b" - c'


def test_url_never_fetched_is_rejected():
    report = '- Opened in 2008 ["The Svalbard Global Seed Vault opened on 26 February 2008"](https://example.org/other)'
    result = check_report(report, [PAGE])
    assert not result.ok
    assert result.citations[0].reason == NEVER_FETCHED


def test_quote_not_in_the_content_is_rejected():
    report = (
        f'- It opened in 2010 ["The Svalbard Global Seed Vault opened on 1 March 2010"]({VAULT})'
    )
    result = check_report(report, [PAGE])
    assert result.citations[0].reason == QUOTE_NOT_FOUND
    assert result.precision == 0.0


def test_a_fetch_log_id_written_by_the_model_is_not_trusted():
    """Another thread fetched the page (record 99); this thread never did. The id in the
    report, and the URL matching another thread's record, prove nothing."""
    other_thread = record(VAULT, PAGE.content, thread="t2", rid=99)
    report = (
        "- Opened in 2008 (fetch-log id: 99, fetched 2026-11-30) "
        f'["The Svalbard Global Seed Vault opened on 26 February 2008"]({VAULT})'
    )
    this_threads_log: list[FetchRecord] = []  # what the tool logged for this thread
    result = check_report(report, this_threads_log)
    assert result.citations[0].reason == NEVER_FETCHED
    assert other_thread.id == 99
    # The checker is given only this thread's records; a failed fetch doesn't count either.
    failed = record(VAULT, "", status=0)
    assert check_report(report, [failed]).citations[0].reason == NEVER_FETCHED


def test_short_quotes_and_uncited_claims_fail():
    report = f'# Title\n\nA bare claim with no source.\n\n- Vault ["opened"]({VAULT})\n'
    result = check_report(report, [PAGE])
    reasons = [c.reason for c in result.failing]
    assert reasons == [UNCITED, QUOTE_TOO_SHORT]


def test_remove_failing_keeps_passing_claims_and_lists_the_rest():
    good = (
        f'- Opened in 2008 ["The Svalbard Global Seed Vault opened on 26 February 2008"]({VAULT})'
    )
    bad = f'- Holds a trillion seeds ["the vault holds one trillion seeds"]({VAULT})'
    report = f"# Seed vault\n\n{good}\n{bad}\n\n## Sources\n\n- {VAULT}\n"
    result = check_report(report, [PAGE])
    removal = remove_failing(report, result)
    assert good in removal.report
    assert "trillion" not in removal.report
    assert removal.not_verified == [
        f'Holds a trillion seeds "the vault holds one trillion seeds" — {QUOTE_NOT_FOUND}'
    ]
    assert check_report(removal.report, [PAGE]).ok
