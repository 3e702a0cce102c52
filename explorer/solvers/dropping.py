"""Recomputations dropped one at a time from a step's plan, the step's own peak the judge.

A graph's solver chooses what its graph runs again for the graph's own peak. In a step of
several graphs (explorer.stepsolver) the step's peak is what counts, and a graph the step runs
several times (a loop's) pays for its recomputations at every run: a plan made of the
graphs' own answers can recompute in one graph what another could have recomputed for less
(a loop's block recomputing at each of three runs what the first graph could recompute once,
1.49 times the best pairing's seconds), or recompute where the step has room.

`drop_pass` takes a step plan within a budget and drops recomputations from any graph, the
costliest for the step first (an operator's seconds times its graph's runs, and times the
windows it runs in when dropped from all of them), keeping each drop after which the step
still fits: from one window (its output then kept from an earlier window, or saved by the
forward) or from every window (saved by the forward). Passes repeat while one keeps a drop,
until a deadline. Each move simulates one graph and the step's peak (the step's memo keeps
the other runs' simulations).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from explorer.progress import check_cancel
from explorer.schedule import GraphSchedule
from explorer.solvers.space import Windows

if TYPE_CHECKING:
    from explorer.stepsolver import StepSolver

ALL_WINDOWS = -1  # a move that drops an operator from every window it runs in


def drop_pass(
    step: StepSolver, picks: list[GraphSchedule], budget: int, deadline: float
) -> list[GraphSchedule]:
    """`picks` (one schedule per solver, their step within `budget`) with recomputations
    dropped while the step stays within `budget` (see the module docstring), until no pass
    drops one or `deadline` (time.perf_counter) passes."""
    windows = [
        solver.space.windows_of(pick) for solver, pick in zip(step.solvers, picks, strict=True)
    ]
    dropped_one = True
    while dropped_one:
        dropped_one = False
        for _, n, window, name in _moves(step, windows):
            if time.perf_counter() >= deadline:
                return picks
            solver = step.solvers[n]
            check_cancel(solver.cancel)
            trial_windows = _without(windows[n], window, name)
            if trial_windows is None:
                continue  # an earlier drop took it
            try:
                schedule = solver.schedule_of(trial_windows)
            except RuntimeError:  # a point the lowering cannot run (check_program)
                continue
            if schedule.predicted_seconds >= picks[n].predicted_seconds:
                continue
            trial = [*picks[:n], schedule, *picks[n + 1 :]]
            if step.peak(step.each_graph(trial)) <= budget:
                picks, dropped_one = trial, True
                windows[n] = solver.space.windows_of(schedule)  # pruned as it was lowered
    return picks


def _moves(step: StepSolver, windows: list[Windows | None]) -> list[tuple[float, int, int, str]]:
    """(the step's seconds it saves at most, solver, window or ALL_WINDOWS, operator) of every
    drop from the solvers' `windows`, the costliest first. A schedule in autograd's own
    backward order (a baseline: windows None) recomputes nothing: it has none."""
    moves = []
    for n, solver in enumerate(step.solvers):
        if windows[n] is None:
            continue
        runs = step.runs[n]
        for t, window in enumerate(windows[n]):
            for name in window:
                moves.append((solver.seconds.get(name, 0.0) * runs, n, t, name))
        for name in {name for window in windows[n] for name in window}:
            count = sum(name in window for window in windows[n])
            moves.append((solver.seconds.get(name, 0.0) * runs * count, n, ALL_WINDOWS, name))
    return sorted(moves, key=lambda move: -move[0])


def _without(windows: Windows, window: int, name: str) -> Windows | None:
    """`windows` with `name` dropped from `window` (from all of them: ALL_WINDOWS); None if
    it is not there."""
    if window == ALL_WINDOWS:
        if not any(name in w for w in windows):
            return None
        return [[a for a in w if a != name] for w in windows]
    if name not in windows[window]:
        return None
    return [[a for a in w if a != name] if t == window else list(w) for t, w in enumerate(windows)]
