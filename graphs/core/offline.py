"""Deterministic stand-in chat model, used when no model key is configured.

It never reads the app's instructions. What it does is chosen by what it is offered: the
structured-output schema (`with_structured_output`) and the tools bound (`bind_tools`); a test
can script a call explicitly with `/tool <name> <json-args>` (whole scripted conversations:
tests/fakes.ScriptedChatModel). What it reads is data: the user's messages, tool results, and
lines the app's code renders from state (numbered steps, "- key: value" lines, blocks fenced in
<tags>), never a prompt's sentences or headings, so rewording a prompt cannot change a reply
(tests/unit/test_offline_ignores_prompts.py rewords them all). Each agent's behaviour is a
subclass overriding `respond` and `answer`, both given a `Turn`.
"""

from __future__ import annotations

import hashlib
import html
import json
import re
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel, LanguageModelInput
from langchain_core.messages import (
    AIMessage,
    AIMessageChunk,
    BaseMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
)
from langchain_core.messages.ai import UsageMetadata
from langchain_core.messages.tool import tool_call, tool_call_chunk
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult
from langchain_core.runnables import Runnable, RunnableLambda
from langchain_core.tools import BaseTool
from langchain_core.utils.function_calling import convert_to_openai_tool
from pydantic import BaseModel
from pydantic_core import to_jsonable_python

REPLY_PREFIX = "(offline model) "
"""Starts every text reply, so nobody mistakes the stand-in for a real model."""

MAX_ECHO_CHARS = 200
TOOL_COMMAND = re.compile(r"/tool\s+(\S+)\s*(.*)", re.DOTALL)
"""`/tool <name> <json-args>` as the last human message makes the model call that tool."""

# Values for string formats pydantic validates (datetime, HttpUrl, EmailStr, UUID ...).
_FORMAT_EXAMPLES = {
    "date-time": "1970-01-01T00:00:00Z",
    "date": "1970-01-01",
    "time": "00:00:00",
    "email": "offline@example.com",
    "uri": "https://example.com/",
    "uuid": "00000000-0000-4000-8000-000000000000",
}
_MAX_NESTING = 4
"""Deeper than this, arrays stay empty so self-referencing schemas terminate."""
OFFLINE_STRUCTURED = "OfflineStructuredOutput"
"""The run name of the stand-in's structured output, which answers without a chat-model run:
counters of model calls count it as the call it stands in for."""
CHARS_PER_TOKEN = 4
"""The stand-in has no tokenizer: it reports one token per 4 characters (about right for
English with the GPT tokenizers), an estimate, so usage figures and budgets work offline."""
NUMBERED_LINE = re.compile(r"^\d+[.)]\s+(.+?)\s*$")
"""An item of a numbered list ("1. ...", "2) ...")."""
_FENCED = re.compile(r"<([a-z_]+)>((?:(?!<\1>).)*?)</\1>", re.DOTALL)
"""A closed <tag>...</tag> block; the latest opening before the close, so a prompt that merely
mentions the tag does not swallow the text after the mention."""


@dataclass(frozen=True)
class Turn:
    """One model call as the offline model sees it: the conversation and the tools it may call."""

    messages: list[BaseMessage]
    tools: tuple[str, ...]

    @property
    def last(self) -> BaseMessage | None:
        return self.messages[-1] if self.messages else None

    @cached_property
    def human(self) -> list[str]:
        """The human messages' text: the user's words, or the task handed to a subagent."""
        return [str(m.text) for m in self.messages if isinstance(m, HumanMessage)]

    @property
    def request(self) -> str:
        """The latest human message."""
        return self.human[-1] if self.human else ""

    @property
    def task(self) -> str:
        """The first human message: what this conversation was started for."""
        return self.human[0] if self.human else ""

    @cached_property
    def data(self) -> str:
        """The system messages' text: read it only for rendered data (numbered lines, "- key:
        value" lines, fenced blocks), never for its wording, which is the prompt's."""
        return "\n".join(str(m.text) for m in self.messages if isinstance(m, SystemMessage))

    @cached_property
    def results(self) -> list[tuple[str, str]]:
        """(tool name, result text) of this conversation's tool calls, in order."""
        names = {
            c["id"]: c["name"]
            for m in self.messages
            if isinstance(m, AIMessage)
            for c in m.tool_calls
        }
        return [
            (m.name or names.get(m.tool_call_id, "tool"), str(m.text))
            for m in self.messages
            if isinstance(m, ToolMessage)
        ]

    def calls(self, *calls: tuple[str, dict[str, Any]]) -> AIMessage:
        """A reply calling these tools, with ids fixed by the conversation so far."""
        seed = f"{len(self.messages)}:{self.request}"
        return AIMessage(
            content="",
            tool_calls=[
                tool_call(name=name, args=args, id=call_id(f"{seed}:{i}:{name}:{args}"))
                for i, (name, args) in enumerate(calls)
            ],
        )


def say(text: str) -> AIMessage:
    """A text reply, marked as the offline model's."""
    return AIMessage(f"{REPLY_PREFIX}{text}")


def call_id(seed: str) -> str:
    return "call_" + hashlib.sha256(seed.encode()).hexdigest()[:24]


def fenced_blocks(text: str) -> list[str]:
    """The bodies of closed <tag>...</tag> blocks: the data the app fences off in a prompt."""
    return [body for _tag, body in _FENCED.findall(text)]


def fenced_block(text: str, tag: str) -> str | None:
    """The body of the last closed <tag>...</tag> block in text, or None."""
    bodies = [body for name, body in _FENCED.findall(text) if name == tag]
    return bodies[-1] if bodies else None


def bullet_lines(text: str) -> list[str]:
    return re.findall(r"^- (.+)$", text, re.M)


def first_sentence(text: str) -> str:
    return re.split(r"(?<=[.!?])\s", " ".join(text.split()), maxsplit=1)[0]


_ATTACHMENT = re.compile(r'<attachment name="([^"]*)">.*?</attachment>', re.S)


def echoed(text: str) -> str:
    """The user's words as an echo shows them: an attached file (ui/input.py `compose`) by its
    name, not as the delimited block the model reads."""
    return _ATTACHMENT.sub(lambda m: f"[attached: {html.unescape(m[1])}]", text)


def truncate(text: str, limit: int = MAX_ECHO_CHARS) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


class OfflineChatModel(BaseChatModel):
    """Echoes the user, runs `/tool` commands and fills structured outputs with minimal values.

    An agent's offline behaviour subclasses it and overrides `respond` (text and tool calls)
    and `answer` (structured output), choosing by `turn.tools` and the schema."""

    tool_names: tuple[str, ...] = ()
    """Names of the tools bound with `bind_tools`."""

    def respond(self, turn: Turn) -> AIMessage | None:
        """The agent's reply to this turn; None falls back to the generic one."""
        return None

    def answer(self, schema: dict[str, Any] | type, turn: Turn) -> Any:
        """The agent's structured output for this schema; None falls back to a minimal value."""
        return None

    @property
    def _llm_type(self) -> str:
        return "cairn-offline"

    @property
    def _identifying_params(self) -> dict[str, Any]:
        return {"model_name": self._llm_type, "tool_names": list(self.tool_names)}

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        return ChatResult(generations=[ChatGeneration(message=self._reply(messages))])

    # Answering takes microseconds: no worker thread (the base class's default) for it.
    async def _agenerate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        return ChatResult(generations=[ChatGeneration(message=self._reply(messages))])

    # The base class reports each chunk to the callbacks, so the stream methods don't.
    def _stream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> Iterator[ChatGenerationChunk]:
        yield from message_chunks(self._reply(messages))

    async def _astream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> AsyncIterator[ChatGenerationChunk]:
        for chunk in message_chunks(self._reply(messages)):
            yield chunk

    def bind_tools(
        self,
        tools: Sequence[dict[str, Any] | type | Callable[..., Any] | BaseTool],
        *,
        tool_choice: str | None = None,
        **kwargs: Any,
    ) -> Runnable[LanguageModelInput, AIMessage]:
        names = tuple(convert_to_openai_tool(tool)["function"]["name"] for tool in tools)
        return self.model_copy(update={"tool_names": names})

    def with_structured_output(
        self,
        schema: dict[str, Any] | type,
        *,
        include_raw: bool = False,
        **kwargs: Any,  # method, strict ...: one way of answering serves them all
    ) -> Runnable[LanguageModelInput, Any]:
        def respond(model_input: LanguageModelInput) -> Any:
            messages = self._convert_input(model_input).to_messages()
            parsed = self._structured(schema, messages)
            if not include_raw:
                return parsed
            raw = AIMessage(content=json.dumps(to_jsonable_python(parsed)))
            return {"raw": raw, "parsed": parsed, "parsing_error": None}

        async def arespond(model_input: LanguageModelInput) -> Any:
            return respond(model_input)

        # The model's metadata (its role) travels with the answer, as a chat-model run's would.
        answer = RunnableLambda(respond, afunc=arespond, name=OFFLINE_STRUCTURED)
        return answer.with_config(metadata=dict(self.metadata or {}))

    def _reply(self, messages: list[BaseMessage]) -> AIMessage:
        reply = self._answer_turn(Turn(list(messages), self.tool_names))
        return reply.model_copy(update={"usage_metadata": estimated_usage(messages, reply)})

    def _answer_turn(self, turn: Turn) -> AIMessage:
        reply = _tool_command(turn) or self.respond(turn)
        if reply is not None:
            return reply
        if isinstance(turn.last, ToolMessage):
            name, result = turn.results[-1]
            return say(f"{name} returned: {truncate(result)}")
        return say(f"You said: {truncate(echoed(turn.request))}")

    def _structured(self, schema: dict[str, Any] | type, messages: list[BaseMessage]) -> Any:
        turn = Turn(list(messages), self.tool_names)
        answer = self.answer(schema, turn)
        if answer is None:
            root = _json_schema(schema)
            text = first_sentence(turn.request) or REPLY_PREFIX.strip()
            answer = minimal_value(root, root.get("$defs", {}), text)
        if isinstance(schema, type) and issubclass(schema, BaseModel):
            return schema.model_validate(answer)
        return answer  # TypedDicts and dict schemas come back as plain dicts, as with ChatOpenAI


def estimated_tokens(chars: int) -> int:
    return -(-chars // CHARS_PER_TOKEN)


def estimated_usage(messages: Sequence[BaseMessage], reply: AIMessage) -> UsageMetadata:
    """Tokens by CHARS_PER_TOKEN (no tokenizer offline): the messages read, the reply written
    (its text and tool calls)."""
    read = estimated_tokens(sum(len(str(m.content)) for m in messages))
    calls = (
        json.dumps([[c["name"], c["args"]] for c in reply.tool_calls]) if reply.tool_calls else ""
    )
    written = estimated_tokens(len(str(reply.content)) + len(calls))
    return UsageMetadata(input_tokens=read, output_tokens=written, total_tokens=read + written)


def _tool_command(turn: Turn) -> AIMessage | None:
    """`/tool <name> <json-args>` as the last message calls that bound tool (tests, demos)."""
    if not isinstance(turn.last, HumanMessage):
        return None
    match = TOOL_COMMAND.fullmatch(turn.request.strip())
    if match is None or match[1] not in turn.tools:
        return None
    try:
        args = json.loads(match[2] or "{}")
    except json.JSONDecodeError:
        return None
    if not isinstance(args, dict):
        return None
    # Position plus text: repeating a command later in a thread gets a fresh id.
    seed = f"{len(turn.messages)}:{turn.request}"
    return AIMessage(content="", tool_calls=[tool_call(name=match[1], args=args, id=call_id(seed))])


def message_chunks(message: AIMessage) -> Iterator[ChatGenerationChunk]:
    """Split a reply into word chunks (spaces kept) plus one chunk carrying its tool calls; the
    last chunk carries the reply's usage (chunks add up, as a server's stream does)."""
    words = re.findall(r"\S+\s*|\s+", str(message.text))
    pieces = [AIMessageChunk(content=w, id=message.id) for w in words]
    if message.tool_calls:
        chunks = [
            tool_call_chunk(
                name=call["name"], args=json.dumps(call["args"]), id=call["id"], index=i
            )
            for i, call in enumerate(message.tool_calls)
        ]
        pieces.append(AIMessageChunk(content="", id=message.id, tool_call_chunks=chunks))
    if not pieces:
        pieces.append(AIMessageChunk(content="", id=message.id))
    if message.usage_metadata is not None:
        pieces[-1].usage_metadata = message.usage_metadata
    for piece in pieces:
        yield ChatGenerationChunk(message=piece)


def minimal_value(schema: dict[str, Any], defs: dict[str, Any], text: str, depth: int = 0) -> Any:
    """A small value valid for a JSON schema, its strings cut from `text`."""
    if "default" in schema:
        return schema["default"]
    if "$ref" in schema:
        return minimal_value(defs[schema["$ref"].rsplit("/", 1)[-1]], defs, text, depth)
    if "const" in schema:
        return schema["const"]
    if "enum" in schema:
        return schema["enum"][0]
    options = schema.get("anyOf") or schema.get("oneOf") or schema.get("allOf")
    if options:
        if any(option.get("type") == "null" for option in options):
            return None
        return minimal_value(options[0], defs, text, depth)
    kind = schema.get("type", "string")
    if isinstance(kind, list):
        return (
            None
            if "null" in kind
            else minimal_value({**schema, "type": kind[0]}, defs, text, depth)
        )
    if kind == "object":
        required = schema.get("required", [])
        return {
            name: minimal_value(sub, defs, text, depth + 1)
            for name, sub in schema.get("properties", {}).items()
            if name in required or "default" in sub
        }
    if kind == "array":
        count = max(1, schema.get("minItems", 0)) if depth < _MAX_NESTING else 0
        return [minimal_value(schema.get("items", {}), defs, text, depth + 1) for _ in range(count)]
    if kind in ("integer", "number"):
        return _minimal_number(schema, integer=kind == "integer")
    if kind == "boolean":
        return False
    if kind == "null":
        return None
    return _minimal_string(schema, text)


def _minimal_number(schema: dict[str, Any], *, integer: bool) -> int | float:
    if "minimum" in schema:
        value = schema["minimum"]
    elif "exclusiveMinimum" in schema:
        value = schema["exclusiveMinimum"] + 1
    else:
        value = min(0, schema.get("maximum", 0), schema.get("exclusiveMaximum", 1) - 1)
    return int(value) if integer else value


def _minimal_string(schema: dict[str, Any], text: str) -> str:
    value = _FORMAT_EXAMPLES.get(schema.get("format", ""), text)
    value = value.ljust(schema.get("minLength", 0), ".")
    return value[: schema.get("maxLength", len(value))]


def _json_schema(schema: dict[str, Any] | type) -> dict[str, Any]:
    if isinstance(schema, type) and issubclass(schema, BaseModel):
        return schema.model_json_schema()
    if isinstance(schema, dict):  # a bare JSON schema or either OpenAI tool shape
        function = schema.get("function", schema)
        return dict(function.get("parameters", function))
    return dict(convert_to_openai_tool(schema)["function"]["parameters"])
