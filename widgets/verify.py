"""The verify panel: run an exported module against the unmodified model and show the table."""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any

import ipywidgets as ipw

import explorer
from remat_explorer.widgets.tasks import TaskRunner
from remat_explorer.widgets.units import format_bytes

NOT_OK = '<b style="color:#b42318">NOT OK</b>'
CELL = "padding:2px 10px;border-bottom:1px solid #ddd;text-align:left"


def format_value(quantity: str, value: Any) -> str:
    """A measured or predicted value for reading: bytes as MiB, floats to 4 digits."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return str(value)
    if "bytes" in quantity:
        return format_bytes(int(value))
    return f"{value:.4g}"


def report_table(report: Any) -> str:
    """`VerifyReport.rows` as an HTML table, each row marked ok or NOT OK."""
    rows = [("quantity", "measured", "predicted", "", "note")] + [
        (
            html.escape(str(r.quantity)),
            html.escape(format_value(str(r.quantity), r.measured)),
            html.escape(format_value(str(r.quantity), r.predicted)),
            "ok" if r.ok else NOT_OK,
            html.escape(str(r.note)),
        )
        for r in report.rows
    ]
    body = "".join(
        "<tr>" + "".join(f"<td style='{CELL}'>{cell}</td>" for cell in row) + "</tr>"
        for row in rows
    )
    verdict = "verified: equal and within budget" if report.ok else "NOT verified"
    return (
        f"<b>{verdict}</b>"
        f"<table class='remat-verify-table' style='border-collapse:collapse'>{body}</table>"
        + timing_lines(report.measurements)
    )


def timing_lines(measurements: dict[str, float]) -> str:
    """The measured overhead of the step beside the predicted one, with the spread of the
    timed rounds and, when they disagree, verify's word that the timing is noisy: the
    cost model's check, as a measurement ('' for a report without timings)."""
    from explorer.verify import (
        FIRST_QUARTILE,
        HIGHEST_ROUND,
        LOWEST_ROUND,
        THIRD_QUARTILE,
        timing_notes,
    )

    measured = measurements.get("overhead, measured")
    predicted = measurements.get("overhead, predicted")
    if measured is None or predicted is None:
        return ""
    # verify's timed rounds come with it (explorer.verify._timings)
    low, high = measurements[LOWEST_ROUND], measurements[HIGHEST_ROUND]
    first, third = measurements[FIRST_QUARTILE], measurements[THIRD_QUARTILE]
    lines = [
        f"step time: {measured:+.1%} measured (rounds {low:+.1%} to {high:+.1%}, middle half "
        f"{first:+.1%} to {third:+.1%}), {predicted:+.1%} predicted"
    ]
    lines += timing_notes(measurements)
    return "".join(f"<div class='remat-verify-timing'>{html.escape(line)}</div>" for line in lines)


class VerifyPanel(ipw.VBox):
    """Path of an exported module, a Verify button and the report table (class `remat-verify`).

    Verifying runs a training step twice (exported and unmodified), so it runs in the
    background like a sweep; `explorer.verify` does the work, this only shows the rows.
    The unmodified model is rebuilt from the SPEC the file records, or, with
    `against=(model, example_inputs)`, is that model (needed for a model without a SPEC).
    """

    def __init__(
        self,
        path: str | Path | None = None,
        device: str | None = None,
        runner: TaskRunner | None = None,
        against: tuple[Any, tuple] | None = None,
    ) -> None:
        self.device = device
        self.against = against
        self.refusal: str | None = None  # why the schedule at hand cannot be verified here
        self.report: Any = None
        self.runner = runner or TaskRunner()
        self.path = ipw.Text(
            value="" if path is None else str(path),
            placeholder="exported .py file",
            description="module",
            layout={"width": "420px"},
        )
        self.verify_button = ipw.Button(description="Verify", icon="check")
        self.verify_button.on_click(lambda _: self.verify())
        self.table = ipw.HTML()
        self.runner.observe(lambda change: self._enable(), "busy")
        rows: list[ipw.Widget] = [ipw.HBox([self.path, self.verify_button]), self.table]
        if runner is None:
            rows.append(self.runner.status)
        super().__init__(rows)
        self.add_class("remat-verify")
        self._enable()

    def set_path(self, path: str | Path) -> None:
        """Verify this file next (an `ExportPanel.on_export` listener)."""
        self.path.value = str(path)
        self.table.value = ""

    def verify(self) -> None:
        """Run `explorer.verify` on the file in the background and show its table."""
        path = self.path.value.strip()
        if not path:
            self.runner.status.error("export a schedule (or type a module's path) first")
            return
        if self.refusal:
            self.runner.status.error(self.refusal)
            return
        device, against = self.device, self.against

        def run(progress: Any, cancel: Any) -> Any:
            if against is None:
                return explorer.verify(path, device=device, cancel=cancel)
            model, inputs = against
            return explorer.verify(path, model=model, example_inputs=inputs, cancel=cancel)

        def done(report: Any) -> None:
            self.report = report
            self.table.value = report_table(report)
            if report.ok:
                self.runner.status.ok(f"{Path(path).name}: verified")
            else:
                self.runner.status.error(f"{Path(path).name}: NOT verified, see the table")

        self.runner.start("verify", run, done)

    def _enable(self) -> None:
        self.verify_button.disabled = self.runner.busy
