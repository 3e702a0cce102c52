"""A training step made of one or more captured graphs: one plan per graph, one memory account.

Dynamo gives one graph for most models; code it cannot trace splits a model into several graphs
run one after another, with eager Python between them. The step then runs the graphs' forwards
in order and their backwards in reverse order. While graph k runs, the earlier graphs hold what
their forwards kept (saved tensors, and outputs the user holds), and the later graphs'
parameter gradients, made by their backwards, are alive during k's backward, and so are the
outputs of a later graph that passes nothing on (the user's) and their tangents. A tensor that
one graph makes and only a later graph reads is counted by the later graph, from its start to
its last use there (`Handoff`), unless the graph that made it keeps it for its own backward,
which then counts it. A graph whose outputs all go to later graphs gets its tangents from their
backwards through autograd, which hands them over: they are freed after their last use. The
parameters, buffers and the user's inputs are counted once for the whole step (`static_bytes`),
however many graphs read them, and so is model state that no graph reads (it is memory all the
same). With one graph all of this reduces to that graph's own simulation plus that unread
state, exactly. A two-graph step whose first graph saves what it hands over is predicted to the
byte (tests/test_backend.py).

`StepSolver` answers "fastest step plan within B bytes" with one solver per graph: every graph
gets the same share of its own range (minimum to no recomputation), the largest share whose
combined peak fits.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from explorer.errors import BelowMinimum
from explorer.graph import Graph
from explorer.program import Handoff, compile_program
from explorer.schedule import GraphSchedule, Schedule
from explorer.simulate import Timeline, simulate
from explorer.units import below_minimum

BISECTIONS = 16  # shares tried when several graphs split a budget


@dataclass
class StepSetup:
    """What preparing the solvers cost, over all graphs."""

    graphs: int
    stages: int
    distinct_stages: int
    ilps: int
    ilp_seconds: float
    table_seconds: float
    worst_gap: float
    solver: str = "chain"  # the name in explorer.solvers.registry
    table_schedules: int = 0  # schedules read out of the chain tables and simulated
    milp_size: int = 0  # recomputation binaries of the whole-step MILPs
    refines: bool = False  # whether any graph's answers are refined with its MILP

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def step_timeline(
    graphs: list[Graph],
    schedules: list[GraphSchedule],
    static_bytes: int,
    workspace: list[dict[str, int]] | None = None,
    handoffs: list[Handoff] | None = None,
) -> Timeline:
    """Bytes alive after each operator of the whole step (see the module docstring)."""
    workspace = workspace or [{}] * len(graphs)
    handoffs = handoffs or [Handoff()] * len(graphs)
    lines: list[Timeline] = []
    programs = []
    for k, (graph, schedule) in enumerate(zip(graphs, schedules, strict=True)):
        programs.append(compile_program(graph, schedule, handoffs[k]))
        # an input that an earlier graph made and keeps for its own backward (which runs
        # after this graph's) is alive all through this graph: that graph counts it
        held = frozenset(
            name
            for name, j, ref in handoffs[k].sources
            if programs[j].slot_of.get(ref) in lines[j].kept_passed_on
        )
        lines.append(simulate(graph, programs[k], workspace[k], held))
    if len(lines) == 1 and lines[0].static_bytes == static_bytes:
        return lines[0]
    grads = [_param_grad_bytes(g) for g in graphs]
    out = Timeline([], [], [], static_bytes)
    held = 0
    for k, line in enumerate(lines):
        _append(out, line, k, range(line.forward_end), static_bytes + held)
        held += line.held_bytes
    out.held_bytes = held
    # a later graph that passes nothing on leaves the user's outputs and their tangents
    # alive through the earlier backwards (one that does: its tangents are autograd's, gone)
    users = [0 if handoffs[k].passed_on else line.user_bytes for k, line in enumerate(lines)]
    for k in reversed(range(len(lines))):
        held -= lines[k].held_bytes
        later = sum(grads[k + 1 :]) + sum(users[k + 1 :])
        backward = range(lines[k].forward_end, len(lines[k].steps))
        _append(out, lines[k], k, backward, static_bytes + held + later)
    return out


def _append(out: Timeline, line: Timeline, k: int, span: range, base: int) -> None:
    for i in span:
        out.steps.append(base + line.steps[i] - line.static_bytes)
        out.labels.append(f"g{k + 1}:{line.labels[i]}")
        out.phase.append(line.phase[i])


def _param_grad_bytes(graph: Graph) -> int:
    """Bytes of the gradients a graph's backward leaves for its parameters."""
    params = {n.name for n in graph.placeholders("param")}
    primals = [n.name for n in graph.nodes if n.phase == "placeholder" and n.role != "tangent"]
    total = 0
    for name, grad in zip(primals, graph.input_grads, strict=False):
        if grad is not None and name in params:
            total += graph.grad_bytes(grad)
    return total


class StepSolver:
    """Plans for a whole step from one prepared solver per graph (see the module docstring).

    Each per-graph solver offers `baseline`, `minimum()`, `solve(budget)` (a GraphSchedule
    whose simulated peak is within the budget) and `fixed_bytes`."""

    def __init__(
        self,
        graphs: list[Graph],
        solvers: list,
        static_bytes: int,
        workspace: list[dict[str, int]] | None = None,
        handoffs: list[Handoff] | None = None,
        *,
        runtime_factor: float = 1.0,
    ) -> None:
        self.graphs = graphs
        self.runtime_factor = runtime_factor  # the profile's (explorer.stepcost)
        self.solvers = solvers
        self.static_bytes = static_bytes
        self.workspace = workspace
        self.handoffs = handoffs
        self.fingerprint = "+".join(g.fingerprint() for g in graphs)
        # one graph: what the step holds beyond the state its graph reads (model state no
        # graph reads); that graph's solver plans in its own bytes, a step budget less these
        self.unread_bytes = static_bytes - graphs[0].static_bytes() if len(graphs) == 1 else 0
        self.baseline = self.combine([s.baseline for s in solvers])
        grads = sum(_param_grad_bytes(g) for g in graphs)
        self.fixed_bytes = (
            static_bytes + grads if len(graphs) > 1 else solvers[0].fixed_bytes + self.unread_bytes
        )
        self._minimum: Schedule | None = None

    @property
    def setup(self) -> StepSetup:
        parts = [s.setup for s in self.solvers]
        return StepSetup(
            graphs=len(parts),
            stages=sum(p.stages for p in parts),
            distinct_stages=sum(p.distinct_stages for p in parts),
            ilps=sum(p.ilps for p in parts),
            ilp_seconds=sum(p.ilp_seconds for p in parts),
            table_seconds=sum(p.table_seconds for p in parts),
            worst_gap=max(p.worst_gap for p in parts),
            solver=self.solvers[0].name,
            table_schedules=sum(p.table_schedules for p in parts),
            milp_size=sum(p.milp_size for p in parts),
            refines=any(p.refines for p in parts),
        )

    def combine(self, schedules: list[GraphSchedule]) -> Schedule:
        """One step plan from one schedule per graph, with the step's predicted figures."""
        for graph, schedule in zip(self.graphs, schedules, strict=True):
            schedule.structure = graph.structure()  # the runtime matches resized graphs by it
        timeline = self.timeline(schedules)
        worst = max(schedules, key=lambda s: s.gap)
        return Schedule(
            graphs=list(schedules),
            predicted_peak_bytes=timeline.peak_bytes,
            predicted_seconds=sum(s.predicted_seconds for s in schedules),
            baseline_seconds=sum(s.baseline_seconds for s in schedules),
            status="optimal" if all(s.status == "optimal" for s in schedules) else "feasible",
            gap=worst.gap,
            solve_seconds=sum(s.solve_seconds for s in schedules),
            runtime_factor=self.runtime_factor,
        )

    def timeline(self, schedules: list[GraphSchedule]) -> Timeline:
        return step_timeline(
            self.graphs, schedules, self.static_bytes, self.workspace, self.handoffs
        )

    def minimum(self) -> Schedule:
        """The leanest plan: every graph at its own minimum."""
        if self._minimum is None:
            self._minimum = self.combine([s.minimum() for s in self.solvers])
        return self._minimum.copy()

    def lowest_known(self) -> int:
        """The least step peak of a plan found so far: for a single graph, its solver's
        lowest answer (a budget's search may pass below the minimum); several graphs share
        each budget out anew, so there the minimum's."""
        if len(self.solvers) == 1:
            return self.combine([self.solvers[0].lowest()]).predicted_peak_bytes
        return self.minimum().predicted_peak_bytes

    def solve(self, budget_bytes: int) -> Schedule:
        """The fastest plan whose predicted step peak is at most `budget_bytes`."""
        started = time.perf_counter()
        if budget_bytes >= self.baseline.predicted_peak_bytes:
            chosen = self.baseline.copy()
        elif len(self.solvers) == 1:
            chosen = self.combine([self._solve_one(budget_bytes)])
        else:
            chosen = self._shared(budget_bytes)
        chosen.budget_bytes = int(budget_bytes)
        chosen.solve_seconds = time.perf_counter() - started
        return chosen

    def _solve_one(self, budget_bytes: int) -> GraphSchedule:
        """The single graph's answer within a step budget, refused in the step's bytes."""
        try:
            return self.solvers[0].solve(budget_bytes - self.unread_bytes)
        except BelowMinimum:
            raise self._below_minimum(budget_bytes, self.lowest_known()) from None

    def _below_minimum(self, budget_bytes: int, lowest: int) -> BelowMinimum:
        """The refusal of a budget under `lowest`, in the step's bytes and fractions."""
        return below_minimum(
            budget_bytes,
            lowest,
            "the feasible minimum",
            self.baseline.predicted_peak_bytes,
            self.fixed_bytes,
        )

    def pace(self, budgets: int) -> None:
        for solver in self.solvers:
            solver.pace(budgets)

    def swept(self, points: int) -> list[int] | None:
        """The budgets an earlier sweep solved: kept for a single graph only (a step of
        several graphs shares its budget out anew each time)."""
        if len(self.solvers) > 1:
            return None
        budgets = self.solvers[0].swept(points)
        return None if budgets is None else [b + self.unread_bytes for b in budgets]

    def remember_sweep(self, points: int, budgets: list[int]) -> None:
        if len(self.solvers) == 1:
            self.solvers[0].remember_sweep(points, [b - self.unread_bytes for b in budgets])

    def bound_unknown(self, budgets: list[int]) -> dict[int, float]:
        """Lower bounds for solved budgets without one (see Solver.bound_unknown): for a
        single graph only, whose budgets are the step's (several graphs share each budget
        out, and a step's gap is its worst graph's)."""
        if len(self.solvers) > 1:
            return {}
        unread = self.unread_bytes
        found = self.solvers[0].bound_unknown([b - unread for b in budgets])
        return {b + unread: bound for b, bound in found.items()}

    def _shared(self, budget: int) -> Schedule:
        """Several graphs: the largest common share of each graph's range that fits."""
        lowest = self.minimum()
        if lowest.predicted_peak_bytes > budget:
            raise self._below_minimum(budget, lowest.predicted_peak_bytes)
        best, lo, hi = lowest, 0.0, 1.0
        for _ in range(BISECTIONS):
            share = (lo + hi) / 2
            candidate = self._at_share(share)
            if candidate.predicted_peak_bytes <= budget:
                if candidate.predicted_seconds <= best.predicted_seconds:
                    best = candidate
                lo = share
            else:
                hi = share
        if best.predicted_seconds > self.baseline.predicted_seconds:
            best.status, best.gap = "feasible", 1.0  # an equal share is not proven best
        return best

    def _at_share(self, share: float) -> Schedule:
        picked = []
        for solver in self.solvers:
            low = solver.minimum().predicted_peak_bytes
            high = solver.baseline.predicted_peak_bytes
            picked.append(solver.solve(int(low + share * (high - low))))
        return self.combine(picked)
