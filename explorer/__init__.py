"""remat-explorer: fit PyTorch training into less memory by recomputing activations.

The pipeline, one module per stage: capture -> profile -> solve (chain, stage_ilp, rotor)
-> sweep -> simulate -> export -> runtime -> verify. `Planner` carries a model through it.
"""

from explorer.errors import Cancelled, UserError
from explorer.planner import Planner
from explorer.progress import CancelToken
from explorer.schedule import Schedule
from explorer.simulate import Timeline
from explorer.sweep import Front, FrontPoint
from explorer.verify import VerifyReport, verify

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
