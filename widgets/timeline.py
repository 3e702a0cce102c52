"""The memory timeline: live bytes op by op under the chosen schedule and without recomputation."""

from __future__ import annotations

from typing import Any

import ipywidgets as ipw
import plotly.graph_objects as go

from remat_explorer.widgets.plotstyle import PLOT_FRAME
from remat_explorer.widgets.units import format_bytes, mib

BASELINE, SCHEDULE, BUDGET = range(3)
TITLE = "memory timeline"
EMPTY = {"x": [], "y": [], "hovertext": []}
TRACES: list[dict[str, Any]] = [
    {"name": "no recompute", "line": {"color": "#999", "width": 1.5}, "hoverinfo": "text+y"},
    {"name": "schedule", "line": {"color": "#1f77b4", "width": 2}, "hoverinfo": "text+y"},
    {
        "name": "budget",
        "line": {"color": "#d62728", "dash": "dash", "width": 1.5},
        "hoverinfo": "y",
    },
]
LAYOUT: dict[str, Any] = {
    "xaxis": {"title": {"text": "op (forward, then backward)"}},
    "yaxis": {"title": {"text": "live memory (MiB)"}},
    **PLOT_FRAME,
}


def _line(timeline: Any) -> dict[str, list]:
    pairs = zip(timeline.labels, timeline.phase, strict=True)
    return {
        "x": list(range(len(timeline.steps))),
        "y": [mib(b) for b in timeline.steps],
        "hovertext": [f"{label} ({phase})" for label, phase in pairs],
    }


class TimelinePlot(ipw.VBox):
    """A plotly FigureWidget (class `remat-timeline`): the chosen schedule's simulated memory
    (`Schedule.timeline()`) over the unmodified model's (`planner.baseline().timeline()`),
    with the budget as a dashed line.

    The figure is made when there is a first timeline to draw, with that data in its
    constructor. Each FigureWidget brings its own copy of plotly's browser bundle, and a
    page that loads two at once on a slow machine can leave the second one deaf to every
    later update (anywidget gives a model 2 s to load); made later, it loads alone.

    Simulating is cheap but not free, so each schedule's timeline is computed once and kept:
    moving the slider back and forth only redraws.
    """

    def __init__(self, planner: Any = None, schedule: Any = None) -> None:
        self._cache: dict[int, tuple[Any, Any]] = {}
        self._baseline_length = 0
        self.schedule: Any = None
        self.figure: go.FigureWidget | None = None
        super().__init__([ipw.HTML("<i>The memory timeline appears once a model is profiled.</i>")])
        self.add_class("remat-timeline")
        if planner is not None:
            self.set_baseline(planner.baseline())
        if schedule is not None:
            self.show(schedule)

    def set_baseline(self, baseline: Any) -> None:
        """Draw the no-recompute schedule's timeline (`planner.baseline()`)."""
        timeline = self._timeline(baseline)
        self._baseline_length = len(timeline.steps)
        self._draw({BASELINE: _line(timeline)})

    def show(self, schedule: Any) -> None:
        """Draw `schedule`'s timeline and its budget line."""
        timeline = self._timeline(schedule)
        self.schedule = schedule
        title = f"{TITLE}: peak {format_bytes(timeline.peak_bytes)}"
        budget_line = {"x": [], "y": []}
        if schedule.budget_bytes is not None:
            end = max(len(timeline.steps), self._baseline_length, 2) - 1
            budget_line = {"x": [0, end], "y": [mib(schedule.budget_bytes)] * 2}
            title += f", budget {format_bytes(schedule.budget_bytes)}"
        self._draw({SCHEDULE: _line(timeline), BUDGET: budget_line}, title)

    def clear(self) -> None:
        """Forget every drawn timeline, e.g. when the model or its input changes."""
        self._cache.clear()
        self._baseline_length = 0
        self.schedule = None
        if self.figure is not None:
            self._draw(dict.fromkeys(range(len(TRACES)), EMPTY), TITLE)

    def _draw(self, traces: dict[int, dict], title: str | None = None) -> None:
        if self.figure is None:
            data = [
                {"type": "scatter", "mode": "lines", **spec, **EMPTY, **traces.get(i, {})}
                for i, spec in enumerate(TRACES)
            ]
            self.figure = go.FigureWidget(
                data=data, layout={**LAYOUT, "title": {"text": title or TITLE}}
            )
            self.children = [self.figure]
            return
        with self.figure.batch_update():
            for index, update in traces.items():
                self.figure.data[index].update(update)
            if title is not None:
                self.figure.layout.title.text = title

    def _timeline(self, schedule: Any) -> Any:
        key = id(schedule)
        if key not in self._cache:
            self._cache[key] = (schedule, schedule.timeline())
        return self._cache[key][1]
