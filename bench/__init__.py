"""Benchmarks for Cairn; run them from the project root (`make bench`)."""
