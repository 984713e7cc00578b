"""The Research agent's behaviour under the offline model: plain rules, so a whole run works without a key."""

from __future__ import annotations

import hashlib
import re
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_core.messages.tool import tool_call

from graphs.core.offline import REPLY_PREFIX, OfflineChatModel
from graphs.research.citations import Claim, normalise_text
from graphs.tools.search import STOPWORDS, WORD_RE

PLANNER_MARK = "You plan research"
ORCHESTRATOR_MARK = "You are the research orchestrator"
RESEARCHER_MARK = "You are a research subagent"
FETCHES_PER_TOPIC = 2
FINDINGS_PER_PAGE = 2
_STOP = STOPWORDS | {"research", "write", "notes"}
_GUTTER = re.compile(r"^\s*(\d+)(?:\.(\d+))?  ?(.*)$")


class OfflineResearchModel(OfflineChatModel):
    """Plans by splitting the question, researches by search -> fetch -> notes, reports from notes."""

    fabricate: bool = False
    """Test hook: the report gains one claim whose quote is in no fetched page."""
    fix_revisions: bool = True
    """False (test hook): asked to fix unsupported claims, the orchestrator leaves them in."""

    def _reply(self, messages: list[BaseMessage]) -> AIMessage:
        system = " ".join(str(m.text) for m in messages if isinstance(m, SystemMessage))
        if RESEARCHER_MARK in system:
            return _researcher_step(messages)
        if ORCHESTRATOR_MARK in system:
            return _orchestrator_step(messages, fabricate=self.fabricate, fix=self.fix_revisions)
        if PLANNER_MARK in system:
            return _planner_step(messages)
        return super()._reply(messages)


def offline_research_model(**kwargs: Any) -> OfflineResearchModel:
    return OfflineResearchModel(structured_responder=_structured, **kwargs)


def _structured(schema: Any, messages: list[BaseMessage]) -> Any:
    if getattr(schema, "__name__", "") == "Critique":
        return {"flags": []}  # the offline critic reads nothing into the quotes
    return None


# Planner ------------------------------------------------------------------------------------


def split_question(question: str) -> list[str]:
    """'When did X open and how do Y work?' -> ['When did X open', 'how do Y work']."""
    parts = re.split(r"\?\s*|;\s*|\s+and\s+(?=(?:how|what|when|where|why|who|which)\b)", question)
    topics = [p.strip(" .,") for p in parts if len(_terms(p)) >= 1]
    return topics[:4] or [question.strip()]


def _planner_step(messages: list[BaseMessage]) -> AIMessage:
    question = _human(messages)
    todos = [{"content": t[:200], "status": "pending"} for t in split_question(question)]
    return _calls(messages, [("write_todos", {"todos": todos})])


# Research subagent --------------------------------------------------------------------------


def _researcher_step(messages: list[BaseMessage]) -> AIMessage:
    task = _human(messages)
    topic = re.sub(r"^Research:\s*", "", task.split(". Write notes to")[0]).strip()
    match = re.search(r"notes/([a-z0-9][a-z0-9_-]*)\.md", task)
    path = f"/notes/{match[1] if match else 'topic'}.md"
    results = _tool_results(messages)
    done = {name for name, _ in results}
    if not results:
        return _calls(messages, [("web_search", {"query": topic})])
    if "fetch_url" not in done and "write_file" not in done:
        urls = re.findall(r"^\s+url: (\S+)$", results[-1][1], re.M)[:FETCHES_PER_TOPIC]
        if not urls:
            return _calls(
                messages, [("write_file", {"file_path": path, "content": _notes(topic, [])})]
            )
        return _calls(messages, [("fetch_url", {"url": u}) for u in urls])
    if "write_file" not in done:
        pages = [_page(text) for name, text in results if name == "fetch_url"]
        notes = _notes(topic, [p for p in pages if p is not None])
        return _calls(messages, [("write_file", {"file_path": path, "content": notes})])
    findings = results[-1][1]
    return AIMessage(f"{REPLY_PREFIX}Researched '{topic}'. {findings}. Notes: {path.lstrip('/')}")


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


# Orchestrator -------------------------------------------------------------------------------


def _orchestrator_step(messages: list[BaseMessage], *, fabricate: bool, fix: bool) -> AIMessage:
    task = _human(messages)
    todos = re.findall(r"^\d+\. (.+) \(notes/([a-z0-9_-]+)\.md\)$", task, re.M)
    unsupported = re.findall(r"^- (.+)$", task.split("Unsupported claims", 1)[-1], re.M)
    unsupported = unsupported if "Unsupported claims" in task else []
    results = _tool_results(messages)
    done = [name for name, _ in results]
    if unsupported:
        return _revise(messages, results, unsupported, fix=fix)
    if "task" not in done:
        calls = [
            (
                "task",
                {
                    "description": f"Research: {topic}. Write notes to notes/{s}.md",
                    "subagent_type": "researcher",
                },
            )
            for topic, s in todos
        ]
        return _calls(messages, calls)
    if "read_file" not in done:
        return _calls(messages, [("read_file", {"file_path": f"/notes/{s}.md"}) for _, s in todos])
    if "write_file" not in done:
        notes = [_strip_gutter(text) for name, text in results if name == "read_file"]
        report = _report(_question(task), notes, fabricate=fabricate)
        return _calls(
            messages, [("write_file", {"file_path": "/final_report.md", "content": report})]
        )
    return AIMessage(f"{REPLY_PREFIX}The report is in final_report.md.")


def _revise(
    messages: list[BaseMessage],
    results: list[tuple[str, str]],
    unsupported: list[str],
    *,
    fix: bool,
) -> AIMessage:
    """Remove each unsupported claim with edit_file, one per turn (edits of one file don't parallelise)."""
    if not fix:
        return AIMessage(f"{REPLY_PREFIX}I kept the report as it is.")
    reads = [text for name, text in results if name == "read_file"]
    if not reads:
        return _calls(messages, [("read_file", {"file_path": "/final_report.md"})])
    lines = _strip_gutter(reads[0]).splitlines()
    wanted = [normalise_text(u.rsplit(" — ", 1)[0]) for u in unsupported]
    targets = [
        ln for ln in lines if ln.strip() and normalise_text(Claim(0, ln, []).plain) in wanted
    ]
    edits = sum(name == "edit_file" for name, _ in results)
    if edits < len(targets):
        line = targets[edits]
        return _calls(
            messages,
            [
                (
                    "edit_file",
                    {"file_path": "/final_report.md", "old_string": line + "\n", "new_string": ""},
                )
            ],
        )
    return AIMessage(f"{REPLY_PREFIX}Removed {len(targets)} unsupported claim(s).")


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
    match = re.search(r"^Question: (.+)$", task, re.M)
    return match[1].strip() if match else ""


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


def _human(messages: list[BaseMessage]) -> str:
    human = next((m for m in messages if isinstance(m, HumanMessage)), None)
    return str(human.text) if human else ""


def _tool_results(messages: list[BaseMessage]) -> list[tuple[str, str]]:
    """(tool name, result text) of this conversation's tool calls, in order."""
    names = {c["id"]: c["name"] for m in messages if isinstance(m, AIMessage) for c in m.tool_calls}
    return [
        (m.name or names.get(m.tool_call_id, "tool"), str(m.text))
        for m in messages
        if isinstance(m, ToolMessage)
    ]


def _calls(messages: list[BaseMessage], calls: list[tuple[str, dict[str, Any]]]) -> AIMessage:
    seed = f"{len(messages)}:{_human(messages)}"
    return AIMessage(
        content="",
        tool_calls=[
            tool_call(
                name=name,
                args=args,
                id="call_" + hashlib.sha256(f"{seed}:{i}:{name}:{args}".encode()).hexdigest()[:24],
            )
            for i, (name, args) in enumerate(calls)
        ],
    )
