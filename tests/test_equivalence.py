"""Every model family: schedules across the front train exactly like the unmodified model.

For each model (small sizes, CPU), three points across its Pareto front are exported and
verified: outputs, every parameter gradient and every buffer equal (bitwise, or allclose with
rtol 1e-5 and atol 1e-5 * max|reference| where verify says so), measured peak (live-tensor
tracker) at most the budget and within 3% of the predicted peak. The sweeps refine for
`quick_search`'s seconds (tests/conftest.py): these tests are about exactness, not quality.
"""

from __future__ import annotations

import pytest
from helpers import planner

import explorer

# the longest first (on 2 cores: densenet121 85 s, resnet18 26 s): the tests' workers
# then end together
MODELS = [
    ("densenet121", 2, 48),
    ("googlenet", 2, 64),
    ("vgg11", 4, 128),
    ("resnet50", 2, 64),
    ("mobilenet_v2", 4, 64),
    ("sample:unet", 2, 64),
    ("sample:gpt", 2, 64),
    ("resnet18", 4, 64),
]


def _three_across(points):
    picks = {0, len(points) // 2, max(len(points) - 2, 0)}
    return [points[i] for i in sorted(picks)]


@pytest.mark.slow
@pytest.mark.parametrize(("spec", "batch", "size"), MODELS, ids=[m[0] for m in MODELS])
def test_front_points_train_exactly_like_the_model(spec, batch, size, tmp_path, quick_search):
    plan = planner(spec, batch, size)
    front = plan.sweep(points=6)
    assert len(front.points) >= 2, "the front should offer a choice"
    peaks = [p.predicted_peak_bytes for p in front.points]
    assert peaks == sorted(peaks) and peaks[0] < front.baseline_peak_bytes
    for k, point in enumerate(_three_across(front.points)):
        path = point.schedule.export(tmp_path / f"point_{k}.py")
        report = explorer.verify(path, model=plan.model, example_inputs=plan.example_inputs)
        rows = {r.quantity: r for r in report.rows}
        expected = ["plan applied as exported", "outputs", "parameter gradients"]
        if any(True for _ in plan.model.buffers()):
            expected.append("buffers (BatchNorm statistics)")
        for quantity in expected:
            assert rows[quantity].ok, report.format_table()
        peak = rows["peak memory (bytes)"]
        assert peak.measured <= point.budget_bytes, report.format_table()
        assert abs(peak.measured - peak.predicted) <= 0.03 * peak.predicted, report.format_table()


def test_resnet50_lowest_point_keeps_a_third_of_the_activations():
    """Activation memory = peak minus parameters, buffers, inputs and parameter gradients."""
    plan = planner("resnet50", 8, 128)
    solver = plan.solver()
    lowest = solver.minimum().predicted_peak_bytes
    baseline = solver.baseline.predicted_peak_bytes
    assert lowest - solver.fixed_bytes <= (baseline - solver.fixed_bytes) / 3
