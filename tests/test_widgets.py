"""The widgets without a kernel: set values, click buttons, read the figures and the files.

Clicks start worker threads, so every click is followed by `wait()`; a job that does not end
in time fails the test rather than hanging it.
"""

from __future__ import annotations

import math

import pytest
import torch

from explorer import Planner
from explorer.models import build
from sample_models.tiny import mlp
from widgets import (
    BudgetSlider,
    Choice,
    Dashboard,
    ExportPanel,
    ParetoPlot,
    TimelinePlot,
    VerifyPanel,
)
from widgets.model_picker import ModelPicker
from widgets.units import mib

SPEC = "sample:tiny_cnn"
JOB_TIMEOUT_S = 300
FRONT, ON_DEMAND, BASELINE, SELECTED = range(4)
TIMELINE_BASELINE, TIMELINE_SCHEDULE, TIMELINE_BUDGET = range(3)


def finish(dashboard: Dashboard) -> None:
    assert dashboard.wait(JOB_TIMEOUT_S), "the dashboard's job did not finish"


def new_dashboard(tmp_path, **kwargs) -> Dashboard:
    kwargs = {"batch_size": 8, "input_size": 64, "points": 5, "peers": False, **kwargs}
    return Dashboard(spec=SPEC, export_dir=tmp_path, **kwargs)


@pytest.fixture(scope="module")
def swept(tmp_path_factory) -> Dashboard:
    """One dashboard that has profiled and swept tiny_cnn, peers included."""
    dashboard = new_dashboard(tmp_path_factory.mktemp("exports"), peers=True)
    dashboard.sweep_button.click()
    finish(dashboard)
    assert dashboard.status.kind == "ok", dashboard.status.text
    return dashboard


def test_picker_lists_torchvision_and_sample_models_and_only_real_devices() -> None:
    picker = ModelPicker()
    assert "resnet18" in picker.spec.options
    assert SPEC in picker.spec.options
    assert ("cuda" in picker.device.options) == torch.cuda.is_available()
    assert "remat-model" in picker._dom_classes


def test_every_part_has_its_css_class(tmp_path) -> None:
    dashboard = new_dashboard(tmp_path)
    classes = set()
    stack = [dashboard]
    while stack:
        widget = stack.pop()
        classes.update(getattr(widget, "_dom_classes", ()))
        stack.extend(getattr(widget, "children", ()))
    expected = {
        "remat-model", "remat-profile", "remat-sweep", "remat-cancel", "remat-progress",
        "remat-pareto", "remat-budget", "remat-timeline", "remat-export", "remat-verify",
        "remat-status",
    }  # fmt: skip
    assert expected <= classes


def test_profile_draws_the_baseline_point_and_timeline(tmp_path) -> None:
    dashboard = new_dashboard(tmp_path)
    dashboard.profile_button.click()
    finish(dashboard)
    assert dashboard.status.kind == "ok", dashboard.status.text
    baseline = dashboard.planner.baseline()
    point = dashboard.pareto.figure.data[BASELINE]
    assert list(point.x) == [pytest.approx(mib(baseline.predicted_peak_bytes))]
    assert list(point.y) == [0.0]
    line = dashboard.timeline.figure.data[TIMELINE_BASELINE]
    assert list(line.y) == pytest.approx([mib(b) for b in baseline.timeline().steps])
    assert dashboard.runner.progress.value == dashboard.runner.progress.max


def test_sweep_draws_every_front_point_with_hover_text(swept: Dashboard) -> None:
    front = swept.front
    trace = swept.pareto.figure.data[FRONT]
    assert len(front.points) >= 2
    assert list(trace.x) == pytest.approx([mib(p.predicted_peak_bytes) for p in front.points])
    assert list(trace.y) == pytest.approx([100 * p.predicted_overhead for p in front.points])
    for text, point in zip(trace.hovertext, front.points, strict=True):
        assert "peak" in text and "overhead" in text
        assert ("recomputes nothing" in text) == (not point.recomputed)
    assert len(swept.budget.slider.options) == len(front.points)


def test_peers_are_their_own_traces(swept: Dashboard) -> None:
    names = [trace.name for trace in swept.pareto.figure.data[SELECTED + 1 :]]
    assert "eager" in names
    assert "checkpoint per block" in names
    assert "checkpoint_sequential" in names
    for trace in swept.pareto.figure.data[SELECTED + 1 :]:
        assert len(trace.x) == 1 and not math.isnan(trace.y[0])
        assert "measured peak" in trace.hovertext[0]


def test_slider_snaps_to_points_and_moves_highlight_timeline_and_export(
    swept: Dashboard, monkeypatch
) -> None:
    front = swept.front
    monkeypatch.setattr(swept.planner, "solve", _never_called)
    monkeypatch.setattr(swept.planner, "sweep", _never_called)
    for index, point in enumerate(front.points):
        swept.budget.slider.value = index
        choice = swept.budget.selected
        assert choice.peak_bytes == point.predicted_peak_bytes
        assert list(swept.pareto.figure.data[SELECTED].x) == [pytest.approx(mib(choice.peak_bytes))]
        steps = swept.timeline.figure.data[TIMELINE_SCHEDULE].y
        assert list(steps) == pytest.approx([mib(b) for b in choice.schedule.timeline().steps])
        budget_line = swept.timeline.figure.data[TIMELINE_BUDGET].y
        assert list(budget_line) == pytest.approx([mib(point.budget_bytes)] * 2)
        assert swept.export_panel.schedule is choice.schedule
        assert f"{round(mib(choice.peak_bytes)) or 1}MiB" in swept.export_panel.file_name.value
    assert swept.status.kind == "ok", swept.status.text


def _never_called(*args, **kwargs):
    raise AssertionError("moving the slider must not solve")


def test_export_writes_the_module_and_verify_shows_its_report(swept: Dashboard) -> None:
    swept.budget.slider.value = 0
    swept.export_panel.file_name.value = "tiny_cnn_low.py"
    swept.export_panel.export_button.click()
    path = swept.export_panel.directory / "tiny_cnn_low.py"
    assert path.is_file()
    assert "def wrap(" in path.read_text()
    assert str(path.resolve()) in swept.export_panel.message.value
    assert swept.verify_panel.path.value == str(path.resolve())
    swept.verify_panel.verify_button.click()
    finish(swept)
    report, table = swept.verify_panel.report, swept.verify_panel.table.value
    assert report is not None, swept.status.text
    assert table.count("<tr>") == len(report.rows) + 1
    assert table.count("NOT OK") == sum(not row.ok for row in report.rows)
    assert ("NOT verified" in table) == (not report.ok)
    assert swept.status.kind == ("ok" if report.ok else "error")


def test_solve_this_budget_adds_a_point_between_two(tmp_path) -> None:
    dashboard = new_dashboard(tmp_path)
    dashboard.sweep_button.click()
    finish(dashboard)
    low, high = dashboard.front.points[0], dashboard.front.points[-1]
    between = (low.predicted_peak_bytes + high.predicted_peak_bytes) // 2
    dashboard.budget.budget_text.value = str(between)
    dashboard.budget.solve_button.click()
    finish(dashboard)
    assert dashboard.status.kind == "ok", dashboard.status.text
    solved = dashboard.budget.selected
    assert solved.on_demand and solved.peak_bytes <= between
    assert len(dashboard.budget.slider.options) == len(dashboard.front.points) + 1
    assert list(dashboard.pareto.figure.data[ON_DEMAND].x) == [
        pytest.approx(mib(solved.peak_bytes))
    ]
    assert dashboard.export_panel.schedule is solved.schedule


def test_errors_show_one_line_in_the_status(tmp_path) -> None:
    dashboard = new_dashboard(tmp_path)
    dashboard.picker.spec.value = "no_such_model"
    dashboard.profile_button.click()
    finish(dashboard)
    assert dashboard.status.kind == "error"
    assert "no_such_model" in dashboard.status.text
    assert "Traceback" not in dashboard.status.value

    dashboard.picker.spec.value = SPEC
    dashboard.sweep_button.click()
    finish(dashboard)
    dashboard.budget.budget_text.value = "1KiB"
    dashboard.budget.solve_button.click()
    finish(dashboard)
    assert dashboard.status.kind == "error"
    assert "\n" not in dashboard.status.text

    dashboard.export_panel.file_name.value = "schedule.txt"
    dashboard.export_panel.export_button.click()
    assert dashboard.status.kind == "error" and ".py" in dashboard.status.text
    assert not (tmp_path / "schedule.txt").exists()


def test_cancel_stops_a_sweep_midway(tmp_path) -> None:
    dashboard = new_dashboard(tmp_path, points=8)
    dashboard.profile_button.click()
    finish(dashboard)
    sweep = dashboard.planner.sweep

    def sweep_then_cancel(**kwargs):
        on_point = kwargs["on_point"]

        def first_point_cancels(point):
            on_point(point)
            assert not dashboard.runner.cancel_button.disabled
            dashboard.runner.cancel_button.click()

        return sweep(**{**kwargs, "on_point": first_point_cancels})

    dashboard.planner.sweep = sweep_then_cancel
    dashboard.sweep_button.click()
    finish(dashboard)
    assert "cancelled" in dashboard.status.text
    assert dashboard.front is None
    assert 1 <= len(dashboard.pareto.figure.data[FRONT].x) < 8
    assert not dashboard.sweep_button.disabled and dashboard.runner.cancel_button.disabled


def test_changing_the_model_starts_over(tmp_path) -> None:
    dashboard = new_dashboard(tmp_path)
    dashboard.sweep_button.click()
    finish(dashboard)
    first = dashboard.planner
    dashboard.picker.batch_size.value = 2
    dashboard.profile_button.click()
    finish(dashboard)
    assert dashboard.planner is not first
    assert len(dashboard.pareto.figure.data[FRONT].x) == 0
    assert dashboard.budget.selected is None
    assert dashboard.export_panel.export_button.disabled


def test_dashboard_plans_a_users_own_module(tmp_path) -> None:
    dashboard = Dashboard(mlp(), torch.randn(16, 64), points=3, peers=False, export_dir=tmp_path)
    assert dashboard.picker.spec.disabled
    dashboard.sweep_button.click()
    finish(dashboard)
    assert dashboard.status.kind == "ok", dashboard.status.text
    assert len(dashboard.pareto.figure.data[FRONT].x) == len(dashboard.front.points) >= 1


@pytest.fixture(scope="module")
def planned():
    """A Planner and Front for the standalone parts, without any dashboard."""
    built = build(SPEC, 8, 64)
    planner = Planner(built.model, built.example_inputs, spec=built.spec)
    front = planner.sweep(points=4)
    return planner, front


def test_parts_work_alone_wired_to_a_planner_and_front(planned, tmp_path) -> None:
    planner, front = planned
    assert len(front.points) >= 2
    plot = ParetoPlot(front)
    assert len(plot.figure.data[FRONT].x) == len(front.points)
    slider = BudgetSlider(front, planner)
    timeline = TimelinePlot(planner)
    export = ExportPanel(directory=tmp_path)
    slider.on_select(lambda choice: timeline.show(choice.schedule))
    slider.on_select(lambda choice: export.set_schedule(choice.schedule, "alone.py"))
    slider.on_select(plot.select)
    slider.step(len(front.points))
    last = front.points[-1]
    assert slider.selected.peak_bytes == last.predicted_peak_bytes
    assert list(plot.figure.data[SELECTED].x) == [pytest.approx(mib(last.predicted_peak_bytes))]
    assert timeline.schedule is last.schedule
    assert len(timeline.figure.data[TIMELINE_BASELINE].x) > 0
    path = export.export()
    assert path == (tmp_path / "alone.py").resolve() and path.is_file()
    panel = VerifyPanel(path)
    panel.verify()
    assert panel.runner.wait(JOB_TIMEOUT_S)
    assert panel.report is not None and "verified" in panel.runner.status.text


def test_choice_hover_names_what_is_recomputed() -> None:
    choice = Choice(
        peak_bytes=3 * 2**20, overhead=0.125, budget_bytes=4 * 2**20,
        recomputed=tuple(f"relu_{i}" for i in range(10)), schedule=None,
    )  # fmt: skip
    text = choice.hover()
    assert "3.0 MiB" in text and "+12.5%" in text and "4.0 MiB" in text
    assert "relu_0" in text and "... and 4 more" in text
