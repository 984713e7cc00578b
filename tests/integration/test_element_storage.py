"""Element storage on a real Postgres: what a reply showed is kept, read back by another worker,
served to its owner only, and gone with its element, step, conversation or account."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import chainlit as cl
import chainlit.data
import httpx
import jwt
import pytest
from chainlit.context import init_http_context
from chainlit.user import PersistedUser, User
from fastapi import FastAPI

from auth.ownership import claim_thread
from auth.sessions import SessionRevocations, SessionTokens
from graphs.core.fence import Fence, acting_for
from graphs.core.persistence import Persistence
from graphs.memory.privacy import Privacy
from ui.chainlit.data_layer import PostgresDataLayer
from ui.chainlit.elements import PostgresStorageClient, build_router, element_key

pytestmark = pytest.mark.integration

SECRET = "element-storage-test-secret-0123456789"
REPORT = b"# Report\n\nThe seed vault opened on 26 February 2008.\n"


def storage_for(persistence: Persistence, **limits: int) -> PostgresStorageClient:
    return PostgresStorageClient(persistence.pool, mime_types=["text/plain"], **limits)


@pytest.fixture
def layer(persistence: Persistence) -> Iterator[PostgresDataLayer]:
    """One worker's data layer, installed where Chainlit looks it up."""
    saved = (chainlit.data._data_layer, chainlit.data._data_layer_initialized)
    data_layer = PostgresDataLayer(persistence.pool, storage=storage_for(persistence))
    chainlit.data._data_layer = data_layer
    chainlit.data._data_layer_initialized = True
    yield data_layer
    chainlit.data._data_layer, chainlit.data._data_layer_initialized = saved


@pytest.fixture
async def other_worker(persistence: Persistence) -> AsyncIterator[httpx.AsyncClient]:
    """Another worker: its own data layer and storage client on the same database, and its route."""
    app = FastAPI()
    app.state.session_tokens = SessionTokens(secret=SECRET, from_cookies=lambda _cookies: None)
    app.include_router(build_router(storage_for(persistence)))
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://worker-2") as client:
        yield client


def bearer(user: str) -> dict[str, str]:
    return {"authorization": f"Bearer {jwt.encode({'identifier': user}, SECRET)}"}


async def new_user(layer: PostgresDataLayer, name: str) -> PersistedUser:
    user = await layer.create_user(User(identifier=f"{name}:{uuid.uuid4().hex[:8]}"))
    assert user is not None
    return user


async def conversation(layer: PostgresDataLayer, owner: PersistedUser) -> tuple[str, str]:
    """A conversation of owner's with one reply; returns (thread id, reply id). The chat session
    is the owner's from here on."""
    thread_id = str(uuid.uuid4())
    await layer.update_thread(thread_id, name="chat", user_id=owner.id)
    await claim_thread(layer._pool, thread_id=thread_id, user_id=owner.identifier, agent="research")
    init_http_context(thread_id=thread_id, user=User(identifier=owner.identifier))
    reply = cl.Message(content="Here is the report", author="Research")
    await layer.create_step(reply.to_dict())
    return thread_id, reply.id


async def attach(layer: PostgresDataLayer, reply_id: str, element: Any) -> Any:
    element.for_id = reply_id
    await layer.create_element(element)
    return element


def report_file() -> Any:
    return cl.File(name="final_report.md", content=REPORT, mime="text/markdown", display="inline")


async def stored_files(persistence: Persistence, thread_id: str) -> int:
    async with persistence.pool.connection() as conn:
        cur = await conn.execute(
            "SELECT count(*) AS n FROM cairn_element_files WHERE thread_id = %s", (thread_id,)
        )
        row = await cur.fetchone()
    assert row is not None
    return int(row["n"])


async def test_a_reply_file_is_read_back_by_another_worker_in_the_same_place(
    persistence: Persistence, layer: PostgresDataLayer, other_worker: httpx.AsyncClient
) -> None:
    alice = await new_user(layer, "alice")
    thread_id, reply_id = await conversation(layer, alice)
    element = await attach(layer, reply_id, report_file())

    # Another worker reopens the conversation: the element is under the same reply, with a URL.
    reopened = await PostgresDataLayer(
        persistence.pool, storage=storage_for(persistence)
    ).get_thread(thread_id)
    assert reopened is not None
    [shown] = reopened["elements"]
    assert shown["forId"] == reply_id
    assert shown["name"] == "final_report.md"
    assert shown["url"] == f"/elements/{element_key(thread_id, element.id)}"

    answer = await other_worker.get(shown["url"], headers=bearer(alice.identifier))
    assert answer.status_code == 200
    assert answer.content == REPORT
    assert answer.headers["content-type"] == "text/markdown; charset=utf-8"
    assert 'filename="final_report.md"' in answer.headers["content-disposition"]
    assert answer.headers["cache-control"] == "private, no-store"


async def test_a_chart_is_kept_as_its_plotly_json(
    layer: PostgresDataLayer, other_worker: httpx.AsyncClient
) -> None:
    from plotly import graph_objects as go

    alice = await new_user(layer, "alice")
    thread_id, reply_id = await conversation(layer, alice)
    figure = go.Figure(go.Bar(x=["EMEA", "APAC"], y=[3, 5]))
    chart = await attach(layer, reply_id, cl.Plotly(name="churn", figure=figure))

    url = f"/elements/{element_key(thread_id, chart.id)}"
    answer = await other_worker.get(url, headers=bearer(alice.identifier))
    assert answer.status_code == 200
    assert answer.json()["data"][0]["x"] == ["EMEA", "APAC"]


async def test_someone_else_gets_the_answer_of_a_missing_element(
    layer: PostgresDataLayer, other_worker: httpx.AsyncClient
) -> None:
    alice, bob = await new_user(layer, "alice"), await new_user(layer, "bob")
    thread_id, reply_id = await conversation(layer, alice)
    element = await attach(layer, reply_id, report_file())
    url = f"/elements/{element_key(thread_id, element.id)}"
    missing = f"/elements/{element_key(thread_id, str(uuid.uuid4()))}"

    foreign = await other_worker.get(url, headers=bearer(bob.identifier))
    absent = await other_worker.get(missing, headers=bearer(bob.identifier))
    assert foreign.status_code == absent.status_code == 404
    assert foreign.json() == absent.json()
    assert (await other_worker.get(url)).status_code == 401
    assert (
        await other_worker.get("/elements/../etc/passwd", headers=bearer(bob.identifier))
    ).status_code == 404


async def test_bytes_are_not_written_into_someone_elses_conversation(
    persistence: Persistence, layer: PostgresDataLayer
) -> None:
    alice, bob = await new_user(layer, "alice"), await new_user(layer, "bob")
    alices, reply_id = await conversation(layer, alice)
    # Bob's session somehow names alice's conversation: Chainlit's row may be written, the
    # bytes are not (and so nothing can be read back under alice's conversation by bob).
    init_http_context(thread_id=alices, user=User(identifier=bob.identifier))
    await attach(layer, reply_id, report_file())

    assert await stored_files(persistence, alices) == 0


async def test_types_and_sizes_cairn_does_not_produce_are_not_kept(
    persistence: Persistence, layer: PostgresDataLayer
) -> None:
    alice = await new_user(layer, "alice")
    thread_id, reply_id = await conversation(layer, alice)
    layer.storage_client = storage_for(persistence, max_element_bytes=100, max_thread_bytes=150)

    await attach(layer, reply_id, cl.File(name="x.html", content=b"<script>", mime="text/html"))
    await attach(layer, reply_id, cl.File(name="big.md", content=b"#" * 101, mime="text/markdown"))
    await attach(layer, reply_id, cl.File(name="a.txt", content=b"a" * 100, mime="text/plain"))
    await attach(layer, reply_id, cl.File(name="b.txt", content=b"b" * 60, mime="text/plain"))

    # Only the upload of an accepted type within both limits is kept; the others leave no row.
    thread = await layer.get_thread(thread_id)
    assert thread is not None
    assert [e["name"] for e in thread["elements"]] == ["a.txt"]
    assert await stored_files(persistence, thread_id) == 1


async def test_a_deleted_message_takes_its_files(
    persistence: Persistence, layer: PostgresDataLayer, other_worker: httpx.AsyncClient
) -> None:
    alice = await new_user(layer, "alice")
    thread_id, reply_id = await conversation(layer, alice)
    element = await attach(layer, reply_id, report_file())
    kept_id = (await conversation_reply(layer, thread_id)).id
    kept = await attach(layer, kept_id, report_file())

    await layer.delete_step(reply_id)

    assert await stored_files(persistence, thread_id) == 1
    gone = f"/elements/{element_key(thread_id, element.id)}"
    assert (await other_worker.get(gone, headers=bearer(alice.identifier))).status_code == 404
    await kept.remove()
    assert await stored_files(persistence, thread_id) == 0


async def conversation_reply(layer: PostgresDataLayer, thread_id: str) -> Any:
    reply = cl.Message(content="Another reply", author="Research")
    await layer.create_step(reply.to_dict())
    return reply


async def test_sidebar_delete_memory_page_delete_retention_and_wipe_remove_the_bytes(
    persistence: Persistence, layer: PostgresDataLayer
) -> None:
    privacy = Privacy(
        pool=persistence.pool,
        store=persistence.store,
        checkpointer=persistence.checkpointer,
        memory_jobs=None,
        revocations=SessionRevocations(persistence.pool),
        default_retention_days=365,
    )
    alice = await new_user(layer, "alice")
    threads = []
    for _ in range(4):
        thread_id, reply_id = await conversation(layer, alice)
        await attach(layer, reply_id, report_file())
        assert await stored_files(persistence, thread_id) == 1
        threads.append(thread_id)
    by_sidebar, by_page, by_retention, by_wipe = threads

    await layer.delete_thread(by_sidebar)
    await privacy.delete_conversation(user_id=alice.identifier, thread_id=by_page, forget=False)
    async with persistence.pool.connection() as conn:
        await conn.execute(
            "UPDATE cairn_threads SET last_active_at = now() - interval '400 days' "
            "WHERE thread_id = %s",
            (by_retention,),
        )
    await privacy.apply_retention()
    assert [await stored_files(persistence, t) for t in threads] == [0, 0, 0, 1]

    report = await privacy.wipe_account(alice.identifier)
    assert report.verified
    assert report.leftovers["element_files"] == 0
    assert await stored_files(persistence, by_wipe) == 0


async def test_a_wiped_session_stores_no_bytes(
    persistence: Persistence, layer: PostgresDataLayer
) -> None:
    alice = await new_user(layer, "alice")
    thread_id, reply_id = await conversation(layer, alice)
    session = Fence(alice.identifier, since=0.0)
    async with persistence.pool.connection() as conn:
        await conn.execute(
            "INSERT INTO cairn_session_revocations (user_id, revoked_at) VALUES (%s, now())",
            (alice.identifier,),
        )
    with acting_for(session):
        await attach(layer, reply_id, report_file())

    assert await stored_files(persistence, thread_id) == 0
