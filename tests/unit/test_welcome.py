"""The empty chat's welcome and the sign-in entry: what each agent does, starters, icons."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from auth.local_oidc import render_entry_page
from ui.agents import AGENTS
from ui.chainlit import welcome

ROOT = Path(__file__).resolve().parents[2]


def test_each_profile_says_what_it_does_names_the_others_and_offers_its_starters() -> None:
    profiles = welcome.chat_profiles(AGENTS)
    assert [p.name for p in profiles] == [a.profile for a in AGENTS]
    assert [p.default for p in profiles] == [True] + [False] * (len(AGENTS) - 1)
    for agent, profile in zip(AGENTS, profiles, strict=True):
        assert agent.description in profile.markdown_description
        for other in AGENTS:
            assert other.profile in profile.markdown_description
        assert 2 <= len(agent.starters) <= 3, agent.key
        assert [(s.label, s.message) for s in profile.starters or []] == [
            (s.label, s.message) for s in agent.starters
        ]
        # Chainlit shows the description on the welcome only for a profile with an icon.
        assert profile.icon is not None
        assert (ROOT / profile.icon.lstrip("/")).is_file()


def test_an_agent_without_an_icon_of_its_own_gets_the_plain_one() -> None:
    stranger = replace(AGENTS[0], key="no-such-agent")
    assert welcome.icon(stranger) == welcome.FALLBACK_ICON
    assert (ROOT / welcome.FALLBACK_ICON.lstrip("/")).is_file()


def test_the_sign_in_entry_escapes_everything_it_shows() -> None:
    page = render_entry_page(
        [("cairn", "Cairn"), ("evil/x", "<b>Evil</b>")],
        agents=[("<i>A</i>", "does & things")],
        error="<script>x</script>",
    )
    for raw in ("<script>", "<b>", "<i>"):
        assert raw not in page
    assert 'action="/auth/oauth/cairn"' in page
    assert 'action="/auth/oauth/evil%2Fx"' in page
    assert "Continue with Cairn" in page
    assert "does &amp; things" in page


def test_the_sign_in_entry_says_when_no_sign_in_is_configured() -> None:
    page = render_entry_page([], agents=[])
    assert "No sign-in is configured" in page
    assert "<form" not in page
