"""The budget slider: picks among solved schedules, and solves a budget between them on demand."""

from __future__ import annotations

import html
from collections.abc import Callable
from typing import Any

import ipywidgets as ipw

from remat_explorer.widgets.choice import Choice
from remat_explorer.widgets.tasks import TaskRunner
from remat_explorer.widgets.units import format_bytes

NO_POINTS = [("no points yet", -1)]

Listener = Callable[[Choice], None]


class BudgetSlider(ipw.VBox):
    """A slider over the solved schedules, lowest peak first (class `remat-budget`).

    Moving it never solves anything: each stop is a schedule already solved, so the plot and
    timeline can follow at once. A budget between two stops is solved by "Solve this budget"
    through `planner.solve`, and becomes a stop of its own. Listeners registered with
    `on_select` get the chosen `Choice`.

    The page reports a move when the handle is released or a key moves it
    (`continuous_update=False`): with continuous updates the page also echoes every stop
    list the kernel sends, and a late echo would move the selection by itself.
    """

    def __init__(
        self,
        front: Any = None,
        planner: Any = None,
        runner: TaskRunner | None = None,
    ) -> None:
        self.planner = planner
        self.choices: list[Choice] = []
        self._listeners: list[Listener] = []
        self._syncing = False
        self._own_runner = runner is None
        self.runner = runner or TaskRunner()
        self.slider = ipw.SelectionSlider(
            options=NO_POINTS,
            description="budget",
            disabled=True,
            continuous_update=False,
            layout={"width": "95%"},
        )
        self.readout = ipw.HTML(layout={"margin": "0 0 0 90px"})
        self.budget_text = ipw.Text(
            placeholder="e.g. 300MiB, 2GB or 0.6",
            description="other budget",
            style={"description_width": "initial"},
            layout={"width": "260px"},
        )
        self.solve_button = ipw.Button(description="Solve this budget", icon="calculator")
        self.solve_button.on_click(lambda _: self.solve())
        self.slider.observe(self._moved, "value")
        self.runner.observe(lambda _: self._enable(), "busy")
        rows: list[ipw.Widget] = [
            self.slider,
            self.readout,
            ipw.HBox([self.budget_text, self.solve_button]),
        ]
        if self._own_runner:
            rows.append(self.runner.status)
        super().__init__(rows)
        self.add_class("remat-budget")
        if front is not None:
            for point in front.points:
                self.add(Choice.from_point(point))
        self._enable()

    @property
    def selected(self) -> Choice | None:
        """The schedule the slider stands on, if any."""
        index = self.slider.value
        return self.choices[index] if index is not None and index >= 0 else None

    def attach(self, planner: Any) -> None:
        """Solve on-demand budgets with this planner (once it is profiled)."""
        self.planner = planner
        self._enable()

    def on_select(self, listener: Listener) -> None:
        """Call `listener(choice)` whenever the selection changes."""
        self._listeners.append(listener)

    def add(self, choice: Choice, select: bool = False) -> None:
        """Add a stop; the slider stays where it was unless `select` or it was empty."""
        current = self.selected
        self.choices.append(choice)
        self.choices.sort(key=lambda c: c.peak_bytes)
        target = choice if select or current is None else current
        self._sync_options(self.choices.index(target))
        self._enable()
        if target is not current:
            self._notify(target)

    def keep_only(self, keep: list[Choice]) -> None:
        """Drop every stop not in `keep` (e.g. points a finished sweep found dominated).

        The slider stays on its stop if kept, else moves to the kept stop nearest in peak.
        """
        current = self.selected
        self.choices = sorted(keep, key=lambda c: c.peak_bytes)
        if not self.choices:
            self.clear()
            return
        target = current
        if current not in self.choices:
            peak = 0 if current is None else current.peak_bytes
            target = min(self.choices, key=lambda c: abs(c.peak_bytes - peak))
        self._sync_options(self.choices.index(target))
        if target is not current:
            self._notify(target)

    def select(self, choice: Choice) -> None:
        """Move the slider to `choice` (one of `choices`)."""
        self.slider.value = self.choices.index(choice)

    def step(self, delta: int) -> None:
        """Move `delta` stops (what the arrow keys do in the page); clamped at the ends."""
        if self.choices:
            index = self.slider.value if self.slider.value >= 0 else 0
            self.slider.value = min(max(index + delta, 0), len(self.choices) - 1)

    def clear(self) -> None:
        """Forget every stop, e.g. when the model or its input changes."""
        self.choices = []
        self._syncing = True
        try:
            self.slider.options = NO_POINTS
        finally:
            self._syncing = False
        self.readout.value = ""
        self._enable()

    def solve(self) -> None:
        """Solve the typed budget in the background and move the slider to the result."""
        budget = self.budget_text.value.strip()
        if self.planner is None:
            self.runner.status.error("profile a model before solving a budget")
            return
        if not budget:
            self.runner.status.error("type a budget first, e.g. 300MiB or 0.6")
            return
        planner = self.planner

        def done(schedule: Any) -> None:
            choice = Choice.from_schedule(schedule)
            self.add(choice, select=True)
            self.runner.status.ok(f"solved {budget}: {choice.summary()}")

        self.runner.start(
            f"solve {budget}",
            lambda progress, cancel: planner.solve(budget, cancel=cancel),
            done,
        )

    def _sync_options(self, index: int) -> None:
        labels = _unique([format_bytes(c.peak_bytes) for c in self.choices])
        self._syncing = True
        try:
            with self.slider.hold_sync():  # one message: the page never sees a stale index
                self.slider.options = list(zip(labels, range(len(labels)), strict=True))
                self.slider.value = index
        finally:
            self._syncing = False
        self._show(self.choices[index])

    def _moved(self, change: dict) -> None:
        if self._syncing or change["new"] is None or change["new"] < 0:
            return
        choice = self.choices[change["new"]]
        self._notify(choice)

    def _notify(self, choice: Choice) -> None:
        self._show(choice)
        for listener in self._listeners:
            listener(choice)

    def _show(self, choice: Choice) -> None:
        self.readout.value = html.escape(choice.summary())

    def _enable(self) -> None:
        self.slider.disabled = not self.choices
        self.solve_button.disabled = self.runner.busy or self.planner is None


def _unique(labels: list[str]) -> list[str]:
    """Slider labels must differ; equal peaks (at display precision) get a counter."""
    seen: dict[str, int] = {}
    out = []
    for label in labels:
        seen[label] = seen.get(label, 0) + 1
        out.append(label if seen[label] == 1 else f"{label} ({seen[label]})")
    return out
