"""Long-term memory: scoped store access, write policy, tombstones and background jobs."""
