"""remat-explorer: fit PyTorch training into less memory by recomputing activations.

The pipeline, one module per stage: capture -> profile -> solve -> sweep -> simulate -> export
-> backend (the runtime) -> verify. `Planner` carries a model through it.

Names are imported on first use, so that `import explorer.backend` (what an exported schedule
imports) loads only torch and the runtime, not the solver (PuLP, numpy) or torchvision.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "CancelToken": "explorer.progress",
    "Cancelled": "explorer.errors",
    "Front": "explorer.sweep",
    "FrontPoint": "explorer.sweep",
    "Planner": "explorer.planner",
    "Schedule": "explorer.schedule",
    "Timeline": "explorer.simulate",
    "UserError": "explorer.errors",
    "VerifyReport": "explorer.verify",
    "verify": "explorer.verify",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'explorer' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
