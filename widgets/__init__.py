"""Notebook and Voila widgets over `explorer`'s public API.

`Dashboard` puts everything on one page; each part also works alone, wired to a `Planner`
or a `Front`: `ParetoPlot(front)`, `BudgetSlider(front, planner)`, `TimelinePlot(planner)`,
`ExportPanel(schedule)`, `VerifyPanel(path)`.
"""

from widgets.budget import BudgetSlider
from widgets.choice import Choice
from widgets.dashboard import Dashboard
from widgets.export import ExportPanel
from widgets.model_picker import ModelPicker
from widgets.pareto import ParetoPlot
from widgets.status import StatusLine
from widgets.tasks import TaskRunner
from widgets.timeline import TimelinePlot
from widgets.verify import VerifyPanel

__all__ = [
    "BudgetSlider",
    "Choice",
    "Dashboard",
    "ExportPanel",
    "ModelPicker",
    "ParetoPlot",
    "StatusLine",
    "TaskRunner",
    "TimelinePlot",
    "VerifyPanel",
]
