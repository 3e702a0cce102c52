"""remat-explorer: fit PyTorch training into less memory by recomputing activations.

The pipeline, one module per stage: capture -> profile -> solve (chain, stage_ilp, rotor)
-> sweep -> simulate -> export -> backend (the runtime) -> verify. `Planner` carries a model
through it.

The public names below load on first use (PEP 562), so that `import explorer` is instant, the
command line can answer --help, a usage error or Ctrl+C before torch has loaded, and
`import explorer.backend` (what an exported schedule imports) loads only torch and the
runtime, never the solver (PuLP, numpy) or torchvision.
"""

from __future__ import annotations

import importlib
import sys
import types
from typing import TYPE_CHECKING, Any

from explorer.errors import Cancelled, UserError

if TYPE_CHECKING:
    from explorer.planner import Planner
    from explorer.progress import CancelToken
    from explorer.schedule import Schedule
    from explorer.simulate import Timeline
    from explorer.sweep import Front, FrontPoint
    from explorer.verify import VerifyReport, verify

_LAZY = {
    "CancelToken": "explorer.progress",
    "Front": "explorer.sweep",
    "FrontPoint": "explorer.sweep",
    "Planner": "explorer.planner",
    "Schedule": "explorer.schedule",
    "Timeline": "explorer.simulate",
    "VerifyReport": "explorer.verify",
    "verify": "explorer.verify",
}

__all__ = [
    "CancelToken",
    "Cancelled",
    "Front",
    "FrontPoint",
    "Planner",
    "Schedule",
    "Timeline",
    "UserError",
    "VerifyReport",
    "verify",
]


class _Package(types.ModuleType):
    """`explorer.verify` stays the function: importing the submodule `explorer.verify` would
    otherwise set the package attribute of that name to the module."""

    def __setattr__(self, name: str, value: Any) -> None:
        if name in _LAZY and isinstance(value, types.ModuleType):
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'explorer' has no attribute {name!r}")
    value = getattr(importlib.import_module(_LAZY[name]), name)
    globals()[name] = value
    return value
