"""Small shared helpers for the engine tests."""

from __future__ import annotations

import importlib.util
import sys
import uuid
from pathlib import Path
from types import ModuleType

import explorer
from explorer.models import build
from explorer.verify import training_step

__all__ = ["import_schedule", "planner", "train_step"]

train_step = training_step  # the same step verify runs: seeded forward, random tangents


def planner(spec: str, batch: int, size: int | None) -> explorer.Planner:
    built = build(spec, batch, size)
    return explorer.Planner(built.model, built.example_inputs, spec=built.spec)


def import_schedule(path: str | Path) -> ModuleType:
    """Import a Python file (an exported schedule) the way a training script does."""
    name = f"schedule_{uuid.uuid4().hex[:8]}"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
