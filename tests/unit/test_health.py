"""/healthz and /readyz: what a load balancer sees, and that they say nothing else."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from ui.health import build_router


class _Cursor:
    pass


@dataclass
class FakePool:
    """Stands in for the pool: answers, or fails the way psycopg's pool does."""

    error: Exception | None = None
    queries: list[str] = field(default_factory=list)

    @asynccontextmanager
    async def connection(self, timeout: float | None = None) -> AsyncIterator[Any]:
        if self.error is not None:
            raise self.error
        yield self

    async def execute(self, query: str) -> _Cursor:
        self.queries.append(query)
        return _Cursor()


@dataclass
class FakeJobs:
    running: bool = True


@dataclass
class FakeRuntime:
    pool: FakePool = field(default_factory=FakePool)
    memory_jobs: FakeJobs | None = field(default_factory=FakeJobs)
    started: bool = True
    draining: bool = False


def client(runtime: FakeRuntime | None) -> TestClient:
    app = FastAPI()
    app.include_router(build_router(lambda: runtime))  # type: ignore[arg-type, return-value]
    return TestClient(app)


def test_healthz_answers_without_touching_the_database() -> None:
    runtime = FakeRuntime(pool=FakePool(error=OSError("down")), started=False)

    response = client(runtime).get("/healthz")

    assert response.status_code == 200
    assert response.json() == {"status": "ok"}
    assert runtime.pool.queries == []


def test_readyz_is_ready_when_started_with_database_and_jobs() -> None:
    runtime = FakeRuntime()

    response = client(runtime).get("/readyz")

    assert response.status_code == 200
    assert response.json() == {"status": "ready"}
    assert runtime.pool.queries == ["SELECT 1"]
    assert response.headers["cache-control"] == "no-store"


@pytest.mark.parametrize(
    ("runtime", "failing"),
    [
        (None, ["starting"]),
        (FakeRuntime(started=False), ["starting"]),
        (
            FakeRuntime(pool=FakePool(error=OSError("password=hunter2 at db.internal"))),
            ["database"],
        ),
        (FakeRuntime(memory_jobs=FakeJobs(running=False)), ["jobs"]),
        (FakeRuntime(memory_jobs=None), ["jobs"]),
        (
            FakeRuntime(pool=FakePool(error=TimeoutError()), memory_jobs=FakeJobs(running=False)),
            ["database", "jobs"],
        ),
    ],
    ids=["no-runtime", "starting", "database", "jobs-stopped", "no-jobs", "both"],
)
def test_readyz_fails_with_the_names_of_the_failing_checks_only(
    runtime: FakeRuntime | None, failing: list[str]
) -> None:
    response = client(runtime).get("/readyz")

    assert response.status_code == 503
    assert response.json() == {"status": "unavailable", "failing": failing}
    assert "hunter2" not in response.text
    assert "db.internal" not in response.text
