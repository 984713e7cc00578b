"""Chainlit lives in one package: the rest of the app imports, builds and runs without it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

_IMPORT = """
import json, sys
import ui.runner, ui.agents, ui.mcp_server, ui.recovery, ui.runtime
import ui.memory_page, ui.support_page, ui.tokens_page, ui.workspace_page, ui.health, ui.metrics
import ui.surface, ui.port, ui.origin_guard
import auth.identity, auth.oauth, auth.sessions, auth.local_oidc, auth.tokens
import graphs.assistant.graph, graphs.research.graph, graphs.planner.graph
print("SEEN " + json.dumps(sorted(m for m in sys.modules if m == "chainlit" or m.startswith("chainlit."))))
"""


def test_runner_agents_mcp_pages_and_auth_import_no_chainlit() -> None:
    out = subprocess.run(
        [sys.executable, "-c", _IMPORT],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
        check=True,
    ).stdout
    assert json.loads(out.split("SEEN ", 1)[1]) == []


def test_the_adapter_does_import_chainlit() -> None:
    """The check above can fail: importing the adapter brings Chainlit in."""
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            _IMPORT.replace("import ui.surface,", "import ui.chainlit.chat, ui.surface,"),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
        check=True,
    ).stdout
    assert "chainlit" in json.loads(out.split("SEEN ", 1)[1])
