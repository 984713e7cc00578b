"""Cross-site requests: a page of another origin (another site, or this host on another port,
which the browser sends the session cookie from) can neither open the chat socket nor change
anything as the signed-in user."""

from __future__ import annotations

import http.server
import json
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import socketio

from tests.e2e.conftest import AppServer, _free_port, login
from tests.e2e.test_hostile_client import ChatSocket, _cookie

pytestmark = pytest.mark.e2e

SIBLING = "http://localhost:{port}"


@pytest.fixture(scope="module")
async def alice(app_server: AppServer) -> str:
    return await _cookie(app_server, "alice")


def _origins(app_server: AppServer) -> dict[str, str | None]:
    return {
        "foreign site": "https://evil.example",
        "sibling port": SIBLING.format(port=app_server.port + 1),
        "subdomain": f"http://evil.localhost:{app_server.port}",
        "null": "null",
        "no origin": None,
    }


async def _socket_opens(app_server: AppServer, cookie: str, origin: str | None) -> bool:
    socket = ChatSocket(app_server, cookie)
    headers = {"Cookie": cookie} | ({"Origin": origin} if origin is not None else {})
    try:
        await socket.client.connect(
            app_server.url,
            socketio_path="/ws/socket.io",
            headers=headers,
            transports=["websocket"],
            auth={
                "clientType": "webapp",
                "sessionId": str(uuid.uuid4()),
                "threadId": "",
                "userEnv": "{}",
                "chatProfile": "",
            },
            wait_timeout=10,
        )
    except socketio.exceptions.ConnectionError:
        return False
    await socket.close()
    return True


@pytest.mark.parametrize("name", ["foreign site", "sibling port", "subdomain", "null", "no origin"])
async def test_the_chat_socket_opens_only_from_the_apps_own_origin(
    app_server: AppServer, alice: str, name: str
) -> None:
    assert not await _socket_opens(app_server, alice, _origins(app_server)[name])


async def test_the_apps_own_origin_opens_the_chat_socket(app_server: AppServer, alice: str):
    """The refusals above are about the origin: the same handshake from the app's page opens."""
    assert await _socket_opens(app_server, alice, app_server.url)


async def test_socket_io_polling_from_another_origin_is_refused(app_server: AppServer, alice):
    """The long-polling transport is refused too (engine.io's own Origin check)."""
    async with httpx.AsyncClient(base_url=app_server.url, timeout=10) as http:
        polled = await http.get(
            "/ws/socket.io/",
            params={"EIO": "4", "transport": "polling"},
            headers={"Cookie": alice, "Origin": "https://evil.example"},
        )
    assert polled.status_code in (400, 403)


STATE_CHANGES: list[tuple[str, str, dict[str, Any]]] = [
    ("PUT", "/project/thread", {"json": {"threadId": "x", "name": "pwned"}}),
    ("DELETE", "/project/thread", {"json": {"threadId": "x"}}),
    ("PUT", "/api/memory/settings", {"json": {"enabled": False}}),
    ("POST", "/api/account/wipe", {"json": {"confirm": "delete my data"}}),
    ("POST", "/api/tokens", {"json": {"name": "t", "scopes": ["assistant"]}}),
    ("POST", "/logout", {}),
]


@pytest.mark.parametrize("name", ["foreign site", "sibling port", "subdomain", "null"])
@pytest.mark.parametrize(("method", "path", "body"), STATE_CHANGES)
async def test_a_state_change_from_another_origin_is_refused(
    app_server: AppServer, alice: str, name: str, method: str, path: str, body: dict[str, Any]
) -> None:
    origin = _origins(app_server)[name]
    headers = {"Cookie": alice, "Origin": str(origin), "X-Cairn-Request": "1"}
    async with httpx.AsyncClient(base_url=app_server.url, timeout=10) as http:
        answer = await http.request(method, path, headers=headers, **body)
    assert answer.status_code == 403
    assert answer.json() == {
        "detail": "This request did not come from Cairn's own pages and was refused."
    }


async def test_a_cookie_carrying_state_change_with_no_origin_needs_the_apps_referer(
    app_server: AppServer, alice: str
) -> None:
    async with httpx.AsyncClient(base_url=app_server.url, timeout=10) as http:
        bare = await http.put(
            "/api/memory/settings", json={"enabled": True}, headers={"Cookie": alice}
        )
        referred = await http.put(
            "/api/memory/settings",
            json={"enabled": True},
            headers={
                "Cookie": alice,
                "Referer": f"{app_server.url}/memory",
                "X-Cairn-Request": "1",
            },
        )
    assert bare.status_code == 403
    assert referred.status_code == 200
    # Still signed in: nothing above ended the session.
    assert await _socket_opens(app_server, alice, app_server.url)


class _AttackPage(http.server.BaseHTTPRequestHandler):
    """A page on another port of the same host: it tries the chat socket and a rename."""

    target = ""

    def do_GET(self) -> None:
        page = f"""<!doctype html><html><body><script>
        const out = {{socket: "pending", rename: "pending"}};
        window.result = out;
        const ws = new WebSocket("{self.target.replace("http", "ws")}/ws/socket.io/?EIO=4&transport=websocket");
        ws.onmessage = () => {{ out.socket = "open"; }};
        ws.onclose = () => {{ if (out.socket === "pending") out.socket = "closed"; }};
        ws.onerror = () => {{ if (out.socket === "pending") out.socket = "closed"; }};
        fetch("{self.target}/project/thread", {{method: "PUT", credentials: "include",
               headers: {{"Content-Type": "text/plain"}}, body: JSON.stringify({{threadId: "x", name: "pwned"}})}})
          .then(r => {{ out.rename = r.status; }}).catch(() => {{ out.rename = "blocked"; }});
        </script></body></html>"""
        body = page.encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        return None


@pytest.fixture(scope="module")
def attack_page(app_server: AppServer) -> Iterator[str]:
    handler = type("Attack", (_AttackPage,), {"target": app_server.url})
    port = _free_port()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield SIBLING.format(port=port)
    server.shutdown()


def test_a_real_page_on_a_sibling_port_cannot_act_as_the_signed_in_user(
    browser, app_server: AppServer, attack_page: str
) -> None:
    page = login(browser, app_server, "bob")
    page.goto(attack_page)
    page.wait_for_function(
        "window.result && window.result.socket !== 'pending' && window.result.rename !== 'pending'",
        timeout=15_000,
    )
    result = json.loads(page.evaluate("JSON.stringify(window.result)"))
    # The browser sent bob's cookie (same host, another port) and the app refused both.
    assert result["socket"] == "closed"
    assert result["rename"] in (403, "blocked")
    page.goto(app_server.url)
    page.locator("#chat-input").wait_for()  # bob's own tab still works
    page.context.close()
