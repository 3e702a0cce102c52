"""On a CUDA device: profiling with CUDA events, measured peaks against predictions,
verify's comparison where the captured graph's kernels differ from eager's, and dropout masks
drawn again in the backward (tests/test_dropout_replay.py checks the draw itself).

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


def test_measured_peak_equals_prediction_and_fits_budget(plan, tmp_path):
    front = plan.sweep(points=5)
    for k, point in enumerate(front.points[:-1]):
        path = point.schedule.export(tmp_path / f"gpu_{k}.py")
        report = explorer.verify(path, model=plan.model, example_inputs=plan.example_inputs)
        rows = {r.quantity: r for r in report.rows}
        assert report.ok, report.format_table()
        peak = rows["peak memory (bytes)"]
        assert peak.measured <= point.budget_bytes, report.format_table()
        # bytes requested of the allocator: the planner's quantity, to the byte
        assert peak.measured == peak.predicted, report.format_table()
        # what the allocator handed out: each request rounded up to 512 bytes, and a large
        # one given a whole cached block when less than 1 MiB of it would be left over. That
        # is not predicted; read 1.2% to 5.1% above the requested peak on an H100 and an H200
        allocated = report.measurements["CUDA allocated peak (bytes)"]
        assert peak.measured <= allocated <= 1.10 * peak.measured, report.format_table()


def _bitwise_and_to_the_byte(planner: explorer.Planner, path) -> None:
    """The exported module at `path` verifies: eager's outputs and gradients bitwise, its
    measured peak equal to the prediction."""
    report = explorer.verify(path, model=planner.model, example_inputs=planner.example_inputs)
    assert report.ok, report.format_table()
    compared = [r for r in report.rows if r.quantity in ("outputs", "parameter gradients")]
    assert [r.measured for r in compared] == ["bitwise equal"] * 2, report.format_table()
    peak = next(r for r in report.rows if r.quantity == "peak memory (bytes)")
    assert peak.measured == peak.predicted, report.format_table()


def test_dropout_on_cuda_is_bitwise_with_its_masks_recomputed(tmp_path):
    """A GPT with dropout on CUDA: its lowest point draws dropout masks again in the backward
    (from the CUDA generator's saved state, explorer.rngreplay) and still gives eager's
    outputs and gradients bitwise, in the memory it predicted to the byte."""
    built = build("sample:gpt", 4, 64, device="cuda")
    planner = explorer.Planner(built.model, built.example_inputs, spec=built.spec)
    front = planner.sweep(points=3)
    lowest = front.points[0]
    assert any("cuda_dropout_mask" in op for op in lowest.schedule.recomputed_ops())
    path = lowest.schedule.export(tmp_path / "gpt_cuda.py")
    _bitwise_and_to_the_byte(planner, path)
    activations = front.baseline_peak_bytes - front.fixed_bytes
    share = (lowest.predicted_peak_bytes - front.fixed_bytes) / activations
    print(f"sample:gpt b4 64 on CUDA: lowest point keeps {share:.3f} of the activations")


def test_dropouts_drawn_once_run_fused_on_cuda_bitwise_and_to_the_byte(tmp_path):
    """Without recomputation every dropout's mask is drawn once, so the runtime runs
    `native_dropout`'s fused kernel itself (explorer.rewrite.fuse_kept_dropouts): eager's
    outputs and gradients bitwise, and the peak predicted to the byte (the fused kernel has no
    workspace; the split form's mask operator counted the kernel's float output as one)."""
    built = build("sample:gpt", 4, 64, device="cuda")
    planner = explorer.Planner(built.model, built.example_inputs, spec=built.spec)
    path = planner.baseline().export(tmp_path / "gpt_fused.py")
    _bitwise_and_to_the_byte(planner, path)


def test_a_moment_of_eager_code_is_measured_on_the_gpu():
    """The allocator's requested bytes between the marks (explorer.eagerpeaks) on CUDA: an
    eagerly computed loss after the graph is the step's peak, predicted to the byte."""
    from test_eagerpeaks import _EagerTail

    torch.manual_seed(0)
    x = torch.randn(32, 64, device="cuda")
    planner = explorer.Planner(_EagerTail().cuda(), (x,))
    (run,) = planner.profile().graphs
    assert run.eager.after_forward >= 2 * 32 * 64 * 64 * 4
    for point in planner.sweep(points=3).points:
        report = point.schedule.verify()
        assert report.ok, report.format_table()
        peak = next(r for r in report.rows if r.quantity == "peak memory (bytes)")
        assert peak.measured == peak.predicted, report.format_table()


@pytest.mark.parametrize("which", ["two graphs", "sample:gpt"])
def test_a_plan_made_on_the_meta_device_for_cuda_is_the_cuda_steps_plan(which, tmp_path):
    """A plan made without a GPU, on the meta device with the cost model's times, for a GPU
    (explorer.costmodel): the graphs it planned are the ones the CUDA step captures (the same
    fingerprints, dropouts split as on CUDA: the runtime applies the plan rather than carry
    it over), and its least-peak export verifies on CUDA. The cost model has no workspace
    bytes (cuBLAS's, cuDNN's), so the peak is held to verify's tolerance, not to the byte."""
    from test_costmodel import EagerBetweenGraphs

    from explorer.costmodel import meta_planner, model_planner

    torch.manual_seed(0)
    if which == "two graphs":
        model, inputs = EagerBetweenGraphs().cuda(), (torch.randn(64, 32, device="cuda"),)
        planned = model_planner(model, inputs, device_name="h100")
    else:
        built = build("sample:gpt", 4, 64, device="cuda")
        model, inputs = built.model, built.example_inputs
        planned = meta_planner("sample:gpt", 4, 64, "h100")
    on_cuda = explorer.Planner(model, inputs)
    assert [g.fingerprint() for g in planned.capture()] == [
        g.fingerprint() for g in on_cuda.capture()
    ]
    least = min(planned.sweep(3).points, key=lambda p: p.predicted_peak_bytes)
    path = planned.export(least.schedule, tmp_path / "planned_for_cuda.py")
    report = explorer.verify(path, model=model, example_inputs=inputs)
    assert report.ok, report.format_table()
    rows = {r.quantity: r for r in report.rows}
    assert rows["plan applied as exported"].ok, report.format_table()


class _WritesItsInput(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = torch.nn.Linear(64, 256), torch.nn.Linear(256, 64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.b(torch.tanh(self.a(torch.sin(x))))
        x.mul_(2)
        return out


def test_a_forward_that_writes_into_its_cuda_input_gets_it_as_given_at_every_step():
    # catches: the inputs' bytes kept or put back wrongly from a CUDA storage (they are kept on
    # the host), so that verify's steps read other inputs or the caller's input changes
    torch.manual_seed(0)
    model, x = _WritesItsInput().cuda(), torch.randn(128, 64, device="cuda")
    given = x.clone()
    plan = explorer.Planner(model, (x,))
    report = plan.sweep(points=3).points[0].schedule.verify()
    assert torch.equal(x, given)
    rows = {r.quantity: r for r in report.rows}
    assert report.ok and rows["inputs written in place"].ok, report.format_table()
