"""The Planner agent: plan, review, execute step by step, replan."""
