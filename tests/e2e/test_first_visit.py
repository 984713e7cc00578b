"""In real Chromium: the first visit (Cairn's sign-in entry, each agent's welcome and starters) and
pages that fit a phone's width and the dark theme (screenshots kept in CAIRN_E2E_ARTIFACTS)."""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path

import psycopg
import pytest
from playwright.sync_api import expect

from tests.e2e.conftest import USERS, wait_until_connected
from tests.e2e.test_chat import send
from tests.e2e.test_time_travel import support_server  # noqa: F401 (the module's server)
from ui.agents import AGENTS

pytestmark = pytest.mark.e2e

ARTIFACTS = Path(os.environ.get("CAIRN_E2E_ARTIFACTS") or tempfile.gettempdir()) / "cairn-e2e"
SIZES = {"phone": (390, 844), "desktop": (1280, 800)}

OUTSIDE_VIEWPORT = """() => {
  const width = window.innerWidth;
  const outside = [];
  for (const el of document.querySelectorAll(arguments[0] || "body *")) {
    const box = el.getBoundingClientRect();
    const style = window.getComputedStyle(el);
    if (box.width === 0 || box.height === 0 || style.visibility === "hidden") continue;
    if (el.closest("[hidden], dialog:not([open])")) continue;
    // Content that scrolls inside its own box (a wide table, a long token) is not overflow.
    let scroller = el.parentElement, clipped = false;
    while (scroller && scroller !== document.body) {
      const overflowX = window.getComputedStyle(scroller).overflowX;
      if (overflowX === "auto" || overflowX === "hidden" || overflowX === "scroll") {
        clipped = true; break;
      }
      scroller = scroller.parentElement;
    }
    if (clipped) continue;
    if (box.left < -1 || box.right > width + 1) {
      outside.push(`${el.tagName.toLowerCase()}#${el.id}.${el.className}: ${Math.round(box.left)}..${Math.round(box.right)}`);
    }
  }
  return {scroll: document.documentElement.scrollWidth, width, outside: outside.slice(0, 10)};
}"""


def fits(page, selector: str = "body *") -> None:
    """Nothing wider than the viewport: no horizontal scroll, no element beyond either edge."""
    found = page.evaluate(OUTSIDE_VIEWPORT.replace("arguments[0]", repr(selector)))
    assert found["scroll"] <= found["width"], found
    assert found["outside"] == [], found


def thread_of(database_url: str, text: str) -> str:
    with psycopg.connect(database_url, autocommit=True) as conn:
        row = conn.execute(
            'SELECT "threadId" FROM "Step" WHERE type = %s AND output = %s',
            ("user_message", text),
        ).fetchone()
    assert row is not None
    return str(row[0])


def background_is_dark(page) -> bool:
    rgb = page.evaluate("getComputedStyle(document.body).backgroundColor")
    red, green, blue = (int(v) for v in re.findall(r"\d+", rgb)[:3])
    return (red + green + blue) / 3 < 100


def shot(page, name: str) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)


def signed_in(browser, server, username: str, *, size: str, scheme: str):
    width, height = SIZES[size]
    context = browser.new_context(viewport={"width": width, "height": height}, color_scheme=scheme)
    page = context.new_page()
    page.set_default_timeout(20_000)
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.goto(server.url)
    page.get_by_role("button", name="Continue with Cairn").click()
    page.get_by_label("Username").fill(username)
    page.get_by_label("Password").fill(USERS[username])
    page.get_by_role("button", name="Sign in").click()
    page.locator("#chat-input").wait_for()
    wait_until_connected(page)
    return page, errors


def test_a_first_visit_lands_on_cairns_own_sign_in_page(support_server, browser):  # noqa: F811
    context = browser.new_context()
    page = context.new_page()
    page.goto(support_server.url)
    page.wait_for_url(f"{support_server.url}/login")
    expect(page.get_by_role("heading", name="Welcome to Cairn")).to_be_visible()
    for agent in AGENTS:
        expect(page.get_by_text(agent.description)).to_be_visible()
    # Not Chainlit's generic page: no "Login to access the app", no Chainlit logo.
    expect(page.get_by_text("Login to access the app")).to_have_count(0)
    expect(page.locator("img")).to_have_count(0)
    # Chainlit's failed-sign-in redirect: a fixed sentence, never the query's own text.
    page.goto(f"{support_server.url}/login?error=%3Cb%3Eoops%3C/b%3E")
    expect(page.get_by_role("alert")).to_have_text("Signing in did not work. Please try again.")
    context.close()


def test_signing_out_comes_back_to_the_sign_in_page(support_server, browser):  # noqa: F811
    page, errors = signed_in(browser, support_server, "alice", size="desktop", scheme="light")
    page.locator("#user-nav-button").click()
    page.get_by_text("Logout").click()
    expect(page.get_by_role("heading", name="Welcome to Cairn")).to_be_visible()
    assert errors == []
    page.context.close()


def test_each_agent_welcomes_with_what_it_does_and_its_starters(support_server, browser):  # noqa: F811
    page, errors = signed_in(browser, support_server, "alice", size="desktop", scheme="light")
    for agent in AGENTS:
        page.locator("#chat-profiles").click()
        page.get_by_role("option", name=agent.profile).click()
        welcome = page.locator("#welcome-screen")
        expect(welcome).to_contain_text(agent.description)
        others = [a.profile for a in AGENTS if a.key != agent.key]
        for name in others:
            expect(welcome).to_contain_text(name)
        assert 2 <= len(agent.starters) <= 3
        for starter in agent.starters:
            expect(page.locator("#starters").get_by_text(starter.label)).to_be_visible()
        wait_until_connected(page)
    # A starter sends its message to the chosen agent (here the last one listed).
    starter = AGENTS[-1].starters[0]
    page.locator("#starters").get_by_text(starter.label).click()
    # In the conversation (the sidebar names the conversation after it too).
    expect(page.get_by_role("main").get_by_text(starter.message, exact=True)).to_be_visible()
    assert errors == []
    page.context.close()


@pytest.mark.parametrize("scheme", ["light", "dark"])
@pytest.mark.parametrize("size", list(SIZES))
def test_the_chat_and_every_page_fit_the_screen_and_the_theme(
    support_server,  # noqa: F811
    browser,
    size: str,
    scheme: str,
):
    page, errors = signed_in(browser, support_server, "bob", size=size, scheme=scheme)
    name = f"{size}-{scheme}"
    fits(page, "#header *")
    shot(page, f"welcome-{name}")
    text = f"Hello from {name}."
    send(page, text)
    expect(page.get_by_text(f"You said: {text}")).to_be_visible()
    # Chainlit moves to the conversation's address from its sidebar, which a phone does not
    # show until it is opened: the conversation is found by its message instead.
    thread_id = thread_of(support_server.database_url, text)
    page.goto(f"{support_server.url}/thread/{thread_id}")
    page.get_by_role("button", name="Delete conversation").wait_for()
    header = page.locator("#header")
    for control in (
        page.get_by_role("button", name="Delete conversation"),
        page.locator("#readme-button"),
        page.locator("#header a[href='/memory']"),
        page.locator("#theme-toggle"),
        page.locator("#user-nav-button"),
    ):
        expect(control).to_be_in_viewport(ratio=1)
        assert header.bounding_box()["height"] <= 64  # type: ignore[index] (one row)
    fits(page, "#header *")
    fits(page)
    shot(page, f"conversation-{name}")

    for path in ("/memory", "/tokens", "/support", f"/support/threads/{thread_id}"):
        page.goto(support_server.url + path)
        page.wait_for_load_state("networkidle")
        fits(page)
        assert background_is_dark(page) is (scheme == "dark"), path
        shot(page, f"{path.strip('/').replace('/', '-')[:40]}-{name}")
    assert errors == []
    page.context.close()


def test_the_tokens_page_shows_a_token_box_only_with_a_token_and_a_copy_button(
    support_server,  # noqa: F811
    browser,
):
    page, _errors = signed_in(browser, support_server, "alice", size="phone", scheme="dark")
    page.context.grant_permissions(["clipboard-read", "clipboard-write"], origin=support_server.url)
    page.goto(f"{support_server.url}/tokens")
    expect(page.get_by_text("Copy this token now")).to_be_hidden()
    page.get_by_label("Name").fill("my editor")
    page.locator("#token-scopes input").first.check()
    page.get_by_role("button", name="Create token").click()
    expect(page.get_by_text("Copy this token now")).to_be_visible()
    token = page.locator("#new-token-value").inner_text()
    assert token
    page.get_by_role("button", name="Copy").click()
    expect(page.get_by_text("Token copied.")).to_be_visible()
    assert page.evaluate("navigator.clipboard.readText()") == token
    fits(page)
    page.context.close()
