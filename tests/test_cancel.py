"""Cancel (the dashboard's button, a `CancelToken` from Python) stops the call it was given to,
between the solver's CBC runs, and no call after it."""

from __future__ import annotations

import importlib
from unittest import mock

import pytest
import torch
from helpers import planner

import explorer
from explorer.errors import Cancelled
from explorer.progress import CancelToken
from explorer.solvers.registry import make_solver
from explorer.verify import training_step


def test_a_cancelled_sweep_stops_no_later_sweep_or_budget(quick_search):
    # catches: the token of the sweep that prepared the solver kept by it, so that after one
    # Cancel every later sweep and "Solve this budget" of that model was cancelled at once
    plan = planner("sample:tiny_cnn", 4, 32)
    token = CancelToken()
    with pytest.raises(Cancelled):
        plan.sweep(points=4, cancel=token, on_point=lambda point: token.cancel())
    front = plan.sweep(points=4)
    assert len(front.points) >= 2
    budget = (front.points[0].predicted_peak_bytes + front.points[-1].predicted_peak_bytes) // 2
    assert plan.solve(budget).predicted_peak_bytes <= budget


def test_a_search_stops_at_its_next_run_and_the_solver_answers_after(quick_search):
    # catches: a search that looks at the token only before it starts (the dashboard's
    # "Solve this budget" ran its 8 s of windows to the end after a Cancel)
    plan = planner("sample:tiny_cnn", 4, 32)
    solver = make_solver("chain", plan.capture()[0], plan.profile().graphs[0])
    budget = (solver.lowest_known() + solver.baseline.predicted_peak_bytes) // 2
    start = solver.answers.best_within(budget)
    assert start.predicted_seconds > solver.baseline.predicted_seconds  # so it is searched
    token = CancelToken()
    refiner = solver._refiner()
    simulate = refiner.simulate
    simulated = []

    def cancelled_once_searching(windows):
        simulated.append(windows)
        token.cancel()
        return simulate(windows)

    refiner.simulate = cancelled_once_searching
    with pytest.raises(Cancelled), solver.cancelled_by(token):
        solver.solve(budget)
    assert len(simulated) == 1  # stopped before the next run or move
    refiner.simulate = simulate
    schedule = solver.solve(budget)
    assert schedule.predicted_peak_bytes <= budget
    assert schedule.predicted_seconds <= start.predicted_seconds


def test_verify_stops_between_its_steps_and_leaves_the_model_as_it_was(tmp_path, quick_search):
    # catches: a verify the dashboard's Cancel cannot stop (tens of seconds on a large step:
    # a compile, the steps compared, six timed steps), or one that stops with the caller's
    # model half-stepped
    plan = planner("sample:tiny_cnn", 4, 32)
    path = plan.sweep(points=2).points[0].schedule.export(tmp_path / "low.py")
    before = {k: v.clone() for k, v in plan.model.state_dict().items()}
    token = CancelToken()
    steps = []

    def step_then_cancel(*args, **kwargs):
        steps.append(args[0])
        token.cancel()
        return training_step(*args, **kwargs)

    module = importlib.import_module("explorer.verify")  # `explorer.verify` is the function
    with mock.patch.object(module, "training_step", step_then_cancel):
        with pytest.raises(Cancelled):
            explorer.verify(path, model=plan.model, example_inputs=plan.example_inputs,
                            cancel=token)  # fmt: skip
    assert len(steps) == 2  # the two steps compared, then stopped before the timed ones
    after = plan.model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert all(p.grad is None for p in plan.model.parameters())
