"""Notebook and Voila widgets over `explorer`'s public API.

`Dashboard` puts everything on one page; each part also works alone, wired to a `Planner`
or a `Front`: `ParetoPlot(front)`, `BudgetSlider(front, planner)`, `TimelinePlot(planner)`,
`ExportPanel(schedule)`, `VerifyPanel(path)`.
"""

from remat_explorer.widgets.budget import BudgetSlider
from remat_explorer.widgets.choice import Choice
from remat_explorer.widgets.dashboard import Dashboard
from remat_explorer.widgets.export import ExportPanel
from remat_explorer.widgets.model_picker import ModelPicker
from remat_explorer.widgets.pareto import ParetoPlot
from remat_explorer.widgets.status import StatusLine
from remat_explorer.widgets.tasks import TaskRunner
from remat_explorer.widgets.timeline import TimelinePlot
from remat_explorer.widgets.verify import VerifyPanel

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
