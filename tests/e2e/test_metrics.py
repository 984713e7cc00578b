"""The running app serves /metrics to a scraper with the token, before Chainlit's catch-all, and a
real chat turn in Chromium moves the turn, duration and time-to-first-token series."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import expect
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import create_database
from tests.e2e.conftest import AppServer, login

pytestmark = pytest.mark.e2e

TOKEN = "e2e-scrape-token-0123456789abcdef"


@pytest.fixture(scope="module")
def metered_server(pg_server_url: str) -> Iterator[AppServer]:
    with tempfile.TemporaryDirectory(prefix="cairn-e2e-metrics-") as folder:
        server = AppServer(
            database_url=create_database(pg_server_url),
            data_dir=Path(folder),
            extra_env={"CAIRN_METRICS_TOKEN": TOKEN},
        )
        server.start()
        try:
            yield server
        finally:
            server.stop()


def scrape(server: AppServer) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    response = httpx.get(
        f"{server.url}/metrics", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=10
    )
    assert response.status_code == 200, response.text[:300]
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(response.text)
        for s in family.samples
    }


def test_metrics_refuse_without_the_token_and_count_a_real_turn(metered_server, browser):
    url = f"{metered_server.url}/metrics"
    assert httpx.get(url, timeout=10).status_code == 401
    assert httpx.get(url, headers={"Authorization": "Bearer nope"}, timeout=10).status_code == 401
    done = ("cairn_turns_total", (("agent", "assistant"), ("outcome", "done")))
    first_token = ("cairn_time_to_first_token_seconds_count", (("agent", "assistant"),))
    before = scrape(metered_server)

    page = login(browser, metered_server, "alice")
    page.locator("#chat-input").fill("Metrics check: hello")
    page.keyboard.press("Enter")
    expect(page.get_by_text("You said: Metrics check: hello")).to_be_visible()
    page.context.close()

    after = scrape(metered_server)
    assert after[done] == before.get(done, 0) + 1
    assert after[first_token] == before.get(first_token, 0) + 1
    assert after[("cairn_db_pool", (("stat", "pool_size"),))] >= 1
    assert ("cairn_memory_jobs", (("status", "todo"),)) in after


def test_without_a_token_configured_there_is_no_metrics_endpoint(app_server):
    response = httpx.get(
        f"{app_server.url}/metrics", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=10
    )
    assert response.status_code == 404
