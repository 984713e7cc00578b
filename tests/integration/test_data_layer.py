"""Chainlit's conversation store on the shared pool: owners never change, strangers get a plain 404."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import chainlit as cl
import chainlit.data
import pytest
from chainlit.context import init_http_context
from chainlit.types import Feedback, Pagination, ThreadFilter
from chainlit.user import PersistedUser, User
from fastapi import HTTPException

from auth.ownership import NOT_FOUND
from graphs.core.persistence import Persistence
from ui.chainlit.data_layer import PostgresDataLayer, add_outside_turn, append_message
from ui.chainlit.patches.acl import require_thread_author
from ui.chainlit.patches.sockets import REPLAYED, SOCKET_EVENTS, guard_socket_events

pytestmark = pytest.mark.integration


@pytest.fixture
def layer(persistence: Persistence) -> Iterator[PostgresDataLayer]:
    """The app's data layer, installed where Chainlit's handlers look it up."""
    saved = (chainlit.data._data_layer, chainlit.data._data_layer_initialized)
    data_layer = PostgresDataLayer(persistence.pool)
    chainlit.data._data_layer = data_layer
    chainlit.data._data_layer_initialized = True
    yield data_layer
    chainlit.data._data_layer, chainlit.data._data_layer_initialized = saved


async def new_user(layer: PostgresDataLayer, name: str) -> PersistedUser:
    user = await layer.create_user(User(identifier=f"{name}:{uuid.uuid4().hex[:8]}"))
    assert user is not None
    return user


async def new_thread(layer: PostgresDataLayer, owner: PersistedUser, name: str = "chat") -> str:
    thread_id = str(uuid.uuid4())
    await layer.update_thread(thread_id, name=name, user_id=owner.id)
    return thread_id


def step(thread_id: str, output: str, **extra: Any) -> dict[str, Any]:
    created = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return {
        "id": str(uuid.uuid4()),
        "threadId": thread_id,
        "type": "user_message",
        "name": "user",
        "output": output,
        "createdAt": created,
        **extra,
    }


async def count(persistence: Persistence, sql: str, *params: Any) -> int:
    async with persistence.pool.connection() as conn:
        cur = await conn.execute(sql, params)
        row = await cur.fetchone()
    assert row is not None
    return int(row["n"])


async def test_create_user_round_trips(layer: PostgresDataLayer) -> None:
    created = await layer.create_user(User(identifier="cairn:roundtrip", metadata={"a": 1}))
    fetched = await layer.get_user("cairn:roundtrip")

    assert created is not None
    assert fetched is not None
    assert fetched.id == created.id
    assert fetched.metadata == {"a": 1}


async def test_update_thread_with_a_user_creates_a_thread_they_own(
    layer: PostgresDataLayer,
) -> None:
    alice = await new_user(layer, "alice")

    thread_id = await new_thread(layer, alice, name="Trip to Lisbon")

    assert await layer.get_thread_author(thread_id) == alice.identifier
    thread = await layer.get_thread(thread_id)
    assert thread is not None
    assert thread["name"] == "Trip to Lisbon"
    assert thread["userIdentifier"] == alice.identifier


async def test_steps_round_trip_with_their_metadata(layer: PostgresDataLayer) -> None:
    alice = await new_user(layer, "alice")
    thread_id = await new_thread(layer, alice)
    init_http_context(thread_id=thread_id)  # create_step needs a Chainlit context

    await layer.create_step(step(thread_id, "first words", metadata={"source": "web", "n": 1}))
    await layer.create_step(step(thread_id, "second words", metadata={}))

    thread = await layer.get_thread(thread_id)
    assert thread is not None
    assert [s["output"] for s in thread["steps"]] == ["first words", "second words"]
    assert thread["steps"][0]["metadata"] == {"source": "web", "n": 1}
    assert thread["steps"][1]["metadata"] == {}


async def test_text_with_percent_signs_and_placeholders_is_stored_verbatim(
    layer: PostgresDataLayer,
) -> None:
    # The layer rewrites $n placeholders for psycopg; user text must pass through untouched.
    alice = await new_user(layer, "alice")
    thread_id = await new_thread(layer, alice)
    init_http_context(thread_id=thread_id)
    text = "100% sure that $1 and %(p1)s and %s are just text"

    await layer.create_step(step(thread_id, text, metadata={"note": "50% $2"}))

    thread = await layer.get_thread(thread_id)
    assert thread is not None
    assert thread["steps"][0]["output"] == text
    assert thread["steps"][0]["metadata"] == {"note": "50% $2"}


async def test_a_step_for_an_unknown_thread_or_parent_creates_placeholders(
    layer: PostgresDataLayer, persistence: Persistence
) -> None:
    # Chainlit may save a step before its thread or parent row exists (late or reordered events).
    thread_id, parent_id = str(uuid.uuid4()), str(uuid.uuid4())
    init_http_context(thread_id=thread_id)

    await layer.create_step(step(thread_id, "early", parentId=parent_id))

    thread_sql = 'SELECT count(*) AS n FROM "Thread" WHERE id = %s AND "userId" IS NULL'
    assert await count(persistence, thread_sql, thread_id) == 1
    parent_sql = """SELECT count(*) AS n FROM "Step" WHERE id = %s AND type = 'run'"""
    assert await count(persistence, parent_sql, parent_id) == 1
    assert await layer.get_thread_author(thread_id) == ""  # a placeholder belongs to nobody


async def test_updating_a_step_keeps_what_the_update_leaves_out(layer: PostgresDataLayer) -> None:
    alice = await new_user(layer, "alice")
    thread_id = await new_thread(layer, alice)
    init_http_context(thread_id=thread_id)
    first = step(thread_id, "the answer", metadata={"k": "v"}, input="the question")
    await layer.create_step(first)

    await layer.update_step({**first, "output": "", "input": "", "metadata": {}, "type": "run"})

    thread = await layer.get_thread(thread_id)
    assert thread is not None
    (saved,) = thread["steps"]
    assert (saved["output"], saved["input"], saved["type"]) == (
        "the answer",
        "the question",
        "user_message",
    )
    assert saved["metadata"] == {"k": "v"}


async def test_a_late_step_does_not_bring_back_a_deleted_conversation(
    layer: PostgresDataLayer, persistence: Persistence
) -> None:
    alice = await new_user(layer, "alice")
    thread_id = await new_thread(layer, alice)
    init_http_context(thread_id=thread_id)
    async with persistence.pool.connection() as conn:
        await conn.execute(
            "INSERT INTO cairn_deleted_threads (thread_id) VALUES (%s)", (thread_id,)
        )
    await layer.delete_thread(thread_id)

    await layer.create_step(step(thread_id, "arrived after the delete"))

    assert (
        await count(persistence, 'SELECT count(*) AS n FROM "Thread" WHERE id = %s', thread_id) == 0
    )
    steps_sql = 'SELECT count(*) AS n FROM "Step" WHERE "threadId" = %s'
    assert await count(persistence, steps_sql, thread_id) == 0


async def test_list_threads_returns_only_the_users_threads(layer: PostgresDataLayer) -> None:
    alice = await new_user(layer, "alice")
    bob = await new_user(layer, "bob")
    alices = {await new_thread(layer, alice) for _ in range(3)}
    bobs = {await new_thread(layer, bob)}

    page = await layer.list_threads(Pagination(first=20), ThreadFilter(userId=alice.id))

    assert {t["id"] for t in page.data} == alices
    assert not {t["id"] for t in page.data} & bobs
    assert {t["userIdentifier"] for t in page.data} == {alice.identifier}


async def test_another_user_cannot_take_over_a_thread(layer: PostgresDataLayer) -> None:
    alice = await new_user(layer, "alice")
    mallory = await new_user(layer, "mallory")
    thread_id = await new_thread(layer, alice, name="Alice's plans")

    await layer.update_thread(thread_id, name="pwned", user_id=mallory.id)

    assert await layer.get_thread_author(thread_id) == alice.identifier
    thread = await layer.get_thread(thread_id)
    assert thread is not None
    assert thread["name"] == "Alice's plans"
    page = await layer.list_threads(Pagination(first=20), ThreadFilter(userId=mallory.id))
    assert page.data == []


async def test_the_owner_can_still_rename_their_thread(layer: PostgresDataLayer) -> None:
    alice = await new_user(layer, "alice")
    thread_id = await new_thread(layer, alice, name="old name")

    await layer.update_thread(thread_id, name="new name", user_id=alice.id)

    thread = await layer.get_thread(thread_id)
    assert thread is not None
    assert thread["name"] == "new name"
    assert await layer.get_thread_author(thread_id) == alice.identifier


async def test_an_unknown_thread_has_no_author(layer: PostgresDataLayer) -> None:
    assert await layer.get_thread_author(str(uuid.uuid4())) == ""
    assert await layer.get_thread(str(uuid.uuid4())) is None


async def test_deleting_a_thread_removes_its_steps(
    layer: PostgresDataLayer, persistence: Persistence
) -> None:
    alice = await new_user(layer, "alice")
    thread_id = await new_thread(layer, alice)
    init_http_context(thread_id=thread_id)
    await layer.create_step(step(thread_id, "to be forgotten"))
    steps_sql = 'SELECT count(*) AS n FROM "Step" WHERE "threadId" = %s'
    assert await count(persistence, steps_sql, thread_id) == 1

    await layer.delete_thread(thread_id)

    assert (
        await count(persistence, 'SELECT count(*) AS n FROM "Thread" WHERE id = %s', thread_id) == 0
    )
    assert await count(persistence, steps_sql, thread_id) == 0
    assert await layer.get_thread_author(thread_id) == ""


async def test_thread_author_check_passes_for_the_owner(layer: PostgresDataLayer) -> None:
    alice = await new_user(layer, "alice")
    thread_id = await new_thread(layer, alice)

    assert await require_thread_author(alice.identifier, thread_id) is True


async def test_unknown_and_foreign_threads_get_the_same_404(layer: PostgresDataLayer) -> None:
    alice = await new_user(layer, "alice")
    mallory = await new_user(layer, "mallory")
    foreign = await new_thread(layer, alice)

    with pytest.raises(HTTPException) as on_unknown:
        await require_thread_author(mallory.identifier, str(uuid.uuid4()))
    with pytest.raises(HTTPException) as on_foreign:
        await require_thread_author(mallory.identifier, foreign)

    assert on_unknown.value.status_code == on_foreign.value.status_code == 404
    assert on_unknown.value.detail == on_foreign.value.detail == NOT_FOUND


async def test_a_thread_without_an_owner_belongs_to_nobody(layer: PostgresDataLayer) -> None:
    mallory = await new_user(layer, "mallory")
    thread_id = str(uuid.uuid4())
    await layer.update_thread(thread_id, name="ownerless")

    with pytest.raises(HTTPException) as caught:
        await require_thread_author(mallory.identifier, thread_id)

    assert caught.value.status_code == 404


async def test_a_message_id_from_another_conversation_changes_nothing_there(
    layer: PostgresDataLayer,
) -> None:
    """Clients pick their message ids: Bob reusing the id of Alice's message neither rewrites
    it nor moves it into his conversation."""
    alice, bob = await new_user(layer, "alice"), await new_user(layer, "bob")
    alices, bobs = await new_thread(layer, alice), await new_thread(layer, bob)
    init_http_context(thread_id=alices)
    original = step(alices, "Alice's own words")
    await layer.create_step(original)

    init_http_context(thread_id=bobs)
    await layer.create_step({**original, "threadId": bobs, "output": "Bob's words"})
    await layer.update_step({**original, "threadId": bobs, "output": "Bob again"})

    thread = await layer.get_thread(alices)
    assert thread is not None
    assert [(s["id"], s["output"]) for s in thread["steps"]] == [
        (original["id"], "Alice's own words")
    ]
    bobs_thread = await layer.get_thread(bobs)
    assert bobs_thread is not None
    assert bobs_thread["steps"] == []


async def test_removing_a_message_reaches_only_the_sessions_conversation(
    layer: PostgresDataLayer, persistence: Persistence
) -> None:
    """A refused message is removed by its client-chosen id; that id may be Alice's message."""
    alice, bob = await new_user(layer, "alice"), await new_user(layer, "bob")
    alices, bobs = await new_thread(layer, alice), await new_thread(layer, bob)
    init_http_context(thread_id=alices)
    hers = step(alices, "keep me")
    await layer.create_step(hers)
    await layer.upsert_feedback(Feedback(forId=hers["id"], value=1, comment="useful"))

    init_http_context(thread_id=bobs)
    await layer.delete_step(hers["id"])

    sql = 'SELECT count(*) AS n FROM "Step" WHERE id = %s'
    assert await count(persistence, sql, hers["id"]) == 1
    sql = 'SELECT count(*) AS n FROM "Feedback" WHERE "stepId" = %s'
    assert await count(persistence, sql, hers["id"]) == 1

    init_http_context(thread_id=alices)
    await layer.delete_step(hers["id"])
    assert await count(persistence, sql, hers["id"]) == 0
    sql = 'SELECT count(*) AS n FROM "Step" WHERE id = %s'
    assert await count(persistence, sql, hers["id"]) == 0


async def test_a_reply_written_outside_a_chat_session_shows_when_the_thread_is_reopened(
    layer: PostgresDataLayer, persistence: Persistence
) -> None:
    alice = await new_user(layer, "alice")
    thread_id = await new_thread(layer, alice)
    init_http_context(thread_id=thread_id)
    await layer.create_step(step(thread_id, "Remember that I have asthma"))

    await append_message(persistence.pool, thread_id, "Noted: saved to memory.")
    missing = str(uuid.uuid4())
    await append_message(persistence.pool, missing, "Nowhere to go.")
    await append_message(persistence.pool, thread_id, "")

    thread = await layer.get_thread(thread_id)
    assert thread is not None
    shown = [(s["type"], s["output"]) for s in thread["steps"]]
    assert shown == [
        ("user_message", "Remember that I have asthma"),
        ("assistant_message", "Noted: saved to memory."),
    ]
    assert (
        await count(persistence, 'SELECT count(*) AS n FROM "Thread" WHERE id = %s', missing) == 0
    )


async def test_a_turn_from_outside_the_chat_shows_in_the_owners_conversation_only(
    layer: PostgresDataLayer, persistence: Persistence
) -> None:
    alice = await new_user(layer, "alice")
    mallory = await new_user(layer, "mallory")
    thread_id = str(uuid.uuid4())

    await add_outside_turn(
        persistence.pool,
        thread_id=thread_id,
        user_id=alice.identifier,
        profile="Planner",
        text="Which region churned most?",
    )
    await add_outside_turn(
        persistence.pool,
        thread_id=thread_id,
        user_id=mallory.identifier,
        profile="Assistant",
        text="pwned",
    )

    thread = await layer.get_thread(thread_id)
    assert thread is not None
    assert thread["userIdentifier"] == alice.identifier
    assert thread["name"] == "Which region churned most?"
    assert thread["metadata"] == {"chat_profile": "Planner"}
    assert [s["output"] for s in thread["steps"]] == ["Which region churned most?"]


async def test_a_reply_written_from_outside_a_session_is_stored_once(
    layer: PostgresDataLayer, persistence: Persistence
) -> None:
    """A run found finished after its worker stopped may already have delivered its reply."""
    owner = await new_user(layer, "alice")
    thread_id = await new_thread(layer, owner)

    await append_message(persistence.pool, thread_id, "The plan found Lisbon.", once=True)
    await append_message(persistence.pool, thread_id, "The plan found Lisbon.", once=True)
    await append_message(persistence.pool, thread_id, "Something else.", once=True)

    thread = await layer.get_thread(thread_id)
    assert thread is not None
    replies = [s["output"] for s in thread["steps"] if s["type"] == "assistant_message"]
    assert replies == ["The plan found Lisbon.", "Something else."]


async def test_an_open_run_step_is_stored_once_when_it_finishes_within_the_grace(
    layer: PostgresDataLayer, persistence: Persistence, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("ui.chainlit.data_layer.OPEN_STEP_GRACE_S", 0.3)
    alice = await new_user(layer, "alice")
    thread_id = await new_thread(layer, alice)
    init_http_context(thread_id=thread_id)
    steps_sql = 'SELECT count(*) AS n FROM "Step" WHERE "threadId" = %s'
    quick = step(thread_id, "", type="run", name="Memory recall")
    slow = step(thread_id, "", type="tool", name="fetch")

    await layer.create_step(quick)
    await layer.create_step(slow)
    assert await count(persistence, steps_sql, thread_id) == 0  # open: not stored yet
    await layer.update_step({**quick, "output": "Nothing relevant.", "end": quick["createdAt"]})
    assert await count(persistence, steps_sql, thread_id) == 1  # finished: stored at once

    await asyncio.sleep(0.6)
    thread = await layer.get_thread(thread_id)
    assert thread is not None
    outputs = {s["name"]: s["output"] for s in thread["steps"]}
    # The quick step's stale "open" copy never overwrote it; the slow one is stored while open.
    assert outputs == {"Memory recall": "Nothing relevant.", "fetch": ""}


async def test_a_step_waiting_to_be_stored_does_not_outlive_its_deletion(
    layer: PostgresDataLayer, persistence: Persistence, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("ui.chainlit.data_layer.OPEN_STEP_GRACE_S", 0.2)
    alice = await new_user(layer, "alice")
    kept, deleted = await new_thread(layer, alice), await new_thread(layer, alice)
    init_http_context(thread_id=kept)
    removed = step(kept, "", type="run")
    await layer.create_step(removed)
    await layer.delete_step(removed["id"])
    init_http_context(thread_id=deleted)
    await layer.create_step(step(deleted, "", type="run"))
    await layer.delete_thread(deleted)

    await asyncio.sleep(0.5)
    steps_sql = 'SELECT count(*) AS n FROM "Step" WHERE "threadId" = %s'
    assert await count(persistence, steps_sql, kept) == 0
    assert await count(persistence, steps_sql, deleted) == 0
    assert layer._deferred == {}


async def test_an_element_for_a_step_waiting_to_be_stored_lands_with_its_step(
    layer: PostgresDataLayer, persistence: Persistence, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Chainlit's create_element makes a placeholder for a missing step, undated: it is stored
    at once (the element's row needs it), and the step's own update fills it in later."""
    monkeypatch.setattr("ui.chainlit.data_layer.OPEN_STEP_GRACE_S", 30.0)
    alice = await new_user(layer, "alice")
    thread_id = await new_thread(layer, alice)
    init_http_context(thread_id=thread_id)
    tool = step(thread_id, "", type="tool", name="chart")
    await layer.create_step(tool)
    element = cl.Text(name="table", content="a | b", for_id=tool["id"])
    element.thread_id = thread_id
    await layer.create_element(element)

    elements_sql = 'SELECT count(*) AS n FROM "Element" WHERE "stepId" = %s'
    assert await count(persistence, elements_sql, tool["id"]) == 1
    await layer.update_step({**tool, "output": "1 row", "end": tool["createdAt"]})
    thread = await layer.get_thread(thread_id)
    assert thread is not None
    assert [(s["name"], s["output"]) for s in thread["steps"]] == [("chart", "1 row")]


class _Sockets:
    """Chainlit's socket server as the guard sees it: one recorded handler, the toasts sent."""

    def __init__(self) -> None:
        self.reached: list[Any] = []
        self.toasts: list[str] = []

        async def client_message(sid: str, payload: Any) -> None:
            self.reached.append(payload)

        self.handlers = {"/": dict.fromkeys(SOCKET_EVENTS, client_message)}

    async def emit(self, event: str, data: Any, to: str) -> None:
        self.toasts.append(data["message"])


async def test_a_message_id_already_stored_anywhere_is_refused_before_chainlit_stores_it(
    layer: PostgresDataLayer,
) -> None:
    """A hand-rolled client resending the id of its own earlier message (which rewrote it) or
    of Alice's (which left Bob's message out of his history) is refused; a new id goes on."""
    alice, bob = await new_user(layer, "alice"), await new_user(layer, "bob")
    alices, bobs = await new_thread(layer, alice), await new_thread(layer, bob)
    init_http_context(thread_id=alices)
    hers = step(alices, "Alice's words")
    await layer.create_step(hers)
    init_http_context(thread_id=bobs)
    his = step(bobs, "Bob's first words")
    await layer.create_step(his)
    sockets = _Sockets()
    guard_socket_events(sockets)
    send = sockets.handlers["/"]["client_message"]

    for reused in (hers["id"], his["id"]):
        await send("no-such-socket", {"message": {**step(bobs, "replayed"), "id": reused}})
    fresh = {"message": step(bobs, "Bob's second words")}
    await send("no-such-socket", fresh)

    assert sockets.toasts == [REPLAYED, REPLAYED]
    assert sockets.reached == [fresh]
    assert await layer.step_exists(hers["id"])
    assert not await layer.step_exists(fresh["message"]["id"])


async def test_a_step_stored_without_output_reopens_with_empty_text(
    layer: PostgresDataLayer,
) -> None:
    owner = await new_user(layer, "alice")
    thread_id = await new_thread(layer, owner)
    init_http_context(thread_id=thread_id)
    # The run step Chainlit wraps on_chat_start in: stored with no output at all.
    chat_start = step(thread_id, "", type="run", name="on_chat_start", end="now")
    chat_start["output"] = None
    await layer.create_step(chat_start)

    thread = await layer.get_thread(thread_id)

    assert thread is not None
    assert [s["output"] for s in thread["steps"]] == [""]
