"""Solve for a memory budget: the chain of stages, each distinct stage's ILP options (PuLP +
CBC), the dynamic program over the chain, and an exact check of the resulting program.

`Solver` does the expensive part once (ILPs and the table for every budget); `solve(budget)`
then only reads a schedule out of the table, compiles it, and simulates it. The table counts
memory conservatively; if the exact simulation of a schedule still exceeds the budget (shared
tensors, rounding), a smaller table budget is tried, so a returned schedule is always within
budget by the same accounting that `simulate` and the plots use.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace

from explorer.chain import Chain, Stage, build_chain
from explorer.errors import UserError
from explorer.graph import BACKWARD, EFFECT, FORWARD, Graph, ValueRef
from explorer.profile import Profile
from explorer.program import baseline_schedule, check_program, compile_program
from explorer.progress import CancelToken, ProgressFn, check_cancel, report
from explorer.rotor import ChainTable, Step, fresh_frontier_bytes, stage_costs
from explorer.schedule import GraphSchedule
from explorer.simulate import simulate
from explorer.stage_ilp import (
    StageOption,
    StageProblem,
    build_problem,
    keep_all_option,
    solve_option,
)
from explorer.units import format_bytes

KEEP_FRACTIONS = (0.0, 0.2, 0.4, 0.6, 0.8)
TABLE_UNITS = 600
TABLE_SPAN = 1.3  # the table covers 1.3x what no recomputation needs beyond the context


@dataclass
class SetupReport:
    """What preparing the solver cost."""

    stages: int
    distinct_stages: int
    ilps: int
    ilp_seconds: float
    table_seconds: float
    worst_gap: float = 0.0
    statuses: dict[str, int] = field(default_factory=dict)


class Solver:
    """Everything needed to answer "best schedule under B bytes" quickly, for any B."""

    def __init__(
        self,
        graph: Graph,
        profile: Profile,
        *,
        time_limit: float | None = None,
        max_stages: int = 48,
        progress: ProgressFn | None = None,
        cancel: CancelToken | None = None,
    ) -> None:
        self.graph = graph
        self.profile = profile
        self.seconds = profile.seconds
        self.fingerprint = graph.fingerprint()
        self.chain: Chain = build_chain(graph, self.seconds, max_stages)
        started = time.perf_counter()
        self.options = self._stage_options(time_limit, progress, cancel)
        _output_overlap(self.chain, self.options)
        ilp_seconds = time.perf_counter() - started
        started = time.perf_counter()
        self.baseline = self.evaluate(baseline_schedule(graph))
        self.context_bytes = self._context_bytes()
        grads = sum(stage.param_grad_bytes for stage in self.chain.stages)
        self.fixed_bytes = graph.static_bytes() + grads  # no schedule can go below this
        self.table = self._build_table()
        flat = [o for opts in self.options for o in opts]
        self.setup = SetupReport(
            stages=len(self.chain.stages),
            distinct_stages=self._distinct,
            ilps=self._ilps,
            ilp_seconds=ilp_seconds,
            table_seconds=time.perf_counter() - started,
            worst_gap=max((o.gap for o in flat), default=0.0),
            statuses={s: sum(1 for o in flat if o.status == s) for s in {o.status for o in flat}},
        )
        self._minimum: GraphSchedule | None = None

    # -- preparation -------------------------------------------------------------------------

    def _stage_options(self, time_limit, progress, cancel) -> list[list[StageOption]]:
        problems = [build_problem(self.chain, st, self.seconds) for st in self.chain.stages]
        solved: dict[str, tuple[StageProblem, list[StageOption]]] = {}
        distinct = list({p.signature: p for p in problems}.values())
        self._distinct, self._ilps = len(distinct), 0
        for k, problem in enumerate(distinct):
            check_cancel(cancel)
            solved[problem.signature] = (problem, self._solve_stage(problem, time_limit))
            report(progress, k + 1, len(distinct), f"stage ILPs {k + 1}/{len(distinct)}")
        return [_translate(solved[p.signature], p) for p in problems]

    def _solve_stage(self, problem: StageProblem, time_limit: float | None) -> list[StageOption]:
        keep_all = keep_all_option(problem)
        options = [keep_all]
        if keep_all.keep_bytes == 0:
            return options
        for fraction in KEEP_FRACTIONS:
            self._ilps += 1
            option = solve_option(problem, int(keep_all.keep_bytes * fraction), time_limit)
            if option is None:
                continue
            key = (option.keep_bytes, round(option.redo_seconds, 9), option.peak_bytes)
            if all(key != (o.keep_bytes, round(o.redo_seconds, 9), o.peak_bytes) for o in options):
                options.append(option)
        return options

    def _build_table(self) -> ChainTable:
        """The chain table over a span that reaches at least one schedule: its count is
        conservative, so where the weights dominate it may need more than TABLE_SPAN."""
        costs = stage_costs(self.chain, self.options)
        fresh = fresh_frontier_bytes(self.chain)
        needed = max(self.baseline.predicted_peak_bytes - self.context_bytes, 1)
        for widen in (1, 2, 4, 8):
            span = int(needed * TABLE_SPAN * widen)
            table = ChainTable(costs, fresh, -(-span // TABLE_UNITS), TABLE_UNITS)
            if table.min_units() is not None:
                break
        return table

    def _context_bytes(self) -> int:
        """Memory outside the table's control: static, pinned tensors, tangents."""
        tangents = sum(n.out_bytes for n in self.graph.placeholders("tangent"))
        return self.graph.static_bytes() + self.chain.bytes_of(self.chain.pinned) + tangents

    # -- answers -----------------------------------------------------------------------------

    def evaluate(self, schedule: GraphSchedule) -> GraphSchedule:
        """Fill in a schedule's predicted peak and time by compiling and simulating it."""
        base = getattr(self, "baseline", None)
        return evaluate(
            self.graph, self.profile, schedule, base.predicted_seconds if base else None
        )

    def minimum(self) -> GraphSchedule:
        """The leanest schedule found: the table's, or no recomputation if that is leaner."""
        if self._minimum is None:
            lowest = self.table.min_units()
            found = self._schedule_at(lowest) if lowest is not None else None
            if found is None or found.predicted_peak_bytes >= self.baseline.predicted_peak_bytes:
                found = self._copy(self.baseline)
            self._minimum = found
        return self._minimum

    def solve(self, budget_bytes: int) -> GraphSchedule:
        """The fastest schedule whose simulated peak is at most `budget_bytes`."""
        started = time.perf_counter()
        if budget_bytes >= self.baseline.predicted_peak_bytes:
            chosen = self._copy(self.baseline)
        else:
            chosen = self._within(budget_bytes)
        chosen.budget_bytes = int(budget_bytes)
        chosen.solve_seconds = time.perf_counter() - started
        return chosen

    def _within(self, budget: int) -> GraphSchedule:
        minimum = self.minimum()
        if minimum.predicted_peak_bytes > budget:
            raise UserError(
                f"budget {format_bytes(budget)} is below the feasible minimum "
                f"{format_bytes(minimum.predicted_peak_bytes)} "
                f"({minimum.predicted_peak_bytes} bytes)"
            )
        lo = self.table.min_units()
        hi = min(self.table.units, max(lo, (budget - self.context_bytes) // self.table.unit))
        candidate = self._schedule_at(hi)
        if candidate.predicted_peak_bytes <= budget:
            return candidate
        best = minimum
        hi -= 1
        while lo < hi:  # the table over-counts; find the largest table budget that fits
            mid = (lo + hi + 1) // 2
            candidate = self._schedule_at(mid)
            if candidate.predicted_peak_bytes <= budget:
                best, lo = candidate, mid
            else:
                hi = mid - 1
        return self._copy(best)

    def _schedule_at(self, units: int) -> GraphSchedule:
        steps = self.table.sequence(units)
        schedule = self.evaluate(
            _lower(self.graph, self.chain, self.options, steps, self.fingerprint)
        )
        used = [self.options[s.stage][s.option] for s in steps if s.kind == "backward"]
        schedule.gap = max((o.gap for o in used), default=0.0)
        schedule.status = "optimal" if all(o.status == "optimal" for o in used) else "feasible"
        return schedule

    @staticmethod
    def _copy(schedule: GraphSchedule) -> GraphSchedule:
        return GraphSchedule.from_dict(schedule.to_dict())


def evaluate(
    graph: Graph, profile: Profile, schedule: GraphSchedule, baseline_seconds: float | None = None
) -> GraphSchedule:
    """Fill in a schedule's predicted peak, time and recomputed operators by compiling and
    simulating it (the same accounting as the plots and verify's prediction)."""
    program = compile_program(graph, schedule)
    problem = check_program(graph, program)
    if problem is not None:
        raise RuntimeError(f"internal error: schedule does not run: {problem}")
    timeline = simulate(graph, program, profile.workspace)
    schedule.predicted_peak_bytes = timeline.peak_bytes
    names = [i.node for i in program.forward] + [i.node for i in program.backward]
    schedule.predicted_seconds = sum(profile.time_of(n) for n in names)
    schedule.baseline_seconds = baseline_seconds or schedule.predicted_seconds
    schedule.recomputed = list(dict.fromkeys(i.node for i in program.backward if i.recompute))
    return schedule


def _translate(solved: tuple[StageProblem, list[StageOption]], problem: StageProblem):
    """Options solved on one stage, restated for an identical stage."""
    source, options = solved
    if source is problem:
        return options
    position = {name: k for k, name in enumerate(source.stage.forward)}
    out = []
    for o in options:
        keep = [problem.values[source.index[ref]] for ref in o.keep]
        redo = [[problem.stage.forward[position[a]] for a in step] for step in o.redo]
        out.append(replace(o, keep=keep, redo=redo))
    return out


def _output_overlap(chain: Chain, options: list[list[StageOption]]) -> None:
    """Record, per option, the kept bytes that are also the stage's output frontier, so the
    table charges those tensors once."""
    for stage, opts in zip(chain.stages, options, strict=True):
        outputs = set(stage.outputs) - set(stage.inputs)
        for option in opts:
            option.output_bytes = chain.bytes_of([r for r in option.keep if r in outputs])


def _slice(graph: Graph, stage: Stage, targets: set[ValueRef], pinned: set[ValueRef]) -> list[str]:
    """The stage's recomputable forward nodes needed to make `targets`, in order."""
    own = {name: k for k, name in enumerate(stage.forward)}
    needed: set[str] = set()
    stack = [ref[0] for ref in targets if ref[0] in own]
    while stack:
        name = stack.pop()
        if name in needed or any(ref[0] == name for ref in pinned):
            continue
        needed.add(name)
        stack.extend(r[0] for r in graph.node(name).inputs if r[0] in own)
    return [name for name in stage.forward if name in needed]


def _lower(
    graph: Graph, chain: Chain, options, steps: list[Step], fingerprint: str
) -> GraphSchedule:
    """Turn the table's stage steps into node lists: the saved set and the backward order."""
    pinned = set(chain.pinned)
    first_backward = next(k for k, s in enumerate(steps) if s.kind == "backward")
    order: list[str] = []
    for step in steps[first_backward:]:
        stage = chain.stages[step.stage]
        if step.kind == "forward":
            order += _slice(graph, stage, set(stage.outputs), pinned)
        elif step.kind == "forward_keep":
            keep = set(options[step.stage][step.option].keep)
            order += _slice(graph, stage, set(stage.outputs) | keep, pinned)
        else:
            plan = options[step.stage][step.option].redo
            for redo, name in zip(plan, stage.backward, strict=True):
                order += redo
                order.append(name)
    # backward operators the chain did not place (none expected) still run, in traced order
    placed = set(order)
    order += [n.name for n in graph.nodes if n.phase == BACKWARD and n.name not in placed]
    return GraphSchedule(fingerprint, _saved_by_liveness(graph, order), order)


def _saved_by_liveness(graph: Graph, order: list[str]) -> list[ValueRef]:
    """Forward values the backward reads before (or without) making them again."""
    made_again: set[ValueRef] = set()
    saved: list[ValueRef] = []
    seen: set[ValueRef] = set()
    for name in order:
        node = graph.node(name)
        for ref in node.inputs:
            producer = graph.node(ref[0])
            if producer.phase in (FORWARD, EFFECT) and ref not in made_again and ref not in seen:
                seen.add(ref)
                saved.append(ref)
        made_again.update((name, i) for i in range(len(node.outputs)))
    return saved
