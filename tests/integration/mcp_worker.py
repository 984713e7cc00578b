"""A worker process for test_durable_runs: the MCP endpoint (ui/mcp_server.py) on a port, its
Assistant slow, beating its runs and its lease as an app worker does, until the test kills it.

    python -m tests.integration.mcp_worker DATABASE_URL PORT
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
from pathlib import Path

import uvicorn
from fastapi import FastAPI

from auth.tokens import AccessTokens
from graphs.core.runs import heartbeat_forever
from graphs.core.settings import Settings
from tests.integration.test_durable_runs import SLOW_CALL_S, make_runner
from ui.agents import assistant as assistant_agent
from ui.chainlit.adapter import ChainlitChat
from ui.chainlit.agents import discover
from ui.mcp_server import McpEndpoint

BEAT_S = 0.2


async def main(url: str, port: str) -> None:
    runner, close = await make_runner(
        url, worker="doomed-mcp", slow_s=SLOW_CALL_S, agent="assistant"
    )
    assert runner.journal is not None
    pool = runner.threads.pool  # type: ignore[attr-defined]
    tokens = AccessTokens(pool, scopes=(assistant_agent.SPEC.key,))
    chat = ChainlitChat(pool, discover((assistant_agent.SPEC,)))
    endpoint = McpEndpoint(
        settings=Settings(data_dir=Path(tempfile.mkdtemp())),
        public_url=f"http://127.0.0.1:{port}",
        pool=pool,
        agents=[assistant_agent.SPEC],
        runner=lambda: runner,
        tokens=lambda: tokens,
        chat=lambda: chat,
    )
    app = FastAPI()
    app.include_router(endpoint.router())
    beats = asyncio.create_task(heartbeat_forever(runner.journal, every_s=BEAT_S))
    await endpoint.start()
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=int(port), log_level="warning")
    )
    try:
        await server.serve()
    finally:
        beats.cancel()
        await endpoint.stop()
        await close()


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:3]))
