"""Sweep budgets from the feasible minimum to the no-recompute peak; keep the Pareto front.

A front is plain data: it saves to JSON (`front.json`, see docs/DESIGN.md) with every point's
schedule inside, so exporting a point later needs neither the model nor a re-solve.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from explorer.errors import UserError
from explorer.files import (
    optional_count,
    optional_seconds,
    optional_share,
    read_json,
    write_atomic,
)
from explorer.pagefaults import front_fault_note
from explorer.progress import CancelToken, ProgressFn, check_cancel, report
from explorer.schedule import Schedule
from explorer.solve import LARGE_SWEEP_TOTAL, Solver
from explorer.solvers.answers import relative_gap
from explorer.timingcheck import timing_note
from explorer.units import below_minimum, format_bytes, parse_budget

SCHEMA = 2
# the runtime's own cost, with nothing recomputed, that the front puts in words: the
# accuracy its predictions aim at (3 points)
RUNTIME_NOTE_SHARE = 0.03


@dataclass
class FrontPoint:
    """One solved budget."""

    budget_bytes: int
    predicted_peak_bytes: int
    predicted_overhead: float
    solve_seconds: float
    gap: float
    status: str
    recomputed: list[str]
    schedule: Schedule

    @classmethod
    def of(cls, schedule: Schedule) -> FrontPoint:
        return cls(
            budget_bytes=int(schedule.budget_bytes or schedule.predicted_peak_bytes),
            predicted_peak_bytes=schedule.predicted_peak_bytes,
            predicted_overhead=schedule.predicted_overhead,
            solve_seconds=schedule.solve_seconds,
            gap=schedule.gap,
            status=schedule.status,
            recomputed=list(schedule.recomputed),
            schedule=schedule,
        )

    def to_dict(self) -> dict:
        return {
            "budget_bytes": self.budget_bytes,
            "predicted_peak_bytes": self.predicted_peak_bytes,
            "predicted_overhead": self.predicted_overhead,
            "solve_seconds": self.solve_seconds,
            "gap": self.gap,
            "status": self.status,
            "recomputed": self.recomputed,
            "schedule": self.schedule.to_dict(),
        }


@dataclass
class Front:
    """Pareto-optimal schedules, ascending in peak (and so descending in overhead)."""

    model: dict
    fingerprint: str
    baseline_peak_bytes: int
    baseline_step_seconds: float
    fixed_bytes: int  # parameters, buffers, inputs and parameter gradients
    points: list[FrontPoint]
    setup: dict = field(default_factory=dict)
    runtime_factor: float = 1.0  # the runtime's no-recompute step over the unmodified model's
    # bytes under which no schedule of the solver's space peaks (None: not known)
    peak_floor_bytes: int | None = None
    # the model's own step, run as it is, measured when profiling (explorer.unmodified; None:
    # not measured, as for a front planned for a device by name)
    unmodified_peak_bytes: int | None = None
    # the gradients, of zeros, that the compiled step makes from outputs the loss leaves
    # unread and eager PyTorch does not make (explorer.unread; 0: none, or not counted)
    unread_gradient_bytes: int = 0
    # the unmodified step's page faults and seconds, as profiling timed it on the CPU
    # (explorer.stepcost; None: not counted, as on CUDA or for a front planned by name)
    unmodified_faults: int | None = None
    unmodified_step_seconds: float | None = None
    # the runtime's no-recompute step when profiled: its seconds inside its graphs, and the
    # spread of the timed rounds' ratios (explorer.timingcheck; None: not measured)
    runtime_graph_seconds: float | None = None
    timing_spread: float | None = None
    context: object | None = field(default=None, repr=False)

    def at_budget(self, budget: int | str | float) -> Schedule:
        """The least-overhead solved point whose predicted peak fits `budget`."""
        limit = parse_budget(budget, self.baseline_peak_bytes, self.fixed_bytes)
        fitting = [p for p in self.points if p.predicted_peak_bytes <= limit]
        if not fitting:
            lowest = min(p.predicted_peak_bytes for p in self.points)
            raise below_minimum(
                limit, lowest, "the front's minimum", self.baseline_peak_bytes, self.fixed_bytes
            )
        best = min(fitting, key=lambda p: (p.predicted_overhead, p.predicted_peak_bytes))
        chosen = best.schedule.copy()
        chosen.context = self.context
        return chosen

    def nothing_lower(self) -> str | None:
        """Why the front stops at no recomputation, in words, where no point has a lower peak
        (None otherwise): how much of that peak is the floor every schedule holds, so that a
        user sees whether the step has activations worth planning at this size."""
        if any(p.predicted_peak_bytes < self.baseline_peak_bytes for p in self.points):
            return None
        peak, floor = self.baseline_peak_bytes, min(self.fixed_bytes, self.baseline_peak_bytes)
        return (
            f"no schedule found has a lower peak than no recomputation: {format_bytes(floor)} "
            f"of its {format_bytes(peak)} ({floor / peak:.0%}) are parameters, buffers, inputs "
            "and parameter gradients, which every schedule holds; a larger batch or input "
            "gives recomputation more to save"
        )

    def floor_note(self) -> str | None:
        """How far the least peak found is from the proven floor, in words (None when no
        floor is known or nothing recomputes)."""
        floor = self.peak_floor_bytes
        lowest = min(p.predicted_peak_bytes for p in self.points)
        if floor is None or lowest >= self.baseline_peak_bytes:
            return None
        above = (lowest - floor) / floor if floor else float("inf")
        return (
            f"least peak {format_bytes(lowest)}: no schedule in the solver's backward order "
            f"peaks under {format_bytes(floor)}, so the lowest possible is at most "
            f"{above:.2%} below it"
        )

    def notes(self) -> list[str]:
        """What is said under the front, in words, where it holds: how far its least peak is
        from the floor, that its points are the table's answers, points above the unmodified
        model, what the runtime costs with nothing recomputed, the unmodified step's page
        faults, and timings that other work on the machine disturbed."""
        found = (
            self.timing_note(),
            self.floor_note(),
            self.table_note(),
            self.unmodified_note(),
            self.runtime_note(),
            self.faults_note(),
        )
        return [note for note in found if note]

    def timing_note(self) -> str | None:
        """Where the profile's timings look disturbed by other work on the machine, in
        words (explorer.timingcheck); None otherwise or where not measured."""
        return timing_note(
            self.runtime_graph_seconds, self.baseline_step_seconds, self.timing_spread
        )

    def runtime_note(self) -> str | None:
        """Where the wrapped model's step with nothing recomputed was timed 3% or more off
        the unmodified model's when profiling, in words: every point's overhead includes it,
        so the no-recompute point's is not 0 (efficientnet_b0 b4 64 px: +6.9%)."""
        share = self.runtime_factor - 1.0
        if abs(share) < RUNTIME_NOTE_SHARE:
            return None
        return (
            f"with nothing recomputed, the wrapped model's step was timed at {share:+.1%} "
            "against the unmodified model's when profiled (its compiled graphs and the work a "
            "wrapped call does around them); every point's overhead includes it"
        )

    def faults_note(self) -> str | None:
        """Where the unmodified step spent a notable share of its time faulting pages in when
        profiled, in words (explorer.pagefaults); None otherwise or where not counted."""
        if self.unmodified_faults is None or self.unmodified_step_seconds is None:
            return None
        return front_fault_note(self.unmodified_faults, self.unmodified_step_seconds)

    def unmodified_note(self) -> str | None:
        """Where points peak above the model run as it is (measured when profiling), in
        words: every point, or those that recompute (slower and larger than no plan); None
        when none does or it was not measured."""
        line = self.unmodified_peak_bytes
        if line is None:
            return None
        why = "; ".join(self.why_above_unmodified())
        why = f": {why}" if why else ""
        lowest = min(p.predicted_peak_bytes for p in self.points)
        if lowest > line:
            return (
                f"every point peaks above the unmodified model's {format_bytes(line)} "
                f"(measured when profiling), so none saves memory against it{why}"
            )
        if not any(self.above_unmodified(p.schedule) for p in self.points):
            return None
        return (
            f"points above {format_bytes(line)}, the unmodified model's peak (measured when "
            "profiling), need more memory than the model run as it is, and those that "
            f"recompute more time too: choose a budget under it{why}"
        )

    def why_above_unmodified(self) -> list[str]:
        """What the compiled step holds that the unmodified one does not, in words, where
        the front knows it: held gradients, or gradients of outputs the loss leaves unread."""
        why = []
        if self.model.get("gradients_held"):
            why.append(
                "a step that adds to held gradients gets every new one at the compiled "
                "backward's end, where eager PyTorch adds each into .grad as it is made"
            )
        if self.unread_gradient_bytes:
            why.append(
                "the loss leaves outputs unread that another run of their compiled graph "
                "reads (a loop's pass), so the compiled backward still makes a gradient, of "
                f"zeros, for the {format_bytes(self.unread_gradient_bytes)} of parameters and "
                "inputs only they reach, where eager PyTorch makes none; plan and train the "
                "model without those outputs"
            )
        return why

    def above_unmodified(self, schedule: Schedule) -> bool:
        """Whether `schedule` (one of this front's, or searched for its step) needs more
        memory than the model run as it is, as `unmodified_note` counts points: it peaks
        above that line and recomputes, or no point of the front is under it. A schedule
        that recomputes nothing a few bytes above it is the compiled step's own layout."""
        line = self.unmodified_peak_bytes
        if line is None or schedule.predicted_peak_bytes <= line:
            return False
        lowest = min(p.predicted_peak_bytes for p in self.points)
        return bool(schedule.recomputed) or lowest > line

    def table_note(self) -> str | None:
        """Where the sweep searched only the least peak (a step too large to search every
        budget in its time: explorer.solve.LARGE_SWEEP_TOTAL), what would search the rest,
        in words; None otherwise."""
        if not self.setup.get("table_budgets"):
            return None
        size = self.setup.get("milp_size", 0)
        return (
            f"points but the least peak are the chain table's answers (the step has {size:,} "
            "recomputation binaries, too many to search every budget in the sweep's time); a "
            'budget asked by itself (export --search, Planner.solve, "Solve this budget") is '
            f"searched, and REMAT_EXPLORER_SEARCH_SECONDS={LARGE_SWEEP_TOTAL:g} has a sweep "
            "search every budget"
        )

    def to_dict(self) -> dict:
        return {
            "schema": SCHEMA,
            "model": self.model,
            "fingerprint": self.fingerprint,
            "baseline": {
                "peak_bytes": self.baseline_peak_bytes,
                "step_seconds": self.baseline_step_seconds,
                "fixed_bytes": self.fixed_bytes,
                "runtime_factor": self.runtime_factor,
            },
            "setup": self.setup,
            "peak_floor_bytes": self.peak_floor_bytes,
            "unmodified_peak_bytes": self.unmodified_peak_bytes,
            "unread_gradient_bytes": self.unread_gradient_bytes,
            "unmodified_page_faults": self.unmodified_faults,
            "unmodified_step_seconds": self.unmodified_step_seconds,
            "runtime_graph_seconds": self.runtime_graph_seconds,
            "timing_spread": self.timing_spread,
            "points": [p.to_dict() for p in self.points],
        }

    def save(self, path: str | Path) -> Path:
        return write_atomic(Path(path), json.dumps(self.to_dict(), indent=1))

    @classmethod
    def load(cls, path: str | Path) -> Front:
        """Read a front.json; a corrupt or foreign file is a UserError naming it."""
        data = read_json(Path(path), what="front")
        if data.get("schema") != SCHEMA:
            raise UserError(f"{path}: not a front.json of schema {SCHEMA}")
        try:
            points = [_point_from_dict(p) for p in data["points"]]
            front = cls(
                model=dict(data["model"]),
                fingerprint=str(data["fingerprint"]),
                baseline_peak_bytes=int(data["baseline"]["peak_bytes"]),
                baseline_step_seconds=float(data["baseline"]["step_seconds"]),
                fixed_bytes=int(data["baseline"]["fixed_bytes"]),
                points=points,
                setup=dict(data.get("setup", {})),
                runtime_factor=float(data["baseline"].get("runtime_factor", 1.0)),
                peak_floor_bytes=optional_count(data.get("peak_floor_bytes")),
                unmodified_peak_bytes=optional_count(data.get("unmodified_peak_bytes")),
                unread_gradient_bytes=optional_count(data.get("unread_gradient_bytes")) or 0,
                unmodified_faults=optional_count(data.get("unmodified_page_faults"), "page faults"),
                unmodified_step_seconds=optional_seconds(data.get("unmodified_step_seconds")),
                runtime_graph_seconds=optional_seconds(data.get("runtime_graph_seconds")),
                timing_spread=optional_share(data.get("timing_spread")),
            )
        except (KeyError, TypeError, ValueError, AttributeError, IndexError) as exc:
            raise UserError(f"{path}: corrupt front file ({type(exc).__name__}: {exc})") from exc
        if not points:
            raise UserError(f"{path}: the front has no points")
        if any(p.schedule.fingerprint != front.fingerprint for p in points):
            raise UserError(f"{path}: its schedules were made for another graph than the front")
        return front


def _point_from_dict(data: dict) -> FrontPoint:
    schedule = Schedule.from_dict(data["schedule"])
    return FrontPoint(
        budget_bytes=int(data["budget_bytes"]),
        predicted_peak_bytes=int(data["predicted_peak_bytes"]),
        predicted_overhead=float(data["predicted_overhead"]),
        solve_seconds=float(data["solve_seconds"]),
        gap=float(data["gap"]),
        status=str(data["status"]),
        recomputed=list(data.get("recomputed", [])),
        schedule=schedule,
    )


HOLE = 0.10  # a gap between neighbouring front points wider than this share of the range
# a least peak found on the way is asked, and one found while asking it, up to this many times
# (its own search may pass lower still: sample:unet b11 416 px's did, and a second sweep of
# the profile then spent 8 s searching a peak the first had never asked)
LOWER_ASKS = 3


def pareto(points: list[FrontPoint]) -> list[FrontPoint]:
    """Keep points that no other point beats in both peak and overhead (ascending peak)."""
    kept: list[FrontPoint] = []
    for point in sorted(points, key=lambda p: (p.predicted_peak_bytes, p.predicted_overhead)):
        if not kept or point.predicted_overhead < kept[-1].predicted_overhead - 1e-12:
            kept.append(point)
    return kept


def sweep_budgets(
    solver: Solver,
    points: int,
    *,
    progress: ProgressFn | None = None,
    on_point: Callable[[FrontPoint], None] | None = None,
    cancel: CancelToken | None = None,
) -> list[FrontPoint]:
    """Solve `points` budgets evenly spaced from the feasible minimum to the baseline peak,
    then up to `points` // 2 more inside the widest holes of the front (wider than HOLE of
    the range). A hole that remains is real for this solver: asked for a budget just under
    its upper end, it answers with the point under its lower end; the solver is told that
    these budgets lie in holes (its searches there lead with CBC on the whole model). A peak
    lower than the minimum, found on the way, is asked too, and one lower still found while
    asking it (the front's range hangs on it, and a second sweep then finds it answered: the
    second solver starts at the least peak its cache holds). A solver that swept this
    profile before (its cache) is asked the budgets it was asked then. Before each budget the
    solver is told how many may follow, so that its search time lasts to the last one; what
    is left at the end buys lower bounds for the points whose gap is still unknown."""
    try:
        return _sweep(solver, points, progress, on_point, cancel)
    finally:  # a budget asked after the sweep (the dashboard's slider) stands on its own
        solver.pace(1)


def _sweep(
    solver: Solver,
    points: int,
    progress: ProgressFn | None,
    on_point: Callable[[FrontPoint], None] | None,
    cancel: CancelToken | None,
) -> list[FrontPoint]:
    if points < 2:
        raise UserError("a sweep needs at least 2 points")
    total = points + points // 2
    report(progress, 0, total, "searching the least peak")  # may take seconds
    low = solver.minimum().predicted_peak_bytes
    high = solver.baseline.predicted_peak_bytes
    # each distinct budget once: a step whose least peak is its no-recompute peak (vit_b_16
    # at 32 px: its peak comes when every activation is freed) has a front of one point
    budgets = sorted({int(low + (high - low) * k / (points - 1)) for k in range(points)})
    total = len(budgets) + (points // 2 if high > low else 0)
    solved: list[FrontPoint] = []
    tried: set[int] = set()

    def solve(budget: int) -> FrontPoint:
        check_cancel(cancel)
        tried.add(budget)
        point = FrontPoint.of(solver.solve(budget))
        solved.append(point)
        if on_point is not None:
            on_point(point)
        report(progress, len(solved), total, f"budget {format_bytes(budget)}")
        return point

    remembered = solver.swept(points)
    if remembered is not None:  # the same profile swept before: ask what it asked
        budgets, total = remembered, len(remembered)
    for k, budget in enumerate(budgets):
        solver.pace(total - k)
        solve(budget)
    if remembered is None:
        for k in range(points // 2):
            budget = _hole_budget(pareto(solved), high - low, tried)
            if budget is None:
                break
            solver.pace(points // 2 - k, in_holes=True)
            solve(budget)
        lowest = solver.lowest_known()
        for _ in range(LOWER_ASKS):  # a search found a lower peak than the last asked: ask it
            if lowest >= low:
                break
            total = max(total, len(solved) + 1)
            solver.pace(1)
            solve(lowest)
            low, lowest = lowest, solver.lowest_known()
        _answer_again(solver, solved, on_point)
        report(progress, len(solved), total, "lower bounds for the unknown gaps")
        _label_unknown_gaps(solver, solved)
        solver.remember_sweep(points, [p.budget_bytes for p in solved])
    report(progress, total, total, "done")
    return pareto(solved)


def _answer_again(
    solver: Solver, solved: list[FrontPoint], on_point: Callable[[FrontPoint], None] | None
) -> None:
    """Replace each point that a schedule found later beats within its budget (a search at
    a higher budget often passes below it: gpt_2_layers' answer within 0.405 of its
    activations was +16.50% when that budget was solved, and +15.65% was known when the
    sweep ended) by the solver's answer now (`recall`: no search), so that every point is the
    fastest schedule known within its budget, as `solve` would answer it."""
    for k, point in enumerate(solved):
        again = solver.recall(point.budget_bytes)
        if again is not None and again.predicted_seconds < point.schedule.predicted_seconds:
            solved[k] = FrontPoint.of(again)
            if on_point is not None:
                on_point(solved[k])


def _label_unknown_gaps(solver: Solver, solved: list[FrontPoint]) -> None:
    """Label the points whose gap is unknown with the bounds the solver finds in the time
    the sweep left (in place: a dashboard holds these points)."""
    bounds = solver.bound_unknown([p.budget_bytes for p in solved if p.gap >= 1.0])
    for point in solved:
        if point.budget_bytes in bounds:
            redo = point.schedule.predicted_seconds - solver.baseline.predicted_seconds
            point.gap = point.schedule.gap = relative_gap(redo, bounds[point.budget_bytes])


def wide_holes(front: list[FrontPoint], span: int) -> list[tuple[FrontPoint, FrontPoint]]:
    """Neighbouring points of `front` (ascending peak) further apart in peak than HOLE of
    `span`, the widest first."""
    pairs = zip(front[:-1], front[1:], strict=True)
    wide = [
        (lo, hi)
        for lo, hi in pairs
        if hi.predicted_peak_bytes - lo.predicted_peak_bytes > HOLE * span
    ]
    return sorted(
        wide, key=lambda pair: pair[0].predicted_peak_bytes - pair[1].predicted_peak_bytes
    )


def hole_budgets(lower: FrontPoint, upper: FrontPoint) -> tuple[int, int]:
    """The budgets a sweep asks inside a hole: its middle, then just under its upper end."""
    lo, hi = lower.predicted_peak_bytes, upper.predicted_peak_bytes
    return (lo + hi) // 2, hi - 1


def _hole_budget(front: list[FrontPoint], span: int, tried: set[int]) -> int | None:
    """A budget inside the widest hole that no budget asked before covers; None when no hole
    is wider than HOLE of the span. A budget asked inside a hole covers every budget under
    it there: its answer found nothing faster than the hole's lower end up to it (gpt_2_layers
    asked the middle of one hole three times as new points lowered its upper end: all six
    of its extra budgets went there, where three now do)."""
    for lower, upper in wide_holes(front, span):
        lo, hi = lower.predicted_peak_bytes, upper.predicted_peak_bytes
        asked = [t for t in tried if lo <= t < hi]
        for budget in hole_budgets(lower, upper):
            if all(t < budget for t in asked):
                return budget
    return None
