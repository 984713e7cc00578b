"""Write eval: golden conversations through write_memories on a real store, judged by what is stored."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from pydantic import BaseModel, ConfigDict, model_validator

from graphs.memory.policy import Category, Reason, fact_key, normalise_fact
from graphs.memory.scoped import Memory, MemorySettings, ScopedMemory
from graphs.memory.writer import InvalidModelOutput, WriteReport, write_memories

if TYPE_CHECKING:
    from langchain_core.language_models import BaseChatModel
    from langgraph.store.base import BaseStore

Decision = Literal["insert", "update", "noop", "reject", "suggest"]
SAVES: tuple[Decision, ...] = ("insert", "update")

OK = "ok"
FALSE_SAVE = "false_save"
"""Stored (or suggested) although it should not have been."""
MISSED_SAVE = "missed_save"
MISSED_UPDATE = "missed_update"
"""The old value is still stored next to, or instead of, the new one."""
WRONG_KEY = "wrong_key"
"""Stored, but not under the slot it belongs to, so a later change cannot overwrite it."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Turn(_Strict):
    role: Literal["user", "assistant"]
    content: str


class SeedFact(_Strict):
    """A memory already stored before the conversation (key omitted: the fact's hash key)."""

    key: str | None = None
    content: str
    category: Category = "profile"
    stated: bool = True


class ForgetRecord(_Strict):
    """A fact the user asked to forget; `match` words find it however it is rephrased."""

    key: str | None = None
    content: str
    match: tuple[str, ...]


class Expect(_Strict):
    """The expected decision for one candidate fact; `match` words identify it in the store."""

    decision: Decision
    key: str | None = None
    """For insert and update: the slot the fact must land on (None: any key)."""
    match: tuple[str, ...] = ()
    """Words all present in the stored content. Empty for noop: nothing at all is stored."""
    replaces: tuple[str, ...] = ()
    """For update: words of the old value, which must be gone."""
    reason: Reason | None = None
    """For reject: the policy rule expected to refuse it (reported, not judged)."""

    @model_validator(mode="after")
    def _complete(self) -> Expect:
        if self.decision != "noop" and not self.match:
            msg = f"a {self.decision} expectation needs match words"
            raise ValueError(msg)
        if self.decision == "update" and not (self.key and self.replaces):
            msg = "an update expectation needs the key and the words of the old value"
            raise ValueError(msg)
        return self


class WriteCase(_Strict):
    id: str
    about: str
    messages: list[Turn]
    existing: list[SeedFact] = []
    tombstones: list[ForgetRecord] = []
    opted_in: frozenset[Category] = frozenset()
    expect: list[Expect]


def load_cases(path: Path) -> list[WriteCase]:
    lines = [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    cases = [WriteCase.model_validate(json.loads(line)) for line in lines]
    duplicates = [cid for cid, n in Counter(c.id for c in cases).items() if n > 1]
    if duplicates:
        msg = f"{path.name}: duplicate case ids {duplicates}"
        raise ValueError(msg)
    return cases


# --- what the store holds -------------------------------------------------------------------


@dataclass(frozen=True)
class StoreView:
    memories: dict[str, str]
    """Every stored memory after the run, key -> content."""
    written: dict[str, str]
    """Memories the run added or changed."""
    suggested: list[str]
    """Sensitive facts waiting for the user's confirmation."""


def contains(content: str, words: tuple[str, ...]) -> bool:
    text = content.casefold()
    return all(word.casefold() in text for word in words)


async def stored(memory: ScopedMemory) -> dict[str, str]:
    return {m.key: m.content for m in await memory.all_memories()}


async def view(memory: ScopedMemory, before: dict[str, str]) -> StoreView:
    memories = await stored(memory)
    written = {k: c for k, c in memories.items() if before.get(k) != c}
    suggested = [str(s["content"]) for s in await memory.suggestions()]
    return StoreView(memories=memories, written=written, suggested=suggested)


# --- judging one candidate ------------------------------------------------------------------


def judge(expect: Expect, seen: StoreView) -> str:
    if expect.decision in ("noop", "reject"):
        saved = _writes_matching(expect, seen) or _suggestions_matching(expect, seen)
        return FALSE_SAVE if saved else OK
    if expect.decision == "suggest":
        if _writes_matching(expect, seen):
            return FALSE_SAVE  # stored without the user's confirmation
        return OK if _suggestions_matching(expect, seen) else MISSED_SAVE
    return _judge_save(expect, seen)


def _judge_save(expect: Expect, seen: StoreView) -> str:
    if expect.replaces and any(contains(c, expect.replaces) for c in seen.memories.values()):
        return MISSED_UPDATE
    keys = _writes_matching(expect, seen)
    if not keys:
        return MISSED_SAVE
    return OK if expect.key is None or expect.key in keys else WRONG_KEY


def _writes_matching(expect: Expect, seen: StoreView) -> list[str]:
    return [k for k, c in seen.written.items() if contains(c, expect.match)]


def _suggestions_matching(expect: Expect, seen: StoreView) -> list[str]:
    return [s for s in seen.suggested if contains(s, expect.match)]


def unexplained(case: WriteCase, seen: StoreView) -> list[str]:
    """Everything stored or suggested that no expected insert, update or suggestion accounts for."""
    saves = [e for e in case.expect if e.decision in SAVES]
    suggestions = [e for e in case.expect if e.decision == "suggest"]
    writes = [c for c in seen.written.values() if not any(contains(c, e.match) for e in saves)]
    pending = [s for s in seen.suggested if not any(contains(s, e.match) for e in suggestions)]
    return writes + [f"(suggestion) {s}" for s in pending]


# --- forgotten facts --------------------------------------------------------------------------


@dataclass(frozen=True)
class Forgotten:
    content: str
    match: tuple[str, ...] = ()


def resurfaced(forgotten: list[Forgotten], seen: StoreView) -> list[str]:
    """Forgotten facts present again, word for word or (by their match words) rephrased."""
    texts = [*seen.memories.values(), *seen.suggested]
    return [f.content for f in forgotten if any(_is_back(f, text) for text in texts)]


def _is_back(forgotten: Forgotten, text: str) -> bool:
    if normalise_fact(text) == normalise_fact(forgotten.content):
        return True
    return bool(forgotten.match) and contains(text, forgotten.match)


def seeded_forgotten(case: WriteCase) -> list[Forgotten]:
    return [Forgotten(t.content, t.match) for t in case.tombstones]


# --- running a case ---------------------------------------------------------------------------


@dataclass
class CaseResult:
    case: WriteCase
    verdicts: list[tuple[Expect, str]]
    unexplained: list[str]
    rejected: Counter[str]
    skipped: str | None
    came_back: list[str]
    """Seeded tombstones present after the first run."""
    came_back_on_replay: list[str] = field(default_factory=list)
    """Facts forgotten between the runs (or seeded tombstones) present after the replay."""

    @property
    def passed(self) -> bool:
        return all(v == OK for _, v in self.verdicts) and not self.unexplained


def user_id(case: WriteCase) -> str:
    return f"eval-writes-{case.id}"


def thread_id(case: WriteCase) -> str:
    return f"eval-writes-{case.id}-thread"


def as_messages(case: WriteCase) -> list[BaseMessage]:
    kinds = {"user": HumanMessage, "assistant": AIMessage}
    return [kinds[t.role](t.content, id=f"{case.id}-{i}") for i, t in enumerate(case.messages)]


def _memory(key: str, content: str) -> Memory:
    return Memory(
        key=key,
        content=content,
        category="other",
        updated_at="",
        source={},
        confidence=0.0,
        stated=True,
    )


async def seed(memory: ScopedMemory, case: WriteCase) -> None:
    await memory.save_settings(MemorySettings(enabled=True, opted_in=frozenset(case.opted_in)))
    for t in case.tombstones:
        await memory.forget(_memory(t.key or "", t.content), reason="eval seed")
    for fact in case.existing:
        await memory.put(
            fact.key or fact_key(fact.content),
            content=fact.content,
            category=fact.category,
            source={"eval": "writes"},
            confidence=1.0,
            stated=fact.stated,
        )


async def run_job(store: BaseStore, model: BaseChatModel, case: WriteCase, run: str) -> WriteReport:
    """One write_memories run over the case's conversation, as the debounced job does it."""

    async def load_messages(_thread_id: str) -> list[BaseMessage]:
        return as_messages(case)

    try:
        return await write_memories(
            store=store,
            model=model,
            load_messages=load_messages,
            user_id=user_id(case),
            thread_id=thread_id(case),
            run_id=f"eval-{case.id}-{run}",
        )
    except InvalidModelOutput:
        return WriteReport(run_id=run, skipped="invalid_model_output")


async def run_case(store: BaseStore, model: BaseChatModel, case: WriteCase) -> CaseResult:
    """Seed, run the job, judge the store; then forget what was written and replay the job."""
    memory = ScopedMemory(store, user_id(case))
    await seed(memory, case)
    before = await stored(memory)
    report = await run_job(store, model, case, "first")
    seen = await view(memory, before)
    result = CaseResult(
        case=case,
        verdicts=[(e, judge(e, seen)) for e in case.expect],
        unexplained=unexplained(case, seen),
        rejected=report.rejected,
        skipped=report.skipped,
        came_back=resurfaced(seeded_forgotten(case), seen),
    )
    result.came_back_on_replay = await replay(store, model, case, report)
    return result


async def replay(
    store: BaseStore, model: BaseChatModel, case: WriteCase, first: WriteReport
) -> list[str]:
    """Forget every fact the first run wrote, rewind the job's marker and run it again."""
    memory = ScopedMemory(store, user_id(case))
    forgotten = seeded_forgotten(case)
    for key in dict.fromkeys(first.written):
        if (written := await memory.get(key)) is not None:
            await memory.forget(written, reason="eval replay")
            forgotten.append(Forgotten(written.content, _match_words(written.content, case)))
    await memory.set_marker(thread_id(case), last_message_id=None)
    await run_job(store, model, case, "replay")
    return resurfaced(forgotten, await view(memory, {}))


def _match_words(content: str, case: WriteCase) -> tuple[str, ...]:
    """The match words of the expected save this content fulfilled, to spot it rephrased."""
    for e in case.expect:
        if e.decision in SAVES and contains(content, e.match):
            return e.match
    return ()


# --- the whole set ----------------------------------------------------------------------------


@dataclass(frozen=True)
class WriteResult:
    cases: list[CaseResult]

    @property
    def verdicts(self) -> list[tuple[Expect, str]]:
        return [v for c in self.cases for v in c.verdicts]

    @property
    def accuracy(self) -> float:
        return sum(v == OK for _, v in self.verdicts) / len(self.verdicts)

    def count(self, verdict: str) -> int:
        return sum(v == verdict for _, v in self.verdicts)

    def by_decision(self) -> dict[str, tuple[int, int]]:
        """decision -> (correct, total)."""
        totals: Counter[str] = Counter(e.decision for e, _ in self.verdicts)
        right: Counter[str] = Counter(e.decision for e, v in self.verdicts if v == OK)
        return {d: (right[d], totals[d]) for d in totals}

    @property
    def false_saves(self) -> list[tuple[str, str]]:
        return [(c.case.id, text) for c in self.cases for text in c.unexplained]

    @property
    def rejected(self) -> Counter[str]:
        return sum((c.rejected for c in self.cases), Counter())

    @property
    def expected_reasons(self) -> Counter[str]:
        return Counter(e.reason for e, _ in self.verdicts if e.reason)

    @property
    def came_back(self) -> int:
        return sum(len(c.came_back) + len(c.came_back_on_replay) for c in self.cases)


async def evaluate_writes(
    store: BaseStore, model: BaseChatModel, cases: list[WriteCase]
) -> WriteResult:
    return WriteResult(cases=[await run_case(store, model, case) for case in cases])


def writes_json(result: WriteResult) -> dict[str, Any]:
    return {
        "cases": len(result.cases),
        "cases_passed": sum(c.passed for c in result.cases),
        "candidates": len(result.verdicts),
        "accuracy": round(result.accuracy, 4),
        "by_decision": {
            d: {"correct": r, "total": t} for d, (r, t) in result.by_decision().items()
        },
        "false_saves": [{"case": cid, "content": text} for cid, text in result.false_saves],
        "missed_saves": result.count(MISSED_SAVE),
        "missed_updates": result.count(MISSED_UPDATE),
        "wrong_key": result.count(WRONG_KEY),
        "rejections_by_reason": dict(sorted(result.rejected.items())),
        "expected_rejection_reasons": dict(sorted(result.expected_reasons.items())),
        "skipped_runs": {c.case.id: c.skipped for c in result.cases if c.skipped},
        "failures": [
            {"case": c.case.id, "expect": e.model_dump(exclude_defaults=True), "verdict": v}
            for c in result.cases
            for e, v in c.verdicts
            if v != OK
        ],
    }


def came_back_json(result: WriteResult) -> dict[str, Any]:
    seeded = [c for c in result.cases if c.case.tombstones]
    return {
        "total": result.came_back,
        "cases_with_tombstones": len(seeded),
        "after_first_run": [{"case": c.case.id, "fact": f} for c in seeded for f in c.came_back],
        "replayed_cases": len(result.cases),
        "after_replay": [
            {"case": c.case.id, "fact": f} for c in result.cases for f in c.came_back_on_replay
        ],
    }
