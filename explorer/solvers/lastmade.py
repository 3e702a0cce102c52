"""Where each storage a stage reads was last made before that stage: rows that show the
floor (explorer.solvers.floor) a window's own moment.

The floor counts a storage made again as free until the stage that reads it, and it has no
row for the moments inside a window. On the first graph of an MLP split in two
(tests/test_several_graphs.py) its least peak was 176,896 bytes where no schedule of the
space goes under 193,025: its point saves a storage and counts it free from the first stage
on, as if a window had made it again and let the saved copy go. Every schedule makes such a
storage somewhere: the forward saves it and nothing makes it again before its first reader,
or it is made last in one window up to that reader. These options are binaries (`Options`):

- made last in window k: at that moment the window holds the fixed bytes entering stage k,
  every storage a stage from k on reads that nothing makes again, the storage, and its
  maker's inputs (a row each);
- made last in window k, or saved and not made again before its reader: it is allocated at
  every stage's operator from then until that reader (rows at each stage's operator, beside
  what the floor's own rows count there).

Windows more than REACH stages before the reader are one option, counted from REACH stages
before. The least peak is solved with the options whole (a few binaries a storage); as an LP
they split and bound nothing more. Steps with more than MAX_STORAGES such storages are left
as they were: their binaries would slow CBC where the floor is solved in a fraction of a
second (resnet50 b8 128 px has 317).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import pulp

from explorer.solvers.milp import GE, LE, StepMilp, _row

REACH = 2
MAX_STORAGES = 200


@dataclass
class Options:
    """The binaries (whole at every schedule's point), their values at the point that makes
    nothing again, and the memory rows (each `terms + constant <= 0`, the peak's term -1)."""

    whole: list[pulp.LpVariable] = field(default_factory=list)
    nothing_again: dict[pulp.LpVariable, float] = field(default_factory=dict)
    memory: list[pulp.LpConstraint] = field(default_factory=list)


def last_made_rows(
    prob: pulp.LpProblem,
    prefix: str,
    milp: StepMilp,
    storages: dict,
    stages_reading: tuple[dict, dict],
    saved: dict,
    made: Callable,
    peak: pulp.LpVariable,
    scale: float,
) -> Options:
    """The options and rows above for `storages` (the floor's: not held, with bytes), added
    to `prob`; `stages_reading`: each read storage's first and last stage reader; `saved`
    and `made` are the floor's variables (made: a storage's maker's `again`, None where
    nothing can make it again)."""
    facts, sc = milp.facts, scale
    first, last = stages_reading
    chosen = [r for r in storages if r in first and r in saved and made(r) is not None]
    out = Options()
    if not chosen or len(chosen) > MAX_STORAGES:
        return out

    # by stage k: the storages read from k on that nothing makes again (allocated)
    never_again = {r: last[r] for r in storages if r in last and made(r) is None}
    kept_from: dict[int, set] = {}

    def kept_at(k: int) -> set:
        if k not in kept_from:
            kept_from[k] = {r for r, final in never_again.items() if final >= k}
        return kept_from[k]

    alive: dict[int, dict] = {}  # stage -> {storage: the options that keep it allocated}
    for r in chosen:
        reader = first[r]
        earliest = max(0, reader - REACH)
        options = {k: _binary(prob, prefix, out) for k in range(earliest, reader + 1)}
        earlier = _binary(prob, prefix, out) if earliest > 0 else None
        as_saved = _binary(prob, prefix, out)
        out.nothing_again[as_saved] = 1.0
        prob += _row({as_saved: 1, saved[r]: -1}, 0, LE)
        every = [as_saved, *options.values(), *([earlier] if earlier is not None else [])]
        prob += _row(dict.fromkeys(every, 1), -1, GE)
        maker = milp.maker[r]
        for k, x in options.items():
            kept = kept_at(k)
            inputs = {u for u in milp.ops_reads[maker] if u in storages and u not in kept}
            nbytes = storages[r].nbytes + sum(storages[u].nbytes for u in inputs - {r})
            const = facts.backward_before[milp.stages[k]] + sum(storages[u].nbytes for u in kept)
            out.memory.append(_row({peak: -1, x: nbytes * sc}, const * sc, LE))
        for j in range(reader):
            keeping = [as_saved, *(x for k, x in options.items() if k <= j)]
            if earlier is not None and j >= earliest:
                keeping.append(earlier)
            alive.setdefault(j, {})[r] = keeping
    for j, kept_by in sorted(alive.items()):
        kept = kept_at(j)
        out.memory.append(_stage_row(prob, prefix, milp, storages, kept, kept_by, j, peak, sc, out))
    return out


def _stage_row(prob, prefix, milp, storages, kept, kept_by, j, peak, sc, out) -> pulp.LpConstraint:
    """Stage j's operator: its fixed bytes, the storages it reads or backward views hold or
    that are `kept` (allocated until a later stage), and those of `kept_by` that one of
    their options keeps allocated."""
    t = milp.stages[j]
    now = set(milp.reads[j])
    const = milp.facts.backward_at[t]
    terms: dict[pulp.LpVariable, float] = {peak: -1}
    for r, st in storages.items():
        if r in now or st.held_in_backward(t) or r in kept:
            const += st.nbytes
        elif r in kept_by:
            held = prob.add_variable(f"{prefix}lh{j}_{len(terms)}", 0, 1)
            prob += _row({held: 1, **{x: -1 for x in kept_by[r]}}, 0, GE)
            out.nothing_again[held] = 1.0
            terms[held] = st.nbytes * sc
    return _row(terms, const * sc, LE)


def _binary(prob: pulp.LpProblem, prefix: str, out: Options) -> pulp.LpVariable:
    x = prob.add_variable(f"{prefix}lm{len(out.whole)}", 0, 1)
    out.whole.append(x)
    return x
