"""The exact solver: the whole-step MILP (explorer.solvers.milp) on CBC, for small graphs and
as the reference the tests and bench/optimality.py measure the default solver against.

Each budget is solved from the chain solver's answer (CBC's MIP start), so a time limit
never leaves it with less than the chain found. Every answer is lowered to a Schedule and
checked by compile_program + check_program + simulate: the MILP's own count is not trusted.
The label is "optimal" only when CBC proved the whole step optimal; otherwise "feasible"
with the gap to CBC's proven bound (or the LP relaxation's, whichever is higher).
"""

from __future__ import annotations

import time

from explorer.errors import UserError
from explorer.graph import Graph
from explorer.profile import Profile
from explorer.progress import CancelToken, ProgressFn, check_cancel
from explorer.schedule import Schedule
from explorer.solve import SetupReport
from explorer.solve import Solver as ChainSolver
from explorer.solvers.accounting import step_facts
from explorer.solvers.answers import Answers, relative_gap
from explorer.solvers.milp import StepMilp
from explorer.solvers.space import Space, backward_order
from explorer.units import format_bytes

DEFAULT_TIME_LIMIT = 60.0  # seconds of CBC per budget


class ExactSolver:
    """Whole-step MILP per budget, started from the chain solver's schedule."""

    name = "exact"

    def __init__(
        self,
        graph: Graph,
        profile: Profile,
        *,
        time_limit: float | None = None,
        max_stages: int = 48,
        progress: ProgressFn | None = None,
        cancel: CancelToken | None = None,
        chain: ChainSolver | None = None,
    ) -> None:
        self.graph = graph
        self.profile = profile
        self.time_limit = DEFAULT_TIME_LIMIT if time_limit is None else time_limit
        self.cancel = cancel
        started = time.perf_counter()
        self.chain = chain or ChainSolver(
            graph, profile, max_stages=max_stages, progress=progress, cancel=cancel
        )
        self.fingerprint = self.chain.fingerprint
        self.baseline = self.chain.baseline
        self.fixed_bytes = self.chain.fixed_bytes
        self.order = backward_order(graph, [s.backward for s in self.chain.chain.stages])
        pinned = {ref[0] for ref in self.chain.chain.pinned}
        self.space = Space(graph, self.order, pinned)
        self.facts = step_facts(graph, self.order, pinned, profile.workspace)
        self.milp = StepMilp(self.space, self.facts, profile.seconds)
        self.answers = Answers(self.baseline)
        self.setup = SetupReport(
            stages=len(self.order),
            distinct_stages=len(self.order),
            ilps=0,
            ilp_seconds=0.0,
            table_seconds=time.perf_counter() - started,
        )
        self._minimum: Schedule | None = None

    def _schedule(self, windows) -> Schedule:
        windows = self.space.prune(windows)
        return self.chain.evaluate(self.space.lower(windows, self.fingerprint))

    def _start(self, schedule: Schedule | None):
        return None if schedule is None else self.space.windows_of(schedule)

    def minimum(self) -> Schedule:
        """The least peak the MILP finds (from the chain's), then the fastest at that peak."""
        if self._minimum is None:
            check_cancel(self.cancel)
            start = self.chain.minimum()
            self.answers.add(start)
            found = self.milp.solve_least_peak(self.time_limit, self._start(start))
            best = start
            if found.windows is not None:
                candidate = self._schedule(found.windows)
                self.answers.add(candidate)
                best = min((start, candidate), key=lambda s: s.predicted_peak_bytes)
            self._minimum = self.solve(best.predicted_peak_bytes)
            bound = found.bound or 0.0
            if not (found.optimal and best.predicted_peak_bytes <= bound):
                self._minimum.status = "feasible"
        return self._copy(self._minimum)

    def solve(self, budget_bytes: int) -> Schedule:
        """The fastest schedule the MILP finds within `budget_bytes` (simulated peak)."""
        started = time.perf_counter()
        check_cancel(self.cancel)
        if budget_bytes >= self.baseline.predicted_peak_bytes:
            chosen = self._copy(self.baseline)
        else:
            chosen = self._solve(budget_bytes)
        chosen.budget_bytes = int(budget_bytes)
        chosen.solve_seconds = time.perf_counter() - started
        return chosen

    def _solve(self, budget: int) -> Schedule:
        try:
            start = self.chain.solve(budget)
            self.answers.add(start)
        except UserError:
            start = None
        found = self.milp.solve_budget(budget, self.time_limit, self._start(start))
        if found.windows is not None:
            candidate = self._schedule(found.windows)
            if candidate.predicted_peak_bytes > budget:
                raise RuntimeError(
                    f"internal error: the exact MILP's schedule peaks at "
                    f"{candidate.predicted_peak_bytes} bytes, over its budget {budget}"
                )
            self.answers.add(candidate)
        best = self.answers.best_within(budget)
        if best is None:
            raise UserError(
                f"budget {format_bytes(budget)} is below the least peak the exact solver "
                f"found in {self.time_limit:g} s"
            )
        bound = found.bound
        if not found.optimal:
            relaxed = self.milp.solve_budget(budget, self.time_limit, relax=True)
            if relaxed.objective is not None:
                bound = max(bound or 0.0, relaxed.objective)
        chosen = self._copy(best)
        proven = found.optimal and found.objective is not None
        redo = chosen.predicted_seconds - self.baseline.predicted_seconds
        if proven and redo <= found.objective * (1 + 1e-9) + 1e-15:
            chosen.status, chosen.gap = "optimal", 0.0
        else:
            chosen.status, chosen.gap = "feasible", relative_gap(redo, bound)
        return chosen

    @staticmethod
    def _copy(schedule: Schedule) -> Schedule:
        return Schedule.from_dict(schedule.to_dict())
