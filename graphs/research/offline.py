"""The Research agent's behaviour under the offline model: plain rules, so a whole run works without a key.

The role is read off the tools it is offered: `task` (delegation) makes it the orchestrator,
`web_search` / `fetch_url` the research subagent, `write_todos` alone the planner. The critic is
the structured output with `verdicts`: it flags nothing and judges relevance lexically
(`relevance_verdicts`)."""

from __future__ import annotations

import re
from typing import Any

from langchain_core.messages import AIMessage

from graphs.core.offline import (
    NUMBERED_LINE,
    OfflineChatModel,
    Turn,
    bullet_lines,
    fenced_block,
    say,
)
from graphs.research.citations import Claim, normalise_text
from graphs.tools.search import STOPWORDS, WORD_RE

FETCHES_PER_TOPIC = 2
FINDINGS_PER_PAGE = 2
TASK = "Research: {topic}. Write notes to notes/{slug}.md"
"""How the offline orchestrator words a subagent's task, and how the offline subagent reads it."""
_STOP = STOPWORDS | {"research", "write", "notes"}
_GUTTER = re.compile(r"^\s*(\d+)(?:\.(\d+))?  ?(.*)$")
_TODO = re.compile(r"^\d+\. (.+) \(notes/([a-z0-9_-]+)\.md\)$", re.M)
"""An approved todo in the orchestrator's task, as the graph renders it."""


class OfflineResearchModel(OfflineChatModel):
    """Plans by splitting the question, researches by search -> fetch -> notes, reports from notes."""

    fabricate: bool = False
    """Test hook: the report gains one claim whose quote is in no fetched page."""
    fix_revisions: bool = True
    """False (test hook): asked to fix unsupported claims, the orchestrator leaves them in."""
    relevance_share: float = 0.5
    """The offline critic counts a claim as answering when its text and quote hold at least this
    share of the content words of the question or of one of its topics."""

    def respond(self, turn: Turn) -> AIMessage | None:
        if "task" in turn.tools:
            return _orchestrator_step(turn, fabricate=self.fabricate, fix=self.fix_revisions)
        if "web_search" in turn.tools or "fetch_url" in turn.tools:
            return _researcher_step(turn)
        if "write_todos" in turn.tools:
            return _planner_step(turn)
        return None

    def answer(self, schema: dict[str, Any] | type, turn: Turn) -> Any:
        fields = getattr(schema, "model_fields", None) or {}
        if "verdicts" in fields and "flags" in fields:
            return {"flags": [], "verdicts": relevance_verdicts(turn.request, self.relevance_share)}
        return None


def offline_research_model(**kwargs: Any) -> OfflineResearchModel:
    return OfflineResearchModel(**kwargs)


# Planner ------------------------------------------------------------------------------------


def split_question(question: str) -> list[str]:
    """'When did X open and how do Y work?' -> ['When did X open', 'how do Y work']."""
    parts = re.split(r"\?\s*|;\s*|\s+and\s+(?=(?:how|what|when|where|why|who|which)\b)", question)
    topics = [p.strip(" .,") for p in parts if len(_terms(p)) >= 1]
    return topics[:4] or [question.strip()]


def _planner_step(turn: Turn) -> AIMessage:
    todos = [{"content": t[:200], "status": "pending"} for t in split_question(turn.request)]
    return turn.calls(("write_todos", {"todos": todos}))


# Research subagent --------------------------------------------------------------------------


def _researcher_step(turn: Turn) -> AIMessage:
    prefix, rest = TASK.split("{topic}")
    topic = turn.task.split(rest.split("notes/")[0])[0].removeprefix(prefix).strip()
    match = re.search(r"notes/([a-z0-9][a-z0-9_-]*)\.md", turn.task)
    path = f"/notes/{match[1] if match else 'topic'}.md"
    results = turn.results
    done = {name for name, _ in results}
    if not results:
        return turn.calls(("web_search", {"query": topic}))
    if "fetch_url" not in done and "write_file" not in done:
        urls = re.findall(r"^\s+url: (\S+)$", results[-1][1], re.M)[:FETCHES_PER_TOPIC]
        if not urls:
            return turn.calls(("write_file", {"file_path": path, "content": _notes(topic, [])}))
        return turn.calls(*[("fetch_url", {"url": u}) for u in urls])
    if "write_file" not in done:
        pages = [_page(text) for name, text in results if name == "fetch_url"]
        notes = _notes(topic, [p for p in pages if p is not None])
        return turn.calls(("write_file", {"file_path": path, "content": notes}))
    findings = results[-1][1]
    return say(f"Researched '{topic}'. {findings}. Notes: {path.lstrip('/')}")


def _page(result: str) -> dict[str, str] | None:
    if not result.startswith("fetch_log_id:"):
        return None  # a failed fetch: recorded as a gap in the notes
    head = dict(re.findall(r"^(fetch_log_id|url|title|fetched_at): (.*)$", result, re.M))
    body = result.split("\n", 4)[-1]
    body = re.sub(r"^<untrusted_page[^>]*>\n", "", body).split("\n</untrusted_page>")[0]
    return {**head, "body": body}


def _notes(topic: str, pages: list[dict[str, str]]) -> str:
    lines = [f"# Notes: {topic}", ""]
    n = 0
    words = _terms(topic)
    for page in pages:
        for sentence in _best_sentences(page["body"], words)[:FINDINGS_PER_PAGE]:
            n += 1
            lines += [
                f"## Finding {n}",
                f"- claim: According to {page['title']}, {sentence[0].lower()}{sentence[1:]}",
                f'- quote: "{sentence}"',
                f"- source_url: {page['url']}",
                f"- title: {page['title']}",
                f"- fetched_at: {page['fetched_at']}",
                f"- fetch_log_id: {page['fetch_log_id']}",
                "",
            ]
    gaps = "none" if n else f"no source found for: {topic}"
    lines += ["## Open questions", f"- {gaps}", "", "## Conflicting evidence", "- none found", ""]
    return "\n".join(lines)


def _best_sentences(text: str, words: set[str]) -> list[str]:
    sentences = [
        s
        for line in text.splitlines()
        if line.strip() and not line.lstrip().startswith("#")
        for s in re.split(r"(?<=[.!?])\s+", " ".join(line.split()))
    ]
    scored = [
        (len(words & _terms(s)), -i, s.rstrip("."))
        for i, s in enumerate(sentences)
        if 30 <= len(s) <= 300 and '"' not in s
    ]
    return [s for score, _, s in sorted(scored, reverse=True) if score > 0]


# Critic -------------------------------------------------------------------------------------


def relevance_verdicts(text: str, share: float) -> list[dict[str, Any]]:
    """A verdict per numbered claim of the <claims> block: lexical overlap with the <question>
    and <topics> blocks, an offline fallback for the critic's reading.

    It fails where words and meaning part: a passage that answers in other words (synonyms,
    another language) is judged off-topic; one that shares enough words while being about
    something else ("best" in "best-known") is judged relevant when the question is short.
    """
    question = fenced_block(text, "question") or ""
    topics = bullet_lines(fenced_block(text, "topics") or "")
    wanted = [t for t in (_terms(q) for q in [question, *topics]) if t]
    verdicts = []
    for line in (fenced_block(text, "claims") or "").splitlines():
        number, _, claim = line.partition(". ")
        if not number.isdigit() or not NUMBERED_LINE.match(line):
            continue
        words = _terms(claim)
        covered = max((len(w & words) / len(w) for w in wanted), default=0.0)
        verdicts.append(
            {
                "claim": int(number),
                "answers_question": covered >= share,
                "reason": "" if covered >= share else "it shares too few words with the question",
            }
        )
    return verdicts


# Orchestrator -------------------------------------------------------------------------------


def _orchestrator_step(turn: Turn, *, fabricate: bool, fix: bool) -> AIMessage:
    """Delegate every approved todo, read the notes, write the report; or fix listed claims."""
    todos = _TODO.findall(turn.task)
    # The bullets after the todos are the claims the citation check refused.
    after = max((m.end() for m in _TODO.finditer(turn.task)), default=0)
    unsupported = bullet_lines(turn.task[after:])
    results = turn.results
    done = [name for name, _ in results]
    if unsupported:
        return _revise(turn, unsupported, fix=fix)
    if "task" not in done:
        return turn.calls(
            *[
                (
                    "task",
                    {"description": TASK.format(topic=t, slug=s), "subagent_type": "researcher"},
                )
                for t, s in todos
            ]
        )
    if "read_file" not in done:
        return turn.calls(*[("read_file", {"file_path": f"/notes/{s}.md"}) for _, s in todos])
    if "write_file" not in done:
        notes = [_strip_gutter(text) for name, text in results if name == "read_file"]
        report = _report(_question(turn.task), notes, fabricate=fabricate)
        return turn.calls(("write_file", {"file_path": "/final_report.md", "content": report}))
    return say("The report is in final_report.md.")


def _revise(turn: Turn, unsupported: list[str], *, fix: bool) -> AIMessage:
    """Remove each unsupported claim with edit_file, one per turn (edits of one file don't parallelise)."""
    if not fix:
        return say("I kept the report as it is.")
    reads = [text for name, text in turn.results if name == "read_file"]
    if not reads:
        return turn.calls(("read_file", {"file_path": "/final_report.md"}))
    lines = _strip_gutter(reads[0]).splitlines()
    wanted = [normalise_text(u.rsplit(" — ", 1)[0]) for u in unsupported]
    targets = [
        ln for ln in lines if ln.strip() and normalise_text(Claim(0, ln, []).plain) in wanted
    ]
    edits = sum(name == "edit_file" for name, _ in turn.results)
    if edits < len(targets):
        edit = {
            "file_path": "/final_report.md",
            "old_string": targets[edits] + "\n",
            "new_string": "",
        }
        return turn.calls(("edit_file", edit))
    return say(f"Removed {len(targets)} unsupported claim(s).")


def _report(question: str, notes: list[str], *, fabricate: bool) -> str:
    lines = [f"# {question or 'Research report'}", ""]
    for note in notes:
        topic = re.search(r"^# Notes: (.+)$", note, re.M)
        findings = re.findall(r'^- claim: (.+)\n- quote: "(.+)"\n- source_url: (\S+)$', note, re.M)
        if not topic or not findings:
            continue
        lines += [f"## {topic[1]}", ""]
        lines += [f'- {claim.rstrip(".")} ["{quote}"]({url})' for claim, quote, url in findings]
        lines.append("")
    if fabricate:
        lines += [
            "## Also",
            "",
            '- The vault holds one trillion seeds ["the vault now holds one trillion seeds"](corpus://sample/seed-vault-overview.md)',
            "",
        ]
    return "\n".join(lines)


def _question(task: str) -> str:
    """The task's first line, without its label: the user's question."""
    first = task.strip().split("\n", 1)[0]
    return re.sub(r"^\w+:\s*", "", first).strip()


def _strip_gutter(text: str) -> str:
    """read_file output as file text: no "@@ lines @@" header, no line-number gutter if present."""
    rows = [r for r in text.splitlines() if not re.match(r"^@@ .* @@$", r)]
    if not rows or not all(_GUTTER.match(r) and re.match(r"^\s*\d", r) for r in rows if r):
        return "\n".join(rows)
    lines: list[str] = []
    for row in rows:
        match = _GUTTER.match(row)
        if match is None:
            continue
        if match[2] and lines:
            lines[-1] += match[3]
        else:
            lines.append(match[3])
    return "\n".join(lines)


# Shared ------------------------------------------------------------------------------------


def _terms(text: str) -> set[str]:
    """Content words, crudely stemmed so "open" meets "opened" and "bee" meets "bees"."""
    words = (w for w in WORD_RE.findall(text.lower()) if w not in _STOP and len(w) > 2)
    return {re.sub(r"(?:ing|ed|es|s)$", "", w) if len(w) > 4 else w for w in words}
