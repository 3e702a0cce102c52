"""Improve a schedule with the whole-step MILP when proving the optimum takes too long.

CBC proves small steps optimal in a second, but on a transformer's step its bound moves
slowly and its own heuristics improve a start slowly. A large-neighbourhood search does
better there: keep the current schedule's recomputations everywhere except in a window of a
few consecutive stages, let CBC re-decide that window (and every save), slide the window over
the step, repeat while it improves. Every candidate is simulated again; only schedules
that fit the budget by simulation are kept.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from explorer.schedule import Schedule
from explorer.solvers.milp import StepMilp
from explorer.solvers.space import Windows

WINDOW = 8  # stages re-decided at once
WHOLE_SHARE = 0.2  # share of the time first given to CBC on the whole model


@dataclass
class Refined:
    """The best schedule found, whether the whole model proved it optimal, and the best
    proven lower bound on its objective (recomputation seconds, or peak bytes)."""

    schedule: Schedule
    optimal: bool
    bound: float | None


class Refiner:
    """Large-neighbourhood search on one StepMilp (see module docstring)."""

    def __init__(self, milp: StepMilp, evaluate: Callable[[Windows], Schedule]) -> None:
        self.milp = milp
        self.evaluate = evaluate
        self.windows_of = milp.space.windows_of
        self.whole_share = WHOLE_SHARE

    def fastest(self, budget: int, start: Schedule, seconds: float) -> Refined:
        """The least recomputation within `budget`, from `start` (which must fit)."""

        def better(s: Schedule, best: Schedule) -> bool:
            return (
                s.predicted_peak_bytes <= budget
                and s.predicted_seconds < best.predicted_seconds * (1 - 1e-9)
            )

        return self._search(start, seconds, lambda: self.milp.use_budget(budget), better)

    def leanest(self, start: Schedule, seconds: float) -> Refined:
        """The least peak, from `start`."""

        def better(s: Schedule, best: Schedule) -> bool:
            return s.predicted_peak_bytes < best.predicted_peak_bytes

        return self._search(start, seconds, self.milp.use_least_peak, better)

    def _search(self, start: Schedule, seconds: float, objective, better) -> Refined:
        started = time.perf_counter()
        deadline = started + seconds
        milp = self.milp
        objective()
        best = start
        # autograd's own order is outside the space: start from no recomputation in ours
        windows = self.windows_of(start) or milp.space.empty()
        overrun, bound = 0.0, None
        if self.whole_share > 0:
            whole_limit = max(seconds * self.whole_share, 0.05)
            whole = milp.run(whole_limit, windows)
            # CBC overruns its limit by what reading, presolving and the root LP take
            overrun = max(0.0, time.perf_counter() - started - whole_limit)
            bound = whole.bound
            if whole.windows is not None:
                candidate = self.evaluate(whole.windows)
                if better(candidate, best):
                    best, windows = candidate, self.windows_of(candidate)
            if whole.optimal:
                return Refined(best, True, bound)
        improved = True
        while improved:
            improved = False
            for first in self._window_starts(windows):
                left = deadline - time.perf_counter() - overrun
                if left < 0.1:
                    return Refined(best, False, bound)
                found = milp.run(min(left, 1.0), windows, free=range(first, first + WINDOW))
                if found.windows is None:
                    continue
                candidate = self.evaluate(found.windows)
                if better(candidate, best):
                    best, windows, improved = candidate, self.windows_of(candidate), True
        return Refined(best, False, bound)

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
