"""Round trips of the MCP endpoint (/mcp) against the full app with the offline model.

`.venv/bin/python -m bench.mcp` from the project root. Signs in, makes an access token on the
settings route, then times with the official client in one session: `tools/list` (the token
check and the MCP layer), `ask_assistant` turns in one thread (the whole turn through the
runner, Postgres checkpointer included), and a refused (401) request.
"""

from __future__ import annotations

import asyncio
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import httpx
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

from bench.login import sign_in
from bench.servers import free_port, running, stop_embedded_postgres

WARM_UP = 5
ROUNDS = 50
RESULTS_DIR = Path(__file__).resolve().parent / "results"


def summary(name: str, samples: list[float]) -> str:
    p50 = statistics.median(samples)
    p95 = statistics.quantiles(samples, n=20)[18]
    return f"{name:<28} p50 {p50:7.1f} ms   p95 {p95:7.1f} ms   (n={len(samples)})"


async def timed(work: object, rounds: int) -> list[float]:
    samples = []
    for i in range(WARM_UP + rounds):
        started = time.perf_counter()
        await work()  # type: ignore[operator]
        if i >= WARM_UP:
            samples.append((time.perf_counter() - started) * 1000)
    return samples


async def measure(url: str) -> None:
    cookie = await sign_in(url, "bench", "bench-password-1")
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        made = await http.post(
            "/api/tokens",
            json={"name": "bench", "scopes": ["assistant"]},
            headers={"Cookie": cookie, "X-Cairn-Request": "1"},
        )
        made.raise_for_status()
        token = made.json()["token"]

        async def refused() -> None:
            answer = await http.post(
                "/mcp",
                json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
                headers={"Authorization": "Bearer cairn_pat_wrong"},
            )
            assert answer.status_code == 401

        results = {"401 (bad token)": await timed(refused, ROUNDS)}

    headers = {"Authorization": f"Bearer {token}"}
    async with (
        httpx.AsyncClient(headers=headers, timeout=60) as http,
        streamable_http_client(f"{url}/mcp", http_client=http) as (read, write, _),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        first = await session.call_tool("ask_assistant", {"message": "hello"})
        thread = (first.structuredContent or {})["thread_id"]

        async def listing() -> None:
            await session.list_tools()

        async def turn() -> None:
            result = await session.call_tool(
                "ask_assistant", {"message": "how are you?", "thread_id": thread}
            )
            assert not result.isError

        results["tools/list"] = await timed(listing, ROUNDS)
        results["ask_assistant (one thread)"] = await timed(turn, ROUNDS)
    for name, samples in results.items():
        print(summary(name, samples))


def main() -> None:
    log_dir = RESULTS_DIR / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    data_dir = Path(tempfile.mkdtemp(prefix="cairn-bench-mcp-"))
    data_dir.chmod(0o755)
    port = free_port()
    env = {
        "CAIRN_DATA_DIR": str(data_dir),
        "CAIRN_LOCAL_USERS": "bench:bench-password-1",
        "CAIRN_PUBLIC_URL": f"http://localhost:{port}",
        "CAIRN_MCP_MAX_RUNS_PER_HOUR": "1000",
    }
    try:
        with running(
            "app-mcp",
            "app.py",
            log_dir=log_dir,
            env=env,
            port=port,
            settle_s=2.0,
            postgres_dir=data_dir / "postgres",
        ) as server:
            asyncio.run(measure(server.url))
    finally:
        stop_embedded_postgres(data_dir)
        shutil.rmtree(data_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
