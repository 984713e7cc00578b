"""Cairn's own sign-in entry at GET /login, in front of Chainlit's generic login page.

Chainlit's UI sends a signed-out user to /login; served here (matched before the mounted
Chainlit), the page says what Cairn is and offers each configured sign-in provider. The UI's
own client-side move to /login is turned into a page load by public/cairn.js.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from chainlit.auth.jwt import decode_jwt
from chainlit.oauth_providers import get_configured_oauth_providers, get_oauth_provider
from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from auth.local_oidc import PAGE_HEADERS, render_entry_page
from ui.chainlit.identity import session_token

if TYPE_CHECKING:
    from collections.abc import Sequence

    from ui.runner import AgentSpec

SIGN_IN_FAILED = "Signing in did not work. Please try again."
"""Whatever Chainlit's `?error=` says (its codes are not for users, and the value is the client's)."""
NAMES = {
    "cairn": "Cairn",
    "github": "GitHub",
    "gitlab": "GitLab",
    "google": "Google",
    "azure-ad": "Microsoft",
    "azure-ad-hybrid": "Microsoft",
    "okta": "Okta",
    "auth0": "Auth0",
    "descope": "Descope",
    "aws-cognito": "AWS Cognito",
}


def provider_names() -> list[tuple[str, str]]:
    """(id, shown name) of each configured sign-in provider, in Chainlit's order."""
    found = []
    for pid in get_configured_oauth_providers():
        if get_oauth_provider(pid) is not None:
            found.append((pid, NAMES.get(pid, pid.replace("-", " ").title())))
    return found


def _signed_in(request: Request) -> bool:
    token = session_token(request.cookies)
    if not token:
        return False
    try:
        decode_jwt(token)
    except Exception:
        return False
    return True


def build_router(agents: Sequence[AgentSpec]) -> APIRouter:
    router = APIRouter()
    listed = [(agent.profile, agent.description) for agent in agents]

    @router.get("/login", include_in_schema=False)
    async def sign_in_entry(request: Request) -> Response:
        if _signed_in(request):
            # Ended sessions are refused by the chat itself, which then comes back here.
            return RedirectResponse("/", status_code=303, headers={"Cache-Control": "no-store"})
        error = SIGN_IN_FAILED if "error" in request.query_params else None
        page = render_entry_page(provider_names(), agents=listed, error=error)
        return HTMLResponse(page, headers=PAGE_HEADERS)

    return router
