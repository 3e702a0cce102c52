"""Solve for a memory budget: the chain of stages, each distinct stage's ILP options (PuLP +
CBC), the dynamic program over the chain, then the whole-step MILP to refine.

`Solver` does the expensive part once: the stage ILPs, the chain table for every budget,
and every distinct schedule the table holds, each lowered into the schedule space
(explorer.solvers.space) and simulated exactly. Those verified schedules form a Pareto set;
`solve(b)` starts from its fastest member within b and, when the step is small enough for
the whole-step MILP (explorer.solvers.milp), improves it with CBC for a few seconds
(explorer.solvers.refine); every result joins the set. So `solve(b)` is never worse than any
schedule found before within b, the overhead never rises with the budget, the minimum is the
least simulated peak found, and every returned schedule fits its budget by the same
accounting as `simulate` and the plots. A schedule is labelled "optimal" only when the whole
step was proven optimal; otherwise "feasible" with its gap to a proven lower bound: the
whole-step MILP's, or, for any step, the floor's (explorer.solvers.floor), which also gives
the least peak no schedule goes under (1.0 when no bound reaches the budget).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor, as_completed
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path

from explorer.chain import Chain, Stage, build_chain
from explorer.graph import BACKWARD, Graph, ValueRef
from explorer.profile import Profile
from explorer.program import Handoff, baseline_schedule, check_program, compile_program
from explorer.progress import CancelToken, ProgressFn, check_cancel, report
from explorer.rotor import ChainTable, Step, fresh_frontier_bytes, stage_costs
from explorer.schedule import GraphSchedule
from explorer.simulate import simulate
from explorer.solvers.accounting import step_facts
from explorer.solvers.answers import Answers, relative_gap
from explorer.solvers.background import BackgroundSearch, search_least_peak
from explorer.solvers.cache import SolverCache, digest
from explorer.solvers.floor import StepFloor, bound_order, spread
from explorer.solvers.milp import Relaxation, StepMilp
from explorer.solvers.refine import FASTEST, WHOLE_SHARE, Refined, Refiner, largest_bound
from explorer.solvers.space import Space, Windows, backward_order, saved_by_liveness
from explorer.stage_ilp import (
    StageOption,
    StageProblem,
    build_problem,
    keep_all_option,
    solve_option,
)
from explorer.units import below_minimum

KEEP_FRACTIONS = (0.0, 0.2, 0.4, 0.6, 0.8)
TABLE_UNITS = 600
TABLE_SPAN = 1.3  # the table covers 1.3x what no recomputation needs beyond the context
REFINE_SECONDS = 4.0  # CBC time per budget for the refinement, when the step is small enough
MAX_REFINE_SIZE = 2500  # recomputation binaries of the whole-step MILP CBC is run on whole
MAX_WINDOWED_SIZE = 8000  # up to this many, the refinement re-decides windows of stages only
# the least peak and the fastest schedule at it get this many budgets' refinement time each:
# they are the hardest searches of a sweep, and the front's range hangs on the first
MINIMUM_EFFORT = 2.0
# ... and the least peak of a step refined with windows only twice that, the extra on top of
# REFINE_TOTAL: there the peak comes down one window at a time (sample:gpt: 0.258 of the
# activations in 8 s, 0.240 in 16 s, 0.238 in 30 s), and the front's range hangs on it
WINDOWED_LEAST_EFFORT = 2 * MINIMUM_EFFORT
REFINE_TOTAL = 45.0  # CBC time one solver spends refining, all budgets together
# above MAX_WINDOWED_SIZE only the least peak is searched (windows, LARGE_LEAST_SECONDS), then
# the fastest schedule at it (LARGE_FASTEST_SECONDS; both scaled down to what is left of
# REFINE_TOTAL): its table answers stand elsewhere. Where a second core is free, a second
# process writes the model while the setup runs and searches two windows at a time
# (explorer.solvers.background). resnet50 b8 128 px on two cores: 0.237 of the activations at
# +35.1% from the table; 0.213 at +20.3% after 3 s and 2 s, nearly all of the second the
# drop's first pass (explorer.solvers.refine: 1.8 s), the whole sweep in 8.7 to 10.5 s, as
# noisy as the machine (in its slow hours the least peak stays at 0.228 whether it gets 2.5 or
# 3 s). With 3 s and 3 s and the drop stopped at half the second, the same point cost +20.6%
# to +22.0% and the sweep 9.9 to 12.2 s (8 s each in one process: +22.0%, 21.7 s)
LARGE_LEAST_SECONDS = 3.0
LARGE_FASTEST_SECONDS = 2.0
# ... and a budget asked by itself (Planner.solve, the dashboard's "Solve this budget"), not
# as one of a sweep's, is searched with windows from its table answer for this long (from
# what is left of REFINE_TOTAL), after the model is written (resnet50 b8 128 px: 3 s). There
# a window run seldom pays in less: at 0.30 of the activations +18.3% stayed +18.3% with 1 s
# and 2.5 s and fell to +13.0% to +13.5% with 8 s; at 0.50, +7.4% fell to +6.2%, +6.1% and
# +5.8% with 1, 2.5 and 8 s
LARGE_ALONE_SECONDS = 8.0
# a large step's sweep searches its budgets that way too (each its share of the time left, at
# most LARGE_ALONE_SECONDS) only when its solver is given at least this much refinement time
# (REMAT_EXPLORER_SEARCH_SECONDS: a sweep's 18 budgets at 8 s each, after its least peak's
# 5 s): with less, windows seldom pay in the seconds each budget would get, and the default
# REFINE_TOTAL keeps resnet50 b8 128 px's sweep near 10 s
LARGE_SWEEP_TOTAL = 150.0
# a step refined with windows only solves no LP while it searches (explorer.solvers.refine),
# nor does one whose whole-step runs stopped paying off (the LP then comes after the windows,
# which take all of a budget's time on gpt_2_layers), so its sweep ends with LPs for the
# labels, this long at most beyond REFINE_TOTAL (see Solver.bound_unknown). Enough for
# gpt_2_layers' LPs (0.4 s each), not for sample:gpt's (3629 binaries: 7 to 10 s for its CPU
# profile, 10 to 13 s for its H200 profile, both solved on two CPU cores), which get one only
# from the time the sweep left: 9 s with the CPU profile, one LP labelling 12 of 13 points;
# too little with the H200 profile, so none
LABEL_SECONDS = 4.0
# the floor's LPs (explorer.solvers.floor) label what the sweep left unbounded, this long at
# most (each bounds every budget, the nearer the tighter): resnet50 b8 128 px's take 0.2 to
# 0.3 s each, after 0.15 s to write the model; its least peak's floor one more
FLOOR_SECONDS = 0.8
MAX_TABLE_SCHEDULES = 96  # distinct table schedules simulated at setup
STAGE_SECONDS = 5.0  # CBC time per stage ILP when no time limit is given (a rare hard one
# took 50 s on resnet50; stopped early it is labelled with its gap, and the table still holds)


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
    table_schedules: int = 0  # distinct schedules read out of the table and simulated
    milp_size: int = 0  # recomputation binaries of the whole-step MILP
    refines: bool = False  # whether solve() refines with it
    # whether a sweep's budgets but the least peak take the table's answers (a step above
    # MAX_WINDOWED_SIZE whose refinement time is under LARGE_SWEEP_TOTAL)
    table_budgets: bool = False


class Solver:
    """Everything needed to answer "best schedule under B bytes" quickly, for any B.

    `refine_seconds` is the CBC time each budget gets to improve the table's answer with
    the whole-step MILP (0: the table only), `refine_total` what all budgets get together
    (None: no limit), and the searches for the least peak and for the fastest schedule at
    it `minimum_effort` times a budget's each (the least peak of a windows-only step at
    least WINDOWED_LEAST_EFFORT times, the extra not counted in `refine_total`). CBC runs
    on the whole MILP only when it has at most `max_refine_size` recomputation binaries
    (None: whatever its size); up to MAX_WINDOWED_SIZE, windows of it are refined; above,
    the table's answers stand but at the least peak, which windows lower first
    (LARGE_LEAST_SECONDS, then LARGE_FASTEST_SECONDS for the fastest schedule at it), at a
    budget asked by itself (`solve_alone`), and at every budget of a sweep when
    `refine_total` is at least LARGE_SWEEP_TOTAL."""

    name = "chain"

    def __init__(
        self,
        graph: Graph,
        profile: Profile,
        *,
        time_limit: float | None = None,
        max_stages: int = 48,
        progress: ProgressFn | None = None,
        cancel: CancelToken | None = None,
        refine_seconds: float | None = None,
        max_refine_size: int | None = MAX_REFINE_SIZE,
        whole_share: float | None = None,
        refine_total: float | None = REFINE_TOTAL,
        minimum_effort: float = MINIMUM_EFFORT,
        cache: str | Path | None = None,
    ) -> None:
        self.graph = graph
        self.profile = profile
        self.seconds = profile.seconds
        self.fingerprint = graph.fingerprint()
        # the token of the call in progress (`cancelled_by`); `cancel` serves the making only,
        # so that a token once set stops no later call
        self.cancel: CancelToken | None = None
        if refine_seconds is None:
            refine_seconds = (
                REFINE_SECONDS if time_limit is None else min(REFINE_SECONDS, time_limit)
            )
        settings = [
            refine_seconds,
            max_refine_size,
            MAX_WINDOWED_SIZE,
            whole_share,
            max_stages,
            time_limit,
            minimum_effort,
        ]
        numbers = [
            sorted(profile.seconds.items()),
            sorted(profile.workspace.items()),
            profile.eager.to_dict(),
            profile.layout_copies,
            sorted(profile.handed_tangents),
        ]
        self.cache = SolverCache(cache, digest([self.fingerprint, numbers, settings]))
        self.chain: Chain = build_chain(graph, self.seconds, max_stages)
        order = backward_order(graph, [stage.backward for stage in self.chain.stages])
        pinned = {ref[0] for ref in self.chain.pinned}
        self.space = Space(graph, order, pinned)
        facts = step_facts(
            graph,
            order,
            profile.workspace,
            profile.eager.after_forward,
            profile.layout_copies,
            profile.handed_tangents,
        )
        self.milp = StepMilp(self.space, facts, self.seconds)
        self.floor = StepFloor(self.milp)
        self.floors: list[Relaxation] = []  # the floor's LPs solved under budgets
        self.refine_seconds = refine_seconds
        self.refine_left = float("inf") if refine_total is None else refine_total
        # a larger step is refined with windows only: CBC on its whole model takes seconds to
        # even start
        self.whole_runs = max_refine_size is None or self.milp.size <= max_refine_size
        self.refines = refine_seconds > 0 and (
            self.whole_runs or self.milp.size <= MAX_WINDOWED_SIZE
        )
        self.least_only = refine_seconds > 0 and not self.refines  # see LARGE_LEAST_SECONDS
        # ... and whether a sweep's budgets are searched as well (see LARGE_SWEEP_TOTAL)
        self.searches_budgets = self.least_only and self.refine_left >= LARGE_SWEEP_TOTAL
        self.background: BackgroundSearch | None = None
        if self.least_only and self.cache.label("least") is None:  # writes the model now
            simulate = partial(_simulated, graph, profile, self.space, self.fingerprint)
            self.background = BackgroundSearch.start(self.milp, simulate)
        started = time.perf_counter()
        stage_limit = STAGE_SECONDS if time_limit is None else time_limit
        self.options = self._stage_options(stage_limit, progress, cancel)
        _output_overlap(self.chain, self.options)
        ilp_seconds = time.perf_counter() - started
        started = time.perf_counter()
        self.baseline = evaluate(graph, profile, baseline_schedule(graph))
        self.context_bytes = self._context_bytes()
        grads = sum(stage.param_grad_bytes for stage in self.chain.stages)
        self.fixed_bytes = graph.static_bytes() + grads  # no schedule can go below this
        self.table = self._build_table()
        self.answers = Answers(self.baseline)
        read = self._read_cache() or self._read_table(cancel)
        self.whole_share = whole_share
        self.refiner: Refiner | None = None
        self.minimum_effort = minimum_effort
        self.share = float("inf")  # a budget's share of the time left (see `pace`)
        self.in_holes = False  # whether the next budgets lie in holes of the front (`pace`)
        flat = [o for opts in self.options for o in opts]
        self.setup = SetupReport(
            stages=len(self.chain.stages),
            distinct_stages=self._distinct,
            ilps=self._ilps,
            ilp_seconds=ilp_seconds,
            table_seconds=time.perf_counter() - started,
            worst_gap=max((o.gap for o in flat), default=0.0),
            statuses={s: sum(1 for o in flat if o.status == s) for s in {o.status for o in flat}},
            table_schedules=read,
            milp_size=self.milp.size,
            refines=self.refines,
            table_budgets=self.least_only and not self.searches_budgets,
        )
        self._minimum: GraphSchedule | None = None
        self._save()

    # -- preparation -------------------------------------------------------------------------

    def _stage_options(self, time_limit, progress, cancel) -> list[list[StageOption]]:
        """Each stage's menu of options. Stages the cache does not hold are solved side by
        side, one CBC process per core (each stage ILP is a separate problem: its answer
        does not depend on the others or on the order they finish in)."""
        problems = [build_problem(self.chain, st, self.seconds) for st in self.chain.stages]
        distinct = list({p.signature: p for p in problems}.values())
        self._distinct, self._ilps = len(distinct), 0
        keys = {p.signature: self._menu_key(p, time_limit) for p in distinct}
        solved: dict[str, list[StageOption]] = {}
        for problem in distinct:
            menu = self._cached_menu(problem, keys[problem.signature])
            if menu is not None:
                solved[problem.signature] = menu
        reported = len(solved)
        report(progress, reported, len(distinct), f"stage ILPs {reported}/{len(distinct)}")
        to_solve = [p for p in distinct if p.signature not in solved]
        busy = 1 if self.background is not None else 0  # its core stays its own
        with ThreadPoolExecutor(max_workers=stage_workers(len(to_solve), busy)) as pool:
            running = {pool.submit(_solve_stage, p, time_limit): p for p in to_solve}
            try:
                for future in as_completed(running):
                    check_cancel(cancel)
                    problem = running[future]
                    options, ilps = future.result()
                    self._ilps += ilps
                    solved[problem.signature] = options
                    reported += 1
                    report(
                        progress, reported, len(distinct), f"stage ILPs {reported}/{len(distinct)}"
                    )
            finally:
                for future in running:  # cancelled or failed: start no more of them
                    future.cancel()
        for problem in to_solve:  # in the stages' order, whatever order they finished in
            menu = [_option_to_local(problem, o) for o in solved[problem.signature]]
            self.cache.put_stage_menu(keys[problem.signature], menu)
        return [_translate((p, solved[p.signature]), p) for p in problems]

    def _menu_key(self, problem: StageProblem, time_limit: float | None) -> str:
        """The cache key of a stage's menu: the stage, its operators' seconds, the limits."""
        stage = problem.stage
        return digest(
            [
                problem.signature,
                [self.seconds.get(n, 0.0) for n in stage.forward + stage.backward],
                time_limit,
                KEEP_FRACTIONS,
            ]
        )

    def _cached_menu(self, problem: StageProblem, key: str) -> list[StageOption] | None:
        """The stage's options when the same stage with the same operator seconds was solved
        before (None when not, or when the entry is damaged: then it is solved again)."""
        menu = self.cache.stage_menu(key)
        if menu is None:
            return None
        try:
            return [_option_from_local(problem, o) for o in menu]
        except (KeyError, IndexError, TypeError, ValueError):
            return None

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

    def _read_cache(self) -> int:
        """Verified answers from the cache (each lowered and simulated again): their count."""
        read = 0
        for windows in self.cache.answers():
            try:
                if len(windows) != len(self.space.order):
                    continue
                self.answers.add(self.schedule_of([list(map(str, w)) for w in windows]))
                read += 1
            except (KeyError, TypeError, ValueError, RuntimeError):
                continue  # not a schedule of this step: ignore it
        return read

    def _save(self) -> None:
        """Write what was learned to the cache (answers as windows, labels, menus)."""
        if self.cache.path is None:
            return  # kept in memory: the answers are here already
        found = [self.space.windows_of(s) for s in self.answers.points]
        self.cache.put_answers([w for w in found if w is not None])
        self.cache.save()

    def _read_table(self, cancel: CancelToken | None) -> int:
        """Lower and simulate the distinct schedules the table holds (its budgets are
        conservative and not monotone in what fits, so each is checked, none assumed); at
        most MAX_TABLE_SCHEDULES of them, spread evenly over the table's budgets."""
        self.answers.add(self.schedule_of(self.space.empty()))  # no recomputation, our order
        lowest = self.table.min_units()
        if lowest is None:
            return 0
        distinct: dict[tuple, list[Step]] = {}
        for units in range(lowest, self.table.units + 1):
            steps = self.table.sequence(units)
            distinct.setdefault(tuple((s.kind, s.stage, s.option) for s in steps), steps)
        sequences = list(distinct.values())
        if len(sequences) > MAX_TABLE_SCHEDULES:
            last = len(sequences) - 1
            picks = {
                round(k * last / (MAX_TABLE_SCHEDULES - 1)) for k in range(MAX_TABLE_SCHEDULES)
            }
            sequences = [sequences[k] for k in sorted(picks)]
        lowered: set[tuple] = set()
        for steps in sequences:
            check_cancel(cancel)
            raw = _lower(self.graph, self.chain, self.options, steps, self.fingerprint)
            windows = self.space.windows_of(raw)
            if windows is None:
                continue
            windows = self.space.prune(windows)
            key = tuple(tuple(w) for w in windows)
            if key not in lowered:  # several table entries lower to one schedule
                lowered.add(key)
                self.answers.add(self.schedule_of(windows))
        return len(lowered)

    # -- answers -----------------------------------------------------------------------------

    def schedule_of(self, windows: Windows) -> GraphSchedule:
        """The simulated schedule of a point of the space (useless recomputations dropped)."""
        base = self.baseline.predicted_seconds
        return _simulated(self.graph, self.profile, self.space, self.fingerprint, windows, base)

    def known(self) -> list[GraphSchedule]:
        """Every verified Pareto-optimal schedule found so far (ascending peak)."""
        return [self._copy(s) for s in self.answers.points]

    def lowest(self) -> GraphSchedule:
        """The schedule with the least simulated peak found so far (a budget's search may
        pass below the minimum's)."""
        return self._copy(self.answers.lowest())

    def lowest_known(self) -> int:
        """The least simulated peak of a schedule found so far."""
        return self.answers.lowest().predicted_peak_bytes

    def minimum(self) -> GraphSchedule:
        """The least simulated peak found (searched with the whole-step MILP when the step
        is small enough), and the fastest schedule found at that peak."""
        if self._minimum is None:
            check_cancel(self.cancel)
            proven = False
            label = self.cache.label("least")
            if label is not None:
                proven = label[0]
            elif self.least_only:
                self._least_of_large_step()
            elif self._refine_time() > 0:
                started = time.perf_counter()
                effort = self.minimum_effort
                if not self.whole_runs:
                    effort = max(effort, WINDOWED_LEAST_EFFORT)
                seconds = self._refine_time(effort)
                # a windowed step's extra time is the least peak's own, not the budgets'
                extra = seconds - self._refine_time(self.minimum_effort)
                refined = self._refiner().leanest(self.answers.lowest(), seconds)
                self.answers.add(refined.schedule)
                # and recomputing everything, where that is leaner still (the table did not
                # hold it: on gpt_2_layers 0.347 of the activations against the table's 0.431,
                # and the least peak, which the search from the table missed by 0.5% on two
                # CPU profiles of four; every budget of such a sweep is spaced from that peak
                # and starts from the family it left: +22.98% at 0.358 against the exact
                # solver's +21.86%). Searching from it instead went astray elsewhere (sample:
                # unet b11 416 px: 0.266 where the table's start reaches 0.257)
                self.answers.add(self.schedule_of(self.space.everything()))
                # what the search found recomputes whatever its objective does not count:
                # dropped here, not left to the search of the fastest schedule at that peak,
                # whose time may be spent or too short for it (Refiner.pruned)
                least = self.answers.lowest().predicted_peak_bytes
                self._refiner().pruned(least, self.answers.best_within(least))
                self.refine_left -= max(time.perf_counter() - started - extra, 0.0)
                proven = refined.optimal
                self.cache.put_label("least", proven, refined.bound)
            lowest = self.answers.lowest().predicted_peak_bytes
            self._minimum = self.solve(lowest, self.minimum_effort)
            if not proven and self._minimum.status == "optimal" and self.refines:
                self._minimum.status = "feasible"  # fastest at this peak, but a lower one?
        return self._copy(self._minimum)

    def _least_of_large_step(self) -> None:
        """A step too large to refine every budget: windows lower the table's least peak,
        then look for the fastest schedule at the new one (LARGE_LEAST_SECONDS, then
        LARGE_FASTEST_SECONDS, from what is left of the refinement time, once the model is
        written), in the process that has been writing the model since the setup began
        (explorer.solvers.background) where there is one. Nothing is proven here, and the
        labels saved make a second sweep read the answers back."""
        background, self.background = self.background, None
        share = min(1.0, self.refine_left / (LARGE_LEAST_SECONDS + LARGE_FASTEST_SECONDS))
        seconds = (LARGE_LEAST_SECONDS * share, LARGE_FASTEST_SECONDS * share)
        if seconds[0] < 0.5:
            if background is not None:
                background.close()
            return
        found = None
        if background is not None:
            found = background.search(self.baseline, self.answers.lowest(), seconds, self.cancel)
        if found is not None:
            schedules, searched = found
            for schedule in schedules:
                self.answers.add(schedule)
        else:  # no second process: write the model here (not the search's time), search
            self.milp.build()
            started = time.perf_counter()
            search_least_peak(self._refiner(), self.answers, *seconds)
            searched = time.perf_counter() - started
        self.refine_left -= searched
        self.cache.put_label("least", False, None)
        self._save()

    def solve(self, budget_bytes: int, effort: float = 1.0, search: bool = True) -> GraphSchedule:
        """The fastest schedule found whose simulated peak is at most `budget_bytes`
        (`effort`: a multiple of the refinement time a budget gets; `search`: False to
        answer from the schedules known, as `recall` does, where no search was made)."""
        started = time.perf_counter()
        check_cancel(self.cancel)
        budget = int(budget_bytes)
        start = self.answers.best_within(budget)
        if start is None and self._minimum is None and (self.refines or self.least_only):
            self.minimum()  # searches for lower peaks than the table's
            start = self.answers.best_within(budget)
        if start is None:
            lowest = self.answers.lowest().predicted_peak_bytes
            raise below_minimum(
                budget,
                lowest,
                "the feasible minimum",
                self.baseline.predicted_peak_bytes,
                self.fixed_bytes,
            )
        label = self.cache.label(str(budget))
        if search and label is None and self.searches_budgets:
            self._search_with_windows(budget, min(self.share * effort, LARGE_ALONE_SECONDS))
            label = self.cache.label(str(budget))
        if start.predicted_seconds <= self.baseline.predicted_seconds:
            status, gap = "optimal", 0.0  # nothing recomputed: nothing can be faster
        elif label is not None or (search and self._refine_time() > 0):
            status, gap = self._refine(budget, start, label, effort)
        else:
            status, gap = "feasible", 1.0
            if search and self.refines:  # out of refinement time: so is a second sweep
                self.cache.put_label(str(budget), False, None)
                self._save()
        chosen = self._copy(self.answers.best_within(budget))
        carried = self._carried_floor(budget) if gap >= 1.0 else None
        if carried is not None:  # what the floor's LPs solved so far prove here (none now)
            gap = relative_gap(chosen.predicted_seconds - self.baseline.predicted_seconds, carried)
        chosen.status, chosen.gap = status, gap
        chosen.budget_bytes = budget
        chosen.solve_seconds = time.perf_counter() - started
        return chosen

    def solve_alone(self, budget_bytes: int) -> GraphSchedule:
        """`solve`, for a budget asked by itself rather than as one of a sweep's: on a step
        too large to refine a sweep's every budget, its table answer is first searched with
        windows (LARGE_ALONE_SECONDS, from what is left of the refinement time), once per
        budget (the label kept makes the next ask, and a later sweep's, read it back)."""
        budget = int(budget_bytes)
        if self.least_only and self.cache.label(str(budget)) is None:
            self._search_with_windows(budget, LARGE_ALONE_SECONDS)
        return self.solve(budget)

    def _search_with_windows(self, budget: int, seconds: float) -> None:
        """The windows' search of one budget of a large step for `seconds` (at most what is
        left of the refinement time; see solve_alone and LARGE_SWEEP_TOTAL). Nothing is
        searched for a budget solve() refuses or answers without recomputing."""
        check_cancel(self.cancel)
        if self.answers.best_within(budget) is None and self._minimum is None:
            self.minimum()  # searches for lower peaks than the table's
        start = self.answers.best_within(budget)
        seconds = min(seconds, self.refine_left)
        if start is None or start.predicted_seconds <= self.baseline.predicted_seconds:
            return
        if seconds < 0.5:
            return
        self.milp.build()  # in this process: a background one searches the least peak only
        refined = self._search(budget, start, seconds)
        self._floors_at([budget])  # its label's bound (a sweep's floors may bound it better)
        bound = largest_bound([refined.bound, self._carried_floor(budget)])
        self.cache.put_label(str(budget), False, bound)
        self._save()

    def recall(self, budget_bytes: int) -> GraphSchedule:
        """A budget solved before, answered again from every schedule found since, without a
        search (a budget's search is made once: its label is kept)."""
        return self.solve(budget_bytes, search=False)

    def pace(self, budgets: int, in_holes: bool = False) -> None:
        """`budgets` budgets (this one included) may still be asked: each gets an equal
        share of the refinement time left, at most `refine_seconds`. `in_holes`: they lie in
        holes of the front (searches there lead with CBC on the whole model: explorer.
        solvers.refine.HOLE_FIRST_SHARE)."""
        self.share = self.refine_left / max(budgets, 1)
        self.in_holes = in_holes

    def bound_unknown(self, budgets: list[int]) -> dict[int, float]:
        """Lower bounds for solved `budgets` that have none above zero (their search ran out
        of time before its LP, or the step is too large for the whole-step MILP): the
        refinement time a sweep left buys LP relaxations of the whole-step MILP at those
        budgets (LABEL_SECONDS at least where the budgets' searches solve no LP: windows
        only, or whole-step runs given up), the highest budget first (its LP is the
        quickest), the lowest next, then the middle of the widest stretch without one; the
        floor's LPs (explorer.solvers.floor) are solved too, for FLOOR_SECONDS at most, the
        lowest budget first. Each budget is labelled with the best bound all those LPs carry
        to it (every LP bounds every budget, the nearer the tighter). Returns the new bounds
        (recomputation seconds), also saved in the cache."""
        unknown = []
        for budget in sorted(set(budgets)):
            label = self.cache.label(str(budget))
            if label is None or (not label[0] and (label[1] or 0.0) <= 0.0):
                unknown.append(budget)  # solved, neither proven nor bounded
        found = self.bounds_within(unknown)
        for budget, bound in found.items():
            self.cache.put_label(str(budget), False, bound)
        if found:
            self._save()
        return found

    def bounds_within(self, budgets: list[int]) -> dict[int, float]:
        """Lower bounds above zero on the recomputation seconds of every schedule of the
        space within each of `budgets`, searched or not: the LPs bound_unknown describes,
        solved in the same time. A step of several graphs asks each graph's solver at the
        most its graph may peak at within the step's budgets (explorer.step)."""
        budgets = sorted({b for b in budgets if b < self.baseline.predicted_peak_bytes})
        if not budgets:
            return {}
        lp = self.refines and self.refiner is not None
        if lp:
            self._relax_unknown(budgets)
        self._floors_at(budgets)
        found: dict[int, float] = {}
        for budget in budgets:
            bound = self._carried_floor(budget)
            if lp:
                bound = largest_bound([bound, self.refiner.bound(budget)])
            if bound is not None and bound > 0.0:
                found[budget] = bound
        return found

    def _relax_unknown(self, unknown: list[int]) -> None:
        """The whole-step MILP's LP relaxations for bound_unknown, in the time left."""
        left = self.refine_left
        if not self.refiner.worth_whole_runs(FASTEST):  # its searches solved no LP
            left = max(left, LABEL_SECONDS)
        for budget in spread(unknown):
            if left < max(self.refiner.lp_seconds, 1.0):
                break
            check_cancel(self.cancel)
            started = time.perf_counter()
            self.refiner.bound(budget, left)
            spent = time.perf_counter() - started
            left -= spent
            self.refine_left = max(self.refine_left - spent, 0.0)

    def _floors_at(self, budgets: list[int]) -> None:
        """The floor's LP at `budgets` (ascending, in `bound_order`) until FLOOR_SECONDS
        have passed; kept in `floors`."""
        deadline = time.perf_counter() + FLOOR_SECONDS
        for budget in bound_order(budgets):
            left = deadline - time.perf_counter()
            if left <= 0.0:
                break
            check_cancel(self.cancel)
            relaxed = self.floor.within(budget, max(left, 1.0))
            if relaxed is not None:
                self.floors.append(relaxed)

    def _carried_floor(self, budget: int) -> float | None:
        """The best bound the floor's LPs solved so far carry to `budget` (None: none)."""
        return largest_bound([r.bound_at(budget) for r in self.floors])

    def peak_floor(self) -> int | None:
        """Bytes under which no schedule of this solver's space peaks (the floor's least
        peak: explorer.solvers.floor), kept in the cache; None if its LP was not solved in
        FLOOR_SECONDS. The space is the chain's backward order: autograd's own order, the
        no-recompute baseline's, is outside it."""
        found = self.cache.floor()
        if found is None:
            check_cancel(self.cancel)
            found = self.floor.least_peak(max(FLOOR_SECONDS, 1.0))
            if found is not None:
                self.cache.put_floor(found)
                self._save()
        return found

    def swept(self, points: int) -> list[int] | None:
        """The budgets an earlier sweep of this profile solved (from the cache), if any."""
        return self.cache.sweep(points)

    def remember_sweep(self, points: int, budgets: list[int]) -> None:
        self.cache.put_sweep(points, budgets)
        self._save()

    def _refine_time(self, effort: float = 1.0) -> float:
        """CBC seconds the next refinement gets (0: none, too little left or too large)."""
        if not self.refines:
            return 0.0
        seconds = min(self.refine_seconds, self.share) * effort
        seconds = min(seconds, self.refine_left)
        return seconds if seconds >= 0.5 else 0.0

    def _refine(self, budget: int, start: GraphSchedule, label, effort: float) -> tuple[str, float]:
        """Improve on `start` at `budget` (or recall an earlier run at this budget from the
        cache); ('optimal', 0) if proven, else ('feasible', gap to the proven bound)."""
        if label is None:
            refined = self._search(budget, start, self._refine_time(effort), self.in_holes)
            label = (refined.optimal, refined.bound)
            self.cache.put_label(str(budget), *label)
            self._save()
        if label[0]:
            return "optimal", 0.0
        best = self.answers.best_within(budget)
        redo = best.predicted_seconds - self.baseline.predicted_seconds
        return "feasible", relative_gap(redo, label[1])

    def _search(
        self, budget: int, start: GraphSchedule, seconds: float, in_hole: bool = False
    ) -> Refined:
        """The refiner's search for the fastest schedule within `budget` from `start`, its
        time taken from what is left; every schedule it takes joins the answers."""
        started = time.perf_counter()
        # at the least peak known, the start is the least-peak search's, found without
        # counting time: drop what it need not recompute first
        drop = budget <= self.answers.lowest().predicted_peak_bytes
        refined = self._refiner().fastest(budget, start, seconds, drop, in_hole)
        self.refine_left -= time.perf_counter() - started
        self.answers.add(refined.schedule)
        return refined

    def _refiner(self) -> Refiner:
        """One refiner for all budgets: it learns whether whole-model runs pay off here (but
        for a solver that chose its share, the exact one, which keeps every run). It keeps
        every schedule a search takes among the answers (all it simulates but the drop pass's
        refused moves), whether or not it beats that search's best, since it may be the best
        known at another peak (the least-peak search's way down: resnet50 b8 128 px reached
        its least peak at +30% and ended at +37% after moves that only lower what the forward
        saves; the fastest schedule at that peak was searched from +37%)."""
        if self.refiner is None:
            chosen = self.whole_share is not None
            self.refiner = Refiner(
                self.milp,
                self.schedule_of,
                self.answers.add,
                whole_share=self.whole_share if chosen else WHOLE_SHARE,
                learn=not chosen,
                whole_runs=self.whole_runs,
                parallel=True,
                follow_peak=self.least_only,
                check=lambda: check_cancel(self.cancel),
            )
        return self.refiner

    @contextmanager
    def cancelled_by(self, cancel: CancelToken | None) -> Iterator[None]:
        """Calls made inside stop at `cancel`, between CBC runs (Cancelled): a token belongs
        to one call, a sweep or a budget, since one kept after it would stop every later call
        once set (a dashboard's Cancel did so for every sweep and solve after it)."""
        before, self.cancel = self.cancel, cancel
        try:
            yield
        finally:
            self.cancel = before

    @staticmethod
    def _copy(schedule: GraphSchedule) -> GraphSchedule:
        return GraphSchedule.from_dict(schedule.to_dict())


def evaluate(
    graph: Graph, profile: Profile, schedule: GraphSchedule, baseline_seconds: float | None = None
) -> GraphSchedule:
    """Fill in a schedule's predicted peak, time and recomputed operators by compiling and
    simulating it (the same accounting as the plots and verify's prediction)."""
    program = compile_program(graph, schedule, Handoff(handed_tangents=profile.handed_tangents))
    problem = check_program(graph, program)
    if problem is not None:
        raise RuntimeError(f"internal error: schedule does not run: {problem}")
    timeline = simulate(
        graph, program, profile.workspace, eager=profile.eager, layout_copies=profile.layout_copies
    )
    schedule.predicted_peak_bytes = timeline.peak_bytes
    names = [name for i in program.forward + program.backward for name in i.parts]
    schedule.predicted_seconds = sum(profile.time_of(n) for n in names)
    schedule.baseline_seconds = baseline_seconds or schedule.predicted_seconds
    schedule.recomputed = list(dict.fromkeys(i.node for i in program.backward if i.recompute))
    return schedule


def _simulated(
    graph: Graph,
    profile: Profile,
    space: Space,
    fingerprint: str,
    windows: Windows,
    baseline_seconds: float,
) -> GraphSchedule:
    """The simulated schedule of a point of `space` (useless recomputations dropped)."""
    schedule = space.lower(space.prune(windows), fingerprint)
    return evaluate(graph, profile, schedule, baseline_seconds)


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
    return GraphSchedule(fingerprint, saved_by_liveness(graph, order), order)


def _option_to_local(problem: StageProblem, option: StageOption) -> dict:
    """A stage option in the stage's own terms (value and operator positions), as JSON."""
    position = {name: k for k, name in enumerate(problem.stage.forward)}
    return {
        "keep": [problem.index[ref] for ref in option.keep],
        "redo": [[position[a] for a in step] for step in option.redo],
        "keep_bytes": option.keep_bytes,
        "peak_bytes": option.peak_bytes,
        "redo_seconds": option.redo_seconds,
        "status": option.status,
        "gap": option.gap,
    }


def _option_from_local(problem: StageProblem, data: dict) -> StageOption:
    """The inverse of _option_to_local, for this stage (raises on a damaged entry)."""
    forward = problem.stage.forward
    redo = [[forward[int(k)] for k in step] for step in data["redo"]]
    if len(redo) != len(problem.stage.backward):
        raise ValueError("stage option for another stage")
    return StageOption(
        keep=[problem.values[int(k)] for k in data["keep"]],
        redo=redo,
        keep_bytes=int(data["keep_bytes"]),
        peak_bytes=int(data["peak_bytes"]),
        redo_seconds=float(data["redo_seconds"]),
        status=str(data["status"]),
        gap=float(data["gap"]),
    )


def stage_workers(stages: int, busy: int = 0) -> int:
    """Threads that run stage ILPs side by side: one per core this process may use (each
    waits on its own CBC process) but the `busy` ones (a background search's), no more than
    there are stages to solve, and at least one."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    return max(1, min(cores - busy, stages))


def _solve_stage(problem: StageProblem, time_limit: float | None) -> tuple[list[StageOption], int]:
    """The stage's options: keeping everything, and the ILP's answer under each share of
    that memory (duplicates dropped); with the number of ILPs solved."""
    keep_all = keep_all_option(problem)
    options = [keep_all]
    if keep_all.keep_bytes == 0:
        return options, 0
    for fraction in KEEP_FRACTIONS:
        option = solve_option(problem, int(keep_all.keep_bytes * fraction), time_limit)
        if option is None:
            continue
        key = (option.keep_bytes, round(option.redo_seconds, 9), option.peak_bytes)
        if all(key != (o.keep_bytes, round(o.redo_seconds, 9), o.peak_bytes) for o in options):
            options.append(option)
    return options, len(KEEP_FRACTIONS)
