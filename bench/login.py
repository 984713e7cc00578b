"""Sign in to Cairn the way a browser does: the OAuth code flow through its bundled login page."""

from __future__ import annotations

import html
import re
from urllib.parse import urljoin

import httpx

PROVIDER = "cairn"
_HIDDEN_INPUT = re.compile(r'<input type="hidden" name="(\w+)" value="([^"]*)">')


class LoginFailed(RuntimeError):
    """A step of the sign-in flow did not answer as a browser would expect."""


async def sign_in(base_url: str, username: str, password: str) -> str:
    """Returns the Cookie header carrying Chainlit's session (`access_token`, maybe chunked)."""
    async with httpx.AsyncClient(base_url=base_url, timeout=30) as http:
        login_page_url = _redirect_target(await http.get(f"/auth/oauth/{PROVIDER}"), 307)
        page = await http.get(login_page_url)
        if page.status_code != 200:
            msg = f"login page answered {page.status_code}: {page.text[:300]}"
            raise LoginFailed(msg)
        form = _hidden_fields(page.text) | {
            "username": username,
            "password": password,
            "mode": "signin",
        }
        form_action = urljoin(str(page.url), "authorize")
        callback = _redirect_target(await http.post(form_action, data=form), 302)
        _redirect_target(await http.get(callback), 302)
        return _session_cookie_header(http.cookies)


def _redirect_target(response: httpx.Response, status: int) -> str:
    if response.status_code != status:
        msg = (
            f"{response.request.method} {response.request.url.path} answered "
            f"{response.status_code} (expected {status}): {response.text[:300]}"
        )
        raise LoginFailed(msg)
    return urljoin(str(response.request.url), response.headers["location"])


def _hidden_fields(page: str) -> dict[str, str]:
    fields = {name: html.unescape(value) for name, value in _HIDDEN_INPUT.findall(page)}
    if "csrf_token" not in fields:
        msg = "the login page has no csrf_token field"
        raise LoginFailed(msg)
    return fields


def _session_cookie_header(cookies: httpx.Cookies) -> str:
    session = {name: value for name, value in cookies.items() if name.startswith("access_token")}
    if not session:
        msg = f"no access_token cookie after the callback (cookies: {sorted(cookies.keys())})"
        raise LoginFailed(msg)
    return "; ".join(f"{name}={value}" for name, value in session.items())
