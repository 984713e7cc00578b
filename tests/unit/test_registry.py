"""The agent registry (ui/agents/) is the one list: Studio's graphs and the layer contracts follow it."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

from ui.agents import AGENTS
from ui.chainlit.agents import discover

ROOT = Path(__file__).resolve().parents[2]


def _agent_packages() -> set[str]:
    """graphs.<agent> of each spec's build_graph."""
    return {spec.build.__module__.split(".")[1] for spec in AGENTS}


def test_studio_lists_exactly_the_registered_agents() -> None:
    config = json.loads((ROOT / "langgraph.json").read_text())
    assert set(config["graphs"]) == {spec.key for spec in AGENTS}
    for key, target in config["graphs"].items():
        path, _, name = target.partition(":")
        assert path == "./graphs/studio.py"
        assert name == key


def test_the_graphs_layer_contract_names_each_agent_package_as_independent() -> None:
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    layers = next(c for c in contracts["contracts"] if c["id"] == "graphs-layers")["layers"]
    agents_layer = next(layer for layer in layers if "|" in layer and "assistant" in layer)
    assert {name.strip() for name in agents_layer.split("|")} == _agent_packages()


def test_each_presentation_belongs_to_a_registered_agent_and_each_question_is_asked() -> None:
    presentations = discover(AGENTS)
    for spec in AGENTS:
        presentation = presentations.of(spec.key)
        assert presentation.key == spec.key
        for kind in spec.interrupts:
            assert presentations.question(kind.name) is not None, (spec.key, kind.name)
