"""The verified schedules a solver has found so far, so that its answers stay consistent.

A schedule found for one budget also answers every larger budget. Keeping all of them (as
the Pareto set of simulated peak and predicted seconds) makes `solve(b)` never worse than
anything the solver already found within b, and the overhead never rise with the budget,
whatever order the budgets come in and whatever a time limit cut short.
"""

from __future__ import annotations

from explorer.schedule import GraphSchedule


class Answers:
    """Pareto set of verified schedules: ascending peak, strictly descending seconds."""

    def __init__(self, baseline: GraphSchedule) -> None:
        self.points: list[GraphSchedule] = [baseline]

    def add(self, schedule: GraphSchedule) -> None:
        """Remember a verified schedule (its peak and seconds come from simulation)."""
        peak, secs = schedule.predicted_peak_bytes, schedule.predicted_seconds
        if any(p.predicted_peak_bytes <= peak and p.predicted_seconds <= secs for p in self.points):
            return
        self.points = [
            p
            for p in self.points
            if not (peak <= p.predicted_peak_bytes and secs <= p.predicted_seconds)
        ]
        self.points.append(schedule)
        self.points.sort(key=lambda p: p.predicted_peak_bytes)

    def best_within(self, budget: int) -> GraphSchedule | None:
        """The fastest known schedule whose peak is at most `budget`."""
        fitting = [p for p in self.points if p.predicted_peak_bytes <= budget]
        return min(fitting, key=lambda p: p.predicted_seconds) if fitting else None

    def lowest(self) -> GraphSchedule:
        return self.points[0]


def relative_gap(found: float, bound: float | None) -> float:
    """(found - bound) / found for a minimised non-negative objective; 1.0 when no bound
    is known (nothing proven), 0.0 when nothing is recomputed."""
    if found <= 0:
        return 0.0
    if bound is None:
        return 1.0
    return min(1.0, max(0.0, (found - bound) / found))
