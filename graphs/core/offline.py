"""Deterministic stand-in chat model, used when no model key is configured."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from typing import Any

from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel, LanguageModelInput
from langchain_core.messages import (
    AIMessage,
    AIMessageChunk,
    BaseMessage,
    HumanMessage,
    ToolCall,
    ToolMessage,
)
from langchain_core.messages.tool import tool_call, tool_call_chunk
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult
from langchain_core.runnables import Runnable, RunnableLambda
from langchain_core.tools import BaseTool
from langchain_core.utils.function_calling import convert_to_openai_tool
from pydantic import BaseModel, Field
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

StructuredResponder = Callable[[type | dict[str, Any], list[BaseMessage]], Any]
ToolRouter = Callable[[list[BaseMessage], tuple[str, ...]], ToolCall | None]
TextResponder = Callable[[list[BaseMessage]], str | None]


class OfflineChatModel(BaseChatModel):
    """Echoes the user, runs `/tool` commands and fills structured outputs with minimal values."""

    tool_names: tuple[str, ...] = ()
    """Names of the tools bound with `bind_tools`."""

    structured_responder: StructuredResponder | None = Field(default=None, exclude=True)
    """Asked first for structured output: `(schema, messages) -> value`; None falls back."""

    tool_router: ToolRouter | None = Field(default=None, exclude=True)
    """An agent's plain-language rules for calling its tools: `(messages, tool_names) -> call`."""

    text_responder: TextResponder | None = Field(default=None, exclude=True)
    """An agent's reply text for a conversation, after the REPLY_PREFIX; None falls back."""

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

        return RunnableLambda(respond, afunc=arespond, name="OfflineStructuredOutput")

    def _reply(self, messages: list[BaseMessage]) -> AIMessage:
        last = messages[-1] if messages else None
        if isinstance(last, ToolMessage):
            result = _truncate(str(last.text))
            return AIMessage(f"{REPLY_PREFIX}{_tool_name(last, messages)} returned: {result}")
        call = self._requested_tool_call(messages)
        if call is None and self.tool_router is not None and isinstance(last, HumanMessage):
            call = self.tool_router(messages, self.tool_names)
        if call is not None:
            return AIMessage(content="", tool_calls=[call])
        text = self.text_responder(messages) if self.text_responder else None
        if text is not None:
            return AIMessage(f"{REPLY_PREFIX}{text}")
        return AIMessage(f"{REPLY_PREFIX}You said: {_truncate(_last_human_text(messages))}")

    def _requested_tool_call(self, messages: list[BaseMessage]) -> ToolCall | None:
        last = messages[-1] if messages else None
        if not isinstance(last, HumanMessage):
            return None
        match = TOOL_COMMAND.fullmatch(str(last.text).strip())
        if match is None or match[1] not in self.tool_names:
            return None
        try:
            args = json.loads(match[2] or "{}")
        except json.JSONDecodeError:
            return None
        if not isinstance(args, dict):
            return None
        # Position plus text: repeating a command later in a thread gets a fresh id.
        digest = hashlib.sha256(f"{len(messages)}:{last.text}".encode()).hexdigest()[:24]
        return tool_call(name=match[1], args=args, id=f"call_{digest}")

    def _structured(self, schema: dict[str, Any] | type, messages: list[BaseMessage]) -> Any:
        answer = self.structured_responder(schema, messages) if self.structured_responder else None
        if answer is None:
            root = _json_schema(schema)
            text = _first_sentence(_last_human_text(messages)) or REPLY_PREFIX.strip()
            answer = minimal_value(root, root.get("$defs", {}), text)
        if isinstance(schema, type) and issubclass(schema, BaseModel):
            return schema.model_validate(answer)
        return answer  # TypedDicts and dict schemas come back as plain dicts, as with ChatOpenAI


def message_chunks(message: AIMessage) -> Iterator[ChatGenerationChunk]:
    """Split a reply into word chunks (spaces kept) plus one chunk carrying its tool calls."""
    words = re.findall(r"\S+\s*|\s+", str(message.text))
    for word in words or ([] if message.tool_calls else [""]):
        yield ChatGenerationChunk(message=AIMessageChunk(content=word, id=message.id))
    if message.tool_calls:
        chunks = [
            tool_call_chunk(
                name=call["name"], args=json.dumps(call["args"]), id=call["id"], index=i
            )
            for i, call in enumerate(message.tool_calls)
        ]
        yield ChatGenerationChunk(
            message=AIMessageChunk(content="", id=message.id, tool_call_chunks=chunks)
        )


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


def _last_human_text(messages: list[BaseMessage]) -> str:
    human = next((m for m in reversed(messages) if isinstance(m, HumanMessage)), None)
    return str(human.text) if human else ""


def _first_sentence(text: str) -> str:
    return re.split(r"(?<=[.!?])\s", " ".join(text.split()), maxsplit=1)[0]


def _truncate(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= MAX_ECHO_CHARS else text[: MAX_ECHO_CHARS - 1] + "…"


def _tool_name(result: ToolMessage, messages: list[BaseMessage]) -> str:
    if result.name:
        return result.name
    calls = (c for m in messages if isinstance(m, AIMessage) for c in m.tool_calls)
    return next((c["name"] for c in calls if c["id"] == result.tool_call_id), "tool")
