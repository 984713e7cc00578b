"""A scripted fake chat model that drives whole graphs in unit tests, without a network."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeGuard

from langchain_core.callbacks import CallbackManagerForLLMRun
from langchain_core.language_models import LanguageModelInput
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.outputs import ChatGenerationChunk, ChatResult
from langchain_core.runnables import Runnable, RunnableLambda
from langchain_core.tools import BaseTool
from pydantic import BaseModel, Field

from graphs.core.offline import message_chunks


class ScriptedChatModel(GenericFakeChatModel):
    """Answers with the scripted replies in order; structured output pops scripted objects.

    `ScriptedChatModel([AIMessage("", tool_calls=[call]), AIMessage("done")], [Plan(...)])`
    """

    structured: list[Any] = Field(default_factory=list)
    """Objects returned, in order, by `with_structured_output(...)` runnables."""

    seen: list[list[BaseMessage]] = Field(default_factory=list)
    """The messages of every call, so tests can check what the model was shown."""

    def __init__(
        self,
        replies: Sequence[AIMessage | str] = (),
        structured: Sequence[Any] = (),
        **kwargs: Any,
    ) -> None:
        super().__init__(messages=iter(replies), structured=list(structured), **kwargs)

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        self.seen.append(list(messages))
        try:
            return super()._generate(messages, stop, run_manager, **kwargs)
        except StopIteration:
            msg = f"ScriptedChatModel ran out of replies on call {len(self.seen)}"
            raise AssertionError(msg) from None

    # GenericFakeChatModel drops `tool_calls` when streaming; this keeps them.
    def _stream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> Iterator[ChatGenerationChunk]:
        message = self._generate(messages, stop, run_manager, **kwargs).generations[0].message
        assert isinstance(message, AIMessage)
        yield from message_chunks(message)

    def bind_tools(
        self,
        tools: Sequence[dict[str, Any] | type | Callable[..., Any] | BaseTool],
        *,
        tool_choice: str | None = None,
        **kwargs: Any,
    ) -> Runnable[LanguageModelInput, AIMessage]:
        return self

    def with_structured_output(
        self, schema: dict[str, Any] | type, *, include_raw: bool = False, **kwargs: Any
    ) -> Runnable[LanguageModelInput, Any]:
        def respond(model_input: LanguageModelInput) -> Any:
            self.seen.append(self._convert_input(model_input).to_messages())
            if not self.structured:
                msg = f"ScriptedChatModel ran out of structured outputs for {schema!r}"
                raise AssertionError(msg)
            parsed = self.structured.pop(0)
            if _is_model(schema) and not isinstance(parsed, schema):
                msg = f"Scripted {type(parsed).__name__} answers a request for {schema!r}"
                raise AssertionError(msg)
            if include_raw:
                return {"raw": AIMessage(""), "parsed": parsed, "parsing_error": None}
            return parsed

        return RunnableLambda(respond, name="ScriptedStructuredOutput")


def _is_model(schema: object) -> TypeGuard[type[BaseModel]]:
    return isinstance(schema, type) and issubclass(schema, BaseModel)


class FakeStep:
    """Stands in for `cl.Step`: records what the chat would show for each step."""

    shown: list[FakeStep] = []

    def __init__(self, name: str = "", type: str = "", default_open: bool = False, **_: Any):
        self.name, self.input, self.output, self.is_error = name, "", "", False
        FakeStep.shown.append(self)

    async def send(self) -> FakeStep:
        return self

    async def update(self) -> None:
        return None

    async def __aenter__(self) -> FakeStep:
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None


class FakeTaskList:
    """Stands in for `cl.TaskList`: keeps its tasks and status; every one made is recorded."""

    made: list[FakeTaskList] = []

    def __init__(self, **kwargs: Any) -> None:
        self.tasks: list[Any] = []
        self.status = kwargs.get("status", "")
        FakeTaskList.made.append(self)

    async def add_task(self, task: Any) -> None:
        self.tasks.append(task)

    async def send(self) -> None:
        return None

    async def update(self) -> None:
        return None


def fake_steps_and_task_lists(monkeypatch: Any) -> None:
    """Chainlit's Step and TaskList replaced by the recording fakes, their records cleared."""
    import chainlit as cl

    FakeStep.shown, FakeTaskList.made = [], []
    monkeypatch.setattr(cl, "Step", FakeStep)
    monkeypatch.setattr(cl, "TaskList", FakeTaskList)
