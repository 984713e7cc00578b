"""In real Chromium: a research question, edited topics, the live task list, a downloadable checked report."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect

from graphs.research.citations import CITATION, normalise_text
from tests.e2e.conftest import login, wait_until_connected

pytestmark = pytest.mark.e2e

QUESTION = "When did the seed vault open and how do honeybees share the location of food?"
TOPICS = ["When did the Svalbard seed vault open", "How do honeybees share the location of food"]


def send(page, text: str) -> None:
    page.locator("#chat-input").fill(text)
    page.keyboard.press("Enter")


def research_page(browser, app_server, user: str):
    page = login(browser, app_server, user)
    # Switching profile restarts the session: wait for the old greeting to go, then the new one.
    old_greeting = page.get_by_text("offline stand-in model").last.element_handle()
    page.locator("#chat-profiles").click()
    page.locator('[data-test="select-item:Research"]').click()
    old_greeting.wait_for_element_state("hidden")
    expect(page.locator("#chat-profiles")).to_contain_text("Research")
    wait_until_connected(page)
    return page


def test_research_with_edited_topics_delivers_a_report_whose_citations_open(
    app_server, browser, tmp_path
):
    page = research_page(browser, app_server, "alice")

    send(page, QUESTION)
    expect(page.get_by_text("I plan to research these topics")).to_be_visible()
    page.get_by_role("button", name="Edit topics").click()
    expect(page.get_by_text("Send the topics to research, one per line.")).to_be_visible()
    send(page, "\n".join(TOPICS))

    # The live task list shows the approved topics; each subagent gets its own step.
    expect(page.get_by_text(TOPICS[0]).first).to_be_visible(timeout=60_000)
    expect(
        page.get_by_text("Researching: When did the Svalbard seed vault open").first
    ).to_be_visible(timeout=60_000)
    expect(page.get_by_text("26 February 2008").first).to_be_visible(timeout=90_000)

    expect(page.get_by_text("final_report.pdf").last).to_be_visible()
    # The run that an Edit resumed marks itself idle again: the input is usable.
    expect(page.locator("#stop-button")).to_have_count(0)
    expect(page.locator("#chat-submit")).to_be_visible()
    with page.expect_download() as download_info:
        page.get_by_text("final_report.md").last.click()
    path = tmp_path / "final_report.md"
    download_info.value.save_as(path)
    report = path.read_text()

    citations = list(CITATION.finditer(report))
    assert len(citations) >= 4
    for citation in citations:
        url = citation["url"]
        assert url.startswith(f"{app_server.url}/research/corpus/"), url
        response = page.request.get(url)
        assert response.status == 200
        assert normalise_text(citation["quote"]) in normalise_text(response.text())
    assert not re.search(r"fetch.log", report, re.I)
    page.context.close()


def test_a_question_the_sample_corpus_does_not_cover_gets_an_honest_report(app_server, browser):
    page = research_page(browser, app_server, "bob")
    send(page, "What is the best way to get from Lisbon airport to the city centre?")
    page.get_by_role("button", name="Approve").click()

    expect(
        page.get_by_text("The sources searched do not answer this question.").first
    ).to_be_visible(timeout=90_000)
    expect(page.get_by_text("Sources searched").first).to_be_visible()
    expect(page.get_by_text("Not about your question").first).to_be_visible()
    # The citation step counts the passing citations that answer the question apart.
    page.get_by_text("Checking citations").first.click()
    expect(
        page.get_by_text("0 of the 1 passing citations cite a passage that answers the question.")
    ).to_be_visible()
    page.context.close()
