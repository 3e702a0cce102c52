"""Small shared helpers for the engine tests."""

from __future__ import annotations

import explorer
from explorer.models import build
from explorer.verify import training_step

__all__ = ["planner", "train_step"]

train_step = training_step  # the same step verify runs: seeded forward, random tangents


def planner(spec: str, batch: int, size: int | None) -> explorer.Planner:
    built = build(spec, batch, size)
    return explorer.Planner(built.model, built.example_inputs, spec=built.spec)
