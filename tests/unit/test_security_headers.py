"""Every response tells the browser to fetch, connect and frame only the app's own origin."""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.responses import HTMLResponse
from fastapi.testclient import TestClient

from ui.security_headers import SecurityHeaders, content_security_policy, script_hashes

URL = "https://cairn.example"


def _directives(policy: str) -> dict[str, list[str]]:
    return {d.split()[0]: d.split()[1:] for d in policy.split("; ")}


def test_policy_allows_only_the_own_origin() -> None:
    policy = _directives(content_security_policy(URL))
    for name in ("img-src", "connect-src", "frame-src", "script-src", "default-src"):
        for source in policy[name]:
            assert source in ("'self'", "data:", "blob:", URL, "wss://cairn.example"), (
                name,
                source,
            )
    assert "data:" not in policy["script-src"]
    assert "'unsafe-inline'" not in policy["script-src"]
    assert policy["object-src"] == ["'none'"]
    assert policy["frame-ancestors"] == ["'none'"]
    assert policy["base-uri"] == ["'self'"]
    assert policy["form-action"] == ["'self'", URL]
    assert policy["connect-src"] == ["'self'", URL, "wss://cairn.example"]


def test_image_origins_and_script_hashes_are_added() -> None:
    hashes = script_hashes(
        "<script>const global = globalThis;</script><script src='/a.js'></script>"
    )
    assert len(hashes) == 1
    assert hashes[0].startswith("'sha256-")
    policy = _directives(
        content_security_policy(URL, image_origins=["https://img.example"], script_sources=hashes)
    )
    assert "https://img.example" in policy["img-src"]
    assert hashes[0] in policy["script-src"]


def _client() -> TestClient:
    app = FastAPI()

    @app.get("/")
    async def index() -> HTMLResponse:
        return HTMLResponse("<p>hi</p>")

    @app.get("/own")
    async def own() -> HTMLResponse:
        return HTMLResponse("<p>hi</p>", headers={"Content-Security-Policy": "default-src 'none'"})

    app.add_middleware(SecurityHeaders, policy=lambda: content_security_policy(URL))
    return TestClient(app)


def test_every_response_carries_the_headers() -> None:
    client = _client()
    for path in ("/", "/missing"):
        response = client.get(path)
        assert response.headers["content-security-policy"] == content_security_policy(URL)
        assert response.headers["x-content-type-options"] == "nosniff"
        assert response.headers["referrer-policy"] == "same-origin"


def test_a_route_with_its_own_policy_keeps_it() -> None:
    response = _client().get("/own")
    assert response.headers.get_list("content-security-policy") == ["default-src 'none'"]
