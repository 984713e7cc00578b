"""The Assistant's behaviour under the offline model: plain rules, so memory works end to end offline."""

from __future__ import annotations

import json
import re
from typing import Any, Literal

from langchain_core.messages import AIMessage, HumanMessage

from graphs.core.offline import (
    OfflineChatModel,
    Turn,
    bullet_lines,
    echoed,
    fenced_blocks,
    say,
)
from graphs.memory.policy import MemoryOp, MemoryOps

_REMEMBER = re.compile(r"^\s*(?:please\s+)?remember(?:\s+that)?\s+(.+?)\s*[.!]?\s*$", re.I | re.S)
_FORGET = re.compile(r"^\s*(?:please\s+)?forget(?:\s+that)?\s+(.+?)\s*[.!]?\s*$", re.I | re.S)
_STORED_LINE = re.compile(r"^- ([a-z0-9_]+): (.+)$", re.M)

# (pattern on a first-person sentence, slot key or None, how to phrase it about the user)
_STATEMENTS: list[tuple[re.Pattern[str], str | None, str]] = [
    (
        re.compile(r"\b(?i:my name is) ([A-Z][\w'-]+(?: [A-Z][\w'-]+)?)"),
        "name",
        "User's name is {0}",
    ),
    (
        re.compile(r"\b(?i:i (?:have )?moved (?:from [\w ]+? )?to) ([A-Z][\w-]+(?: [A-Z][\w-]+)?)"),
        "home_city",
        "User lives in {0}",
    ),
    (
        re.compile(r"\b(?i:i live in) ([A-Z][\w-]+(?: [A-Z][\w-]+)?)"),
        "home_city",
        "User lives in {0}",
    ),
    (re.compile(r"\bi(?:'m| am) (vegetarian|vegan|pescatarian)\b", re.I), "diet", "User is {0}"),
    (re.compile(r"\b(?i:my manager is) ([A-Z][\w'-]+)"), "manager", "User's manager is {0}"),
    (
        re.compile(r"\b(?i:i work (?:at|for)) ([A-Z][\w&.-]+(?: [A-Z][\w&.-]+)?)"),
        "employer",
        "User works at {0}",
    ),
    (re.compile(r"\bi (?:prefer|like) ([^.!?]{3,80})", re.I), None, "User prefers {0}"),
]


def first_person_to_user(text: str) -> str:
    """'I'm vegetarian' -> 'User is vegetarian'; used for the remember tool's argument."""
    for pattern, _slot, phrase in _STATEMENTS:
        if match := pattern.search(text):
            return phrase.format(*match.groups())
    text = re.sub(r"^(i am|i'm)\b", "User is", text.strip(), flags=re.I)
    text = re.sub(r"^my\b", "User's", text, flags=re.I)
    text = re.sub(r"^(i have|i've)\b", "User has", text, flags=re.I)
    text = re.sub(r"^i\b", "User", text, flags=re.I)
    return text if text.lower().startswith("user") else f"User: {text}"


class OfflineAssistant(OfflineChatModel):
    """With `remember` / `forget` bound, "remember that ..." and "forget ..." call them; a text
    reply echoes the user and lists the facts recall fenced into the prompt; asked for
    MemoryOps (the memory writer), first-person statements become memory operations."""

    def respond(self, turn: Turn) -> AIMessage | None:
        if isinstance(turn.last, HumanMessage):
            if call := _memory_call(turn):
                return turn.calls(call)
            return say(_echo(turn))
        return None  # after a tool result: the generic "<tool> returned: ..."

    def answer(self, schema: Any, turn: Turn) -> Any:
        if schema is not MemoryOps:
            return None
        stored = dict(_STORED_LINE.findall(turn.data))
        ops: list[MemoryOp] = []
        for line in "\n".join(turn.human).splitlines():
            said = _user_line(line)
            if said is not None:
                ops.extend(_ops_for(said, stored))
        return MemoryOps(ops=ops[:20])


def offline_assistant() -> OfflineChatModel:
    return OfflineAssistant()


def _memory_call(turn: Turn) -> tuple[str, dict[str, Any]] | None:
    """'remember that ...' calls remember; 'forget ...' calls forget (when they are bound)."""
    if "remember" in turn.tools and (match := _REMEMBER.match(turn.request)):
        return "remember", {"fact": first_person_to_user(match[1]), "category": "fact"}
    if "forget" in turn.tools and (match := _FORGET.match(turn.request)):
        return "forget", {"what": first_person_to_user(match[1])}
    return None


def _echo(turn: Turn) -> str:
    """Echo the user, and show which memories recall put into the prompt (its fenced lines)."""
    said = f"You said: {echoed(turn.request)[:200]}"
    remembered = [line for block in fenced_blocks(turn.data) for line in bullet_lines(block)]
    if not remembered:
        return said
    return f"{said}\nWhat I remember about you: " + "; ".join(remembered)


def _user_line(line: str) -> str | None:
    """The text of one transcript line (graphs.memory.writer.transcript) if the user wrote it."""
    try:
        message = json.loads(line)
    except ValueError:
        return None
    if not isinstance(message, dict) or message.get("role") != "user":
        return None
    return str(message.get("text", ""))


def _ops_for(sentence: str, stored: dict[str, str]) -> list[MemoryOp]:
    if _REMEMBER.match(sentence) or _FORGET.match(sentence):
        return []  # handled by the tools in the conversation itself
    ops = []
    for pattern, slot, phrase in _STATEMENTS:
        if match := pattern.search(sentence):
            action: Literal["insert", "update"] = "update" if slot in stored else "insert"
            content = phrase.format(*match.groups())
            ops.append(
                MemoryOp(
                    action=action,
                    key=slot,
                    content=content,
                    category="profile" if slot else "preference",
                    stated=True,
                )
            )
    return ops
