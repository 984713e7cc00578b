"""Chainlit, in one place: the only package that imports it (hooks, data layer, request guard,
the chat surface and widgets, per-agent presentation, and the patches, each pinned)."""
