"""Cheap lower bounds for a whole step, however large: the least peak no schedule of the
space goes under, and the least recomputation seconds within a budget.

The whole-step MILP (explorer.solvers.milp) decides, stage by stage, what is available and
what each window runs again; its LP relaxation takes minutes on a large step (resnet50 b8
128 px: 13,476 binaries, 176,439 rows, unsolved in 60 s). This relaxation forgets when
things happen in the backward and keeps only what must hold at each moment:

- `again[a]`: forward operator a runs again somewhere (costs its seconds at least once, but
  for an operator only the backward reads, which the forward then need not run at all);
- `saved[s]`: the forward saves storage s (it is allocated when the forward returns).

A storage a stage reads is saved or made again (`saved[s] + again[maker] >= 1`); an
operator run again reads each input storage saved or made again itself
(`again[a] <= saved[u] + again[maker(u)]`). Memory rows: after each forward operator the
fixed bytes plus the saved storages past their last forward reader; at each backward
operator the fixed bytes, the storages it reads and those backward views hold, every
storage a later stage reads that is never made again, and, for pairs of such a storage and
an input of its maker that no stage reads (`_pairs`), the pair's bytes where the first is
made again and the second is not (one of them is then allocated until the first's last
reader). Each is a bound on the same moment of `simulate`'s count (explorer.solvers.
accounting splits it) that every schedule of the space meets, with `again[a]` whether a
runs in any window and `saved[s]` whether the forward saves s; the windows' own moments are
left out. So the LP's values bound every schedule of the space, of the chain's backward
order (not autograd's own, outside the space). On the small graphs of bench/small_graphs.py
its least peak is within 0.01% of the exact solver's proven least peak; its seconds are
weaker, and far from the optimum where recomputations come in chains (docs/BENCHMARKS.md,
"Lower bounds"). Where a step is small enough, explorer.solvers.lastmade adds where each
storage made again was last made before its reader, which shows the least peak a window's
own moment (binaries, whole in that solve).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

import pulp

from explorer.solvers import cbc
from explorer.solvers.lastmade import last_made_rows
from explorer.solvers.milp import GE, LE, Relaxation, StepMilp, _row, forward_rows

SLACK = 1e-6  # share of a bound given up for CBC's printed digits (see milp.CARRY_SLACK)


@dataclass
class FloorPart:
    """One graph's part of a floor LP (StepFloor.add_graph): its memory rows, each `terms +
    constant <= 0` with the peak's term -1; the recomputation seconds of its variables; the
    bytes of each storage its forward may save (the variable saying so, with the storage's
    bytes); the point of a schedule that runs nothing again (it saves what a stage reads;
    every variable not named is 0); and the variables that are 0 or 1 at every schedule's
    point (made again, saved)."""

    memory: list[pulp.LpConstraint]
    seconds: dict[pulp.LpVariable, float]
    saved_bytes: dict[pulp.LpVariable, int]
    nothing_again: dict[pulp.LpVariable, float]
    decisions: list[pulp.LpVariable]
    # binaries the least peak is solved with whole (explorer.solvers.lastmade)
    branched: list[pulp.LpVariable]


class FloorLp:
    """A floor's LP, built at its first use (`_build`, which sets `peak`, in bytes times
    `scale`, and `time_cost`, in `time_unit` seconds), solved for the least peak or under
    budgets."""

    def __init__(self, scale: float, time_unit: float) -> None:
        self.scale = scale
        self.time_unit = time_unit
        self.prob: pulp.LpProblem | None = None
        self.peak: pulp.LpVariable | None = None
        self.time_cost: pulp.LpAffineExpression | None = None
        self.decisions: list[pulp.LpVariable] = []  # 0 or 1 at every schedule's point
        self.branched: list[pulp.LpVariable] = []  # whole in the least peak's solve

    def _build(self) -> pulp.LpProblem:
        raise NotImplementedError

    def _problem(self) -> pulp.LpProblem:
        if self.prob is None:
            self.prob = self._build()
        return self.prob

    def least_peak(self, time_limit: float | None) -> int | None:
        """Bytes no schedule of the space peaks under (None: the LP was not solved in time)."""
        prob = self._problem()
        self.peak.upBound = None
        prob.setObjective(pulp.lpSum([self.peak]))
        for x in self.branched:
            x.cat = pulp.LpInteger
        try:
            outcome = cbc.solve(prob, time_limit, relax=not self.branched)
        finally:
            for x in self.branched:
                x.cat = pulp.LpContinuous
        if outcome.optimal:
            found = outcome.objective
        elif self.branched:  # stopped at the time limit: the bound CBC proved holds
            found = outcome.bound
        else:
            found = None
        if found is None:
            return None
        return max(0, math.floor(found / self.scale * (1 - SLACK)))

    def within(self, budget: int, time_limit: float | None) -> Relaxation | None:
        """The least recomputation seconds within `budget` as this relaxation counts them,
        with the rate at which they change per byte of budget (so that it bounds other
        budgets too: Relaxation.bound_at); None if not solved in time. A budget under the
        least peak gives None as well (infeasible: nothing to bound)."""
        prob = self._problem()
        self.peak.upBound = budget * self.scale
        prob.setObjective(self.time_cost)
        outcome = cbc.solve(prob, time_limit, relax=True)
        if not outcome.optimal or outcome.objective is None:
            return None
        bound = max(0.0, outcome.objective * self.time_unit * (1 - SLACK))
        slope = None if self.peak.dj is None else min(self.peak.dj, 0.0)
        if slope is not None:
            slope *= self.time_unit * self.scale  # seconds per byte of budget
        return Relaxation(bound, {}, budget, slope)

    def whole_within(self, budget: int, time_limit: float | None) -> float | None:
        """The least recomputation seconds within `budget` with every decision whole (made
        again or not, saved or not), as every schedule's point has them, or the bound CBC
        proved in `time_limit` (None: none). A bound for every budget up to `budget` too,
        and often far above the LP's: the fractions the LP takes of many storages and
        operators are where it is weak (tests/test_several_graphs.py: on two MLPs, 75% of
        the optimum and exact at the larger budgets, where the LP gives 61% and 35%)."""
        prob = self._problem()
        self.peak.upBound = budget * self.scale
        prob.setObjective(self.time_cost)
        for x in self.decisions:
            x.cat = pulp.LpInteger
        try:
            outcome = cbc.solve(prob, time_limit)
        finally:
            for x in self.decisions:
                x.cat = pulp.LpContinuous
        if outcome.bound is None:
            return None
        return max(0.0, outcome.bound * self.time_unit * (1 - SLACK))


class StepFloor(FloorLp):
    """The relaxation of one step (see module docstring), built once, solved for the least
    peak or under budgets. Reads the sets StepMilp computes without building its model."""

    def __init__(self, milp: StepMilp) -> None:
        super().__init__(milp.scale, milp.time_unit)
        self.milp = milp

    def _build(self) -> pulp.LpProblem:
        prob = pulp.LpProblem("floor", pulp.LpMinimize)
        self.peak = prob.add_variable("peak", 0)
        part = self.add_graph(prob, self.peak, self.scale)
        self.decisions = part.decisions
        self.branched = part.branched
        for row in part.memory:
            prob += row
        self.time_cost = pulp.lpSum(
            seconds / self.time_unit * x for x, seconds in part.seconds.items()
        )
        return prob

    def add_graph(
        self, prob: pulp.LpProblem, peak: pulp.LpVariable, scale: float, prefix: str = ""
    ) -> FloorPart:
        """This graph's variables (named with `prefix`) and the rows between them, added to
        `prob`; its memory rows, at most `peak` in bytes times `scale`, returned for the
        caller to add (explorer.solvers.joint adds them once for each run of the graph,
        moved by what the step holds beside it)."""
        milp, facts = self.milp, self.milp.facts
        storages = {r: s for r, s in facts.storages.items() if not s.held and s.nbytes}
        # what window 0 may run and what something from stage 0 on may read: each appears in
        # a row (CBC refuses a model with a column in none)
        runs = milp.candidates[0] if milp.n else []
        again = {a: prob.add_variable(f"{prefix}x{k}", 0, 1) for k, a in enumerate(runs)}
        useful = sorted(milp.useful[0]) if milp.n else []
        saved = {r: prob.add_variable(f"{prefix}s{k}", 0, 1) for k, r in enumerate(useful)}
        first_stage: dict = {}
        last_stage: dict = {}
        for i, reads in enumerate(milp.reads):
            for r in reads:
                first_stage.setdefault(r, i)
                last_stage[r] = i

        def made(r) -> pulp.LpVariable | None:
            return again.get(milp.maker.get(r) or "")

        for r in last_stage:
            if r in saved:
                remade = made(r)
                terms = {saved[r]: 1} if remade is None else {saved[r]: 1, remade: 1}
                prob += _row(terms, -1, GE)
        for a, x in again.items():
            for u in milp.ops_reads[a]:
                if u in saved:
                    remade = made(u)
                    terms = {x: 1, saved[u]: -1}
                    if remade is not None:
                        terms[remade] = -1
                    prob += _row(terms, 0, LE)
        kept = [(storages[r], x) for r, x in saved.items() if r in storages]
        memory = list(forward_rows(facts, kept, peak, scale))
        pairs = []  # each with `apart`, at least 1 when s is made again and u is not
        for k, (s, u, nbytes) in enumerate(self._pairs(storages, last_stage)):
            apart = prob.add_variable(f"{prefix}p{k}", 0, 1)
            terms = {apart: 1, made(s): -1}
            remade = made(u)
            if remade is not None:
                terms[remade] = 1
            prob += _row(terms, 0, GE)
            pairs.append((s, u, nbytes, apart))
        memory.extend(self._backward_rows(peak, scale, storages, last_stage, made, pairs))
        options = last_made_rows(
            prob, prefix, milp, storages, (first_stage, last_stage), saved, made, peak, scale
        )
        memory.extend(options.memory)
        memory.append(_row({peak: -1}, facts.end_bytes * scale, LE))
        # an operator only the backward reads (mobilenet_v2's clone before each ReLU6) is
        # left out of the forward when it is made again instead of saved: it may cost nothing
        seconds = {
            x: milp.seconds.get(a, 0.0) for a, x in again.items() if a not in milp.backward_only
        }
        nothing_again = {saved[r]: 1.0 for r in last_stage if r in saved}
        nothing_again.update(options.nothing_again)
        return FloorPart(
            memory,
            seconds,
            {x: s.nbytes for s, x in kept},
            nothing_again,
            [*again.values(), *saved.values(), *options.whole],
            options.whole,
        )

    def _pairs(self, storages: dict, last_stage: dict) -> list[tuple]:
        """(s, u, bytes): a storage s some stage reads, made by an operator a whose only such
        storage is s, and one input storage u of a that no stage reads, each s and u in one
        pair at most (the largest `bytes`, the smaller of the two, first). Until s's last
        stage reader, if a runs again and u does not, s or u is allocated: s is needed later,
        and if it is not kept until then it is made again from u, which, never made again,
        stays allocated from the forward until then (resnet50: a ReLU's output and its
        BatchNorm's, which no backward operator reads)."""
        milp = self.milp
        options = []
        for a in milp.candidates[0] if milp.n else []:
            outs = [r for r in milp.ops_makes[a] if r in storages and r in last_stage]
            if len(outs) != 1:
                continue
            for u in milp.ops_reads[a]:
                if u in storages and u not in last_stage and u not in outs:
                    nbytes = min(storages[outs[0]].nbytes, storages[u].nbytes)
                    options.append((nbytes, outs[0], u))
        used: set = set()
        pairs = []
        for nbytes, s, u in sorted(options, key=lambda o: (-o[0], o[1], o[2])):
            if s not in used and u not in used:
                used.update((s, u))
                pairs.append((s, u, nbytes))
        return pairs

    def _backward_rows(
        self,
        peak: pulp.LpVariable,
        scale: float,
        storages: dict,
        last_stage: dict,
        made,
        pairs: list,
    ) -> Iterator[pulp.LpConstraint]:
        """At backward operator t: its fixed bytes, the storages it reads or backward views
        hold, each storage a stage from t on reads, unless made again (`1 - again`), and the
        bytes of each of `_pairs` whose s a stage from t on reads, if its s is made again and
        its u is not (`apart >= again[maker(s)] - again[maker(u)]`; s's own term is then 0,
        and no other term counts u)."""
        milp, facts, sc = self.milp, self.milp.facts, scale
        stage_at = {t: i for i, t in enumerate(milp.stages)}
        following = 0  # the first stage at or after t
        for t in range(len(milp.space.order)):
            while following < milp.n and milp.stages[following] < t:
                following += 1
            now = set(milp.reads[stage_at[t]]) if t in stage_at else set()
            const = facts.backward_at[t]
            terms: dict[pulp.LpVariable, float] = {peak: -1}
            for r, s in storages.items():
                if r in now or s.held_in_backward(t):
                    const += s.nbytes
                elif last_stage.get(r, -1) >= following:
                    const += s.nbytes
                    remade = made(r)
                    if remade is not None:
                        terms[remade] = terms.get(remade, 0.0) - s.nbytes * sc
            for s, u, nbytes, apart in pairs:
                if last_stage[s] < following or s in now:
                    continue
                if storages[s].held_in_backward(t) or storages[u].held_in_backward(t):
                    continue
                terms[apart] = nbytes * sc
            yield _row(terms, const * sc, LE)


def spread(items: list[int]) -> list[int]:
    """`items` (sorted) in an order that covers their range early: the last, the first,
    then the middle of the widest stretch between two already taken, and so on."""
    if len(items) <= 2:
        return items[::-1]
    order = [len(items) - 1, 0]
    stretches = [(0, len(items) - 1)]
    while stretches:
        lo, hi = stretches.pop(0)
        if hi - lo >= 2:
            mid = (lo + hi) // 2
            order.append(mid)
            stretches += [(lo, mid), (mid, hi)]
    return [items[k] for k in order]


def bound_order(budgets: list[int]) -> list[int]:
    """`budgets` (ascending) in the order their floors are worth solving in a time limit:
    the lowest first, then spread over their range (`spread`), the highest last (its bound
    is the least worth having)."""
    order = spread(budgets[::-1])
    return [*order[:1], *order[2:], *order[1:2]]
