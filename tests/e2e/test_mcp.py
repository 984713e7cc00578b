"""The agents over MCP: the official `mcp` client against the running app, with personal access
tokens made through the settings page's HTTP routes by signed-in users."""

from __future__ import annotations

import json
import uuid
from typing import Any

import httpx
import psycopg
import pytest
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

from bench.login import sign_in
from tests.e2e.conftest import USERS, AppServer

pytestmark = pytest.mark.e2e

GOAL = "Which region had the highest churn last quarter?"
QUESTION = "When did the seed vault open and how do honeybees share the location of food?"
TOPICS = ["When did the Svalbard seed vault open", "How do honeybees share the location of food"]
NOT_FOUND = "Conversation not found"
PAGE = {"X-Cairn-Request": "1"}


class McpError(AssertionError):
    """A tool answered with an error result."""


@pytest.fixture(scope="module")
async def cookies(app_server: AppServer) -> dict[str, str]:
    return {user: await sign_in(app_server.url, user, USERS[user]) for user in USERS}


async def make_token(server: AppServer, cookie: str, **body: Any) -> dict[str, Any]:
    """A token made on the settings page, as its script does (the page header, same origin)."""
    body = {"name": "test", "scopes": ["assistant", "research", "planner"], **body}
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
        response = await http.post(
            "/api/tokens", json=body, headers={"Cookie": cookie, **PAGE, "Origin": server.url}
        )
    assert response.status_code == 200, response.text
    made = response.json()
    assert made["token"].startswith("cairn_pat_")
    return dict(made)


async def call(server: AppServer, token: str, tool: str, **arguments: Any) -> dict[str, Any]:
    """One tool call in a fresh MCP client session; the tool's structured result."""
    headers = {"Authorization": f"Bearer {token}"}
    async with (
        httpx.AsyncClient(headers=headers, timeout=httpx.Timeout(180)) as http,
        streamable_http_client(f"{server.url}/mcp", http_client=http) as (read, write, _),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        result = await session.call_tool(tool, arguments)
    text = "".join(getattr(c, "text", "") for c in result.content)
    if result.isError:
        raise McpError(text)
    assert result.structuredContent == json.loads(text)  # structured, and the same as text
    return dict(result.structuredContent)


async def refused(server: AppServer, token: str, tool: str, **arguments: Any) -> str:
    with pytest.raises(McpError) as caught:
        await call(server, token, tool, **arguments)
    return str(caught.value)


async def tool_names(server: AppServer, token: str) -> set[str]:
    headers = {"Authorization": f"Bearer {token}"}
    async with (
        httpx.AsyncClient(headers=headers, timeout=30) as http,
        streamable_http_client(f"{server.url}/mcp", http_client=http) as (read, write, _),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        return {t.name for t in (await session.list_tools()).tools}


async def client_status(server: AppServer, token: str) -> int:
    """The HTTP status the official client stopped at (it raises inside its task group)."""
    with pytest.raises(ExceptionGroup) as caught:
        await tool_names(server, token)
    [error] = caught.value.exceptions
    assert isinstance(error, httpx.HTTPStatusError)
    return error.response.status_code


async def test_no_or_a_bad_token_gets_a_bearer_challenge(app_server: AppServer) -> None:
    initialize = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {}}
    accept = {"Accept": "application/json, text/event-stream"}
    async with httpx.AsyncClient(base_url=app_server.url, timeout=30) as http:
        bare = await http.post("/mcp", json=initialize, headers=accept)
        bad = await http.post(
            "/mcp", json=initialize, headers={**accept, "Authorization": "Bearer cairn_pat_nope"}
        )
        garbage = await http.post(
            "/mcp", json=initialize, headers={**accept, "Authorization": "Basic YTpi"}
        )
    assert bare.status_code == 401
    assert bare.headers["www-authenticate"].startswith("Bearer ")
    assert bad.status_code == 401
    assert 'error="invalid_token"' in bad.headers["www-authenticate"]
    assert garbage.status_code == 401
    # The official client gets the 401 too and nothing runs.
    assert await client_status(app_server, "cairn_pat_nope") == 401


async def test_every_tool_and_a_plan_paused_in_one_call_resumed_in_another(
    app_server: AppServer, cookies: dict[str, str]
) -> None:
    token = (await make_token(app_server, cookies["alice"]))["token"]
    assert await tool_names(app_server, token) == {
        "ask_assistant",
        "research",
        "run_planner",
        "answer_approval",
    }

    first = await call(app_server, token, "ask_assistant", message="hello over MCP")
    assert first["status"] == "done"
    assert "You said: hello over MCP" in first["reply"]
    again = await call(
        app_server, token, "ask_assistant", message="and again", thread_id=first["thread_id"]
    )
    assert again["thread_id"] == first["thread_id"]
    assert "You said: and again" in again["reply"]
    # The conversation is in Alice's chat sidebar too, opening in the Assistant's profile.
    with psycopg.connect(app_server.database_url, autocommit=True) as conn:
        thread = conn.execute(
            'SELECT t.name, t.metadata, u.identifier FROM "Thread" t '
            'JOIN "User" u ON u.id = t."userId" WHERE t.id = %s',
            (first["thread_id"],),
        ).fetchone()
        steps = conn.execute(
            'SELECT type, output FROM "Step" WHERE "threadId" = %s ORDER BY "createdAt"',
            (first["thread_id"],),
        ).fetchall()
    assert thread is not None
    assert thread[0] == "hello over MCP"
    assert thread[1] == {"chat_profile": "Assistant"}
    assert thread[2].startswith("cairn:")
    assert [t for t, _ in steps] == ["user_message", "assistant_message"] * 2
    assert [o for t, o in steps if t == "user_message"] == ["hello over MCP", "and again"]

    paused = await call(app_server, token, "run_planner", goal=GOAL)
    assert paused["status"] == "paused"
    [pending] = paused["approval"]
    assert pending["kind"] == "planner_review"
    assert pending["plan"]
    assert set(pending["decisions"]) == {"approve", "edit", "reject"}
    # An edit's steps become the plan word for word, and come back for review.
    steps = [
        "List the tables available in the analytics database",
        "Count churned customers by region for the latest quarter in churn_events",
    ]
    edited = await call(
        app_server,
        token,
        "answer_approval",
        thread_id=paused["thread_id"],
        decision="edit",
        edit="\n".join(steps),
    )
    assert edited["status"] == "paused"
    assert edited["approval"][0]["plan"] == steps
    done = await call(
        app_server, token, "answer_approval", thread_id=paused["thread_id"], decision="approve"
    )
    assert done["status"] == "done"
    assert done["thread_id"] == paused["thread_id"]
    assert done["reply"]
    # Answered once: a second answer finds nothing waiting.
    assert "waiting" in await refused(
        app_server, token, "answer_approval", thread_id=paused["thread_id"], decision="approve"
    )


async def test_research_edit_delivers_the_report_with_its_citations_and_not_verified_list(
    app_server: AppServer, cookies: dict[str, str]
) -> None:
    token = (await make_token(app_server, cookies["alice"], scopes=["research"]))["token"]
    paused = await call(app_server, token, "research", question=QUESTION)
    assert paused["status"] == "paused"
    assert paused["approval"][0]["topics"]
    # An edit without the topics is refused and the plan keeps waiting.
    assert "topics" in (
        await refused(
            app_server, token, "answer_approval", thread_id=paused["thread_id"], decision="edit"
        )
    )
    done = await call(
        app_server,
        token,
        "answer_approval",
        thread_id=paused["thread_id"],
        decision="edit",
        edit="\n".join(TOPICS),
    )
    assert done["status"] == "done"
    assert "26 February 2008" in done["report"]
    assert len(done["citations"]) >= 2
    for citation in done["citations"]:
        assert citation["url"].startswith(f"{app_server.url}/research/corpus/")
        assert f"]({citation['url']})" in done["report"]
    assert isinstance(done["not_verified"], list)


async def test_another_users_thread_is_refused_like_a_missing_one(
    app_server: AppServer, cookies: dict[str, str]
) -> None:
    alice = (await make_token(app_server, cookies["alice"]))["token"]
    bob = (await make_token(app_server, cookies["bob"]))["token"]
    paused = await call(app_server, alice, "run_planner", goal=GOAL)
    thread = paused["thread_id"]
    missing = str(uuid.uuid4())
    answers, runs = [], []
    for target in (thread, missing):
        answers.append(
            await refused(app_server, bob, "answer_approval", thread_id=target, decision="approve")
        )
        runs.append(await refused(app_server, bob, "run_planner", goal="mine", thread_id=target))
    # The same refusal for a foreign thread as for one that does not exist.
    assert answers[0] == answers[1]
    assert answers[0].endswith(NOT_FOUND)
    assert runs[0] == runs[1]
    assert runs[0].endswith(NOT_FOUND)
    # Alice's plan is still waiting for her, untouched.
    assert (await call(app_server, alice, "answer_approval", thread_id=thread, decision="reject"))[
        "status"
    ] == "done"


async def test_scopes_and_pre_approval_are_the_token_owners_choice(
    app_server: AppServer, cookies: dict[str, str]
) -> None:
    limited = await make_token(app_server, cookies["alice"], scopes=["assistant"])
    assistant_only = limited["token"]
    assert "may not use the planner agent" in await refused(
        app_server, assistant_only, "run_planner", goal=GOAL
    )
    plain = (await make_token(app_server, cookies["alice"]))["token"]
    # Nor may it answer a plan of the same user's (made with another token).
    paused = await call(app_server, plain, "run_planner", goal=GOAL)
    assert "may not use the planner agent" in await refused(
        app_server,
        assistant_only,
        "answer_approval",
        thread_id=paused["thread_id"],
        decision="approve",
    )
    async with httpx.AsyncClient(base_url=app_server.url, timeout=30) as http:
        logged = await http.get(
            f"/api/tokens/{limited['id']}/calls", headers={"Cookie": cookies["alice"]}
        )
    assert [(c["tool"], c["status"]) for c in logged.json()["calls"]] == [
        ("answer_approval", "refused"),
        ("run_planner", "refused"),
    ]
    assert "does not allow pre-approval" in await refused(
        app_server, plain, "run_planner", goal=GOAL, pre_approve=True
    )
    trusted = (await make_token(app_server, cookies["alice"], pre_approve=True))["token"]
    done = await call(app_server, trusted, "run_planner", goal=GOAL, pre_approve=True)
    assert done["status"] == "done"
    assert done["pre_approval"] == "applied"
    assert done["reply"]


async def test_limits_give_clear_errors_and_every_call_is_logged(
    app_server: AppServer, cookies: dict[str, str]
) -> None:
    hourly = await make_token(app_server, cookies["alice"], max_runs_per_hour=1)
    await call(app_server, hourly["token"], "ask_assistant", message="one")
    assert "limit is 1 per hour" in await refused(
        app_server, hourly["token"], "ask_assistant", message="two"
    )
    budget = await make_token(app_server, cookies["alice"], max_model_calls=1)
    # Drawing the plan is one model call; running it needs more than the budget allows.
    paused = await call(app_server, budget["token"], "run_planner", goal=GOAL)
    assert paused["model_calls"] == 1
    assert "budget of 1 model calls" in await refused(
        app_server,
        budget["token"],
        "answer_approval",
        thread_id=paused["thread_id"],
        decision="approve",
    )
    async with httpx.AsyncClient(
        base_url=app_server.url, headers={"Cookie": cookies["alice"]}, timeout=30
    ) as http:
        logged = (await http.get(f"/api/tokens/{hourly['id']}/calls")).json()["calls"]
        foreign = await http.get(f"/api/tokens/{hourly['id']}/calls", headers={"Cookie": ""})
    assert [c["status"] for c in logged] == ["refused", "done"]
    assert "per hour" in logged[0]["detail"]
    assert foreign.status_code == 401
    assert app_server.log_path is not None
    server_log = app_server.log_path.read_text()
    assert f"mcp call token={budget['id']}" in server_log
    assert "status=over_budget" in server_log


async def test_the_assistant_over_mcp_uses_the_callers_own_memories(
    app_server: AppServer, cookies: dict[str, str]
) -> None:
    alice = (await make_token(app_server, cookies["alice"], scopes=["assistant"]))["token"]
    bob = (await make_token(app_server, cookies["bob"], scopes=["assistant"]))["token"]
    saved = await call(app_server, alice, "ask_assistant", message="remember that I like jazz")
    assert saved["status"] == "done"
    # A new conversation recalls what the earlier one saved, for Alice only.
    hers = await call(app_server, alice, "ask_assistant", message="What music should I play?")
    assert hers["thread_id"] != saved["thread_id"]
    assert "jazz" in hers["reply"]
    his = await call(app_server, bob, "ask_assistant", message="What music should I play?")
    assert "jazz" not in his["reply"]


# Last: it wipes Bob's account (his session cookie ends with it).
async def test_a_revoked_token_and_a_wiped_account_get_401(
    app_server: AppServer, cookies: dict[str, str]
) -> None:
    made = await make_token(app_server, cookies["alice"])
    other = await make_token(app_server, cookies["bob"])
    await call(app_server, made["token"], "ask_assistant", message="before")
    browser = {"Origin": app_server.url}  # every request below comes from the app's own page
    async with httpx.AsyncClient(base_url=app_server.url, timeout=30, headers=browser) as http:
        # Bob cannot revoke Alice's token: the same 404 as a made-up id.
        foreign = await http.post(
            f"/api/tokens/{made['id']}/revoke", headers={"Cookie": cookies["bob"], **PAGE}
        )
        # Without the page's header (a cross-site form) nothing is revoked.
        forged = await http.post(
            f"/api/tokens/{made['id']}/revoke", headers={"Cookie": cookies["alice"]}
        )
        assert (foreign.status_code, forged.status_code) == (404, 403)
        await call(app_server, made["token"], "ask_assistant", message="still works")
        revoked = await http.post(
            f"/api/tokens/{made['id']}/revoke", headers={"Cookie": cookies["alice"], **PAGE}
        )
        assert revoked.status_code == 200
        listed = (await http.get("/api/tokens", headers={"Cookie": cookies["alice"]})).json()
        assert all("token" not in t for t in listed["tokens"])  # never shown again
        assert next(t for t in listed["tokens"] if t["id"] == made["id"])["revoked"]
        after = await http.post(
            "/mcp",
            json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
            headers={"Authorization": f"Bearer {made['token']}"},
        )
        assert after.status_code == 401
        assert after.headers["www-authenticate"].startswith("Bearer ")

        await call(app_server, other["token"], "ask_assistant", message="bob before the wipe")
        wiped = await http.post(
            "/api/account/wipe",
            json={"confirm": "delete my data"},
            headers={"Cookie": cookies["bob"], **PAGE},
        )
        assert wiped.status_code == 200, wiped.text
        assert wiped.json()["leftovers"]["tokens"] == 0
    assert await client_status(app_server, other["token"]) == 401
