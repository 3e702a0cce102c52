"""Solvers chosen by name: the command line's `--solver`, `Planner.solver(name=...)`, the
benchmarks and the tests all build them here.

- "chain" (the default): the chain of stages and its table, refined per budget for a few
  seconds (explorer.solve.REFINE_TOTAL for all budgets of one graph together, or what the
  environment's REMAT_EXPLORER_SEARCH_SECONDS says: see `search_seconds`) with the
  whole-step MILP when the step is small enough for it, or with windows of it up to
  explorer.solve.MAX_WINDOWED_SIZE binaries; above, only its least peak (and the fastest
  schedule at it) is searched with windows, and a budget asked by itself, and every budget
  of a sweep given explorer.solve.LARGE_SWEEP_TOTAL seconds or more.
- "exact": the whole-step MILP on CBC for every budget (`time_limit` seconds each, 60 by
  default), whatever the size, started from the chain's answer: the reference.
- "table": the chain table's schedules only, no MILP (the fastest).
"""

from __future__ import annotations

from collections.abc import Callable

from explorer.errors import UserError
from explorer.graph import Graph
from explorer.profile import Profile
from explorer.solve import REFINE_TOTAL, Solver
from explorer.units import seconds_from_environment

EXACT_SECONDS = 60.0
# the default solver's refinement time per graph, all budgets together, where the caller
# gives none: the command line, the dashboard and a Planner all read it, and so do the
# processes they start (a quicker sweep in a user's CI, a longer one overnight)
SEARCH_SECONDS = "REMAT_EXPLORER_SEARCH_SECONDS"


def search_seconds() -> float:
    """The default solver's refinement seconds per graph: $REMAT_EXPLORER_SEARCH_SECONDS
    where set (0 keeps the table's answers), else explorer.solve.REFINE_TOTAL."""
    return seconds_from_environment(
        SEARCH_SECONDS, REFINE_TOTAL, "the default solver's refinement time per graph"
    )


def _chain(graph: Graph, profile: Profile, time_limit: float | None, **kw) -> Solver:
    kw.setdefault("refine_total", search_seconds())
    return Solver(graph, profile, time_limit=time_limit, **kw)


def _exact(graph: Graph, profile: Profile, time_limit: float | None, **kw) -> Solver:
    seconds = EXACT_SECONDS if time_limit is None else time_limit
    solver = Solver(
        graph,
        profile,
        refine_seconds=seconds,
        refine_total=None,
        max_refine_size=None,
        whole_share=0.5,
        minimum_effort=1.0,  # the time limit is each budget's, the least peak's too
        **kw,
    )
    solver.name = "exact"
    return solver


def _table(graph: Graph, profile: Profile, time_limit: float | None, **kw) -> Solver:
    solver = Solver(graph, profile, time_limit=time_limit, refine_seconds=0.0, **kw)
    solver.name = "table"
    return solver


SOLVERS: dict[str, Callable[..., Solver]] = {"chain": _chain, "exact": _exact, "table": _table}
DEFAULT = "chain"


def make_solver(
    name: str, graph: Graph, profile: Profile, *, time_limit: float | None = None, **kw
) -> Solver:
    """The solver called `name` for this step (see module docstring); `kw` goes to Solver
    (max_stages, progress, cancel)."""
    if name not in SOLVERS:
        raise UserError(f"unknown solver {name!r}; choose one of {', '.join(SOLVERS)}")
    return SOLVERS[name](graph, profile, time_limit, **kw)
