"""Improve a schedule with the whole-step MILP within a few seconds.

CBC proves small steps optimal in a moment, but on a transformer's or a UNet's step its bound
moves slowly and its own heuristics improve a start slowly. Three things work better, in
this order: the LP relaxation, which is a lower bound (it proves a schedule optimal when they
meet) and a guide: re-deciding only the decisions on which it disagrees with the current
schedule, everything else fixed (RINS, Danna et al. 2005), finds most of what there is to
find in one small MILP; then CBC on the whole model from the improved schedule, which may
prove it optimal; then windows of a few consecutive stages re-decided in turn
(a large-neighbourhood search) while time remains. Every candidate is simulated again; only
schedules that fit by simulation are kept.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from explorer.schedule import GraphSchedule
from explorer.solvers.milp import StepMilp
from explorer.solvers.space import Windows

WINDOW = 8  # stages re-decided at once
WHOLE_SHARE = 0.5  # share of the time left after RINS given to CBC on the whole model


@dataclass
class Refined:
    """The best schedule found, whether it is proven optimal (CBC proved it, or it meets
    the LP bound), and the best proven lower bound on its objective (recomputation seconds
    of the operators the MILP decides about, or peak bytes)."""

    schedule: GraphSchedule
    optimal: bool
    bound: float | None


class Refiner:
    """LP, RINS, whole model, windows: the search of the module docstring, on one StepMilp."""

    def __init__(self, milp: StepMilp, evaluate: Callable[[Windows], GraphSchedule]) -> None:
        self.milp = milp
        self.evaluate = evaluate
        self.windows_of = milp.space.windows_of
        self.whole_share = WHOLE_SHARE

    def fastest(self, budget: int, start: GraphSchedule, seconds: float) -> Refined:
        """The least recomputation within `budget`, from `start` (which must fit)."""

        def better(s: GraphSchedule, best: GraphSchedule) -> bool:
            return (
                s.predicted_peak_bytes <= budget
                and s.predicted_seconds < best.predicted_seconds * (1 - 1e-9)
            )

        def value(s: GraphSchedule, windows: Windows) -> float:
            return self.milp.seconds_of(windows)

        return self._search(start, seconds, lambda: self.milp.use_budget(budget), better, value)

    def leanest(self, start: GraphSchedule, seconds: float) -> Refined:
        """The least peak, from `start`."""

        def better(s: GraphSchedule, best: GraphSchedule) -> bool:
            return s.predicted_peak_bytes < best.predicted_peak_bytes

        def value(s: GraphSchedule, windows: Windows) -> float:
            return float(s.predicted_peak_bytes)

        return self._search(start, seconds, self.milp.use_least_peak, better, value)

    def _search(self, start: GraphSchedule, seconds: float, objective, better, value) -> Refined:
        started = time.perf_counter()
        deadline = started + seconds
        milp = self.milp
        objective()
        best = start
        # autograd's own order is outside the space: start from no recomputation in ours
        windows = self.windows_of(start) or milp.space.empty()

        def take(found) -> None:
            nonlocal best, windows
            if found.windows is not None:
                candidate = self.evaluate(found.windows)
                if better(candidate, best):
                    best, windows = candidate, self.windows_of(candidate)

        def proven(bound: float | None) -> bool:
            return bound is not None and value(best, windows) <= bound * (1 + 1e-9) + 1e-12

        relaxed = milp.relaxation(max(seconds, 1.0))
        bound = None if relaxed is None else relaxed[0]
        if proven(bound):
            return Refined(best, True, bound)
        if relaxed is not None:  # RINS again from each better schedule (a new neighbourhood)
            previous = None
            while previous is not best and time.perf_counter() < deadline:
                previous = best
                left = deadline - time.perf_counter()
                limit = max(min(left, max(1.0, seconds / 4)), 0.2)
                take(milp.run_guided(limit, windows, relaxed[1]))
                if proven(bound):
                    return Refined(best, True, bound)
        left = deadline - time.perf_counter()
        if left > 0.1:
            whole_limit = max(left * self.whole_share, 0.1)
            before = time.perf_counter()
            whole = milp.run(whole_limit, windows)
            # CBC overruns its limit by what reading, presolving and the root LP take
            overrun = max(0.0, time.perf_counter() - before - whole_limit)
            take(whole)
            if whole.bound is not None:
                bound = max(bound or 0.0, whole.bound)
            if whole.optimal or proven(bound):
                return Refined(best, True, bound)
            self._windows(deadline, overrun, take, lambda: windows)
        return Refined(best, proven(bound), bound)

    def _windows(self, deadline: float, overrun: float, take, current) -> None:
        """Re-decide windows of stages in turn while that improves and time remains."""
        improved = True
        while improved:
            improved = False
            for first in self._window_starts(current()):
                left = deadline - time.perf_counter() - overrun
                if left < 0.1:
                    return
                before = current()
                take(self.milp.run(min(left, 1.0), before, free=range(first, first + WINDOW)))
                improved = improved or current() is not before

    def _window_starts(self, windows: Windows) -> list[int]:
        """First stages of the windows to re-decide, overlapping by half: those where the
        schedule recomputes come first (that is where time can be won back)."""
        n, step = self.milp.n, WINDOW // 2
        starts = list(range(0, max(n - step, 1), step))
        busy = {i for i, t in enumerate(self.milp.stages) if windows[t]}
        return sorted(starts, key=lambda f: -len(busy & set(range(f, f + WINDOW))))


def lp_bound(milp: StepMilp, budget: int, seconds: float) -> float | None:
    """The LP relaxation's least recomputation seconds within `budget`: a valid lower bound
    for every schedule of the space (None if the LP was not solved in time)."""
    milp.use_budget(budget)
    outcome = milp.run(seconds, None, relax=True)
    return outcome.objective
