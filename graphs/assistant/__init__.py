"""Assistant agent: personal assistant with long-term memory."""
