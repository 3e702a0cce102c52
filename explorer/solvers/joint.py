"""The floor of a step of several graphs: one LP over every graph's floor.

Each graph's floor (explorer.solvers.floor) bounds what the graph's own simulation counts.
In the step (explorer.step) a run's graph counts at least that, less `graph_budget(run, 0)`
(the step's static bytes for the graph's own, less what of its outputs the backward's
constant bytes do not cover), plus what the step holds beside it. Bounding each run apart and
summing forgets the largest part of the latter: what an earlier run's forward saves is alive
through every later run, forward and backward, since the earlier backward runs after theirs.
So here one peak variable bounds the whole step: each solver's variables appear once (a graph
run several times runs one schedule), and each run's memory rows are moved by its constant
and carry, beside the run's own terms, the storages every earlier run saves (their variables,
their bytes). A storage a graph hands to a later one is the maker's output, which the floor
counts among its fixed bytes and not as saved, so it is never counted twice. The seconds are
the sum over the runs of each graph's.

A graph's baseline runs autograd's own backward order, outside the floor's space, and the
step may pair it with the others' schedules. Its point (nothing made again, what the stages
read saved) must then meet the graph's rows at the baseline's own peak; a graph whose rows
count more at that point than that peak has its rows lowered by the difference (`_excess`).
So every pairing of the graphs' schedules, baselines included, is a point of the LP whose
peak is at most the step's, and the LP's values bound them all: checked on sampled pairings
of twelve steps and against every pairing of two (tests/test_several_graphs.py).
"""

from __future__ import annotations

import time

import pulp

from explorer.solvers.floor import FloorLp, FloorPart, StepFloor, bound_order
from explorer.solvers.milp import Relaxation, _row, byte_scale
from explorer.solvers.refine import largest_bound


class JointFloor(FloorLp):
    """The floor's LP of a step of several graphs (see the module docstring)."""

    def __init__(
        self,
        floors: list[StepFloor],
        solver_of: list[int],
        moves: list[int],
        baseline_peaks: list[int],
        largest: int,
    ) -> None:
        """`floors`: each solver's; `solver_of`: the solver of each run; `moves`: the bytes
        added to each run's rows (minus `graph_budget(run, 0)`); `baseline_peaks`: each
        solver's baseline's own peak; `largest`: the step's most bytes (for the scale)."""
        unit = sum(f.time_unit for f in floors)
        super().__init__(byte_scale(largest), unit)
        self.floors = floors
        self.solver_of = solver_of
        self.moves = moves
        self.baseline_peaks = baseline_peaks
        self.parts: list[FloorPart] = []  # each solver's, once built

    def _build(self) -> pulp.LpProblem:
        prob = pulp.LpProblem("joint_floor", pulp.LpMinimize)
        self.peak = prob.add_variable("peak", 0)
        self.parts = parts = [
            f.add_graph(prob, self.peak, self.scale, f"g{n}_") for n, f in enumerate(self.floors)
        ]
        own = [peak * self.scale for peak in self.baseline_peaks]
        excess = [_excess(part, peak, self.peak) for part, peak in zip(parts, own, strict=True)]
        beside: dict[pulp.LpVariable, float] = {}  # what the earlier runs save
        for run, n in enumerate(self.solver_of):
            move = self.moves[run] * self.scale - excess[n]
            for row in parts[n].memory:
                terms = dict(row.items())
                for x, nbytes in beside.items():
                    terms[x] = terms.get(x, 0.0) + nbytes
                prob += _row(terms, row.constant + move, row.sense)
            for x, nbytes in parts[n].saved_bytes.items():
                beside[x] = beside.get(x, 0.0) + nbytes * self.scale
        self.decisions = [x for part in parts for x in part.decisions]
        self.branched = [x for part in parts for x in part.branched]
        runs = [self.solver_of.count(n) for n in range(len(parts))]
        self.time_cost = pulp.lpSum(
            count * seconds / self.time_unit * x
            for part, count in zip(parts, runs, strict=True)
            for x, seconds in part.seconds.items()
        )
        return prob

    def bounds(self, budgets: list[int], seconds: float) -> dict[int, float]:
        """Lower bounds above zero on the step's recomputation seconds within `budgets`:
        at budgets in `bound_order`, for `seconds` at most (one budget at least), the LP
        (carried to every budget by the peak's reduced cost) and the model with whole
        decisions (`whole_within`, which bounds every smaller budget too); each budget
        bounded by the best of them."""
        deadline = time.perf_counter() + seconds
        relaxed: list[Relaxation] = []
        whole: dict[int, float] = {}
        for budget in bound_order(sorted(set(budgets))):
            if time.perf_counter() >= deadline and relaxed:
                break
            solved = self.within(budget, max(deadline - time.perf_counter(), 1.0))
            if solved is not None:
                relaxed.append(solved)
            proven = self.whole_within(budget, max(deadline - time.perf_counter(), 1.0))
            if proven is not None:
                whole[budget] = proven
        found = {}
        for budget in budgets:
            above = [bound for at, bound in whole.items() if at >= budget]
            bound = largest_bound([*(r.bound_at(budget) for r in relaxed), *above])
            if bound is not None and bound > 0.0:
                found[budget] = bound
        return found


def _excess(part: FloorPart, baseline_peak: float, peak: pulp.LpVariable) -> float:
    """How much more than the baseline's own peak (scaled) a graph's memory rows count at
    the point of its schedule that makes nothing again (0 if none does)."""
    most = 0.0
    for row in part.memory:
        counted = row.constant + sum(
            coefficient * part.nothing_again.get(x, 0.0)
            for x, coefficient in row.items()
            if x is not peak
        )
        most = max(most, counted - baseline_peak)
    return most
