"""`create_app()` is the whole app: served by a plain ASGI test client, no `chainlit run`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]

# In a process of its own: Chainlit keeps its hooks and config in module globals, which other
# tests of this session set their own way.
_SERVE = """
import json, sys
from fastapi.testclient import TestClient
from app import create_app
from graphs.core.settings import Settings

settings = Settings(data_dir=sys.argv[2], database_url=sys.argv[1], port=8765)
seen = {}
with TestClient(create_app(settings), base_url="http://localhost:8765") as client:
    seen["healthz"] = client.get("/healthz").status_code
    seen["readyz"] = client.get("/readyz").json()
    seen["memory_api"] = [client.get("/api/memory").status_code, client.get("/api/memory").json()]
    page = client.get("/memory")
    seen["memory_page"] = [page.status_code, "<html" in page.text.lower()]
    ui = client.get("/")
    seen["chat_ui"] = [ui.status_code, ui.headers["content-type"], "og:root_path" in ui.text]
    seen["csp"] = "script-src" in ui.headers.get("content-security-policy", "")
    seen["auth_config"] = client.get("/auth/config").json()["oauthProviders"]
    seen["foreign_post"] = client.post(
        "/api/memory/settings", headers={"Origin": "http://evil.test", "Cookie": "access_token=x"}
    ).status_code
    seen["thread_unknown"] = client.get("/project/thread/00000000-0000-0000-0000-000000000000").status_code
print("SEEN " + json.dumps(seen))
import chainlit.cli  # noqa: F401  (imported only now, to show nothing before needed it)
"""


def test_create_app_serves_health_the_memory_page_and_the_chat_ui(
    database_url: str, tmp_path: Path
) -> None:
    env = {**os.environ, "CI": "true"}
    env.pop("OPENAI_API_KEY", None)
    out = subprocess.run(
        [sys.executable, "-c", _SERVE, database_url, str(tmp_path)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=300,
        check=False,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    seen = json.loads(out.stdout.split("SEEN ", 1)[1].splitlines()[0])
    assert seen["healthz"] == 200
    assert seen["readyz"] == {"status": "ready"}
    assert seen["memory_api"] == [401, {"detail": "Not signed in"}]
    assert seen["memory_page"] == [200, True]
    assert seen["chat_ui"][0] == 200
    assert seen["chat_ui"][1].startswith("text/html")
    assert seen["chat_ui"][2]  # Chainlit's page, served from the mount
    assert seen["csp"]
    assert seen["auth_config"] == ["cairn"]  # the bundled sign-in, registered by create_app
    assert seen["foreign_post"] == 403  # another origin's state-changing request
    assert seen["thread_unknown"] in (401, 404)
