"""Evaluations of Cairn's behaviour on labelled data (`make eval`), separate from pass/fail tests."""
