"""The whole-step MILP: which forward storages to save, and which forward operators to run
again in each window (explorer.solvers.space), for the least recomputation time under a
memory budget.

In the spirit of Checkmate (Jain et al. 2020) and MONeT (Shah et al. 2021), but over this
tool's schedule space and memory accounting (explorer.simulate, restated by
explorer.solvers.accounting). Decisions are about storages: a view is available exactly when
the storage it views is (the lowering makes views again as needed). Stage i is the i-th
backward operator that reads a forward tensor; the backward operators between two such
stages change no forward storage and only add memory constraints. Variables (CBC via PuLP):

- `redo[i, a]` (binary): allocating forward operator a runs again in window i;
- `avail[i, s]` (binary): forward storage s is allocated entering stage i (`avail[0, s]`:
  the forward saves it);
- `freed[i, s, a]` (in [0, 1]): s is released right after recomputation a of window i
  (a is its last user there and no later stage needs it);
- `mem[i, a]`: bytes allocated right after recomputation a of window i;
- `remade[i, v]` (in [0, 1]): view v is made again in window i for a recomputation there that
  reads it, its storage having been made again earlier in the window (its seconds count).

A read needs its storage available or made earlier in the same window; a storage stays
available only if it was, or was made again. The bytes after every operator (forward,
recomputation, backward) are at most `peak`. The count is exact for every schedule of the
space except those that make a storage again while an older copy is still alive (never
needed: the older copy could have been used). It over-counts those, but one kind it
under-counts: a storage made again while a backward view holds the old copy, and kept past
its stage, is one storage to the MILP and two to the lowering (random_step(Random(7), 10):
264 bytes counted, 268 simulated). Every answer is lowered to a GraphSchedule and simulated
again by the caller; the MILP's count is not trusted, and a proof about a refused answer
labels nothing (explorer.solvers.refine).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import pulp

from explorer.program import forward_needed
from explorer.solvers import cbc
from explorer.solvers.accounting import StepFacts, Storage
from explorer.solvers.space import Space, Windows

Root = tuple[str, int]
CARRY_SLACK = 1e-6  # share of a bound carried to another budget given up (see Relaxation)
GE, LE = pulp.LpConstraintGE, pulp.LpConstraintLE
KEPT_TIE = 0.1  # weight of the least-peak objective's tie-break (see use_least_peak)


@dataclass
class MilpResult:
    """A solved (or time-limited) MILP: its windows if a solution was found, the objective
    and the proven lower bound on it (seconds of recomputation, or bytes of peak; equal
    when CBC proved its answer optimal, which holds for the schedule only if simulation
    agrees with the count)."""

    windows: Windows | None
    objective: float | None
    bound: float | None


@dataclass
class Relaxation:
    """The LP relaxation at one budget (or for the least peak): its value, a lower bound for
    every schedule of the space; the binaries' values (RINS's guide); and, under a budget,
    the value's rate of change per byte of budget (the peak's reduced cost, at most 0). By
    weak duality the LP's value at any other budget b2 is at least
    `bound + slope * (b2 - budget)`: one LP bounds every budget of a sweep, the nearer the
    tighter (UNet at 0.55 of the activations: 3.4e-4 s from the LP at 0.65, 3.6e-4 s its own)."""

    bound: float
    values: dict[str, float]
    budget: int | None
    slope: float | None

    def bound_at(self, budget: int) -> float | None:
        """The lower bound this LP proves at `budget` (None: under the least-peak objective)."""
        if self.budget is None or self.slope is None:
            return None
        change = self.slope * (budget - self.budget)
        # CBC prints the LP's value and reduced costs to about ten digits: the carried bound
        # gives up a millionth of its terms rather than ever claim more than the LP proves
        return max(0.0, self.bound + change - CARRY_SLACK * (abs(self.bound) + abs(change)))


class StepMilp:
    """The MILP for one step, built once, solved for many budgets or for the least peak."""

    def __init__(self, space: Space, facts: StepFacts, seconds: dict[str, float]) -> None:
        self.space = space
        self.facts = facts
        self.seconds = seconds
        graph = facts.graph
        self.position = space.position
        self.maker: dict[Root, str | None] = {}
        decisions = set(space.decisions)
        for root in facts.storages:
            self.maker[root] = root[0] if root[0] in decisions else None
        # operators the forward leaves out when it saves nothing made from them: only the
        # backward reads them (mobilenet_v2's clone before each ReLU6; see _forward_skips)
        needed = forward_needed(graph, set())
        self.backward_only = {a for a in space.decisions if a not in needed}
        self.ops_reads = {a: self._storage_reads(a) for a in space.decisions}
        self.ops_makes = {
            a: [(a, i) for i, m in enumerate(graph.node(a).outputs) if (a, i) in facts.storages]
            for a in space.decisions
        }
        reads = [self._storage_reads(n) for n in space.order]
        self.stages = [t for t, r in enumerate(space.reading) if r]  # backward positions
        self.reads = [reads[t] for t in self.stages]
        self.n = len(self.stages)
        self.candidates = self._candidates()
        self.useful = self._useful()
        self.scale = _byte_scale(facts)
        self._views_cache: dict[str, list[tuple[str, set[str]]]] = {}
        self.remade_views = self._remade_views()
        self.window_views = self._window_views()
        self.time_unit = max(sum(seconds.get(a, 0.0) for a in space.decisions), 1e-12)
        self.unit = self.time_unit
        self.tie_break: pulp.LpAffineExpression | None = None  # windows' (use_least_peak)
        self.skip_offset = 0.0  # the time objective's constant (see _forward_skips)
        self.offset = 0.0  # the current objective's constant, in its units over `unit`
        self.budget: int | None = None  # the current objective's (None: the least peak)
        self.size = sum(len(c) for c in self.candidates)  # recomputation binaries
        self.prob: pulp.LpProblem | None = None
        self._shared_rows: dict[pulp.LpVariable, list[int]] | None = None  # see _shared_rows_with
        self._touched_cache: dict[str, tuple[Root, ...]] = {}
        # the warm start last set (see set_start): its windows, and the start values of the
        # variables a window's sub-model has let CBC overwrite since
        self._start_key: tuple[tuple[str, ...], ...] | None = None
        self._lent: dict[pulp.LpVariable, float | None] = {}
        self._highs: dict[int, float] = {}  # see _start_high
        self._entering: list[tuple[float, list[tuple[Root, float]]]] | None = None
        self._holders: dict[pulp.LpVariable, set[int]] | None = None  # see _stages_holding
        self._rows: list[pulp.LpConstraint] = []  # the model's, in order (_shared_rows_with)

    def build(self) -> None:
        """Write the model (PuLP); separate from __init__ so `size` can be read first."""
        if self.prob is None:
            self._build()

    # -- which variables exist ---------------------------------------------------------------

    def _storage_reads(self, name: str) -> list[Root]:
        """Forward storages operator `name` reads (those held all step excepted)."""
        return [r for r in self.space.storage_reads(name) if r in self.facts.storages]

    def _candidates(self) -> list[list[str]]:
        """Window i may recompute what any stage from i on may need."""
        out: list[list[str]] = [[] for _ in range(self.n)]
        acc: set[str] = set()
        for i in reversed(range(self.n)):
            stack = [self.maker[s] for s in self.reads[i] if self.maker[s]]
            while stack:
                a = stack.pop()
                if a not in acc:
                    acc.add(a)
                    stack.extend(self.maker[s] for s in self.ops_reads[a] if self.maker[s])
            out[i] = sorted(acc, key=self.position.__getitem__)
        return out

    def _useful(self) -> list[list[Root]]:
        """Storages some operator from stage i on may read: only those get `avail[i, s]`."""
        out: list[list[Root]] = [[] for _ in range(self.n)]
        acc: set[Root] = set()
        for i in reversed(range(self.n)):
            acc.update(self.reads[i])
            for a in self.candidates[i]:
                acc.update(self.ops_reads[a])
            out[i] = sorted(acc)
        return out

    def _remade_views(self) -> dict[tuple[int, str], float]:
        """Seconds of the views `lower` surely makes again when window i recomputes a: the
        views of a's storages that stage i's backward operator reads (directly or through
        other views); a's new copy leaves them stale, so each is made once more right before
        it. Views read by the window's own recomputations are counted apart (see
        _window_views); others (read later) are left out: the objective then never exceeds
        a schedule's simulated time, and its LP stays a valid bound.
        (gpt_2_layers at 0.64 of its activations: 1.28e-4 s simulated where the objective
        without them said 0.91e-4 s, and a window's answer it rated cheaper was slower.)"""
        out: dict[tuple[int, str], float] = {}
        for i, t in enumerate(self.stages):
            candidates = set(self.candidates[i])
            for v, makers in self._views_read_by(self.space.order[t]):
                for maker in sorted(makers):
                    if maker in candidates:
                        out[(i, maker)] = out.get((i, maker), 0.0) + self.seconds.get(v, 0.0)
        return out

    def _window_views(self) -> dict[tuple[int, str], tuple[str, list[str]]]:
        """Views a window surely makes again for its own recomputations: when window i
        recomputes a, then b, which reads a view v of a's storage (directly or through other
        views), v is made again once, before the first such b, unless stage i's backward
        operator reads it too (then remade_views counts it). {(i, v): (a, the b's)}.
        (gpt_2_layers at 0.58 to 0.64 of its activations: 2.3% of the step's time in its
        table's answers, where all of that step's recomputations cost 4.3 to 4.9%.)"""
        out: dict[tuple[int, str], tuple[str, list[str]]] = {}
        for i, t in enumerate(self.stages):
            candidates = set(self.candidates[i])
            counted = {v for v, _ in self._views_read_by(self.space.order[t])}
            for b in self.candidates[i]:
                for v, makers in self._views_read_by(b):
                    (a,) = makers if len(makers) == 1 else (None,)
                    if v not in counted and a in candidates and a != b:
                        out.setdefault((i, v), (a, []))[1].append(b)
        return out

    def _views_read_by(self, name: str) -> list[tuple[str, set[str]]]:
        """The views operator `name` reads directly or through other views (pinned ones, and
        what is behind them, excepted: `lower` never makes those again), each with the
        makers of the storages it views (cached)."""
        if name not in self._views_cache:
            graph, space = self.facts.graph, self.space
            found: list[tuple[str, set[str]]] = []
            seen: set[str] = set()
            stack = [r[0] for r in graph.node(name).inputs]
            while stack:
                v = stack.pop()
                if v in seen or v not in space.views or v in space.pinned:
                    continue
                seen.add(v)
                stack.extend(r[0] for r in graph.node(v).inputs)
                outputs = range(len(graph.node(v).outputs))
                found.append((v, {space.owner.get((v, k), (v, k))[0] for k in outputs}))
            self._views_cache[name] = found
        return self._views_cache[name]

    # -- the model ---------------------------------------------------------------------------

    def _build(self) -> None:
        prob = pulp.LpProblem("step", pulp.LpMinimize)
        self.prob = prob
        self.peak = prob.add_variable("peak", 0)
        roots = sorted(self.facts.storages)
        self.rid = {r: k for k, r in enumerate(roots)}
        opid = {a: k for k, a in enumerate(self.space.decisions)}
        self.redo = {
            (i, a): prob.add_variable(f"r{i}_{opid[a]}", cat="Binary")
            for i in range(self.n)
            for a in self.candidates[i]
        }
        self.avail = {
            (i, s): prob.add_variable(f"a{i}_{self.rid[s]}", cat="Binary")
            for i in range(self.n)
            for s in self.useful[i]
        }
        self.freed: dict[tuple[int, Root, str], pulp.LpVariable] = {}
        self.mem: dict[tuple[int, str], pulp.LpVariable] = {}
        self.entry: list[dict[pulp.LpVariable, float]] = []  # stage i's bytes from avail[i, .]
        self.peak_rows: list[list[pulp.LpConstraint]] = []  # stage i's rows "... <= peak"
        self.local: list[set[pulp.LpVariable]] = []  # stage i's mem and freed variables
        self.releases: list[list[tuple[Root, pulp.LpVariable]]] = []  # stage i's freed
        self._availability()
        self._forward_memory()
        self._between_memory()
        for i in range(self.n):
            self._stage_memory(i)
        prob += self.peak >= self.facts.end_bytes * self.scale
        view_cost = self._window_view_rows()
        self.time_cost = (
            pulp.lpSum(self._cost(i, a) / self.time_unit * x for (i, a), x in self.redo.items())
            + pulp.lpSum(view_cost)
            + self._forward_skips()
        )

    def _forward_skips(self) -> pulp.LpAffineExpression:
        """The seconds the forward saves by not running an operator only the backward reads,
        when it does not save what it makes (the backward makes it again where it reads it):
        `seconds * (avail[0, s] - 1)` for its first storage s, the constant kept apart in
        `skip_offset` (CBC's logged bounds leave an objective's constant out). Without this
        the objective counted mobilenet_v2's clone before each ReLU6 twice, and exceeded the
        simulated time of 60 of its 65 table schedules at b16 96 px (P100 seconds), by up to
        4.7% of the step: its bounds were not bounds. Where a saved value made from the
        operator keeps it in the forward after all, this under-counts, which bounds allow."""
        terms: dict[pulp.LpVariable, float] = {}
        for a in sorted(self.backward_only, key=self.position.__getitem__):
            stores = [s for s in self.ops_makes[a] if (0, s) in self.avail]
            if not stores:
                continue
            share = self.seconds.get(a, 0.0) / self.time_unit
            x = self.avail[(0, stores[0])]
            terms[x] = terms.get(x, 0.0) + share
            self.skip_offset -= share
        return pulp.LpAffineExpression(terms)

    def _window_view_rows(self) -> list[pulp.LpAffineExpression]:
        """A variable per view of window_views, at least 1 when its storage's maker and one
        of its readers are both recomputed (`remade >= redo[a] + redo[b] - 1`); the terms
        of their seconds in the objective."""
        self.remade: dict[tuple[int, str], pulp.LpVariable] = {}
        self._linked: dict[pulp.LpVariable, list[pulp.LpVariable]] = {}  # redo: its remade
        cost = []
        for k, ((i, v), (a, readers)) in enumerate(self.window_views.items()):
            z = self.prob.add_variable(f"v{k}", 0, 1)
            self.remade[(i, v)] = z
            x, reads = self.redo[(i, a)], [self.redo[(i, b)] for b in readers]
            for y in reads:
                self.prob += _row({z: 1, x: -1, y: -1}, 1, GE)
            for y in (x, *reads):
                self._linked.setdefault(y, []).append(z)
            cost.append(self.seconds.get(v, 0.0) / self.time_unit * z)
        return cost

    def _made(self, i: int, s: Root) -> pulp.LpVariable | None:
        """The variable that makes storage s again in window i (None: none can)."""
        a = self.maker[s]
        return self.redo.get((i, a)) if a else None

    def _availability(self) -> None:
        """A read needs its storage available or made again before it in the window; a
        storage is available entering the next stage only if it was, or was made again
        (rows as terms, see _stage_rows: `avail + made >= 1`, `redo <= avail + made` and
        `avail[i + 1] <= avail[i] + made`)."""
        prob = self.prob
        for i in range(self.n):
            for s in self.reads[i]:
                made = self._made(i, s)
                terms = {self.avail[(i, s)]: 1}
                if made is not None:
                    terms[made] = 1
                prob += _row(terms, -1, GE)
            for a in self.candidates[i]:
                for s in self.ops_reads[a]:
                    prob += _row(
                        _sum_at_most(self.redo[(i, a)], self.avail[(i, s)], self._made(i, s)), 0, LE
                    )
            if i + 1 < self.n:
                for s in self.useful[i + 1]:
                    prob += _row(
                        _sum_at_most(self.avail[(i + 1, s)], self.avail[(i, s)], self._made(i, s)),
                        0,
                        LE,
                    )

    def _state(self, i: int, t: int):
        """Bytes of forward storages allocated while backward operator t runs, given the
        storages available entering stage i (nothing but views' holds after the last)."""
        f, sc = self.facts, self.scale
        const, terms = 0, []
        for root, s in f.storages.items():
            if s.held or not s.nbytes:
                continue
            if s.held_in_backward(t):
                const += s.nbytes
            elif i < self.n and (i, root) in self.avail:
                terms.append(s.nbytes * sc * self.avail[(i, root)])
        return pulp.lpSum(terms) + const * sc

    def _forward_memory(self) -> None:
        """The forward's rows (`forward_rows`), a storage saved when available at stage 0."""
        f = self.facts
        saved = [
            (s, self.avail[(0, s.root)])
            for s in f.storages.values()
            if not s.held and s.nbytes and self.n and (0, s.root) in self.avail
        ]
        for row in forward_rows(f, saved, self.peak, self.scale):
            self.prob += row

    def _between_memory(self) -> None:
        """Backward operators without a window run with the storages available entering the
        next stage (nothing changes them in between). Those before one stage while the same
        storages are held by backward views have rows that differ only in their fixed
        bytes: the one with the most is kept (sample:gpt: 75 rows of 266, resnet50: 68 of
        125, and a window's model a third smaller on sample:gpt)."""
        f = self.facts
        nxt = 0
        fullest: dict[tuple[int, frozenset[Root]], int] = {}  # (stage, held): operator
        for t in range(len(self.space.order)):
            while nxt < self.n and self.stages[nxt] < t:
                nxt += 1
            if nxt < self.n and self.stages[nxt] == t:
                continue
            held = frozenset(
                root
                for root, s in f.storages.items()
                if not s.held and s.nbytes and s.held_in_backward(t)
            )
            kept = fullest.get((nxt, held))
            if kept is None or f.backward_at[t] > f.backward_at[kept]:
                fullest[(nxt, held)] = t
        for (i, _), t in sorted(fullest.items(), key=lambda item: item[1]):
            self.prob += self._state(i, t) + f.backward_at[t] * self.scale <= self.peak

    def _touched(self, a: str) -> tuple[Root, ...]:
        """Storages operator a reads or allocates, sorted: the rows written for them come in
        the same order whatever the hash seed, so CBC reads one model in every process
        (cached: the warm start asks often)."""
        if a not in self._touched_cache:
            self._touched_cache[a] = tuple(sorted({*self.ops_reads[a], *self.ops_makes[a]}))
        return self._touched_cache[a]

    def _stage_memory(self, i: int) -> None:
        """Memory entering stage i, after each recomputation of its window, and at its
        backward operator (see module docstring)."""
        f, sc = self.facts, self.scale
        t = self.stages[i]
        self.entry.append(
            {
                self.avail[(i, r)]: f.storages[r].nbytes * sc
                for r in self.useful[i]
                if f.storages[r].nbytes and not f.storages[r].held_entering(t)
            }
        )
        self.peak_rows.append([])
        self.local.append(set())
        self.releases.append([])
        for row in self._stage_rows(i, self.candidates[i], lambda a: self.redo[(i, a)], True):
            self.prob += row

    def _stage_rows(
        self, i: int, window: list[str], redo: Callable[[str], pulp.LpVariable | int], new: bool
    ) -> Iterator[pulp.LpConstraint]:
        """The rows of stage i's memory over the recomputations `window` (its candidates in
        order, or those of them not fixed at 0, which change nothing), each `redo(a)` a
        variable or a fixed value (1). `new`: make the variables (the whole model, once).

        The rows are written as terms and constants (see _row), not with PuLP's operators,
        which make several expressions per row (resnet50 b8 128 px: 132,000 rows in 2.5 s).
        The coefficients, constants and term orders are those the operators gave."""
        f, sc, peak = self.facts, self.scale, self.peak
        t = self.stages[i]
        # the bytes allocated so far: entering the stage, then after each recomputation
        current: dict[pulp.LpVariable, float] = dict(self.entry[i])
        constant = 0.0 + self._entering_bytes()[i][0]
        read_now = set(self.reads[i])
        touchers: dict[Root, list[str]] = {}
        for a in window:
            for root in self._touched(a):
                touchers.setdefault(root, []).append(a)
        for k, a in enumerate(window):
            x = redo(a)
            made = sum(f.storages[r].nbytes for r in self.ops_makes[a]) * sc
            workspace = f.workspace.get(a, 0) * sc
            if new:
                self.mem[(i, a)] = self._local_variable(i, f"m{i}_{k}", None)
            mem = self.mem[(i, a)]
            # mem >= current + made * x, and mem + workspace * x <= peak
            terms = {mem: 1, **{v: -c for v, c in current.items()}}
            if isinstance(x, int):
                yield _row(terms, -(constant + made * x), GE)
                yield self._peak_row(i, {mem: 1, peak: -1}, workspace * x, new)
            else:
                if made:
                    terms[x] = -made
                yield _row(terms, -constant, GE)
                high = {mem: 1, x: workspace, peak: -1} if workspace else {mem: 1, peak: -1}
                yield self._peak_row(i, high, 0, new)
            current, constant = {mem: 1}, 0.0
            for root in self._touched(a):
                s = f.storages[root]
                if not s.nbytes or root in read_now or s.held_in_backward(t):
                    continue
                if new:
                    y = self._local_variable(i, f"f{i}_{k}_{self.rid[root]}", 1)
                    self.freed[(i, root, a)] = y
                    self.releases[i].append((root, y))
                y = self.freed[(i, root, a)]
                # released only after a recomputation (y <= x), if the next stage does not
                # need it (y <= 1 - avail) and no later recomputation here touches it
                yield _at_most(y, x, False)
                if (i + 1, root) in self.avail:
                    yield _at_most(y, self.avail[(i + 1, root)], True)
                for later in touchers[root]:
                    if self.position[later] > self.position[a]:
                        yield _at_most(y, redo(later), True)
                current[y] = -(s.nbytes * sc)
        current[peak] = -1
        backward = (f.backward_at[t] - f.backward_before[t]) * sc
        yield self._peak_row(i, current, constant + backward, new)

    def _local_variable(self, i: int, name: str, upper: int | None) -> pulp.LpVariable:
        """A new continuous variable of stage i's memory (a mem or a freed), from 0."""
        x = self.prob.add_variable(name, 0, upper)
        self.local[i].add(x)
        return x

    def _peak_row(
        self, i: int, terms: dict[pulp.LpVariable, float], constant: float, new: bool
    ) -> pulp.LpConstraint:
        """`terms + constant <= 0` (terms that hold `-peak`), remembered as one of stage i's
        peaks when `new`."""
        row = _row(terms, constant, LE)
        if new:
            self.peak_rows[i].append(row)
        return row

    # -- solving -----------------------------------------------------------------------------

    def use_budget(self, budget: int) -> None:
        """Objective: least recomputation seconds within `budget` bytes."""
        self.build()
        self.peak.upBound = budget * self.scale
        self.budget = budget
        self.prob.setObjective(self.time_cost)
        self.unit = self.time_unit
        self.offset = self.skip_offset
        self.tie_break = None

    def use_least_peak(self) -> None:
        """Objective: the least peak in bytes (whatever it recomputes: a tie-break on time
        makes CBC much slower to lower the peak; `fastest` at that peak comes next). Windows
        and RINS break ties towards fewer bytes saved by the forward (KEPT_TIE of a peak
        unit in all): without that, a window that lowers what its stages keep but not yet
        the peak is not worth taking, and the windows stall wherever the peak is bound at
        several places (sample:gpt's windows in 16 s: 0.264 of the activations without,
        0.251 to 0.258 with). CBC on the whole model, which may prove the peak, gets the
        peak alone."""
        self.build()
        self.peak.upBound = None
        self.budget = None
        saved = [(self.facts.storages[s].nbytes, x) for (i, s), x in self.avail.items() if i == 0]
        total = max(sum(nbytes for nbytes, _ in saved), 1)
        self.tie_break = pulp.lpSum(KEPT_TIE * nbytes / total * x for nbytes, x in saved)
        self.prob.setObjective(self.peak)
        self.unit = 1 / self.scale
        self.offset = 0.0

    def _bound(self, raw: float | None) -> float | None:
        """A proven bound in the objective's units (CBC's, without the constant)."""
        return None if raw is None else max(0.0, self._value(raw))

    def _value(self, raw: float) -> float:
        """An objective value CBC or PuLP gives (without the constant), in its units."""
        return (raw + self.offset) * self.unit

    def run(
        self,
        time_limit: float | None,
        start: Windows | None = None,
        free: range | None = None,
        reach: int | None = None,
    ) -> MilpResult:
        """Solve under the current objective, from `start` (CBC's MIP start). With `free`
        (and a start), only the windows of those stages may change: CBC then gets the model
        with every other decision replaced by its value in `start`. `reach` narrows each of
        those windows to the operators it runs in `start` and those within `reach`
        producers of what its stage reads (None: every operator it may run)."""
        if start is not None:
            self.set_start(start)
        prob = self.prob
        if free is not None and start is not None:
            prob = self._neighbourhood(free, reach)
        else:
            self._forget_start()  # CBC overwrites every variable
        outcome = cbc.solve(prob, time_limit, warm_start=start is not None)
        bound = None if free else self._bound(outcome.bound)
        if not outcome.found:
            return MilpResult(None, None, bound)
        return MilpResult(self.windows(), self._value(outcome.objective or 0.0), bound)

    def count(self, windows: Windows) -> float | None:
        """The MILP's least peak for exactly these recomputations (everything else left to
        CBC): it must equal the simulated peak of the lowered schedule."""
        self.use_least_peak()
        chosen = {(i, a) for i, t in enumerate(self.stages) for a in windows[t]}
        for key, x in self.redo.items():
            x.lowBound = x.upBound = 1 if key in chosen else 0
        self._forget_start()
        try:
            outcome = cbc.solve(self.prob, None)
        finally:
            for x in self.redo.values():
                x.lowBound, x.upBound = 0, 1
        return None if outcome.objective is None else outcome.objective * self.unit

    def _neighbourhood(self, free: range, reach: int | None) -> pulp.LpProblem:
        """The model restricted to re-deciding the windows of stages `free` (see `run`): the
        recomputations they may run, the availability at their stages of the storages those
        read or make, and the memory of every stage these appear in. Before the windows, such
        a storage's availability is tied to its availability entering them (`_tied_before`);
        after them it stays as at the start, which keeps each copy only up to its last read
        (`_available_entering`): the later stages' reads and remakings are fixed, so they
        need no more. Every other variable keeps its start value. (A window's model has a
        third of the variables it had with that availability free at every stage; every
        window compared had the same optimum either way: docs/BENCHMARKS.md.)"""
        stages = set(free) & set(range(self.n))
        touched: set[Root] = set()
        free_vars: set[pulp.LpVariable] = set()
        for i in stages:
            touched.update(self.reads[i])
            for a in self._within_reach(i, reach):
                touched.update(self._touched(a))
                free_vars.add(self.redo[(i, a)])
        if not stages:  # a window past the last stage: nothing to re-decide
            return self._restricted(free_vars, stages)
        first, last = min(stages), max(stages)
        fixed_reads = self._fixed_reads(first)
        tied: dict[pulp.LpVariable, pulp.LpVariable] = {}
        for s in touched:
            free_vars.update(
                self.avail[(i, s)] for i in range(first, last + 1) if (i, s) in self.avail
            )
            tied.update(self._tied_before(first, s, fixed_reads))
        return self._restricted(free_vars, stages, tied)

    def _fixed_reads(self, first: int) -> list[set[Root]]:
        """For each stage before `first`, the storages it needs available or made there,
        its start's recomputations fixed: what its backward operator reads, and what they
        read."""
        return [
            set(self.reads[i]).union(
                *(self.ops_reads[a] for a in self.candidates[i] if _is_one(self.redo[(i, a)]))
            )
            for i in range(first)
        ]

    def _tied_before(
        self, first: int, s: Root, fixed_reads: list[set[Root]]
    ) -> dict[pulp.LpVariable, pulp.LpVariable]:
        """Storage s's availability entering the stages before `first` that follow its last
        read or remaking there, each tied to its availability entering `first`: with every
        read and remaking of those stages fixed, it can only fall from one stage to the next,
        and falling earlier only frees memory, so the least that serves the windows is
        available throughout or not at all (from the forward's end when nothing earlier
        reads or makes it: the save decision itself). Where it is read or made again later,
        it stays as at the start. The one variable replaces up to 33 on gpt_2_layers."""
        joined = self.avail.get((first, s))
        if joined is None:
            return {}
        tail = 0
        for i in range(first):
            made = self._made(i, s)
            if s in fixed_reads[i] or (made is not None and _is_one(made)):
                tail = i + 1
        return {self.avail[(j, s)]: joined for j in range(tail, first) if (j, s) in self.avail}

    def _within_reach(self, i: int, reach: int | None) -> list[str]:
        """The operators window i may re-decide: those the start runs there, and those
        within `reach` producers of what stage i reads (most gains are near the reads,
        and a narrow window is a CBC run several times cheaper)."""
        if reach is None:
            return self.candidates[i]
        near: set[str] = set()
        frontier = {self.maker[s] for s in self.reads[i] if self.maker[s]}
        for _ in range(reach):
            frontier -= near
            near |= frontier
            frontier = {self.maker[s] for a in frontier for s in self.ops_reads[a] if self.maker[s]}
        return [a for a in self.candidates[i] if a in near or _is_one(self.redo[(i, a)])]

    def _restricted(
        self,
        free_vars: set[pulp.LpVariable],
        stages: set[int],
        tied: dict[pulp.LpVariable, pulp.LpVariable] | None = None,
    ):
        """The model with only the binaries `free_vars` free (stages `stages` hold the free
        recomputations) and every other variable fixed to its start value: a row left
        without a free variable (the start satisfies it) is dropped.

        The memory rows of a stage are written again for it alone, over the recomputations
        that are free or fixed at 1 (one fixed at 0 changes nothing), for the stages of
        `stages` and the one before each (so that a window may keep what that stage makes
        instead of making it again); every other stage keeps its start's recomputations and
        releases, and its rows fold into one (see _folded_rows). On sample:gpt a 16-stage
        window of reach 2 fell from 9,000 to 24,000 rows to 2,000 to 9,400, and a window
        run (writing the model, CBC, reading back) from 0.6 to 1.0 s to 0.2 to 0.7 s.
        `tied`: variables replaced by another (free) one wherever they appear."""
        tied = tied or {}
        free_vars = set(free_vars) | {self.peak}
        free_vars |= {z for x in list(free_vars) for z in self._linked.get(x, ())}
        whole = {j for i in stages for j in (i - 1, i) if j >= 0 and self.local[j]}
        folded = [j for j in range(self.n) if j not in whole and self.local[j]]
        sub = pulp.LpProblem("window", pulp.LpMinimize)
        for row in self._shared_rows_with(free_vars | tied.keys()):
            self._add_fixed_out(sub, row, free_vars, tied=tied)
        for j in sorted(whole):

            def redo(a: str, j: int = j) -> pulp.LpVariable | int:
                x = self.redo[(j, a)]
                return x if x in free_vars else 1

            window = [
                a
                for a in self.candidates[j]
                if self.redo[(j, a)] in free_vars or _is_one(self.redo[(j, a)])
            ]
            for row in self._stage_rows(j, window, redo, False):
                self._add_fixed_out(sub, row, free_vars, self.local[j], tied)
        for row in self._folded_rows(folded, free_vars, tied):
            sub += row
        objective = self.prob.objective
        if self.tie_break is not None:
            objective = objective + self.tie_break
        terms, constant = _fixed_out(objective.items(), 0.0, free_vars, frozenset(), tied)
        sub.setObjective(pulp.LpAffineExpression(terms, constant))
        for x in sub.variables():  # CBC will overwrite them: set_start puts them back
            self._lent.setdefault(x, x.varValue)
        return sub

    @staticmethod
    def _add_fixed_out(
        sub: pulp.LpProblem,
        row: pulp.LpConstraint,
        free_vars: set[pulp.LpVariable],
        local: set[pulp.LpVariable] = frozenset(),  # type: ignore[assignment]
        tied: dict[pulp.LpVariable, pulp.LpVariable] | None = None,
    ) -> None:
        """Add `row` to `sub` (see `_fixed_out`; nothing if no variable is left)."""
        terms, constant = _fixed_out(row.items(), row.constant, free_vars, local, tied or {})
        if terms:
            sub += pulp.LpConstraint(pulp.LpAffineExpression(terms, constant), row.sense)

    def _folded_rows(
        self,
        folded: list[int],
        free_vars: set[pulp.LpVariable],
        tied: dict[pulp.LpVariable, pulp.LpVariable],
    ) -> list[pulp.LpConstraint]:
        """For each stage of `folded` (all its recomputations and releases fixed): one row,
        its entry's free part plus its highest point at the start less that part, at most
        the peak (the stages whose entry is fixed share one row); and, for each storage a
        fixed release lets go, that it is not available entering the next stage."""
        rows, fixed_high = [], 0.0
        varying = self._stages_holding(free_vars | tied.keys())
        for j in folded:
            high = self._start_high(j)
            if j not in varying:  # nothing free in its entry or releases
                fixed_high = max(fixed_high, high)
                continue
            for root, y in self.releases[j]:
                kept = self.avail.get((j + 1, root))
                kept = tied.get(kept, kept)
                if _is_one(y) and kept is not None and kept in free_vars:
                    rows.append(kept <= 0)
            entry = {x: c for x, c in self.entry[j].items() if x in free_vars or x in tied}
            if not entry:
                fixed_high = max(fixed_high, high)
                continue
            high -= _at_start(entry.items())
            terms, _ = _fixed_out(entry.items(), 0.0, free_vars, frozenset(), tied)
            rows.append(pulp.LpAffineExpression(terms, high) <= self.peak)
        rows.append(self.peak >= fixed_high)
        return rows

    def _stages_holding(self, held: set[pulp.LpVariable]) -> set[int]:
        """The stages whose entry, or whose releases' availability entering the next stage,
        holds a variable of `held` (the index is built once): the only stages a window's
        `_folded_rows` must read term by term (resnet50 b8 128 px: a median of 51 of the 139
        stages a window folds)."""
        if self._holders is None:
            self._holders = {}
            for j in range(self.n):
                for x in self.entry[j]:
                    self._holders.setdefault(x, set()).add(j)
                for root, _ in self.releases[j]:
                    kept = self.avail.get((j + 1, root))
                    if kept is not None:
                        self._holders.setdefault(kept, set()).add(j)
        found: set[int] = set()
        for x in held:
            found.update(self._holders.get(x, ()))
        return found

    def stage_highs(self, windows: Windows) -> list[float]:
        """Each stage's highest point (scaled bytes) under the schedule `windows`, as its rows
        count it (0 for a stage without rows): the least-peak search re-decides the windows
        around the highest first. Computed once per start, as the window runs need it too."""
        self.set_start(windows)
        return [self._start_high(j) if self.peak_rows[j] else 0.0 for j in range(self.n)]

    def _start_high(self, j: int) -> float:
        """Stage j's highest point at the start (scaled bytes), kept until the next whole
        start: every window folds most stages, each from all its rows."""
        if j not in self._highs:
            self._highs[j] = max(
                row.constant + _at_start((x, c) for x, c in row.items() if x is not self.peak)
                for row in self.peak_rows[j]
            )
        return self._highs[j]

    def relaxation(self, time_limit: float | None) -> Relaxation | None:
        """The LP relaxation under the current objective; None if not solved to optimality
        (a simplex stopped by its time limit proves no bound; PuLP calls it solved)."""
        self._forget_start()
        outcome = cbc.solve(self.prob, time_limit, relax=True)
        if not outcome.optimal or outcome.objective is None:
            return None
        values = {x.name: x.varValue or 0.0 for x in [*self.redo.values(), *self.avail.values()]}
        bound = self._bound(outcome.objective) or 0.0
        if self.budget is None or self.peak.dj is None:
            return Relaxation(bound, values, None, None)
        slope = min(self.peak.dj, 0.0) * self.unit * self.scale  # seconds per byte of budget
        return Relaxation(bound, values, self.budget, slope)

    def saved_bytes(self, windows: Windows) -> int:
        """Bytes of forward storages the schedule `windows` saves (the least-peak tie-break)."""
        self.build()
        entering = self._available_entering(windows)
        return sum(self.facts.storages[s].nbytes for i, s in entering if i == 0)

    def _cost(self, i: int, a: str) -> float:
        """Seconds of recomputing a in window i: a's own and those of the views it surely
        makes stale (see _remade_views)."""
        return self.seconds.get(a, 0.0) + self.remade_views.get((i, a), 0.0)

    def run_guided(self, time_limit: float, start: Windows, lp: dict[str, float]) -> MilpResult:
        """RINS: from `start`, re-decide only the binaries on which the LP relaxation `lp`
        disagrees with it (by more than 0.1), with everything else fixed."""
        self.set_start(start)
        free_vars: set[pulp.LpVariable] = set()
        stages: set[int] = set()
        for (i, _), x in self.redo.items():
            if abs(lp.get(x.name, 0.0) - (x.varValue or 0.0)) > 0.1:
                free_vars.add(x)
                stages.add(i)
        for x in self.avail.values():
            if abs(lp.get(x.name, 0.0) - (x.varValue or 0.0)) > 0.1:
                free_vars.add(x)
        outcome = cbc.solve(self._restricted(free_vars, stages), time_limit, warm_start=True)
        if not outcome.found:
            return MilpResult(None, None, None)
        return MilpResult(self.windows(), self._value(outcome.objective or 0.0), None)

    def prepare_windows(self) -> None:
        """Build what every window run reads (the model, the indexes of its shared rows and
        of the stages holding each variable), so that a forked worker inherits it instead of
        building its own."""
        self.build()
        self._shared_rows_with(set())
        self._stages_holding(set())

    def _shared_rows_with(self, free_vars: set[pulp.LpVariable]) -> list[pulp.LpConstraint]:
        """The rows without a stage's mem or freed variable (a window writes those stages'
        rows again) that hold any of `free_vars`, in the model's order (the index is built
        once, and so is the list of rows, which PuLP makes afresh at each call: 15 ms a
        window on densenet121's 1.78 M rows)."""
        if self._shared_rows is None:
            self._rows = self.prob.constraints()
            local = set().union(*self.local)
            self._shared_rows = {}
            for k, row in enumerate(self._rows):
                if any(x in local for x in row):
                    continue
                for x in row:
                    self._shared_rows.setdefault(x, []).append(k)
        picked = sorted({k for x in free_vars for k in self._shared_rows.get(x, ())})
        return [self._rows[k] for k in picked]

    def windows(self) -> Windows:
        """The recomputations of the current solution, as windows of the space."""
        windows = self.space.empty()
        for i, t in enumerate(self.stages):
            windows[t] = [a for a in self.candidates[i] if _is_one(self.redo[(i, a)])]
        return windows

    # -- warm start --------------------------------------------------------------------------

    def set_start(self, windows: Windows) -> None:
        """Give every variable the value the schedule `windows` implies (CBC's MIP start).
        Starting again from the windows of the last start, only the variables CBC has
        overwritten since (those of the window sub-models) are put back: most window runs
        find nothing and start again where they did, and a whole start costs a tenth of a
        second on resnet50's step."""
        key = tuple(map(tuple, windows))
        if key == self._start_key:
            for x, value in self._lent.items():
                x.varValue = value
        else:
            self._forget_start()
            chosen = {(i, a) for i, t in enumerate(self.stages) for a in windows[t]}
            for k, x in self.redo.items():
                x.varValue = 1 if k in chosen else 0
            avail = self._available_entering(windows)
            for k, x in self.avail.items():
                x.varValue = 1 if k in avail else 0
            for i in range(self.n):
                self._start_stage(i, chosen, avail)
            for (i, v), z in self.remade.items():
                a, readers = self.window_views[(i, v)]
                both = (i, a) in chosen and any((i, b) in chosen for b in readers)
                z.varValue = 1 if both else 0
            self._start_key = key
        self._lent = {}
        if self.peak.upBound is not None:
            self.peak.setInitialValue(self.peak.upBound)

    def _forget_start(self) -> None:
        """The variables no longer hold the last start: the next one is set whole."""
        self._start_key = None
        self._highs.clear()

    def _available_entering(self, windows: Windows) -> set[tuple[int, Root]]:
        """(i, s) where storage s is read at or after stage i from a copy made before it."""
        made_at: dict[Root, int] = {s: -1 for s in self.facts.storages}
        last: dict[tuple[Root, int], int] = {}
        for i, t in enumerate(self.stages):
            for a in windows[t]:
                for s in self.ops_reads[a]:
                    last[(s, made_at[s])] = i
                for s in self.ops_makes[a]:
                    made_at[s] = i
            for s in self.reads[i]:
                last[(s, made_at[s])] = i
        return {
            (i, s)
            for (s, made), read in last.items()
            for i in range(made + 1, read + 1)
            if (i, s) in self.avail
        }

    def _start_stage(self, i: int, chosen, avail) -> None:
        """Stage i's mem and freed values under the recomputations `chosen` and the
        storages `avail` available entering each stage."""
        f, sc = self.facts, self.scale
        held, counted = self._entering_bytes()[i]
        current = held + sum(nbytes for root, nbytes in counted if (i, root) in avail)
        window = self.candidates[i]
        last_use: dict[Root, int] = {}  # the last recomputation of window i touching a storage
        for a in window:
            if (i, a) in chosen:
                for root in self._touched(a):
                    last_use[root] = self.position[a]
        for a in window:
            x = 1 if (i, a) in chosen else 0
            current += sum(f.storages[r].nbytes for r in self.ops_makes[a]) * sc * x
            self.mem[(i, a)].setInitialValue(current)
            for root in self._touched(a):
                y = self.freed.get((i, root, a))
                if y is None:
                    continue
                free = bool(x) and last_use[root] <= self.position[a]
                free = free and (i + 1, root) not in avail
                y.varValue = 1 if free else 0
                current -= f.storages[root].nbytes * sc * (1 if free else 0)

    def _entering_bytes(self) -> list[tuple[float, list[tuple[Root, float]]]]:
        """Per stage, the scaled bytes entering it before its window runs: the fixed ones
        (the backward's own and the storages backward views hold), and the storages that
        count when available (worked out once: every start and every window's rewritten
        stage needs them)."""
        if self._entering is None:
            f, sc = self.facts, self.scale
            self._entering = []
            for t in self.stages:
                held, counted = f.backward_before[t] * sc, []
                for root, s in f.storages.items():
                    if s.held or not s.nbytes:
                        continue
                    if s.held_entering(t):
                        held += s.nbytes * sc
                    else:
                        counted.append((root, s.nbytes * sc))
                self._entering.append((held, counted))
        return self._entering


def forward_rows(
    facts: StepFacts,
    saved: list[tuple[Storage, pulp.LpVariable]],
    peak: pulp.LpVariable,
    scale: float,
) -> Iterator[pulp.LpConstraint]:
    """Bytes when the forward has returned (the saved storages beside what stays) and after
    each forward position p, at most `peak`: a storage past its last forward reader costs
    bytes only if saved (`saved`: each storage with the variable saying so). A row implied
    by a later one with a larger fixed part is left out."""
    if facts.after_forward is not None:
        terms = {x: s.nbytes * scale for s, x in saved}
        terms[peak] = -1
        yield _row(terms, facts.after_forward * scale, LE)
    most = -1
    for p in reversed(range(len(facts.forward))):
        const = facts.forward_const[p]
        if const <= most:
            continue
        most = const
        terms = {x: s.nbytes * scale for s, x in saved if s.last_forward < p}
        terms[peak] = -1
        yield _row(terms, const * scale, LE)


def _row(terms: dict[pulp.LpVariable, float], constant: float, sense: int) -> pulp.LpConstraint:
    """The row `terms + constant (sense) 0`, made directly."""
    return pulp.LpConstraint(pulp.LpAffineExpression(terms, constant), sense)


def _at_most(y: pulp.LpVariable, x: pulp.LpVariable | int, flip: bool) -> pulp.LpConstraint:
    """`y <= x`, or `y <= 1 - x` if `flip`; x a variable or a fixed value."""
    if isinstance(x, int):
        return _row({y: 1}, -(1 - x if flip else x), LE)
    return _row({y: 1, x: 1 if flip else -1}, -1 if flip else 0, LE)


def _sum_at_most(
    x: pulp.LpVariable, avail: pulp.LpVariable, made: pulp.LpVariable | None
) -> dict[pulp.LpVariable, int]:
    """The terms of `x <= avail + made` (made None: `x <= avail`)."""
    return {x: 1, avail: -1} if made is None else {x: 1, avail: -1, made: -1}


def _at_start(terms: Iterable[tuple[pulp.LpVariable, float]]) -> float:
    """The value of a sum of terms at the current solution (or start)."""
    return sum(c * (x.varValue or 0.0) for x, c in terms)


def _fixed_out(
    items: Iterable[tuple[pulp.LpVariable, float]],
    constant: float,
    free_vars: set[pulp.LpVariable],
    local: set[pulp.LpVariable],
    tied: dict[pulp.LpVariable, pulp.LpVariable],
) -> tuple[dict[pulp.LpVariable, float], float]:
    """Terms and constant of a row with each tied variable replaced by the one it is tied
    to, and every variable then in neither `free_vars` nor `local` by its start value."""
    terms: dict[pulp.LpVariable, float] = {}
    for x, coef in items:
        x = tied.get(x, x)
        if x in free_vars or x in local:
            terms[x] = terms.get(x, 0.0) + coef
        else:
            constant += coef * (x.varValue or 0.0)
    return {x: c for x, c in terms.items() if c}, constant


def _is_one(x: pulp.LpVariable) -> bool:
    """Whether a binary is 1 in the current solution (or start)."""
    return (x.value() or 0) > 0.5


def _byte_scale(facts: StepFacts) -> float:
    """`byte_scale` of the step's largest fixed byte count."""
    return byte_scale(
        max([facts.end_bytes, *facts.forward_const, *facts.backward_at, facts.after_forward or 0])
    )


def byte_scale(largest: int) -> float:
    """A power of two that brings `largest` bytes near 2**12 (exact in floating point)."""
    return 2.0 ** -(max(0, max(largest, 1).bit_length() - 12))
