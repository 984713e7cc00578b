"""The memory & data page in real Chromium: see, edit, delete, confirm, delete a conversation,
and delete everything, each checked in the database as well as on screen."""

from __future__ import annotations

import json
import re

import httpx
import psycopg
import pytest
from playwright.sync_api import expect

from graphs.memory.plans import summary_key
from graphs.memory.research import SOURCES_KEY
from graphs.memory.scoped import user_label
from tests.e2e.conftest import login, wait_until_connected
from tests.e2e.test_memory import THREAD_URL, send, stored_memories, wait_for
from ui.memory_page import CATEGORY_LABELS

pytestmark = pytest.mark.e2e


def rows(database_url: str, sql: str, *args: object) -> list[tuple]:
    with psycopg.connect(database_url, autocommit=True) as conn:
        return conn.execute(sql, args).fetchall()


def open_memory_page(page, server) -> None:
    page.goto(f"{server.url}/memory")
    expect(page.locator("#who")).not_to_be_empty()
    page.locator("#memories").wait_for()


def new_conversation(page, server) -> None:
    page.goto(server.url)
    page.locator("#chat-input").wait_for()
    wait_until_connected(page)


def test_see_edit_and_delete_memories_with_provenance(app_server, browser):
    page = login(browser, app_server, "alice")
    page.on("dialog", lambda dialog: dialog.accept())
    send(page, "By the way, I live in Pune and I'm vegetarian.")
    expect(page.get_by_text("You said: By the way, I live in Pune")).to_be_visible()
    page.wait_for_url(THREAD_URL)
    thread_id = THREAD_URL.match(page.url).group(1)  # type: ignore[union-attr]
    wait_for(lambda: "User is vegetarian" in stored_memories(app_server.database_url))

    # The header link leads to the page; each memory names the conversation it came from.
    page.get_by_role("link", name="Memory & data").click()
    page.wait_for_url(f"{app_server.url}/memory")
    row = page.locator("li.memory", has_text="User is vegetarian")
    expect(row).to_be_visible()
    # The header names the user as they signed in, never by their account id.
    expect(page.locator("#who")).to_have_text("alice")
    # Categories read as words: the group headings, the filter and the opt-in boxes.
    headings = page.locator("#memories h3").all_inner_texts()
    assert headings
    assert set(headings) <= set(CATEGORY_LABELS.values()), headings
    options = page.locator("#category-filter option").all_inner_texts()
    assert options[0] == "All categories"
    assert set(options[1:]) == set(headings), options
    expect(page.locator("#opt-in")).to_contain_text("Finance (sensitive)")
    expect(page.locator("#opt-in")).not_to_contain_text("finance")
    link = row.get_by_role("link")
    expect(link).to_have_attribute("href", f"/thread/{thread_id}")

    # Edit: same key, new text, used by the assistant in a new conversation.
    row = page.locator(f'li.memory[data-key="{row.get_attribute("data-key")}"]')
    row.get_by_role("button", name="Edit").click()
    row.locator("textarea").fill("User is vegan")
    row.get_by_role("button", name="Save").click()
    expect(page.locator("li.memory", has_text="User is vegan")).to_be_visible()
    expect(page.locator("li.memory", has_text="edited by you")).to_be_visible()
    assert "User is vegan" in stored_memories(app_server.database_url)
    assert "User is vegetarian" not in stored_memories(app_server.database_url)

    new_conversation(page, app_server)
    send(page, "What should I cook tonight?")
    reply = page.get_by_text("What I remember about you").last
    expect(reply).to_contain_text("User is vegan")

    # Delete: gone from the store and from the very next turn.
    open_memory_page(page, app_server)
    city = page.locator("li.memory", has=page.locator(".text", has_text="Pune"))
    expect(city).to_be_visible()
    city.get_by_role("button", name="Delete").click()
    expect(city).to_have_count(0)
    assert not any("Pune" in m for m in stored_memories(app_server.database_url))
    new_conversation(page, app_server)
    send(page, "Where should I go out this weekend?")
    reply = page.get_by_text("You said: Where should I go out").last
    expect(reply).to_be_visible()
    expect(reply).not_to_contain_text("Pune")

    # Search by text filters the list; export downloads the same memories as JSON.
    open_memory_page(page, app_server)
    page.locator("#filter").fill("vegan")
    expect(page.locator("li.memory")).to_have_count(1)
    with page.expect_download() as download:
        page.get_by_role("link", name="Export as JSON").click()
    exported = json.loads(open(download.value.path()).read())  # noqa: SIM115
    assert [m["content"] for m in exported["memories"]] == ["User is vegan"]
    page.context.close()


def test_memory_text_is_escaped_on_the_page(app_server, browser):
    page = login(browser, app_server, "alice")
    send(page, "Remember that I like <img src=x onerror=alert(1)> tags")
    expect(page.get_by_text("Saved:").last).to_be_visible()
    open_memory_page(page, app_server)
    fired: list[str] = []
    page.on("dialog", lambda dialog: (fired.append(dialog.message), dialog.dismiss()))
    row = page.locator("li.memory", has_text="<img src=x onerror=alert(1)>")
    expect(row).to_be_visible()
    assert page.locator("li.memory img").count() == 0
    assert fired == []
    page.context.close()


def seed_agent_memories(database_url: str, username: str) -> tuple[str, str]:
    """A source rating and a plan example as Research and the Planner store them; returns
    their store prefixes."""
    [(subject,)] = rows(
        database_url, "SELECT subject FROM local_accounts WHERE username = %s", username
    )
    label = user_label(f"cairn:{subject}")
    evidence = {"stats.example": {"thread-gone": [3, 4, "2026-01-02"]}}
    research = {
        "content": "- stats.example: 3/4 quoted excerpts verified (last 2026-01-02)",
        "encoding": "utf-8",
        "evidence": evidence,
    }
    plan = {
        "goal": "Compare churn by region " + "and by quarter " * 12,
        "steps": ["Count customers per region", "Divide cancellations by customers"],
        "outcome": "answered",
        "quality": "good",
        "thread_id": "thread-gone",
        "at": "2026-01-02T10:00:00+00:00",
    }
    prefixes = (f"{label}.research.memories", f"{label}.plans")
    with psycopg.connect(database_url, autocommit=True) as conn:
        for prefix, key, value in zip(
            prefixes, (SOURCES_KEY, summary_key("thread-gone", plan["goal"])), (research, plan)
        ):
            conn.execute(
                "INSERT INTO store (prefix, key, value) VALUES (%s, %s, %s)",
                (prefix, key, json.dumps(value)),
            )
    return prefixes


def test_research_and_plan_memories_are_shown_and_deleted_on_a_phone(app_server, browser):
    research, plans = seed_agent_memories(app_server.database_url, "bob")
    page = login(browser, app_server, "bob")
    page.set_viewport_size({"width": 390, "height": 844})
    page.on("dialog", lambda dialog: dialog.accept())
    open_memory_page(page, app_server)
    source = page.locator("#sources li.source")
    expect(source).to_contain_text("stats.example")
    expect(source).to_contain_text("3 of 4 quoted excerpts held up")
    expect(source).to_contain_text("earlier or deleted conversations")
    plan = page.locator("#plans li.plan")
    expect(plan).to_contain_text("Compare churn by region")
    expect(plan.locator(".steps li")).to_have_count(2)
    expect(plan).to_contain_text("ended with an answer")
    # Nothing is wider than the phone's screen.
    assert page.evaluate("document.documentElement.scrollWidth") <= 390

    with page.expect_download() as download:
        page.get_by_role("link", name="Export as JSON").click()
    exported = json.loads(open(download.value.path()).read())  # noqa: SIM115
    assert [s["source"] for s in exported["research_sources"]] == ["stats.example"]
    assert len(exported["plan_examples"]) == 1

    source.get_by_role("button", name="Delete").click()
    expect(page.locator("#sources")).to_contain_text("No source ratings yet.")
    plan.get_by_role("button", name="Delete").click()
    expect(page.locator("#plans")).to_contain_text("No plan examples yet.")
    assert (
        rows(
            app_server.database_url,
            "SELECT key FROM store WHERE prefix IN (%s, %s)",
            research,
            plans,
        )
        == []
    )
    page.context.close()


def test_delete_conversation_from_the_conversation_with_also_forget(app_server, browser):
    page = login(browser, app_server, "alice")
    send(page, "I prefer lighthouse tours.")
    expect(page.get_by_text("You said: I prefer lighthouse tours.")).to_be_visible()
    page.wait_for_url(THREAD_URL)
    thread_id = THREAD_URL.match(page.url).group(1)  # type: ignore[union-attr]
    wait_for(lambda: any("lighthouse tours" in m for m in stored_memories(app_server.database_url)))
    db = app_server.database_url
    assert rows(db, "SELECT 1 FROM checkpoints WHERE thread_id = %s", thread_id)

    page.get_by_role("button", name="Delete conversation").click()
    page.locator("#cairn-also-forget").check()
    page.locator("#cairn-delete-dialog").get_by_role("button", name="Delete").click()
    page.wait_for_url(f"{app_server.url}/")

    assert not rows(db, "SELECT 1 FROM checkpoints WHERE thread_id = %s", thread_id)
    assert not rows(db, "SELECT 1 FROM checkpoint_writes WHERE thread_id = %s", thread_id)
    assert not rows(db, 'SELECT 1 FROM "Thread" WHERE id = %s', thread_id)
    assert not rows(db, 'SELECT 1 FROM "Step" WHERE "threadId" = %s', thread_id)
    assert not rows(db, "SELECT 1 FROM cairn_threads WHERE thread_id = %s", thread_id)
    assert not rows(
        db,
        "SELECT 1 FROM procrastinate_jobs WHERE args->>'thread_id' = %s AND status = 'todo'",
        thread_id,
    )
    assert not any("lighthouse" in m for m in stored_memories(db))
    # Its URL is now "not found", like any id that never existed.
    cookies = {c["name"]: c["value"] for c in page.context.cookies()}
    answer = httpx.get(f"{app_server.url}/project/thread/{thread_id}", cookies=cookies)
    assert answer.status_code == 404
    page.context.close()


def test_delete_all_my_data_ends_the_session_and_leaves_nothing(app_server, browser):
    page = login(browser, app_server, "bob")
    send(page, "I'm allergic to peanuts and I live in Lisbon.")
    expect(page.get_by_text("You said: I'm allergic to peanuts")).to_be_visible()
    page.wait_for_url(THREAD_URL)
    # A second message keeps a memory job pending while the wipe runs.
    send(page, "My favourite colour is teal.")
    expect(page.get_by_text("You said: My favourite colour is teal.")).to_be_visible()
    cookies = {c["name"]: c["value"] for c in page.context.cookies()}

    page.goto(f"{app_server.url}/memory")
    expect(page.locator("#who")).to_have_text("bob")
    user = httpx.get(f"{app_server.url}/api/memory", cookies=cookies).json()["user"]
    assert user.startswith("cairn:")
    db = app_server.database_url
    assert rows(db, "SELECT 1 FROM cairn_threads WHERE owner_id = %s", user)
    page.locator("#wipe-confirm").fill("delete my data")
    page.get_by_role("button", name="Delete all my data").click()
    expect(page.get_by_text("All your data was deleted.")).to_be_visible()

    label = user.replace("%", "%25").replace(".", "%2E")

    def nothing_left() -> bool:
        return not (
            rows(db, "SELECT 1 FROM store WHERE prefix LIKE %s", f"memories.{label}%")
            or rows(db, "SELECT 1 FROM cairn_threads WHERE owner_id = %s", user)
            or rows(db, 'SELECT 1 FROM "User" WHERE identifier = %s', user)
            or rows(
                db,
                "SELECT 1 FROM procrastinate_jobs WHERE args->>'user_id' = %s AND status = 'todo'",
                user,
            )
        )

    assert nothing_left()
    # Nothing is written afterwards, even by the job that was pending (idle time is 1 s).
    import time

    time.sleep(3)
    assert nothing_left()
    assert rows(db, "SELECT verified FROM cairn_wipes WHERE user_id = %s", user) == [(True,)]

    # The old session cannot act any more, on any path.
    for path in ("/api/memory", "/project/threads"):
        method = httpx.get if path == "/api/memory" else httpx.post
        kwargs = (
            {} if method is httpx.get else {"json": {"pagination": {"first": 20}, "filter": {}}}
        )
        browser = {"Origin": app_server.url}  # as the page sends it
        refused = method(f"{app_server.url}{path}", cookies=cookies, headers=browser, **kwargs)
        assert refused.status_code == 401, (path, refused.status_code)
    page.context.close()


def test_a_recalled_fact_links_to_its_entry_which_shows_when_it_was_last_used(app_server, browser):
    page = login(browser, app_server, "bob")
    send(page, "By the way, I live in Lisbon and I'm vegetarian.")
    expect(page.get_by_text("You said: By the way, I live in Lisbon")).to_be_visible()
    wait_for(lambda: "User is vegetarian" in stored_memories(app_server.database_url))
    # Bob's diet: the one stored beside his home city (alice lives elsewhere).
    mine = "SELECT prefix FROM store WHERE value->>'content' = 'User lives in Lisbon'"
    [(key,)] = rows(
        app_server.database_url,
        f"SELECT key FROM store WHERE prefix IN ({mine}) AND value->>'content' = %s",
        "User is vegetarian",
    )

    # Before any reply used it, the page says so, and the "never used" filter shows it.
    open_memory_page(page, app_server)
    row = page.locator(f"#memory-{key}")
    expect(row).to_contain_text("not used in a reply yet")

    # A reply that recalls it: its "Memory recall" step links to the entry on the memory page.
    new_conversation(page, app_server)
    send(page, "What should I cook tonight?")
    expect(page.get_by_text("What I remember about you").last).to_contain_text("User is vegetarian")
    page.get_by_text("Used Memory recall").last.click()
    link = page.locator(f'a[href="/memory#memory-{key}"]').last
    expect(link).to_be_visible()
    wait_for(
        lambda: (
            rows(
                app_server.database_url,
                "SELECT value->>'last_recalled_at' FROM store WHERE key = %s AND prefix LIKE %s",
                key,
                "memories.%",
            )[0][0]
            is not None
        )
    )

    # Following the link (Chainlit may open it in a new tab, so it is followed here) lands on
    # that entry, marked, with its last use and its source conversation.
    page.goto(app_server.url + link.get_attribute("href"))
    row = page.locator(f"#memory-{key}")
    expect(row).to_have_class(re.compile(r"\blinked\b"))
    expect(row).to_contain_text("last used")
    expect(row.get_by_role("link")).to_have_attribute("href", re.compile(r"^/thread/"))

    # Sort by last use: the used fact comes first. Filter: "never used" hides it,
    # "used in the last day" shows only used ones.
    page.locator("#sort").select_option("last-used")
    expect(page.locator("li.memory").first).to_have_id(f"memory-{key}")
    page.locator("#used-filter").select_option("never")
    expect(page.locator(f"#memory-{key}")).to_have_count(0)
    page.locator("#used-filter").select_option("1")
    expect(page.locator(f"#memory-{key}")).to_be_visible()
    for text in page.locator("li.memory .used").all_inner_texts():
        assert text.startswith("last used"), text
    page.context.close()
