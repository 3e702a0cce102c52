"""Improve a schedule with the whole-step MILP within a few seconds.

CBC proves small steps optimal in a moment, but on a transformer's or a UNet's step its bound
moves slowly and its own heuristics improve a start slowly; and every CBC run on such a step
costs most of a second before it searches at all (reading the model, the LP, the MIP start).
So the search goes, in this order: the LP relaxation, a lower bound (it proves a schedule
optimal when they meet) and a guide; CBC on the whole model for a quarter of the time (enough
to prove a small step optimal); RINS (Danna et al. 2005): re-deciding only the decisions on
which the LP disagrees with the current schedule, everything else fixed; windows of a few
consecutive stages re-decided in turn while that improves (a large-neighbourhood search, which
is what finds most on a transformer's step); and CBC on the whole model again from the best
schedule for the last quarter, which may prove it. A window first re-decides only the
operators near what its stages read, and is widened only when a pass over the windows finds
nothing: a narrow window is a CBC run several times cheaper, so a budget's seconds go further.
From one level to the next the windows' edges also move by a quarter of their width, so that
each reach meets both sets of edges.
A refiner learns from its own runs: once CBC on the whole model has found nothing twice in a
row for an objective (neither a better schedule nor a proof), later searches for it give that
time to the windows, and try the whole model again only when the windows stall (the exact
solver keeps every run). The LP and RINS then step aside too: on UNet's step they took the
second and a half each budget had. Given that time, the windows met the goal (within 5% of the
exact solver) at every budget of three sweeps, where the LP-first order missed it at three to
five of twelve. The LP comes after the windows instead, if time is left, for its bound; and
every LP solved under a budget bounds the other budgets too (explorer.solvers.milp.Relaxation),
so a budget without an LP of its own is labelled from the others' (gap 1.0, unknown, when none
reaches it, until a sweep spends the time it left on LPs at such budgets: Solver.bound_unknown).
A budget inside a hole of the front (a sweep's extra budgets: the windows found nothing there)
is searched with CBC on the whole model first, for most of its time, whether or not such runs
paid off elsewhere (HOLE_FIRST_SHARE), until such runs have found nothing FRUITLESS times in a
row inside holes: then a hole's budget is searched like the others.
On a step too large for CBC on its whole model (seconds before it even starts: sample:gpt's
CPU step took 11 s for a 5 s run) the refiner re-decides windows only: no LP bound, RINS or
whole-model run, so nothing is proven and the gap stays unknown. Nor is a whole-model run
made when its limit would end before CBC is past its start (the root LP and the MIP start,
which it finishes whatever its limit: sample:unet's least peak took 3.6 s for a 0.2 s run);
where that is known before a search's LP, the LP and RINS step aside as after fruitless runs.
A search for the fastest schedule first drops what its start need not recompute (`_drop`):
at a least peak for as long as that pays (the least-peak search counts no time), elsewhere
for a quarter of its time (its start is the answer within the budget below). `pruned` runs
that drop alone to its end, with no time limit: the solver gives it the least-peak search's
schedule before any search time it may lack is spent on the fastest one. With a second
core, windows run two at a time, one in a forked worker (explorer.solvers.worker).
Every candidate is simulated again; only schedules that fit by simulation are kept.
"""

from __future__ import annotations

import math
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, replace

from explorer.schedule import GraphSchedule
from explorer.solvers.milp import Relaxation, Root, StepMilp
from explorer.solvers.space import Windows
from explorer.solvers.worker import WindowWorker

WINDOW = 8  # stages re-decided at once
# the least-peak search re-decides twice as many: its peak sits in one layer's backward but
# is raised by what every earlier layer keeps (sample:gpt: 0.271 -> 0.265 of the activations
# in 8 s, 0.268 -> 0.259 in 16 s)
LEAN_WINDOW = 16
WINDOW_SECONDS = 1.0  # CBC time limit of one window run
MIN_WINDOW_SECONDS = 0.1  # no window run is started with less time left
# ... of one least-peak window run: a window of 16 stages often needs more than a second to
# lower the peak (sample:gpt's least peak in 16 s: 0.259 to 0.266 of the activations in eight
# runs with 1 s, median 0.263; 0.251 to 0.263 in nine with 3 s, median 0.259)
LEAN_WINDOW_SECONDS = 3.0
REACHES = (2, 4, None)  # producers back from a stage's reads its window re-decides (None: all)
# the windows' levels, in order: (reach, shifted). The reach grows and falls back while the
# windows' first stages alternate between multiples of half their width and those shifted by
# a quarter, so that every reach meets both, and the next level moves the windows' edges too
# (sample:unet at 0.584 of its activations: only the window at stage 50 of 62, shifted, with
# reach 4 finds the optimum, +3.82% where the sweep's answer was +4.44%)
LEVELS = tuple((REACHES[k % len(REACHES)], k % 2 == 1) for k in range(2 * len(REACHES)))
FIRST_SHARE = 0.25  # share of the time for CBC on the whole model first (proves small steps)
# ... inside a hole of the front, where windows found nothing: CBC on the whole model first,
# whether or not it paid off elsewhere (vgg16 b176 224 px: 2.0 s of each budget's 2.1 s was
# windows, which left holes 14% of the front wide; a whole-model run of 1.2 to 2.9 s from the
# hole's lower end found and proved a point inside each of three)
HOLE_FIRST_SHARE = 0.75
RINS_SHARE = 0.25  # share of the time left for RINS ...
RINS_SECONDS = 1.0  # ... at most
# ... in the least-peak search: RINS's sub-model there is solved whole in about 1.2 s of CBC
# (gpt_2_layers), and where a second stopped it first the least peak, which every budget of
# a sweep is spaced from and searched after, was 0.358 of the activations, not 0.345, in 9 of
# 20 sweeps (timed alone, RINS found it in 0 of 4 runs with 0.7 s, 10 of 11 with 1 s, 8 of 8
# with 1.25 s, 6 of 6 with 1.5 or 2 s; 10 of 10 sweeps of that profile since)
LEAN_RINS_SHARE = 0.5
LEAN_RINS_SECONDS = 2.0
WHOLE_SHARE = 0.25  # share of the time left after RINS kept for CBC on the whole model last
FRUITLESS = 2  # whole-model runs in a row that found nothing, after which they are skipped
HOLE = "hole"  # the fruitless count of the whole-model runs that lead inside holes
# a whole-model run is tried only when its limit is at least this many times what such a run
# took beyond its limit before: half of it searching
STARTUP_SHARE = 2.0
# before the first run, its start-up is taken as this many times the last LP's time (CBC's
# root LP under the MIP took 2.0 s where the LP alone took 0.8 s, sample:unet's least peak)
LP_STARTUP = 2.0
# a drop pass over the moves left follows only one that kept at least this share of its
# moves: a move refused once seldom fits after more are kept (gpt_2_layers' least peak: 114
# of 416, 8 of 61, 1 of 50, 0 of 49 in 0.2 s; sample:gpt b8 256 px: 42 of 200, 2 of 146 and
# 0 of 144, each of those two 1.8 s the windows then lacked)
DROP_AGAIN_SHARE = 0.1
# share of a budget's search for the drop pass where its start fits a lower budget (the
# budget below's answer): dropping is then what the higher budget allows
DROP_SHARE = 0.25
FASTEST, LEANEST = "fastest", "leanest"  # the two objectives a refiner searches, as it learns


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

    def __init__(
        self,
        milp: StepMilp,
        simulate: Callable[[Windows], GraphSchedule],
        keep: Callable[[GraphSchedule], object] | None = None,
        whole_share: float = WHOLE_SHARE,
        learn: bool = True,
        whole_runs: bool = True,
        parallel: bool = False,
        follow_peak: bool = False,
        check: Callable[[], None] | None = None,
    ) -> None:
        self.milp = milp
        # called between runs and moves: raises to stop the search (a user's Cancel, through
        # the solver's token for the call in progress)
        self.check = check or (lambda: None)
        self.simulate = simulate  # the schedule some windows lower to, simulated
        # what the search does with each schedule it takes (the solver keeps them all among
        # its answers: one may be the best known at another peak). The drop pass's refused
        # moves are not taken (a mid budget would start from them: gpt_2_layers' 0.643 ended
        # at +9.5% where it ended at +4.6% without them)
        self.keep = keep or (lambda schedule: None)
        self.windows_of = milp.space.windows_of
        self.whole_share = whole_share
        self.learn = learn
        self.whole_runs = whole_runs  # False: windows only (CBC on a large whole model is slow)
        self.parallel = parallel  # two windows at once, with a forked worker where one may run
        # the least-peak search of a large step (a few seconds, about one pass over its
        # windows): once the peak falls, the windows around the new highest stage run next,
        # not after the rest of the pass (resnet50 b8 128 px, CPU profile: 0.2275 of the
        # activations in 3 s, 0.2133 so). Not elsewhere: on sample:gpt, whose longer search
        # gains from what the pass lowers far from the peak first, it was worse as often as
        # better (0.2479 against 0.2404 at b8 256 tokens, P100 profile)
        self.follow_peak = follow_peak
        self.fruitless: Counter[str] = Counter()  # objective: whole-model runs in a row
        self.relaxations: list[Relaxation] = []  # LPs solved under budgets (their bounds)
        self.lp_seconds = 0.0  # what the last LP took
        # objective: the most a whole-model run took beyond its limit. CBC solves the root LP
        # and reads the MIP start before it checks the clock (sample:unet's least peak: 2.0 s
        # and 0.7 s), so a run given less than that only overruns (see `_too_short`)
        self.startup: dict[str, float] = {}

    def fastest(
        self,
        budget: int,
        start: GraphSchedule,
        seconds: float,
        drop: bool = False,
        in_hole: bool = False,
    ) -> Refined:
        """The least recomputation within `budget`, from `start` (which must fit), whose
        recomputations the budget does not need are dropped first (see `_drop`): for
        DROP_SHARE of the time, or, with `drop`, for as long as that pays, for a start found
        without counting time (the least-peak search's). `in_hole`: the budget lies in
        a hole of the front, so CBC on the whole model leads (HOLE_FIRST_SHARE)."""

        def better(s: GraphSchedule, best: GraphSchedule) -> bool:
            return (
                s.predicted_peak_bytes <= budget
                and s.predicted_seconds < best.predicted_seconds * (1 - 1e-9)
            )

        def value(s: GraphSchedule) -> float:
            """Simulated recomputation seconds, views made again included: the MILP's
            objective counts only some of those, so it bounds this from below."""
            return s.predicted_seconds - s.baseline_seconds

        objective = lambda: self.milp.use_budget(budget)  # noqa: E731
        return self._search(
            FASTEST,
            start,
            seconds,
            objective,
            better,
            value,
            WINDOW,
            WINDOW_SECONDS,
            drop,
            in_hole,
        )

    def pruned(self, budget: int, start: GraphSchedule) -> GraphSchedule:
        """`start` with what `budget` does not need it to recompute dropped: the drop pass
        alone (`_drop`), pass after pass until one drops nothing, however long that takes.
        For the least-peak search's schedule, whose objective counts no time: a search left
        too little time to speed it up kept it as it was (sample:unet b2 32 px with 1 s of
        search: +835% at 0.468 of its activations; the table's lowest point, 0.492, +7.7%)."""
        best = start
        windows = self.windows_of(start) or self.milp.space.empty()

        def take_better(found: Windows) -> None:
            nonlocal best, windows
            candidate = self.simulate(found)
            if (
                candidate.predicted_peak_bytes <= budget
                and candidate.predicted_seconds < best.predicted_seconds * (1 - 1e-9)
            ):
                self.keep(candidate)
                best, windows = candidate, self.windows_of(candidate)

        self._drop(math.inf, take_better, lambda: windows, again_share=0.0)
        return best

    def leanest(self, start: GraphSchedule, seconds: float) -> Refined:
        """The least peak, from `start`."""

        def saved(s: GraphSchedule) -> float:
            windows = self.windows_of(s)
            return float("inf") if windows is None else self.milp.saved_bytes(windows)

        def better(s: GraphSchedule, best: GraphSchedule) -> bool:
            """A lower peak, or the same peak with less saved by the forward (the MILP's
            tie-break: it lets the windows make progress the peak does not show yet)."""
            if s.predicted_peak_bytes != best.predicted_peak_bytes:
                return s.predicted_peak_bytes < best.predicted_peak_bytes
            return saved(s) < saved(best)

        def value(s: GraphSchedule) -> float:
            return float(s.predicted_peak_bytes)

        objective = self.milp.use_least_peak
        return self._search(
            LEANEST, start, seconds, objective, better, value, LEAN_WINDOW, LEAN_WINDOW_SECONDS
        )

    def _search(
        self,
        kind: str,
        start: GraphSchedule,
        seconds: float,
        objective,
        better,
        value,
        width: int,
        window_seconds: float,
        drop: bool = False,
        in_hole: bool = False,
    ) -> Refined:
        self.check()
        started = time.perf_counter()
        deadline = started + seconds
        milp = self.milp
        objective()
        best = start
        # autograd's own order is outside the space: start from no recomputation in ours
        windows = self.windows_of(start) or milp.space.empty()

        def consider(candidate: GraphSchedule) -> None:
            nonlocal best, windows
            self.keep(candidate)
            if better(candidate, best):
                best, windows = candidate, self.windows_of(candidate)

        def take(found: Windows | None) -> None:
            if found is not None:
                consider(self.simulate(found))

        def proven(bound: float | None) -> bool:
            return bound is not None and value(best) <= bound * (1 + 1e-9) + 1e-12

        def left() -> float:
            return deadline - time.perf_counter()

        if kind == FASTEST:

            def take_better(found: Windows) -> None:
                candidate = self.simulate(found)
                if better(candidate, best):
                    consider(candidate)

            # elsewhere the start fits a lower budget: what it need not recompute here
            until = deadline if drop else started + seconds * DROP_SHARE
            self._drop(until, take_better, lambda: windows)
        # inside a hole, CBC on the whole model leads until such runs found nothing there
        # FRUITLESS times in a row
        hole_first = in_hole and (not self.learn or self.fruitless[HOLE] < FRUITLESS)
        first_share = HOLE_FIRST_SHARE if hole_first else FIRST_SHARE
        lean = kind == LEANEST
        # a first whole-model run that could not start counts as fruitless here, before its
        # LP is paid for (the first run below gets this limit, or less)
        self._learn_too_short(kind, left() * first_share)
        # the LP guides RINS and leads only where CBC on the whole model pays off; elsewhere
        # it comes after the windows, for its bound, if there is time (see _relax)
        guided = self.worth_whole_runs(kind)
        relaxed = self._relax(seconds) if guided else None
        bound = self._best_bound(relaxed)

        def whole(limit: float) -> bool:
            """CBC on the whole model from the best schedule; True once it is proven. CBC's
            "optimal" proves the best schedule only through its bound: a schedule CBC counts
            below its simulated peak is refused by `take`, and its proof is then about
            nothing that was kept."""
            nonlocal bound
            self.check()
            ran = time.perf_counter()
            outcome = milp.run(limit, windows)
            overrun = time.perf_counter() - ran - limit
            self.startup[kind] = max(self.startup.get(kind, 0.0), overrun)
            take(outcome.windows)
            if outcome.bound is not None:
                bound = max(bound or 0.0, outcome.bound)
            return proven(bound)

        def tried_whole(limit: float, anyway: bool = False, hole: bool = False) -> bool:
            """CBC on the whole model if it has paid off here (or `anyway`) and `limit` leaves
            it time to search past its start (see `_too_short`); remember (for the holes of
            the front too, if the run is one that leads there)."""
            if not self.whole_runs or not (anyway or self.worth_whole_runs(kind)):
                return False
            if self._too_short(kind, limit):
                self._learn_too_short(kind, limit)
                return proven(bound)
            before = best
            proved = whole(limit)
            paid = proved or best is not before
            for counted in (kind, HOLE) if hole else (kind,):
                self.fruitless[counted] = 0 if paid else self.fruitless[counted] + 1
            return proved

        if proven(bound) or tried_whole(left() * first_share, hole_first, hole_first):
            return Refined(best, True, bound)
        if relaxed is not None:
            if lean:
                rins_seconds = min(left() * LEAN_RINS_SHARE, LEAN_RINS_SECONDS)
            else:
                rins_seconds = min(left() * RINS_SHARE, RINS_SECONDS)
            self.check()
            take(milp.run_guided(max(rins_seconds, 0.2), windows, relaxed.values).windows)
            if proven(bound):
                return Refined(best, True, bound)
        whole_share = self.whole_share if self.worth_whole_runs(kind) else 0.0
        window_end = deadline - left() * whole_share
        peak = (lambda: value(best)) if lean and self.follow_peak else None
        self._windows(window_end, take, lambda: windows, width, window_seconds, lean, peak)
        if self.whole_runs and not guided and left() >= self.lp_seconds:
            bound = largest_bound(
                [bound, self._best_bound(self._relax(max(left(), 2 * self.lp_seconds)))]
            )
            if proven(bound):
                return Refined(best, True, bound)
        stalled = left() >= 1.0  # the windows found nothing more: try the whole model again
        proved = tried_whole(left(), anyway=stalled)  # before reading `best`: it may improve it
        return Refined(best, proved or proven(bound), bound)

    def bound(self, budget: int, seconds: float | None = None) -> float | None:
        """The best lower bound known at `budget`: what the LPs solved at other budgets
        carry to it, and, given `seconds`, its own LP's."""
        self.milp.use_budget(budget)
        return self._best_bound(None if seconds is None else self._relax(seconds))

    def _relax(self, seconds: float) -> Relaxation | None:
        """The LP relaxation under the current objective (remembered: under a budget it
        bounds every other budget too), and how long it took."""
        started = time.perf_counter()
        relaxed = self.milp.relaxation(max(seconds, 1.0))
        self.lp_seconds = time.perf_counter() - started
        if relaxed is not None and relaxed.slope is not None:
            self.relaxations.append(replace(relaxed, values={}))  # its bound is what lasts
        return relaxed

    def _best_bound(self, relaxed: Relaxation | None) -> float | None:
        """The best lower bound known for the current objective: its own LP's, or what the
        LPs solved at other budgets prove at this one."""
        bounds = [relaxed.bound] if relaxed is not None else []
        if self.milp.budget is not None:
            bounds += [r.bound_at(self.milp.budget) for r in self.relaxations]
        return largest_bound(bounds)

    def _too_short(self, kind: str, limit: float) -> bool:
        """Whether a whole-model run for `kind` given `limit` would overrun it without
        searching (see `startup`)."""
        return limit < max(
            0.1, STARTUP_SHARE * self.startup.get(kind, LP_STARTUP * self.lp_seconds)
        )

    def _learn_too_short(self, kind: str, limit: float) -> None:
        """Count a whole-model run that `limit` leaves too short to search as FRUITLESS ones
        that found nothing, so that the LP and RINS step aside for the windows too
        (sample:unet: 2 s of each budget's 3.7 s went to an LP before whole-model runs that
        could not start). Under 0.1 s no time is left, which says nothing about the model."""
        if self.learn and limit >= 0.1 and self._too_short(kind, limit):
            self.fruitless[kind] = max(self.fruitless[kind], FRUITLESS)

    def worth_whole_runs(self, kind: str) -> bool:
        """Whether CBC on the whole model is still worth its time for objective `kind`; a
        search for it leads with the LP (its bound) only then."""
        return self.whole_runs and (not self.learn or self.fruitless[kind] < FRUITLESS)

    def _drop(self, until: float, take, current, again_share: float = DROP_AGAIN_SHARE) -> None:
        """Try running each recomputation of the current schedule no more (see
        `_drop_moves`), the costliest first, keeping every removal that still fits, pass
        after pass while the last kept at least `again_share` of its moves, until `until`.
        One simulation a move, where a window finds such moves one CBC run at a time: the
        least peak's first schedule on gpt_2_layers (the least-peak objective counts no
        time) went from +289% to +29% in 1.9 s, where 8 s of windows reached +60%. It may
        take the whole search: on resnet50 b8 128 px its first pass takes 1.8 s, and the
        windows after it did less (stopped at half of 3 s it reached +20.7%, and 1.5 s of
        windows +20.6%; given 2 s or more, +20.3%)."""
        kept, kept_share = 1, 1.0
        while kept and kept_share >= again_share:
            moves = self._drop_moves(current())
            kept = 0
            for move in moves:
                if time.perf_counter() >= until:
                    return
                self.check()
                before = current()
                dropped = {(t, a) for t, a in move if a in before[t]}
                if not dropped:
                    continue  # already dropped by the pruning of an earlier move
                take([[a for a in w if (t, a) not in dropped] for t, w in enumerate(before)])
                kept += current() is not before
            kept_share = kept / max(len(moves), 1)

    def _drop_moves(self, windows: Windows) -> list[tuple[tuple[int, str], ...]]:
        """The drop pass's moves, the costliest first: each recomputation alone, and those
        that read one storage together, which the backward may then no longer hold where
        dropping any one alone only adds what it makes to what the forward keeps
        (gpt_2_layers at 0.405 of its activations: two clones of one attention projection,
        in two stages, +17.41% to +16.65%; each alone no longer fit)."""
        singles = [((t, a),) for t, window in enumerate(windows) for a in window]
        readers: defaultdict[Root, list[tuple[int, str]]] = defaultdict(list)
        for ((t, a),) in singles:
            for storage in self.milp.ops_reads[a]:
                readers[storage].append((t, a))
        groups = {tuple(group) for group in readers.values() if len(group) > 1}
        moves = singles + sorted(groups)
        moves.sort(key=lambda move: -sum(self.milp.seconds.get(a, 0.0) for _, a in move))
        return moves

    def _windows(
        self,
        deadline: float,
        take,
        current,
        width: int,
        seconds: float,
        lean: bool,
        peak: Callable[[], float] | None,
    ) -> None:
        """Re-decide windows of `width` stages in turn (each CBC run at most `seconds`) while
        time remains: each level of LEVELS while a pass over its windows improves, then the
        next; done when the last finds nothing. (Going back to the
        narrowest after each improvement kept sample:gpt's cheap end narrow: +1.9% where
        wide windows found +0.7%.) A window is not run again from a schedule it already
        started from: the pass after an improvement would otherwise repeat every window run
        since, each a CBC run that had found nothing from that very schedule. With a worker
        (explorer.solvers.worker), two windows that share no stage run at once from the same
        schedule; each answer is taken on its own, then both together. `lean`: the least
        peak's (the windows holding the highest stage first); `peak`, the best peak found,
        where the windows around a new highest stage go next once it falls (`follow_peak`)."""
        if deadline - time.perf_counter() < MIN_WINDOW_SECONDS:
            return  # no time left for a run (the drop took it): fork no worker
        worker = WindowWorker.start(self.milp) if self.parallel else None
        try:
            self._window_passes(deadline, take, current, width, seconds, lean, peak, worker)
        finally:
            if worker is not None:
                worker.close()

    def _window_passes(
        self,
        deadline: float,
        take,
        current,
        width: int,
        seconds: float,
        lean: bool,
        peak: Callable[[], float] | None,
        worker: WindowWorker | None,
    ) -> None:
        """The passes of `_windows`, with `worker` if there is one."""
        level = 0
        tried: set[tuple[int, int, tuple[tuple[str, ...], ...]]] = set()
        # the most a run has taken beyond its CBC limit (writing its sub-model, reading the
        # answer back: up to a second on resnet50's step), kept off the next runs' limits so
        # the windows end by the deadline
        overhead = 0.0
        while level < len(LEVELS):
            improved = False
            reach, shifted = LEVELS[level]
            pending = self._window_starts(current(), width, lean, shifted)
            lowest = peak() if peak is not None else 0.0
            while pending:
                self.check()  # no run is pending with the worker here
                left = deadline - time.perf_counter() - overhead
                if left < MIN_WINDOW_SECONDS:
                    return
                before = current()
                state = tuple(map(tuple, before))
                pending = [f for f in pending if (f, level, state) not in tried]
                if not pending:
                    break
                first = pending.pop(0)
                partner = None
                if worker is not None and worker.alive:
                    partner = next((f for f in pending if abs(f - first) >= width), None)
                runs = [first] if partner is None else [first, partner]
                tried.update((f, level, state) for f in runs)
                limit = min(left, seconds)
                if partner is not None:
                    pending.remove(partner)
                    worker.submit(before, range(partner, partner + width), reach, limit)
                free = range(first, first + width)
                ran = time.perf_counter()
                found = [self.milp.run(limit, before, free=free, reach=reach).windows]
                if partner is not None:
                    found.append(worker.result())
                overhead = max(overhead, time.perf_counter() - ran - limit)
                for windows in found:
                    take(windows)
                if len(found) == 2 and found[0] is not None and found[1] is not None:
                    take(_together(before, found[0], found[1]))
                improved = improved or current() is not before
                if peak is not None and peak() < lowest:
                    # the highest stage may have moved: the windows around it next (again,
                    # if they ran earlier in this pass), then the rest of the pass
                    lowest = peak()
                    leading = self._around_highest(current(), width, shifted)
                    pending = leading + [f for f in pending if f not in leading]
            if not improved:
                level += 1

    def _window_starts(self, windows: Windows, width: int, lean: bool, shifted: bool) -> list[int]:
        """First stages of the windows to re-decide, overlapping by half (from stage 0, or a
        quarter of `width` on when `shifted`): for the least peak
        (`lean`), those holding the highest stage first (the peak comes down only where it
        is reached); then those where the schedule recomputes (where time can be won back)."""
        n = self.milp.n
        busy = {i for i, t in enumerate(self.milp.stages) if windows[t]}
        highs = self.milp.stage_highs(windows) if lean else [0.0] * n

        def key(first: int) -> tuple[float, int]:
            stages = range(first, min(first + width, n))
            return -max((highs[i] for i in stages), default=0.0), -len(busy & set(stages))

        return sorted(self._starts(width, shifted), key=key)

    def _around_highest(self, windows: Windows, width: int, shifted: bool) -> list[int]:
        """First stages of the windows (placed as _window_starts places them) that hold the
        highest stage under `windows` (none where no stage has a high point)."""
        highs = self.milp.stage_highs(windows)
        top = max(highs, default=0.0)
        if top <= 0.0:
            return []
        n = self.milp.n
        return [f for f in self._starts(width, shifted) if top in highs[f : min(f + width, n)]]

    def _starts(self, width: int, shifted: bool) -> list[int]:
        """First stages of windows of `width` stages overlapping by half: from stage 0, or
        a quarter of `width` on when `shifted`."""
        n, step = self.milp.n, width // 2
        if shifted:  # none where one window from stage 0 holds every stage
            return list(range(width // 4, n - step, step))
        return list(range(0, max(n - step, 1), step))


def _together(start: Windows, one: Windows, other: Windows) -> Windows | None:
    """The changes two window runs made to `start`, both applied (None where either made
    none: the other alone was taken already)."""
    if one == start or other == start:
        return None
    return [b if b != s else a for s, a, b in zip(start, one, other, strict=True)]


def largest_bound(bounds: list[float | None]) -> float | None:
    """The best of several lower bounds, the unknown (None) left out."""
    known = [b for b in bounds if b is not None]
    return max(known) if known else None


def lp_bound(milp: StepMilp, budget: int, seconds: float) -> float | None:
    """The LP relaxation's least recomputation seconds within `budget`: a valid lower bound
    for every schedule of the space (None if the LP was not solved in time)."""
    milp.use_budget(budget)
    relaxed = milp.relaxation(seconds)
    return None if relaxed is None else relaxed.bound
