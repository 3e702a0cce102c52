"""Schedules of one graph that save less for their seconds, for a step of several graphs.

A graph's solver plans for the graph's own peak. In a step of several graphs, what a graph's
forward saves is alive through every later graph too, so a schedule that saves less can lower
the step's peak where the graph's own is not the step's: on a two-graph MLP the least step
peak had the first graph saving nothing, at a peak of its own no lower than its minimum's
(tests/test_several_graphs.py). Two kinds, each simulated by the solver (`schedule_of`):

- `stage_mixes`: running again all a stage can (Space.everything) from one of CUTS stages on,
  or only before it, nothing elsewhere: no search, for any solver.
- `saved_limited`: the whole-graph MILP (explorer.solvers.milp) with the bytes the forward
  saves at most a share of what the no-recompute schedule saves (LIMITS), within the graph's
  own no-recompute peak and within its least known peak: the fastest way to save that
  little. Only for a solver that runs CBC on the whole graph, for RUN_SECONDS a run and
  TOTAL_SECONDS a graph at most.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from explorer.progress import check_cancel
from explorer.schedule import GraphSchedule
from explorer.solvers.milp import LE, StepMilp, _row
from explorer.solvers.space import Windows

if TYPE_CHECKING:
    from explorer.solve import Solver

CUTS = 8  # stages where a stage mix starts or stops
LIMITS = (0.0, 0.25, 0.5, 0.75)  # shares of the no-recompute schedule's saved bytes
RUN_SECONDS = 0.5
TOTAL_SECONDS = 2.0


def stage_mixes(solver: Solver) -> list[GraphSchedule]:
    """All a stage can run again, at every stage, from a cut on, before it, and nothing
    again in the chain's backward order (its no-recompute schedule, not autograd's)."""
    space = solver.space
    everything = space.everything()
    stages = [t for t, window in enumerate(everything) if window]
    cuts = sorted({stages[len(stages) * k // CUTS] for k in range(1, CUTS) if stages})
    mixes: list[Windows] = [everything, space.empty()]
    for cut in cuts:
        mixes.append([w if t >= cut else [] for t, w in enumerate(everything)])
        mixes.append([w if t < cut else [] for t, w in enumerate(everything)])
    return _simulated(solver, mixes)


def saved_limited(solver: Solver) -> list[GraphSchedule]:
    """The fastest schedules that save at most each of LIMITS, within each of the peaks
    (see module docstring); none for a solver that does not run CBC on the whole graph."""
    if not (solver.whole_runs and solver.refine_seconds > 0):
        return []
    milp = StepMilp(solver.space, solver.milp.facts, solver.seconds)
    milp.use_budget(solver.baseline.predicted_peak_bytes)
    saved = {x: milp.facts.storages[s].nbytes for (i, s), x in milp.avail.items() if i == 0}
    if not saved:
        return []
    limit = milp.prob.add_variable("saved_limit", 0)
    milp.prob += _row({**{x: n * milp.scale for x, n in saved.items()}, limit: -1}, 0, LE)
    most = milp.saved_bytes(solver.space.empty())
    peaks = {solver.baseline.predicted_peak_bytes, solver.lowest_known()}
    deadline = time.perf_counter() + TOTAL_SECONDS
    found: list[Windows] = []
    for peak in sorted(peaks, reverse=True):
        milp.peak.upBound = peak * milp.scale
        for share in LIMITS:
            left = deadline - time.perf_counter()
            if left <= 0.0:
                return _simulated(solver, found)
            check_cancel(solver.cancel)  # between CBC runs, as the solver's own searches
            limit.upBound = share * most * milp.scale
            result = milp.run(min(RUN_SECONDS, left))
            if result.windows is not None:
                found.append(result.windows)
    return _simulated(solver, found)


def _simulated(solver: Solver, points: list[Windows]) -> list[GraphSchedule]:
    """The distinct schedules of `points` that the lowering can run."""
    found: dict[tuple, GraphSchedule] = {}
    for windows in points:
        try:
            schedule = solver.schedule_of(windows)
        except RuntimeError:  # a point the lowering cannot run (check_program)
            continue
        found[(tuple(schedule.saved), tuple(schedule.backward))] = schedule
    return list(found.values())
