"""The deterministic citation check: a citation passes only if this thread fetched its URL and the quote is in that page.

Citation syntax (the prompts teach it; nothing else counts as a citation):

    Honeybees dance to share directions ["the angle of the waggle run relative to vertical"](https://example.org/bees).

A citation is a Markdown link whose text is a double-quoted, verbatim excerpt of the cited page
(straight or curly quotes). A *claim* is one line of the report body: a paragraph line or a
list item. Headings, blank lines, rules and anything under a "Sources"/"References" heading are
structure, not claims, and so are the fixed notices code writes (`NOTICES`): they state no fact a
citation could back. A claim passes only when it carries at least one citation and every one
of its citations passes. Fetch-log ids written in the report are ignored: the only evidence is
the fetch log the fetch tool wrote for this thread.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from graphs.tools.fetchlog import normalise_url

if TYPE_CHECKING:
    from collections.abc import Iterable

    from graphs.tools.fetchlog import FetchRecord

CITATION = re.compile(r"\[\s*[\"“”](?P<quote>[^\]]+?)[\"“”]\s*\]\((?P<url>[^()\s]+)\)")
MIN_QUOTE_CHARS = 20
"""Shorter quotes ("the", "in 2008") would match almost any page."""
_HEADING = re.compile(r"^\s{0,3}#{1,6}\s")
_RULE = re.compile(r"^\s*([-*_]\s*){3,}$")
_SOURCE_HEADINGS = re.compile(r"^\s{0,3}#{1,6}\s*(sources|references|bibliography)\b", re.I)
_TRANSLATE = str.maketrans(
    {
        "‘": "'",
        "’": "'",
        "‚": "'",
        "‛": "'",
        "“": '"',
        "”": '"',
        "„": '"',
        "‟": '"',
        "–": "-",
        "—": "-",
        "−": "-",
        "…": "...",
        "\u00a0": " ",
    }
)

VERIFIED = "ok"
NEVER_FETCHED = "the URL was never fetched in this thread"
QUOTE_NOT_FOUND = "the quoted excerpt is not in the fetched page"
QUOTE_TOO_SHORT = f"the quoted excerpt is shorter than {MIN_QUOTE_CHARS} characters"
UNCITED = "the claim has no citation"
NOT_ANSWERED = "The sources searched do not answer this question."
RELEVANCE_UNCHECKED = "Cairn could not check whether the sources searched answer this question."
NOTICES = frozenset({NOT_ANSWERED, RELEVANCE_UNCHECKED})
"""Sentences only code puts in a delivered report (graphs/research/relevance.py)."""


def normalise_text(text: str) -> str:
    """Compare text, not typography: unicode forms, quotes, dashes, whitespace and case folded."""
    text = unicodedata.normalize("NFKC", text).translate(_TRANSLATE)
    return " ".join(text.split()).casefold()


@dataclass(frozen=True)
class Citation:
    quote: str
    url: str
    passed: bool
    reason: str
    fetch_log_id: int | None = None
    """The fetch-log record that proved it (found by the checker, never read from the report)."""


@dataclass(frozen=True)
class Claim:
    line: int
    """0-based line number in the report."""
    text: str
    citations: list[Citation]

    @property
    def passed(self) -> bool:
        return bool(self.citations) and all(c.passed for c in self.citations)

    @property
    def reason(self) -> str:
        if not self.citations:
            return UNCITED
        return next((c.reason for c in self.citations if not c.passed), VERIFIED)

    @property
    def plain(self) -> str:
        """The claim without its citation links, for the "not verified" list."""
        text = CITATION.sub(lambda m: f'"{m["quote"]}"', self.text)
        return re.sub(r"^\s*(?:[-*+]|\d+[.)])\s+", "", text).strip()


@dataclass
class CheckResult:
    claims: list[Claim] = field(default_factory=list)

    @property
    def citations(self) -> list[Citation]:
        return [c for claim in self.claims for c in claim.citations]

    @property
    def failing(self) -> list[Claim]:
        return [c for c in self.claims if not c.passed]

    @property
    def precision(self) -> float:
        """Share of the report's citations that pass (1.0 for a report with none)."""
        cited = self.citations
        return sum(c.passed for c in cited) / len(cited) if cited else 1.0

    @property
    def ok(self) -> bool:
        return not self.failing


def check_report(report: str, records: Iterable[FetchRecord]) -> CheckResult:
    """Check every claim of a Markdown report against this thread's fetch log."""
    by_url: dict[str, list[FetchRecord]] = {}
    for record in records:
        if not record.ok:
            continue
        for url in {record.url, record.final_url}:
            by_url.setdefault(url, []).append(record)
    pages = {id(r): normalise_text(r.content) for rs in by_url.values() for r in rs}
    claims = []
    for number, line in claim_lines(report):
        citations = [_check(m["quote"], m["url"], by_url, pages) for m in CITATION.finditer(line)]
        claims.append(Claim(number, line, citations))
    return CheckResult(claims)


def _check(
    quote: str, url: str, by_url: dict[str, list[FetchRecord]], pages: dict[int, str]
) -> Citation:
    wanted = normalise_text(quote)
    if len(wanted) < MIN_QUOTE_CHARS:
        return Citation(quote, url, False, QUOTE_TOO_SHORT)
    fetched = by_url.get(normalise_url(url), [])
    if not fetched:
        return Citation(quote, url, False, NEVER_FETCHED)
    for record in fetched:
        if wanted in pages[id(record)]:
            return Citation(quote, url, True, VERIFIED, fetch_log_id=record.id)
    return Citation(quote, url, False, QUOTE_NOT_FOUND)


def claim_lines(report: str) -> list[tuple[int, str]]:
    """(line number, text) of every claim line in the report body."""
    lines = []
    in_code = in_sources = False
    for number, line in enumerate(report.splitlines()):
        stripped = line.strip()
        if stripped.startswith("```"):
            in_code = not in_code
            continue
        if _HEADING.match(line):
            in_sources = bool(_SOURCE_HEADINGS.match(line))
            continue
        if in_code or in_sources or not stripped or _RULE.match(stripped):
            continue
        if stripped in NOTICES:
            continue
        if stripped.startswith("|") and set(stripped) <= set("|-: "):
            continue
        lines.append((number, line))
    return lines


@dataclass(frozen=True)
class Removal:
    report: str
    """The report without its failing claims."""
    not_verified: list[str]
    """Each removed claim, in plain text with the reason, for the user (outside the report)."""
    lines: list[int] = field(default_factory=list)
    """The removed claims' line numbers in the checked report, in the order of `not_verified`."""


def remove_failing(
    report: str, result: CheckResult, *, flagged: dict[int, str] | None = None
) -> Removal:
    """Drop every failing claim's line (and `flagged` lines: line -> reason); keep the rest as written."""
    reasons = {c.line: (c, c.reason) for c in result.failing}
    for claim in result.claims:
        if flagged and claim.line in flagged and claim.line not in reasons:
            reasons[claim.line] = (claim, flagged[claim.line])
    kept = drop_empty_sections([ln for i, ln in enumerate(report.splitlines()) if i not in reasons])
    text = re.sub(r"\n{3,}", "\n\n", "\n".join(kept)).strip() + "\n"
    removed = sorted(reasons.items())
    return Removal(
        text,
        [f"{claim.plain} — {reason}" for _, (claim, reason) in removed],
        [n for n, _ in removed],
    )


def drop_empty_sections(lines: list[str]) -> list[str]:
    """Headings left with nothing under them (before the next heading of their level) go too."""
    out: list[str] = []
    for i, line in enumerate(lines):
        heading = re.match(r"^\s{0,3}(#{2,6})\s", line)
        if heading:
            level = len(heading[1])
            body = []
            for later in lines[i + 1 :]:
                nxt = re.match(r"^\s{0,3}(#{1,6})\s", later)
                if nxt and len(nxt[1]) <= level:
                    break
                body.append(later)
            if not any(b.strip() and not _HEADING.match(b) for b in body):
                continue
        out.append(line)
    return out
