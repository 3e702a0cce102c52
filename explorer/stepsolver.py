"""Plans for a training step of one or more captured graphs (explorer.step), one solver per
graph.

`StepSolver` answers "fastest step plan within B bytes" with one solver per graph: first every
graph gets the same share of its own range (minimum to no recomputation), the largest share
whose combined peak fits; then the fastest combination of each graph's options (the schedules
its solver knows, and those that save less: explorer.solvers.saving) whose step fits, if
faster; then each graph in turn faster where the step still fits; then recomputations of any
graph dropped where the step's peak allows (explorer.solvers.dropping). Its least peak is
searched over the step (`minimum`). Its plans are bounded by the better of the sum of each
graph's bounds at the most that graph may peak at within the step's budget (`graph_budget`)
and the floor's LP over all the graphs (explorer.solvers.joint).
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from functools import cached_property

from explorer.eagerpeaks import EagerPeaks
from explorer.errors import BelowMinimum
from explorer.graph import Graph
from explorer.program import Handoff
from explorer.progress import CancelToken
from explorer.schedule import GraphSchedule, Schedule
from explorer.simulate import Timeline
from explorer.solvers.dropping import drop_pass
from explorer.solvers.joint import JointFloor
from explorer.solvers.saving import saved_limited, stage_mixes
from explorer.step import (
    backward_constants,
    eager_throughout,
    output_storage_bytes,
    param_grad_bytes,
    step_timeline,
    unreached_grads,
)
from explorer.units import below_minimum

BISECTIONS = 16  # shares tried when several graphs split a budget
MAX_PAIRINGS = 1000  # combinations of the graphs' known schedules tried for one budget
LEANEST_ROUNDS = 4  # rounds of one graph at a time changed for the least step peak
DROP_SECONDS = 1.0  # the drop pass's for one budget, all its starts (explorer.solvers.dropping)
JOINT_SECONDS = 2.0  # the joint floor's LPs for one call of bound_unknown (one LP at least)


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
    table_budgets: bool = False  # whether a graph's sweep keeps the table's answers (SetupReport)

    def to_dict(self) -> dict:
        return dict(self.__dict__)


class StepSolver:
    """Plans for a whole step from one prepared solver per graph (see the module docstring).

    Each per-graph solver offers `baseline`, `minimum()`, `solve(budget)` (a GraphSchedule
    whose simulated peak is within the budget) and `fixed_bytes`. `solver_of` gives, for each
    graph of the step, its solver: a graph the step runs several times (one pass of a loop
    each) has one solver and one schedule for all its runs, as the runtime has; by default
    one solver per graph."""

    def __init__(
        self,
        graphs: list[Graph],
        solvers: list,
        static_bytes: int,
        workspace: list[dict[str, int]] | None = None,
        handoffs: list[Handoff] | None = None,
        *,
        runtime_factor: float = 1.0,
        runtime_seconds: float | None = None,
        graph_seconds: float | None = None,
        solver_of: list[int] | None = None,
        moments: list[EagerPeaks] | None = None,
        gradients_held: bool = False,
    ) -> None:
        self.graphs = graphs
        self.solver_of = solver_of or list(range(len(graphs)))
        self.runs = [self.solver_of.count(k) for k in range(len(solvers))]
        self.single = len(graphs) == 1  # the step is that graph's own simulation
        self.runtime_factor = runtime_factor  # the profile's (explorer.stepcost)
        self.runtime_seconds = runtime_seconds  # likewise (explorer.schedule.Schedule)
        self.graph_seconds = graph_seconds
        self.solvers = solvers
        self.workspace = workspace
        self.handoffs = handoffs
        self.moments = moments  # per run (explorer.eagerpeaks)
        self.gradients_held = gradients_held
        self.fingerprint = "+".join(g.fingerprint() for g in graphs)
        handed = handoffs or [Handoff()] * len(graphs)
        grads = sum(
            param_grad_bytes(g, h) + h.eager.grads for g, h in zip(graphs, handed, strict=True)
        )
        # a step that starts with the gradients an earlier one left (gradient accumulation)
        # holds them throughout, and autograd adds into them in place
        self.static_bytes = static_bytes + (grads if gradients_held else 0)
        # gradients the autograd graph does not show, made in the backward (the safe side for
        # one graph: counted at every operator)
        unreached = unreached_grads(moments or [], -1)
        # one graph: what the step holds beyond what that graph's own simulation counts
        # (model state no graph reads, what eager code before the graph saves for the
        # backward); its solver plans in its own bytes, a step budget less these
        self.beyond_graph_bytes = (
            self.static_bytes
            - graphs[0].static_bytes()
            + eager_throughout(handed[0].eager)
            + unreached
            if self.single
            else 0
        )
        self._memo: dict = {}  # the runs' programs and simulations (step_timeline)
        every_run = moments or [EagerPeaks()] * len(graphs)
        self.backward_constants = backward_constants(graphs, handed, every_run)
        self.baseline = self.combine([s.baseline for s in solvers])
        single_fixed = solvers[0].fixed_bytes + self.beyond_graph_bytes
        self.fixed_bytes = single_fixed if self.single else self.static_bytes + grads + unreached
        self._minimum: Schedule | None = None
        self._saving: dict[int, list[GraphSchedule]] = {}  # per solver (`options`)

    @contextmanager
    def cancelled_by(self, cancel: CancelToken | None) -> Iterator[None]:
        """Every graph's solver stops at `cancel` for the calls made inside (see
        explorer.solve.Solver.cancelled_by)."""
        with ExitStack() as stack:
            for solver in self.solvers:
                stack.enter_context(solver.cancelled_by(cancel))
            yield

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
            table_budgets=any(p.table_budgets for p in parts),
        )

    def combine(self, schedules: list[GraphSchedule]) -> Schedule:
        """One step plan from one schedule per solver, with the step's predicted figures."""
        for graph, schedule in zip(self.graphs, self.each_graph(schedules), strict=True):
            schedule.structure = graph.structure()  # the runtime matches resized graphs by it
            schedule.unread_tangents = list(graph.unread_tangents)
        timeline = self.timeline(self.each_graph(schedules))
        worst = max(schedules, key=lambda s: s.gap)
        return Schedule(
            graphs=self.each_graph(schedules),
            predicted_peak_bytes=timeline.peak_bytes,
            predicted_seconds=self._seconds(s.predicted_seconds for s in schedules),
            baseline_seconds=self._seconds(s.baseline_seconds for s in schedules),
            status="optimal" if all(s.status == "optimal" for s in schedules) else "feasible",
            gap=worst.gap,
            solve_seconds=sum(s.solve_seconds for s in schedules),
            runtime_factor=self.runtime_factor,
            runtime_seconds=self.runtime_seconds,
            graph_seconds=self.graph_seconds,
        )

    def each_graph(self, schedules: list[GraphSchedule]) -> list[GraphSchedule]:
        """One schedule per solver, as one per graph of the step."""
        return [schedules[k] for k in self.solver_of]

    def _seconds(self, per_solver) -> float:
        """A step's seconds from each solver's graph's: a graph run n times costs n runs."""
        return sum(n * seconds for n, seconds in zip(self.runs, per_solver, strict=True))

    def timeline(self, schedules: list[GraphSchedule], labelled: bool = True) -> Timeline:
        """Bytes alive after each operator of the step, one schedule per graph (`labelled`:
        False for the bytes alone, see step_timeline)."""
        return step_timeline(
            self.graphs,
            schedules,
            self.static_bytes,
            self.workspace,
            self.handoffs,
            self.moments,
            layout_copies=not self.gradients_held,
            memo=None if self.single else self._memo,
            labelled=labelled,
            constants=self.backward_constants,
        )

    def peak(self, schedules: list[GraphSchedule]) -> int:
        """The step's peak bytes, one schedule per graph."""
        return self.timeline(schedules, labelled=False).peak_bytes

    def minimum(self) -> Schedule:
        """The leanest plan found. One graph: its solver's minimum. Several: a graph's own
        least peak is not the step's, for what a graph's forward saves is alive through the
        later graphs (a graph that saves less at the same own peak lowers the step's, and
        so may one that recomputes nothing where its own peak is not the step's); so from
        every graph at its own minimum, each graph in turn takes the option (`options`)
        that lowers the step's peak most, until none does (`_leanest`), and then drops what
        its recomputations need not run at that peak (explorer.solvers.dropping)."""
        if self._minimum is None:
            picks = [s.minimum() for s in self.solvers]
            if not self.single:
                picks = self._leanest(picks)
                deadline = time.perf_counter() + DROP_SECONDS
                picks = drop_pass(self, picks, self.peak(self.each_graph(picks)), deadline)
            self._minimum = self.combine(picks)
        return self._minimum.copy()

    def _leanest(self, picks: list[GraphSchedule]) -> list[GraphSchedule]:
        """`picks` (one schedule per solver) changed one graph at a time to the option that
        lowers the step's peak most (then its seconds), for LEANEST_ROUNDS rounds at most."""

        def rank(trial: list[GraphSchedule]) -> tuple[int, float]:
            peak = self.peak(self.each_graph(trial))
            return peak, self._seconds(s.predicted_seconds for s in trial)

        options = [self.options(n) for n in range(len(self.solvers))]
        best = rank(picks)
        for _ in range(LEANEST_ROUNDS):
            improved = False
            for n, choices in enumerate(options):
                for option in choices:
                    trial = [*picks[:n], option, *picks[n + 1 :]]
                    ranked = rank(trial)
                    if ranked < best:
                        best, picks, improved = ranked, trial, True
            if not improved:
                break
        return picks

    def options(self, n: int) -> list[GraphSchedule]:
        """What solver `n`'s graph may run, for a step of several graphs to combine: the
        schedules its solver knows (the fastest for their own peak), and those that save
        less through the later graphs for their seconds (explorer.solvers.saving)."""
        if n not in self._saving:
            solver = self.solvers[n]
            self._saving[n] = [*stage_mixes(solver), *saved_limited(solver)]
        known = self.solvers[n].known()
        seen = {(tuple(s.saved), tuple(s.backward)) for s in known}
        more = [s for s in self._saving[n] if (tuple(s.saved), tuple(s.backward)) not in seen]
        return [*known, *(GraphSchedule.from_dict(s.to_dict()) for s in more)]

    def lowest_known(self) -> int:
        """The least step peak of a plan found so far: for a single graph, its solver's
        lowest answer (a budget's search may pass below the minimum); several graphs share
        each budget out anew, so there the minimum's."""
        if self.single:
            return self.combine([self.solvers[0].lowest()]).predicted_peak_bytes
        return self.minimum().predicted_peak_bytes

    def solve(self, budget_bytes: int, alone: bool = False, search: bool = True) -> Schedule:
        """The fastest plan whose predicted step peak is at most `budget_bytes`. `alone`: the
        budget is asked by itself, not as one of a sweep's (Solver.solve_alone: a large
        graph searches it longer); `search`: False to answer from what is
        known (`recall`)."""
        started = time.perf_counter()
        if budget_bytes >= self.baseline.predicted_peak_bytes:
            chosen = self.baseline.copy()
        elif self.single:
            chosen = self.combine([self._solve_one(budget_bytes, alone, search)])
        else:
            chosen = self._shared(budget_bytes, search, alone)
        chosen.budget_bytes = int(budget_bytes)
        chosen.solve_seconds = time.perf_counter() - started
        return chosen

    def recall(self, budget_bytes: int) -> Schedule | None:
        """A budget solved before, answered again from every schedule found since, without a
        search (Solver.recall); None for several graphs, whose budgets are shared out anew
        (answered again, a 2-layer GPT-2's sweep took 7.5 s more and found nothing faster)."""
        return self.solve(budget_bytes, search=False) if self.single else None

    def _solve_one(
        self, budget_bytes: int, alone: bool = False, search: bool = True
    ) -> GraphSchedule:
        """The single graph's answer within a step budget, refused in the step's bytes. The
        solver plans in its graph's bytes with everything beyond them counted at every
        operator (the safe side); the step's own timeline counts what eager code holds in
        the backward only there, so its least peak can be under the solver's plus that, when
        it lies in the forward: the solver's lowest schedule then answers the budgets
        between (a sweep starts from that least peak)."""
        solver = self.solvers[0]
        try:
            if alone:
                return solver.solve_alone(budget_bytes - self.beyond_graph_bytes)
            return solver.solve(budget_bytes - self.beyond_graph_bytes, search=search)
        except BelowMinimum:
            lowest = solver.lowest()
            if self.combine([lowest]).predicted_peak_bytes <= budget_bytes:
                return lowest
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

    def pace(self, budgets: int, in_holes: bool = False) -> None:
        for solver in self.solvers:
            solver.pace(budgets, in_holes)

    def swept(self, points: int) -> list[int] | None:
        """The budgets an earlier sweep solved: kept for a single graph only (a step of
        several graphs shares its budget out anew each time)."""
        if not self.single:
            return None
        budgets = self.solvers[0].swept(points)
        return None if budgets is None else [b + self.beyond_graph_bytes for b in budgets]

    def remember_sweep(self, points: int, budgets: list[int]) -> None:
        if self.single:
            self.solvers[0].remember_sweep(points, [b - self.beyond_graph_bytes for b in budgets])

    def bound_unknown(self, budgets: list[int]) -> dict[int, float]:
        """Lower bounds for solved budgets without one (see Solver.bound_unknown). A single
        graph's budgets are the step's; several graphs share each budget out, so there the
        step's bound is the better of two: the sum over the runs of each graph's bound at
        the most it may peak at (`graph_budget`), and the joint floor's (explorer.solvers.
        joint), which counts what earlier graphs save through the later ones."""
        if self.single:
            beyond = self.beyond_graph_bytes
            found = self.solvers[0].bound_unknown([b - beyond for b in budgets])
            return {b + beyond: bound for b, bound in found.items()}
        asked = {b: [self.graph_budget(k, b) for k in range(len(self.graphs))] for b in budgets}
        bounds = [
            solver.bounds_within([within[k] for within in asked.values() for k in self._runs_of(n)])
            for n, solver in enumerate(self.solvers)
        ]
        joint = self.joint_floor.bounds(list(asked), JOINT_SECONDS)
        found = {}
        for budget, within in asked.items():
            runs = zip(self.solver_of, within, strict=True)
            total = sum(bounds[n].get(graph_budget, 0.0) for n, graph_budget in runs)
            total = max(total, joint.get(budget, 0.0))
            if total > 0.0:
                found[budget] = total
        return found

    @cached_property
    def joint_floor(self) -> JointFloor:
        """Several graphs: the floor's LP over all of them (explorer.solvers.joint)."""
        return JointFloor(
            [solver.floor for solver in self.solvers],
            self.solver_of,
            [-self.graph_budget(run, 0) for run in range(len(self.graphs))],
            [solver.baseline.predicted_peak_bytes for solver in self.solvers],
            self.baseline.predicted_peak_bytes,
        )

    @cached_property
    def _joint_least_peak(self) -> int | None:
        """The joint floor's least peak (None: not solved in JOINT_SECONDS)."""
        return self.joint_floor.least_peak(JOINT_SECONDS)

    def graph_budget(self, run: int, budget: int) -> int:
        """The most bytes that run `run`'s graph may peak at, as its own solver counts
        (`evaluate`: everything the graph reads counted throughout as static, no handoff),
        in a step that peaks at `budget` at most. Above their static bytes, the step counts
        the run's operators as that simulation does, or more (what the step's other parts
        count of them), on top of its own static bytes and of what other graphs and eager
        code hold (zero or more; through the backward at least `backward_constants`); but
        after the forward the step may let go of the graph's outputs (passed on to a later
        graph, or dropped), which the graph's own count keeps. So the graph peaks at most at
        the step's budget, less the step's static bytes, plus its own static bytes and
        whatever of its outputs the backward's constant bytes do not cover. Checked on
        sampled pairings of schedules of twelve steps (tests/test_several_graphs.py)."""
        graph = self.graphs[run]
        uncovered = max(0, output_storage_bytes(graph) - self.backward_constants[run])
        return budget - self.static_bytes + graph.static_bytes() + uncovered

    def _runs_of(self, solver: int) -> list[int]:
        """The runs of the step whose graph `solver` plans."""
        return [k for k, n in enumerate(self.solver_of) if n == solver]

    def peak_floor(self) -> int | None:
        """Step bytes under which no plan of the solver's space peaks (see
        Solver.peak_floor). Several graphs: the higher of the joint floor's least peak
        (explorer.solvers.joint) and the highest step peak that a run's graph at its own
        floor implies (`graph_budget` the other way round); None if neither is known."""
        if self.single:
            floor = self.solvers[0].peak_floor()
            return None if floor is None else floor + self.beyond_graph_bytes
        implied = []
        for run, n in enumerate(self.solver_of):
            floor = self.solvers[n].peak_floor()  # kept in the solver's cache once found
            if floor is not None:
                implied.append(floor - self.graph_budget(run, 0))
        joint = self._joint_least_peak
        known = [*implied, *([] if joint is None else [joint])]
        return max(known) if known else None

    def _shared(self, budget: int, search: bool = True, alone: bool = False) -> Schedule:
        """Several graphs: the largest common share of each graph's range that fits, from
        the schedules known (`_bisected`); then, where `search`, one search per graph at that
        share's budgets (`alone`: each asked by itself, Solver.solve_alone), and the share
        bisected again over what those searches found; then the fastest pairing of the
        graphs' options that fits (`_faster_apart`), each graph in turn faster (`_descend`),
        and recomputations dropped (`_dropped`). One search per graph and budget spends each
        graph's refinement time as its solver paces it (`pace`): searched at every share
        tried, a 2-layer GPT-2's lowest budget took all of its first graph's time and left
        the later budgets none."""
        lowest = self.minimum()
        if lowest.predicted_peak_bytes > budget:
            raise self._below_minimum(budget, lowest.predicted_peak_bytes)
        share, best = self._bisected(budget, lowest)
        if search:
            for solver, graph_budget in zip(self.solvers, self._share_budgets(share), strict=True):
                if alone:
                    solver.solve_alone(graph_budget)
                else:
                    solver.solve(graph_budget)
            _, best = self._bisected(budget, best)
        options = self._options_by_seconds()
        best = self._descend(self._faster_apart(best, budget, options), budget, options)
        best = self._dropped(best, budget)
        if best.predicted_seconds > self.baseline.predicted_seconds:
            best.status, best.gap = "feasible", 1.0  # a shared budget is not proven best
        return best

    def _bisected(self, budget: int, fallback: Schedule) -> tuple[float, Schedule]:
        """The largest share of every graph's range (BISECTIONS halvings) whose known
        schedules, combined, fit `budget`, and the fastest plan among the shares tried that
        fit (`fallback` if none is faster). A larger share need not peak higher in the step
        (a graph's faster schedule may save more through the later graphs), so the share
        found is where to search, and the pairings tried after it (`_faster_apart`) decide."""
        best, lo, hi = fallback, 0.0, 1.0
        for _ in range(BISECTIONS):
            share = (lo + hi) / 2
            candidate = self._at_share(share)
            if candidate.predicted_peak_bytes <= budget:
                if candidate.predicted_seconds <= best.predicted_seconds:
                    best = candidate
                lo = share
            else:
                hi = share
        return lo, best

    def _options_by_seconds(self) -> list[list[GraphSchedule]]:
        """Each solver's `options`, the fastest first."""
        return [
            sorted(self.options(n), key=lambda g: g.predicted_seconds)
            for n in range(len(self.solvers))
        ]

    def _faster_apart(
        self, plan: Schedule, budget: int, options: list[list[GraphSchedule]]
    ) -> Schedule:
        """The fastest combination of the schedules each graph's solver knows whose step
        fits, if faster than `plan`: tried in ascending total seconds (best first), so the
        first that fits is the fastest of them; at most MAX_PAIRINGS tried. An equal share of
        each range is rarely where the step is fastest: a two-graph CNN (tests/test_backend.py)
        costs +11.4% with equal shares from half its range up, +8.9% given apart. `options`:
        each solver's, the fastest first (`_options_by_seconds`)."""

        def seconds(index: tuple[int, ...]) -> float:
            return self._seconds(options[k][i].predicted_seconds for k, i in enumerate(index))

        first = (0,) * len(options)
        queue, seen = [(seconds(first), first)], {first}
        for _ in range(MAX_PAIRINGS):
            if not queue or queue[0][0] >= plan.predicted_seconds:
                break
            _, index = heapq.heappop(queue)
            picks = [options[k][i] for k, i in enumerate(index)]
            if self.peak(self.each_graph(picks)) <= budget:
                return self.combine(picks)  # known() gave copies
            for k in range(len(index)):
                after = (*index[:k], index[k] + 1, *index[k + 1 :])
                if after[k] < len(options[k]) and after not in seen:
                    seen.add(after)
                    heapq.heappush(queue, (seconds(after), after))
        return plan

    def _descend(self, plan: Schedule, budget: int, options: list[list[GraphSchedule]]) -> Schedule:
        """`plan` with one graph at a time changed to its fastest option (`options`, as
        `_faster_apart` takes them) that keeps the step within `budget`, until none is faster
        (LEANEST_ROUNDS rounds at most): where the pairings `_faster_apart` tries run out
        before one fits, or none fits, the plan is still made faster graph by graph."""
        picks = self._picks(plan)
        best = self._seconds(s.predicted_seconds for s in picks)
        changed = False
        for _ in range(LEANEST_ROUNDS):
            improved = False
            for n, choices in enumerate(options):
                for option in choices:
                    trial = [*picks[:n], option, *picks[n + 1 :]]
                    seconds = self._seconds(s.predicted_seconds for s in trial)
                    if seconds >= best:
                        break  # the rest are no faster
                    if self.peak(self.each_graph(trial)) <= budget:
                        picks, best, improved = trial, seconds, True
                        break
            changed |= improved
            if not improved:
                break
        return self.combine(picks) if changed else plan

    def _dropped(self, plan: Schedule, budget: int) -> Schedule:
        """The fastest plan the drop pass (explorer.solvers.dropping) reaches within `budget`
        from `plan`, from every graph running again all it can (`_everything`) and from the
        least peak's plan, each where its step fits: DROP_SECONDS for them all; `plan` if
        none is faster. One graph's drops can make room for another's: from the plan alone a
        loop's step stayed 1.25 times the best pairing's seconds at one budget and 1.49 at
        another, where from all three it is 1.13 and 1.01 (tests/test_several_graphs.py)."""
        deadline = time.perf_counter() + DROP_SECONDS
        best = plan
        for start in (self._picks(plan), self._everything, self._picks(self.minimum())):
            if start is None or self.peak(self.each_graph(start)) > budget:
                continue
            picks = drop_pass(self, start, budget, deadline)
            if self._seconds(s.predicted_seconds for s in picks) < best.predicted_seconds:
                best = self.combine([GraphSchedule.from_dict(s.to_dict()) for s in picks])
        return best

    def _picks(self, plan: Schedule) -> list[GraphSchedule]:
        """One schedule per solver, from a step plan's one per graph."""
        return [plan.graphs[self.solver_of.index(n)] for n in range(len(self.solvers))]

    @cached_property
    def _everything(self) -> list[GraphSchedule] | None:
        """Every graph running again all it can before each stage (Space.everything), the
        costliest start of the drop pass; None if a graph's lowering cannot run it."""
        try:
            return [solver.schedule_of(solver.space.everything()) for solver in self.solvers]
        except RuntimeError:
            return None

    def _share_budgets(self, share: float) -> list[int]:
        """Each solver's budget at `share` of its range (its minimum to no recomputation)."""
        budgets = []
        for solver in self.solvers:
            low = solver.minimum().predicted_peak_bytes
            high = solver.baseline.predicted_peak_bytes
            budgets.append(int(low + share * (high - low)))
        return budgets

    def _at_share(self, share: float) -> Schedule:
        """The step plan of each graph's fastest known schedule at `share` of its range."""
        budgets = self._share_budgets(share)
        return self.combine(
            [s.solve(b, search=False) for s, b in zip(self.solvers, budgets, strict=True)]
        )
