"""The exported module: it trains like the model, and refuses what it was not made for."""

from __future__ import annotations

import copy

import pytest
import torch
from helpers import planner, train_step

import explorer
from explorer.errors import UserError
from explorer.models import build
from explorer.verify import load_wrap


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    plan = planner("sample:tiny_cnn", 4, 32)
    front = plan.sweep(points=5)
    schedule = front.at_budget(min(p.predicted_peak_bytes for p in front.points))
    assert schedule.recomputed_ops(), "the lowest point should recompute something"
    path = schedule.export(tmp_path_factory.mktemp("export") / "tiny_cnn_low.py")
    return plan, schedule, path


def test_three_sgd_steps_end_with_the_same_parameters(exported):
    plan, _schedule, path = exported
    reference = copy.deepcopy(plan.model)
    wrapped = load_wrap(path)(copy.deepcopy(plan.model))
    inputs = plan.example_inputs
    for model in (reference, wrapped):
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        for step in range(3):
            opt.zero_grad(set_to_none=True)
            train_step(model, inputs, seed=step)
            opt.step()
    for a, b in zip(
        reference.state_dict().values(), wrapped.model.state_dict().values(), strict=True
    ):
        assert torch.equal(a, b)


def test_dropout_training_matches_bitwise(tmp_path):
    plan = planner("sample:gpt", 2, 32)
    front = plan.sweep(points=4)
    path = front.points[0].schedule.export(tmp_path / "gpt_low.py")
    reference = copy.deepcopy(plan.model)
    wrapped = load_wrap(path)(copy.deepcopy(plan.model))
    for model in (reference, wrapped):
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        for step in range(3):
            opt.zero_grad(set_to_none=True)
            train_step(model, plan.example_inputs, seed=10 + step)
            opt.step()
    for a, b in zip(reference.parameters(), wrapped.model.parameters(), strict=True):
        assert torch.equal(a, b)


def test_refuses_another_model(exported):
    _plan, _schedule, path = exported
    other = build("sample:tiny_mlp", 4, None).model
    with pytest.raises(UserError, match="made for"):
        load_wrap(path)(other)


def test_refuses_another_shape(exported):
    plan, _schedule, path = exported
    wrapped = load_wrap(path)(copy.deepcopy(plan.model))
    bigger = torch.randn(8, *plan.example_inputs[0].shape[1:])
    with pytest.raises(UserError, match="made for inputs"):
        wrapped(bigger)


def test_eval_mode_runs_the_model_unchanged(exported):
    plan, _schedule, path = exported
    reference = copy.deepcopy(plan.model).eval()
    wrapped = load_wrap(path)(copy.deepcopy(plan.model)).eval()
    with torch.no_grad():
        x = torch.randn(3, *plan.example_inputs[0].shape[1:])  # any shape in eval
        assert torch.equal(reference(x), wrapped(x))


def test_verify_api_reports_equal_and_within_budget(exported):
    plan, schedule, path = exported
    report = explorer.verify(path, model=plan.model, example_inputs=plan.example_inputs)
    assert report.ok, report.format_table()
    peak = next(r for r in report.rows if r.quantity.startswith("peak memory"))
    assert peak.measured == peak.predicted == schedule.predicted_peak_bytes
