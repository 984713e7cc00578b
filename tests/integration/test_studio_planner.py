"""The Studio Planner (`langgraph dev`) sets up its analytics database and answers from it."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.types import Command

from graphs.core.context import Context
from graphs.core.settings import get_settings

pytestmark = pytest.mark.integration

STUDIO = Path(__file__).resolve().parents[2] / "graphs" / "studio.py"


@pytest.fixture
def app_database(database_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The app's database as Studio finds it, from the settings; offline models."""
    monkeypatch.setenv("CAIRN_DATABASE_URL", database_url)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("CAIRN_OPENAI_API_KEY", raising=False)
    get_settings.cache_clear()
    yield database_url
    get_settings.cache_clear()


def load_studio() -> Any:
    """A fresh copy of graphs/studio.py, executed from its file as `langgraph dev` does."""
    spec = importlib.util.spec_from_file_location("graphs__studio_integration", STUDIO)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


async def test_the_studio_planner_answers_from_the_demo_tables(app_database: str) -> None:
    studio = load_studio()
    graph = (await studio.planner()).copy(update={"checkpointer": InMemorySaver()})
    assert await studio.planner() is not None  # a second run does not migrate again
    thread = "studio-planner"
    config: Any = {"configurable": {"thread_id": thread}}
    context = Context(user_id="studio-user", thread_id=thread, agent="planner")

    paused = await graph.ainvoke(
        {"input": "Which region had the most churned customers last quarter?"},
        config,
        context=context,
    )
    assert paused["__interrupt__"][0].value["kind"] == "planner_review"
    done = await graph.ainvoke(Command(resume={"decision": "approve"}), config, context=context)

    assert done["outcome"] == "answered"
    assert "EMEA" in done["response"]
    assert not any("unavailable" in result for _, _, result in done["past_steps"])
