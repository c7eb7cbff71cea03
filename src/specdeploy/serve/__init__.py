"""The serving phase: one variable set rendered into the engine container, and its rollout."""
