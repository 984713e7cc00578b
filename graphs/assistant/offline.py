"""The Assistant's behaviour under the offline model: plain rules, so memory works end to end offline."""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any, Literal

from langchain_core.messages import BaseMessage, HumanMessage, SystemMessage, ToolCall
from langchain_core.messages.tool import tool_call

from graphs.core.offline import OfflineChatModel
from graphs.memory.policy import MemoryOp, MemoryOps

_REMEMBER = re.compile(r"^\s*(?:please\s+)?remember(?:\s+that)?\s+(.+?)\s*[.!]?\s*$", re.I | re.S)
_FORGET = re.compile(r"^\s*(?:please\s+)?forget(?:\s+that)?\s+(.+?)\s*[.!]?\s*$", re.I | re.S)
_MEMORY_LINE = re.compile(r"^- (.+)$", re.M)
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


def route_tools(messages: list[BaseMessage], tool_names: tuple[str, ...]) -> ToolCall | None:
    """'remember that ...' calls remember; 'forget ...' calls forget."""
    text = str(messages[-1].text)
    call_id = "call_" + hashlib.sha256(f"{len(messages)}:{text}".encode()).hexdigest()[:24]
    if "remember" in tool_names and (match := _REMEMBER.match(text)):
        fact = first_person_to_user(match[1])
        return tool_call(name="remember", args={"fact": fact, "category": "fact"}, id=call_id)
    if "forget" in tool_names and (match := _FORGET.match(text)):
        return tool_call(name="forget", args={"what": first_person_to_user(match[1])}, id=call_id)
    return None


def reply_text(messages: list[BaseMessage]) -> str | None:
    """Echo the user, and show which memories recall put into the prompt."""
    system = next((m for m in messages if isinstance(m, SystemMessage)), None)
    human = next((m for m in reversed(messages) if isinstance(m, HumanMessage)), None)
    said = str(human.text)[:200] if human else ""
    prompt = str(system.text) if system else ""
    # Only a closed block is the real one (the instructions mention the opening tag too).
    block = prompt.split("<user_memories>")[-1] if "</user_memories>" in prompt else ""
    remembered = _MEMORY_LINE.findall(block.split("</user_memories>")[0]) if block else []
    if not remembered:
        return f"You said: {said}"
    return f"You said: {said}\nWhat I remember about you: " + "; ".join(remembered)


def propose_memories(schema: Any, messages: list[BaseMessage]) -> Any:
    """The memory writer's structured output: first-person statements become memory ops."""
    if schema is not MemoryOps:
        return None
    system = next((str(m.text) for m in messages if isinstance(m, SystemMessage)), "")
    stored = dict(_STORED_LINE.findall(system.split("Forgotten")[0]))
    transcript = "\n".join(str(m.text) for m in messages if isinstance(m, HumanMessage))
    ops: list[MemoryOp] = []
    for line in transcript.splitlines():
        said = _user_line(line)
        if said is not None:
            ops.extend(_ops_for(said, stored))
    return MemoryOps(ops=ops[:20])


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


def offline_assistant() -> OfflineChatModel:
    return OfflineChatModel(
        tool_router=route_tools, text_responder=reply_text, structured_responder=propose_memories
    )
