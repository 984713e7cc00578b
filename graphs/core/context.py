"""Per-run context every graph receives from the UI layer: who is asking, in which thread."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Context:
    """Set by ui/ from the authenticated session; nodes and tools read it through the runtime."""

    user_id: str
    """Stable id of the signed-in user, from auth/ only. Never from a client field or the model."""
    thread_id: str
    """The conversation this run belongs to (already checked to be the user's)."""
    agent: str = "assistant"
    """Which chat profile started the run."""
    memory: bool = True
    """False for a temporary chat: long-term memory is neither read nor written."""
    step_model_calls: float | None = None
    """Inner model calls per executed step, the median of this agent's recent runs, for the
    estimate shown before a plan is approved; None: not measured yet (the graph's constant)."""
    call_tokens: float | None = None
    """Tokens per model call over this agent's recent runs, and their cost at the configured
    prices (`call_cost`), for the token and money estimate shown before a plan is approved;
    None: not measured yet (no estimate is shown)."""
    call_cost: float | None = None
    workspace_id: str | None = None
    """The team workspace the thread belongs to, from its stored record (None: personal). It
    chooses the team plan gallery and the research source memory the run reads and writes."""

    def __post_init__(self) -> None:
        if not self.user_id or not self.thread_id:
            msg = "a run needs both user_id and thread_id"
            raise ValueError(msg)
