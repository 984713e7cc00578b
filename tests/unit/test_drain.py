"""A draining worker: not ready at once, and new chat connections refused with a 503 (nginx
passes those to another worker) while everything else is still served."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import httpx
import pytest

from ui.drain import DrainGuard
from ui.health import failing_checks


async def ok_app(scope: Any, receive: Any, send: Any) -> None:
    if scope["type"] == "websocket":
        await send({"type": "websocket.accept"})
        return
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"served"})


def guarded(state: SimpleNamespace) -> DrainGuard:
    return DrainGuard(ok_app, draining=lambda: state.draining)


@pytest.mark.parametrize("draining", [False, True])
async def test_a_socket_io_request_is_refused_only_while_draining(draining):
    state = SimpleNamespace(draining=draining)
    transport = httpx.ASGITransport(app=guarded(state))
    async with httpx.AsyncClient(transport=transport, base_url="http://w") as client:
        polling = await client.get("/ws/socket.io/?EIO=4&transport=polling")
        page = await client.get("/thread/abc")
    assert polling.status_code == (503 if draining else 200)
    if draining:
        assert polling.json() == {"status": "unavailable", "failing": ["draining"]}
    assert page.status_code == 200, "other requests are served until the server closes"


async def test_a_websocket_handshake_while_draining_gets_an_http_503_not_an_accept():
    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    async def receive() -> dict[str, Any]:
        return {"type": "websocket.connect"}

    scope = {"type": "websocket", "path": "/ws/socket.io/", "headers": []}
    await guarded(SimpleNamespace(draining=True))(scope, receive, send)
    assert [m["type"] for m in sent] == [
        "websocket.http.response.start",
        "websocket.http.response.body",
    ]
    assert sent[0]["status"] == 503
    sent.clear()
    await guarded(SimpleNamespace(draining=False))(scope, receive, send)
    assert [m["type"] for m in sent] == ["websocket.accept"]


async def test_a_draining_worker_is_not_ready_before_any_other_check():
    runtime = SimpleNamespace(started=True, draining=True, pool=None, memory_jobs=None)
    assert await failing_checks(runtime) == ["draining"]  # type: ignore[arg-type]
