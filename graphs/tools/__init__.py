"""Web tools shared by the Research and Planner agents: SSRF-safe fetching and search providers."""
