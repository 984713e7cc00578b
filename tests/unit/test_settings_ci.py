"""Chainlit's CI mode exports a placeholder OpenAI key; it must not switch off the offline model."""

from graphs.core.settings import CHAINLIT_CI_PLACEHOLDER_KEY, Settings


def test_chainlit_ci_placeholder_key_keeps_offline_model(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", CHAINLIT_CI_PLACEHOLDER_KEY)
    assert Settings(_env_file=None).offline


def test_real_key_switches_to_configured_model(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-real-looking-key")
    assert not Settings(_env_file=None).offline
