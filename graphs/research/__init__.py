"""The Research agent: plan approval, research subagents, notes files and checked citations."""

from pathlib import Path

SAMPLE_CORPUS_DIR = Path(__file__).resolve().parent / "corpus"
"""The small sample corpus the offline demo, the eval and the tests search."""
