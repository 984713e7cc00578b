"""Whether each cited passage answers the question: the critic's per-claim verdicts, bounded and matched in code."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, Field

from graphs.research.citations import NOT_ANSWERED, RELEVANCE_UNCHECKED

if TYPE_CHECKING:
    from collections.abc import Iterable

    from graphs.research.citations import CheckResult, Claim, Removal
    from graphs.research.state import ClaimRelevance, Todo, Verification
    from graphs.tools.fetchlog import FetchRecord

MAX_JUDGED_CLAIMS = 100
"""Claims numbered for the critic; a longer report's later claims get no verdict, so none counts."""
MAX_VERDICTS = 2 * MAX_JUDGED_CLAIMS
"""Verdicts read per round: a flood is cut before it is matched."""
MAX_SEARCHED_LISTED = 20
CLAIM_CHARS = 300
"""How much of a claim's text a verdict keeps: enough to tell it from the claim on the next line."""
REOPEN_PREFIX = "Re-research or remove ("
"""How reopen_claims words a todo; such todos are repairs, not topics the user approved."""
OFF_TOPIC = "off-topic"
NO_VERDICT = "the critic gave no verdict on it"
CONFLICTING = "the critic's verdicts on it disagree"
UNCHECKED = "relevance not checked: the critic's reading was unusable"
NOT_PASSING = "its citation does not pass the check"


class Verdict(BaseModel):
    claim: int = Field(description="The claim's number in the <claims> list.")
    answers_question: bool = Field(
        description=(
            "True only if the claim's quoted passage itself answers the question or one of its "
            "topics. A true passage about another subject is false."
        )
    )
    reason: str = Field(default="", description="One line: what the passage is about instead.")


def claims_block(claims: list[Claim]) -> str:
    """The claims as the critic sees them: numbered, so a verdict names one claim exactly."""
    return "\n".join(f"{i}. {c.plain}" for i, c in enumerate(claims[:MAX_JUDGED_CLAIMS], 1))


def judge(claims: list[Claim], verdicts: list[Verdict] | None) -> list[ClaimRelevance]:
    """Each claim with the critic's verdict on it, as code decides it: only a passing claim with
    one or more verdicts, all saying it answers the question, counts as relevant. No verdict, a
    number that names no claim, disagreeing verdicts or no usable reading: not relevant."""
    by_number: dict[int, list[Verdict]] = {}
    for verdict in (verdicts or [])[:MAX_VERDICTS]:
        if 1 <= verdict.claim <= min(len(claims), MAX_JUDGED_CLAIMS):
            by_number.setdefault(verdict.claim, []).append(verdict)
    return [
        _relevance(claim, by_number.get(n, []), checked=verdicts is not None)
        for n, claim in enumerate(claims, 1)
    ]


def _relevance(claim: Claim, verdicts: list[Verdict], *, checked: bool) -> ClaimRelevance:
    answers = {v.answers_question for v in verdicts}
    if not checked:
        relevant, reason = False, UNCHECKED
    elif not claim.passed:
        relevant, reason = False, NOT_PASSING
    elif not answers:
        relevant, reason = False, NO_VERDICT
    elif len(answers) > 1:
        relevant, reason = False, CONFLICTING
    else:
        relevant = answers == {True}
        why = next((v.reason for v in verdicts if v.reason.strip()), "")
        reason = "" if relevant else f"{OFF_TOPIC}: {_one_line(why) or 'not about the question'}"
    return {
        "line": claim.line,
        "claim": claim.plain[:CLAIM_CHARS],
        "relevant": relevant,
        "reason": reason,
    }


def relevant_passing(result: CheckResult, relevance: list[ClaimRelevance]) -> int:
    """Passing citations on claims judged to answer the question."""
    lines = relevant_lines(result, relevance)
    return sum(len(c.citations) for c in result.claims if c.line in lines and c.passed)


def relevant_lines(result: CheckResult, relevance: Iterable[ClaimRelevance]) -> set[int]:
    """Lines of the claims judged relevant, matched by line and text: a verdict kept for one
    claim never carries over to another that came to stand on its line."""
    judged = {(r["line"], r["claim"]) for r in relevance if r["relevant"]}
    return {c.line for c in result.claims if (c.line, c.plain[:CLAIM_CHARS]) in judged}


def off_topic(result: CheckResult, verification: Verification | None) -> dict[int, str]:
    """Passing claims not judged relevant in the last check: line -> why, for removal. A check
    recorded before relevance was judged (a run resumed across the upgrade) removes nothing."""
    if verification is None or "relevance_checked" not in verification:
        return {}
    relevance = verification.get("relevance") or []
    keep = relevant_lines(result, relevance)
    reasons = {r["line"]: r["reason"] for r in relevance}
    return {
        c.line: reasons.get(c.line) or NO_VERDICT
        for c in result.claims
        if c.passed and c.line not in keep
    }


def judged_off_topic(verifications: list[Verification], kept: set[str]) -> list[str]:
    """Claims some round judged off-topic that are not in the delivered report: the writer may
    have removed them when asked to, and the user still sees what was found and set aside."""
    return [
        f"{r['claim']} — {r['reason']}"
        for v in verifications
        for r in v.get("relevance") or []
        if not r["relevant"] and r["reason"].startswith(OFF_TOPIC) and r["claim"] not in kept
    ]


def split_removed(
    removal: Removal, unanswering: set[int], verifications: list[Verification], kept: CheckResult
) -> tuple[list[str], list[str]]:
    """The removed claims as (not verified, off-topic); the off-topic ones include those an
    earlier round judged off-topic and the writer has since removed."""
    removed = dict(zip(removal.lines, removal.not_verified, strict=True))
    not_verified = [item for n, item in removed.items() if n not in unanswering]
    off = [item for n, item in removed.items() if n in unanswering]
    earlier = judged_off_topic(verifications, {c.plain[:CLAIM_CHARS] for c in kept.claims})
    return not_verified, list(dict.fromkeys([*earlier, *off]))


def relevance_checked(verification: Verification | None) -> bool:
    """Whether the critic's last reading was usable (old checkpoints had no relevance check)."""
    return bool(verification and verification.get("relevance_checked"))


def unsupported_off_topic(relevance: list[ClaimRelevance]) -> list[str]:
    """Off-topic claims for the next round (re-research or remove); none when the critic's
    reading was unusable, as a failed reading says nothing about the claims."""
    return [
        f"{r['claim']} — {r['reason']}"
        for r in relevance
        if not r["relevant"] and r["reason"] not in (UNCHECKED, NOT_PASSING)
    ]


def not_answered_report(
    question: str,
    todos: list[Todo],
    records: list[FetchRecord],
    provider: str,
    *,
    checked: bool,
) -> str:
    """The honest report when no checked passage answers the question: it says so first, then
    lists what was searched (the approved topics, where, and every page fetched)."""
    title = " ".join(question.split())[:200] or "Research report"
    lines = [f"# {title}", "", NOT_ANSWERED if checked else RELEVANCE_UNCHECKED, ""]
    lines += ["## Sources searched", ""]
    topics = [t["content"] for t in todos if not t["content"].startswith(REOPEN_PREFIX)]
    lines += [f"- Searched {provider} for: {_one_line(t)}" for t in topics]
    lines += _fetched_lines(records)
    return "\n".join(lines) + "\n"


def _fetched_lines(records: list[FetchRecord]) -> list[str]:
    seen: dict[str, FetchRecord] = {}
    for record in records:
        seen.setdefault(record.final_url or record.url, record)
    lines = []
    for url, record in list(seen.items())[:MAX_SEARCHED_LISTED]:
        if record.ok:
            lines.append(f"- Read: {_one_line(record.title) or 'untitled'} (`{_code(url)}`)")
        else:
            lines.append(f"- Could not fetch: `{_code(url)}`")
    if not seen:
        lines.append("- No page was fetched.")
    elif len(seen) > MAX_SEARCHED_LISTED:
        lines.append(f"- and {len(seen) - MAX_SEARCHED_LISTED} more pages")
    return lines


def check_summary(verification: dict[str, Any]) -> list[str]:
    """The citation step's lines: passing citations, and how many of those answer the question."""
    passing, total = verification["passing"], verification["citations"]
    lines = [f"Round {verification['round']}: {passing} of {total} citations pass the check."]
    if "relevant_passing" in verification:
        relevant = verification["relevant_passing"]
        lines.append(
            f"{relevant} of the {passing} passing citations cite a passage that answers the question."
            if verification.get("relevance_checked")
            else "Whether they answer the question could not be checked."
        )
    lines += [f"- failed: {claim}" for claim in verification["failing_claims"]]
    lines += [f"- critic: {claim}" for claim in verification["critic_flags"]]
    lines += [
        f"- {OFF_TOPIC}: {r['claim']}"
        for r in verification.get("relevance") or []
        if not r["relevant"] and r["reason"].startswith(OFF_TOPIC)
    ]
    return lines


def _one_line(text: str) -> str:
    """Untrusted text on one line, without Markdown that could turn it into a link or markup;
    and never containing the " — " that separates a claim from its reason."""
    text = re.sub(r"[\[\]`<>*_#|]", "", " ".join(text.split())).replace(" — ", " - ")
    return text[:200]


def _code(url: str) -> str:
    return url.replace("`", "")[:300]
