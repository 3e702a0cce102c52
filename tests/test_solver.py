"""Solve: stage ILPs on CBC, the chain table, and schedules that keep their promises."""

from __future__ import annotations

import pytest
from helpers import planner

from explorer.chain import build_chain
from explorer.errors import UserError
from explorer.graph import BACKWARD
from explorer.program import check_program, compile_program
from explorer.simulate import simulate
from explorer.stage_ilp import build_problem, keep_all_option, solve_option


@pytest.fixture(scope="module")
def cnn():
    plan = planner("sample:tiny_cnn", 4, 32)
    plan.profile()
    return plan


def test_chain_places_every_backward_operator_once(cnn):
    graph = cnn.capture()[0]
    chain = build_chain(graph, cnn.profile().graphs[0].seconds)
    placed = [name for stage in chain.stages for name in stage.backward]
    assert sorted(placed) == sorted(n.name for n in graph.nodes if n.phase == BACKWARD)
    assert len(chain.stages) > 3


def test_stage_ilp_reports_status_and_gap(cnn):
    graph = cnn.capture()[0]
    chain = build_chain(graph, cnn.profile().graphs[0].seconds)
    problem = max(
        (build_problem(chain, s, cnn.profile().graphs[0].seconds) for s in chain.stages),
        key=lambda p: keep_all_option(p).keep_bytes,
    )
    full = keep_all_option(problem)
    option = solve_option(problem, full.keep_bytes // 2, time_limit=30)
    assert option is not None
    assert option.status == "optimal" and option.gap == 0.0
    assert option.keep_bytes <= full.keep_bytes // 2
    assert option.redo_seconds > 0  # it has to recompute something to keep less
    assert solve_option(problem, -1, time_limit=30) is None  # infeasible cap


def test_every_budget_is_kept_by_the_exact_simulation(cnn):
    solver = cnn.solver()
    graph = cnn.capture()[0]
    low = solver.minimum().predicted_peak_bytes
    high = solver.baseline.predicted_peak_bytes
    assert low < high
    overheads = []
    for k in range(9):
        budget = low + (high - low) * k // 8
        schedule = solver.solve(budget)
        program = compile_program(graph, schedule.graphs[0])
        assert check_program(graph, program) is None
        peak = simulate(graph, program).peak_bytes
        assert peak == schedule.predicted_peak_bytes <= budget
        overheads.append(schedule.predicted_overhead)
    assert overheads[-1] == 0.0
    assert max(overheads) > 0.0


def test_budget_below_minimum_names_the_minimum(cnn):
    minimum = cnn.solver().minimum().predicted_peak_bytes
    with pytest.raises(UserError, match=f"minimum .*{minimum} bytes"):
        cnn.solve(minimum - 1)


def test_time_limited_solve_still_returns_a_schedule():
    plan = planner("sample:tiny_cnn", 4, 32)
    plan.profile()
    lowest = plan.solver(time_limit=0.01).minimum().predicted_peak_bytes
    schedule = plan.solve(lowest, time_limit=0.01)
    assert schedule.status in ("optimal", "feasible")
    assert 0.0 <= schedule.gap <= 1.0


def test_identical_stages_are_solved_once():
    plan = planner("resnet18", 2, 32)
    plan.profile()
    setup = plan.solver().setup
    assert setup.distinct_stages < setup.stages
