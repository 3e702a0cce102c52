"""On a CUDA device: profiling with CUDA events, and measured peaks against predictions.

Marked `gpu`: skipped where there is no CUDA device (see conftest.py).
"""

from __future__ import annotations

import pytest
import torch

import explorer
from explorer.models import build

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def plan():
    built = build("resnet18", 8, 96, device="cuda")
    planner = explorer.Planner(built.model, built.example_inputs, spec=built.spec)
    planner.profile()
    return planner


def test_profile_uses_the_gpu(plan):
    profile = plan.profile()
    assert profile.device.startswith("cuda")
    assert torch.cuda.get_device_name() in profile.device_name
    assert all(s >= 0 for graph in profile.graphs for s in graph.seconds.values())
    assert profile.total_seconds > 0


def test_measured_peak_within_two_percent_and_under_budget(plan, tmp_path):
    front = plan.sweep(points=5)
    for k, point in enumerate(front.points[:-1]):
        path = point.schedule.export(tmp_path / f"gpu_{k}.py")
        report = explorer.verify(path, model=plan.model, example_inputs=plan.example_inputs)
        rows = {r.quantity: r for r in report.rows}
        assert report.ok, report.format_table()
        peak = rows["peak memory (bytes)"]
        assert peak.measured <= point.budget_bytes, report.format_table()
        assert abs(peak.measured - peak.predicted) <= 0.02 * peak.predicted, report.format_table()
