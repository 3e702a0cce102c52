"""The floor (explorer.solvers.floor): lower bounds that hold for every schedule of the space.

Checked against every point of the space of small random graphs (tests/ir_graphs.
brute_force), each lowered and simulated by the planner's own code; against the exact
solver's proven least peak on a traced CNN; and through what a user sees: the labels of a
step too large for the whole-step MILP, the front file and the command line.
"""

from __future__ import annotations

import json
import random

import pytest
from helpers import planner
from ir_graphs import StepBuilder, brute_force, random_step

from explorer import solve
from explorer.costmodel import meta_planner
from explorer.errors import UserError
from explorer.solvers.floor import StepFloor
from explorer.solvers.registry import make_solver
from explorer.sweep import Front, sweep_budgets


@pytest.mark.parametrize(
    "seed,n_ops,handed",
    [(0, 5, False), (3, 5, False), (4, 5, False), (11, 5, False), (25, 5, False), (26, 6, False),
     (0, 5, True), (4, 5, True), (11, 5, True)],
)  # fmt: skip
def test_no_point_of_the_space_is_under_the_floor(seed, n_ops, handed):
    # catches: a row that counts a storage the schedule need not hold, or an operator run
    # again whose inputs must be saved (not made again themselves: seed 26 of 6 operators
    # needs that), either of which passes the least peak or the least seconds at some
    # budget: every point of the space is enumerated and compared with the floors. (The
    # module as it is passed this on seeds 0 to 79 of 5 and 6 operators.) `handed`: the
    # tangent a loss hands the backward, counted through the whole backward where the step
    # frees it after its last use. The same model with its decisions whole (whole_within)
    # bounds them too, and no lower than the LP
    head = 64 if handed else 4
    graph, profile = random_step(random.Random(seed), n_ops, head_bytes=head, handed=handed)
    solver = make_solver("table", graph, profile)
    points = brute_force(solver.space, graph, profile)
    assert points, "the enumeration found no valid schedule"
    floor = StepFloor(solver.milp)
    least = min(p for p, _, _ in points)
    found = floor.least_peak(None)
    assert found is not None and found <= least
    base = solver.baseline.predicted_seconds
    for peak in sorted({p for p, _, _ in points}):
        best = min(seconds for p, seconds, _ in points if p <= peak)
        relaxed = floor.within(peak, None)
        assert relaxed is not None
        assert relaxed.bound <= best - base + 1e-9
        whole = floor.whole_within(peak, None)  # its decisions whole (a step's joint floor)
        assert whole is not None and relaxed.bound - 1e-9 <= whole <= best - base + 1e-9
        for other in sorted({p for p, _, _ in points}):  # what the LP carries to others
            if other >= least:
                carried = relaxed.bound_at(other)
                assert carried <= min(s for p, s, _ in points if p <= other) - base + 1e-9


def _two_private_inputs():
    """s is made from u1 and u2, which no backward operator reads; e's gradient reads s."""
    b = StepBuilder()
    x, w = b.input("x", 8), b.param("w", 4)
    u1 = b.op("u1", [x, w], 64, saves="nothing")
    u2 = b.op("u2", [x, w], 64, saves="nothing")
    s = b.op("s", [u1, u2], 64, saves="nothing")
    e = b.op("e", [s, w], 64)
    return b.build(b.op("g", [b.op("f", [e, w], 64)], 4))


def test_a_storage_is_in_one_pair_at_most():
    # catches: s paired with both of its inputs, which would count s twice wherever it is
    # kept and both inputs freed (each pair says "s or u is allocated", one of them for both)
    graph, profile = _two_private_inputs()
    milp = make_solver("table", graph, profile).milp
    storages = {r: s for r, s in milp.facts.storages.items() if not s.held and s.nbytes}
    last_stage = {r: i for i, reads in enumerate(milp.reads) for r in reads}
    pairs = StepFloor(milp)._pairs(storages, last_stage)
    assert [p[0] for p in pairs] == [("s", 0)] and pairs[0][1] in {("u1", 0), ("u2", 0)}


def test_the_floor_meets_the_proven_least_peak_of_a_traced_cnn():
    # catches: a floor too weak to say anything (the least peak found is compared with it:
    # on the small graphs of bench/small_graphs.py it is within 0.1% of the proven least
    # peak) and one above it (invalid)
    plan = planner("sample:tiny_cnn", 4, 16)
    solver = make_solver("exact", plan.capture()[0], plan.profile().graphs[0], time_limit=20)
    lowest = solver.minimum().predicted_peak_bytes
    assert solver.cache.label("least")[0]  # proven
    floor = solver.peak_floor()
    assert floor is not None and lowest * 0.999 <= floor <= lowest


def test_no_table_schedule_of_mobilenet_v2_is_under_the_floor():
    # catches: an operator run again counted at its seconds where the forward then need not
    # run it at all (mobilenet_v2's clone before each ReLU6, which only ReLU6's gradient
    # reads): the floor's seconds passed 4 of the 12 points of its b16 96 px front on the
    # CPU, and 51 of these 65 schedules. Planned for a P100 (explorer.costmodel): the same
    # seconds every run, nothing timed
    plan = meta_planner("mobilenet_v2", 16, 96, "p100")
    solver = make_solver("table", plan.capture()[0], plan.profile().graphs[0])
    floor = StepFloor(solver.milp)
    least = floor.least_peak(None)
    base = solver.baseline.predicted_seconds
    checked = 0
    for schedule in solver.known():
        if solver.space.windows_of(schedule) is None:  # autograd's own order
            continue
        assert schedule.predicted_peak_bytes >= least
        relaxed = floor.within(schedule.predicted_peak_bytes, None)
        assert relaxed.bound <= schedule.predicted_seconds - base + 1e-12
        checked += 1
    assert checked >= 30


def test_a_step_too_large_for_the_milp_gets_gaps_from_the_floor(monkeypatch, tmp_path):
    # catches: a step above MAX_WINDOWED_SIZE labelled "gap 100%" at every recomputing point
    # (resnet50 b8 128 px: 13 of 14), a label above what the floor's own LP proves at that
    # budget, and labels a second sweep of the same profile forgets or solves again
    monkeypatch.setattr(solve, "MAX_WINDOWED_SIZE", 0)
    plan = planner("sample:tiny_cnn", 4, 16)
    graph, profile = plan.capture()[0], plan.profile().graphs[0]
    path = tmp_path / "solver_cache.json"
    solver = make_solver("chain", graph, profile, max_refine_size=0, cache=path)
    assert not solver.refines
    front = sweep_budgets(solver, 6)
    base = solver.baseline.predicted_seconds
    recomputing = [p for p in front if p.schedule.predicted_seconds > base]
    assert len(recomputing) >= 3
    own = StepFloor(solver.milp)
    for point in recomputing:
        assert point.status == "feasible" and point.gap < 1.0
        bound = (1 - point.gap) * (point.schedule.predicted_seconds - base)
        assert 0.0 < bound <= own.within(point.budget_bytes, None).bound * (1 + 1e-6)
    floor = solver.peak_floor()
    between = (recomputing[0].budget_bytes + recomputing[1].budget_bytes) // 2
    limit = own.within(between, None).bound
    monkeypatch.setattr(StepFloor, "within", lambda *_: pytest.fail("solved again"))
    alone = solver.solve(between)  # after the sweep: what its LPs carry there, none solved
    redo = alone.predicted_seconds - base
    assert alone.gap < 1.0 and 0.0 < (1 - alone.gap) * redo <= limit * (1 + 1e-6)
    monkeypatch.setattr(StepFloor, "least_peak", lambda *_: pytest.fail("solved again"))
    again = make_solver("chain", graph, profile, max_refine_size=0, cache=path)
    second = sweep_budgets(again, 6)
    assert [p.gap for p in second] == pytest.approx([p.gap for p in front], rel=1e-9)
    assert again.peak_floor() == floor


def test_the_front_keeps_its_floor_and_the_command_line_prints_it(tmp_path, capsys):
    # catches: a floor lost on the way to front.json, a corrupt one read as a number, and a
    # command line that does not say how far its least peak may be from the lowest possible
    from explorer.cli import main

    args = ["sweep", "--model", "sample:tiny_cnn", "--batch-size", "4", "--input-size", "16"]
    assert main([*args, "--points", "4", "--solver", "table", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    path = tmp_path / "front.json"
    front = Front.load(path)
    lowest = min(p.predicted_peak_bytes for p in front.points)
    assert front.peak_floor_bytes is not None and 0 < front.peak_floor_bytes <= lowest
    assert front.floor_note() in out and "no schedule in the solver's backward order" in out
    data = json.loads(path.read_text())
    data["peak_floor_bytes"] = "many"
    path.write_text(json.dumps(data))
    with pytest.raises(UserError, match="corrupt front file"):
        Front.load(path)
    data["peak_floor_bytes"] = None  # a front written before floors: no note
    path.write_text(json.dumps(data))
    assert Front.load(path).floor_note() is None
