"""The session cookie is SameSite=Strict, and Secure behind https; other cookies are untouched."""

from __future__ import annotations

import httpx
import pytest
from starlette.types import Receive, Scope, Send

from ui.chainlit.identity import SessionCookieFlags

SET = [
    (b"set-cookie", b"access_token=abc; HttpOnly; Max-Age=900; Path=/; SameSite=lax"),
    (b"set-cookie", b"access_token_0=part; HttpOnly; Path=/; SameSite=lax"),
    (b"set-cookie", b"oauth_state=xyz; HttpOnly; Path=/; SameSite=lax"),
]


async def sets_cookies(scope: Scope, receive: Receive, send: Send) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": SET})
    await send({"type": "http.response.body", "body": b""})


@pytest.mark.parametrize("secure", [False, True])
async def test_the_session_cookie_is_strict_and_secure_when_served_over_https(
    secure: bool,
) -> None:
    transport = httpx.ASGITransport(app=SessionCookieFlags(sets_cookies, secure=secure))
    async with httpx.AsyncClient(transport=transport, base_url="http://cairn") as http:
        answer = await http.get("/auth/oauth/cairn/callback")
    cookies = answer.headers.get_list("set-cookie")
    session = [c for c in cookies if c.startswith("access_token")]
    assert len(session) == 2
    for cookie in session:
        assert "SameSite=strict" in cookie
        assert "SameSite=lax" not in cookie
        assert ("Secure" in cookie) is secure
        assert "HttpOnly" in cookie
    [state] = [c for c in cookies if c.startswith("oauth_state")]
    assert state.endswith("SameSite=lax")  # a real provider's redirect back must carry it
