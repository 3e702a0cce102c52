"""The per-stage ILP: which of a stage's tensors to keep for its backward, and which to
recompute, and when, so that its backward's memory stays low and the extra compute is least.

Time steps are the stage's backward operators, in order. Variables (PuLP, solved by CBC):

- `keep[v]` (binary): tensor v stays alive from the forward into this stage's backward (the
  stage's inputs cost nothing here: the chain's table keeps them as the stage's checkpoint);
- `redo[t, a]` (binary): forward operator a is recomputed right before backward step t;
- `live[t, v]` (in [0, 1]): v is alive at step t. It can only be alive if it was alive at
  t-1 or is recomputed at t; it must be alive where a backward step or a recomputation
  reads it; a view keeps its base's storage alive.

Memory at every step t, `sum(bytes[v] * live[t, v]) + backward tensors alive at t`, is at
most the variable `peak`; the kept bytes are at most `keep_cap`. The objective is the
recomputation time plus a tiny weight on `peak` (among equally fast plans, the leaner one).
Solving this for a few `keep_cap`s gives each stage a menu of options for the chain's
dynamic program (explorer.rotor). Identical stages (same operators, shapes and wiring) share
one solve.
"""

from __future__ import annotations

import hashlib
import re
import time
from dataclasses import dataclass, field

import pulp

from explorer.chain import Chain, Stage
from explorer.graph import Graph, ValueRef
from explorer.solvers import cbc
from explorer.solvers.answers import relative_gap

PEAK_WEIGHT = 1e-12  # seconds per byte of peak: breaks ties only
MAX_STEPS = 12  # decision windows per stage backward: bounds each ILP's size


@dataclass
class StageOption:
    """One way to run a stage: what its forward keeps and what its backward recomputes."""

    keep: list[ValueRef]
    redo: list[list[str]]  # per backward step: forward nodes recomputed right before it
    keep_bytes: int  # the stage's inputs excluded: the chain keeps those
    peak_bytes: int  # the stage backward's peak, kept tensors and gradients included
    redo_seconds: float
    output_bytes: int = 0  # of keep_bytes, what is also the stage's output frontier
    status: str = "optimal"
    gap: float = 0.0
    solve_seconds: float = 0.0


@dataclass
class StageProblem:
    """A stage in local terms: values, producers, readers and fixed backward memory."""

    stage: Stage
    values: list[ValueRef]  # decision values: stage-made values and stage inputs
    nbytes: list[int]  # bytes charged to each value (0 for views)
    owner: list[int | None]  # local index of the storage owner, for views
    maker: list[str | None]  # forward node that makes it (None: stage input, not recomputable)
    node_inputs: dict[str, list[int]]  # recomputable node -> local values it reads
    node_outputs: dict[str, list[int]]
    node_seconds: dict[str, float]
    reads: list[list[int]]  # per decision step: local values its backward operator reads
    fixed_bytes: list[int]  # per decision step: most backward bytes alive until the next one
    step_of: list[int] = field(default_factory=list)  # decision step -> backward position
    signature: str = ""
    index: dict[ValueRef, int] = field(default_factory=dict)


def build_problem(chain: Chain, stage: Stage, seconds: dict[str, float]) -> StageProblem:
    """Describe one stage's backward in local indices (see module docstring)."""
    graph = chain.graph
    pinned = set(chain.pinned)
    recomputable = [name for name in stage.forward if not any(ref[0] == name for ref in pinned)]
    made = [
        (name, i)
        for name in recomputable
        for i, meta in enumerate(graph.node(name).outputs)
        if meta is not None
    ]
    values = list(stage.inputs) + made
    index = {ref: k for k, ref in enumerate(values)}
    node_outputs = {name: [index[r] for r in made if r[0] == name] for name in recomputable}
    node_inputs = {
        name: [index[r] for r in graph.node(name).inputs if r in index] for name in recomputable
    }
    owner, nbytes, maker = _storage(chain, values, index, set(stage.inputs))
    all_reads = [[index[r] for r in graph.node(b).inputs if r in index] for b in stage.backward]
    reads, fixed, step_of = _decision_steps(all_reads, _backward_bytes(chain, stage))
    problem = StageProblem(
        stage=stage,
        values=values,
        nbytes=nbytes,
        owner=owner,
        maker=maker,
        node_inputs=node_inputs,
        node_outputs=node_outputs,
        node_seconds={n: seconds.get(n, 0.0) for n in recomputable},
        reads=reads,
        fixed_bytes=fixed,
        step_of=step_of,
        index=index,
    )
    problem.signature = _signature(graph, stage, index)
    return problem


def _decision_steps(reads: list[list[int]], fixed: list[int]):
    """Coarsen the backward into at most MAX_STEPS decision windows.

    Only steps that read a stage tensor start a window (recomputing anywhere else never
    helps). A long stage's windows hold several such steps: recomputations for the whole
    window happen at its start, and each window carries the union of its reads and the
    largest backward memory until the next window; the tensors alive in a window count over
    all of it, a safe over-count that keeps the ILP small."""
    if not reads:
        return [], [], []
    starts = [t for t, r in enumerate(reads) if r] or [0]
    stride = -(-len(starts) // MAX_STEPS)
    starts = starts[::stride]
    merged_reads, merged_fixed = [], []
    for k, t in enumerate(starts):
        end = starts[k + 1] if k + 1 < len(starts) else len(reads)
        first = 0 if k == 0 else t
        merged_reads.append(sorted({v for step in reads[t:end] for v in step}))
        merged_fixed.append(max(fixed[first:end], default=0))
    return merged_reads, merged_fixed, starts


def _storage(chain: Chain, values, index, inputs):
    graph = chain.graph
    owner: list[int | None] = []
    nbytes: list[int] = []
    maker: list[str | None] = []
    for ref in values:
        own = chain.owner.get(ref)
        owner.append(index.get(own) if own is not None else None)
        # a stage's inputs are the chain's checkpoint, alive and paid for by the chain's table
        nbytes.append(graph.meta(ref).nbytes if own is None and ref not in inputs else 0)
        maker.append(None if ref in inputs else ref[0])
    return owner, nbytes, maker


def _backward_bytes(chain: Chain, stage: Stage) -> list[int]:
    """Bytes of backward tensors alive at each backward step of the stage."""
    graph = chain.graph
    keep_to_end = set(stage.grad_outputs) | {r for r in graph.input_grads if r is not None}
    last_read: dict[ValueRef, int] = {}
    for t, name in enumerate(stage.backward):
        for ref in graph.node(name).inputs:
            last_read[ref] = t
    alive: dict[ValueRef, int] = {}  # owner -> bytes
    users: dict[ValueRef, set[ValueRef]] = {}
    for ref in stage.grad_inputs:
        own = chain.owner.get(ref, ref)
        alive[own] = graph.meta(own).nbytes
        users.setdefault(own, set()).add(ref)
    fixed = []
    for t, name in enumerate(stage.backward):
        node = graph.node(name)
        for i, meta in enumerate(node.outputs):
            if meta is None:
                continue
            ref = (name, i)
            own = chain.owner.get(ref, ref)
            if own[0] in stage.backward or own in alive:
                alive.setdefault(own, graph.meta(own).nbytes)
                users.setdefault(own, set()).add(ref)
        fixed.append(sum(alive.values()))
        for own in list(alive):
            refs = users.get(own, set())
            if any(r in keep_to_end or last_read.get(r, -1) > t for r in refs):
                continue
            if any(
                last_read.get(r, t) == t or r[0] == name or r in stage.grad_inputs for r in refs
            ):
                del alive[own]
                users.pop(own, None)
    return fixed


def _signature(graph: Graph, stage: Stage, index: dict[ValueRef, int]) -> str:
    """Same signature = same operators, shapes, bytes and wiring: one solve serves both stages."""
    local_names = {name: k for k, name in enumerate(stage.forward + stage.backward)}
    parts = []
    for name in stage.forward + stage.backward:
        node = graph.node(name)
        ins = []
        for ref in node.inputs:
            if ref in index:
                ins.append(("v", index[ref]))
            elif ref[0] in local_names:
                ins.append(("n", local_names[ref[0]], ref[1]))
            else:
                ins.append(("x", graph.meta(ref).shape, graph.meta(ref).dtype))
        parts.append(
            (
                node.target,
                node.phase,
                re.sub(r"0x[0-9a-f]+", "", node.consts),
                ins,
                [(m.shape, m.dtype, m.nbytes, m.alias_of) if m else None for m in node.outputs],
            )
        )
    parts.append(sorted(index.values()))
    return hashlib.sha256(repr(parts).encode()).hexdigest()


def keep_all_option(problem: StageProblem) -> StageOption:
    """Keep what the backward reads, recompute nothing: what eager autograd does."""
    keep = sorted({v for step in problem.reads for v in step})
    keep = sorted(set(keep) | {problem.owner[v] for v in keep if problem.owner[v] is not None})
    keep_bytes = sum(problem.nbytes[v] for v in keep)
    peak = max((keep_bytes + f for f in problem.fixed_bytes), default=keep_bytes)
    return StageOption(
        [problem.values[v] for v in keep],
        [[] for _ in problem.stage.backward],
        keep_bytes,
        peak,
        0.0,
    )


def solve_option(
    problem: StageProblem, keep_cap: int, time_limit: float | None
) -> StageOption | None:
    """Solve the stage ILP under `keep_cap` kept bytes; None if infeasible."""
    started = time.perf_counter()
    steps = range(len(problem.reads))
    needed = _needed_values(problem)
    prob = pulp.LpProblem("stage", pulp.LpMinimize)
    keep = {v: prob.add_variable(f"k{v}", cat="Binary") for v in needed}
    live = {(t, v): prob.add_variable(f"l{t}_{v}", 0, 1) for t in steps for v in needed}
    makers = sorted({problem.maker[v] for v in needed if problem.maker[v] in problem.node_outputs})
    redo = {
        (t, a): prob.add_variable(f"r{t}_{k}", cat="Binary")
        for t in steps
        for k, a in enumerate(makers)
    }
    peak = prob.add_variable("peak", 0)
    prob += pulp.lpSum(problem.node_seconds[a] * x for (t, a), x in redo.items()) + (
        PEAK_WEIGHT * peak
    )
    prob += pulp.lpSum(problem.nbytes[v] * keep[v] for v in needed) <= keep_cap, "keep_cap"
    for t in steps:
        for v in needed:
            before = keep[v] if t == 0 else live[(t - 1, v)]
            made = redo.get((t, problem.maker[v]), 0) if problem.maker[v] else 0
            prob += live[(t, v)] <= before + made
            own = problem.owner[v]
            if own is not None and own in needed:
                prob += live[(t, own)] >= live[(t, v)]
        for v in problem.reads[t]:
            if v in needed:
                prob += live[(t, v)] >= 1
        for (tt, a), x in redo.items():
            if tt == t:
                for u in problem.node_inputs[a]:
                    if u in needed:
                        prob += x <= live[(t, u)]
        prob += (
            pulp.lpSum(problem.nbytes[v] * live[(t, v)] for v in needed) + problem.fixed_bytes[t]
            <= peak
        )
    for v in needed:
        own = problem.owner[v]
        if own is not None and own in needed:
            prob += keep[own] >= keep[v]
    outcome = cbc.solve(prob, time_limit)
    if not outcome.found:
        return None
    chosen = [v for v in needed if (keep[v].value() or 0) > 0.5]
    plan: list[list[str]] = [[] for _ in problem.stage.backward]
    for t in steps:
        plan[problem.step_of[t]] = [
            a
            for a in problem.stage.forward
            if redo.get((t, a)) is not None and (redo[(t, a)].value() or 0) > 0.5
        ]
    peak_bytes = int(round(peak.value() or 0))
    status, gap = _status(prob, outcome)  # may re-solve a relaxation: read the solution first
    return StageOption(
        keep=[problem.values[v] for v in chosen],
        redo=plan,
        keep_bytes=sum(problem.nbytes[v] for v in chosen),
        peak_bytes=peak_bytes,
        redo_seconds=sum(problem.node_seconds[a] for step in plan for a in step),
        status=status,
        gap=gap,
        solve_seconds=time.perf_counter() - started,
    )


def _needed_values(problem: StageProblem) -> list[int]:
    """Values a backward step reads, and everything recomputing them could read."""
    needed: set[int] = set()
    stack = [v for step in problem.reads for v in step]
    while stack:
        v = stack.pop()
        if v in needed:
            continue
        needed.add(v)
        if problem.owner[v] is not None:
            stack.append(problem.owner[v])
        maker = problem.maker[v]
        if maker is not None and maker in problem.node_inputs:
            stack.extend(problem.node_inputs[maker])
    return sorted(needed)


def _status(prob: pulp.LpProblem, outcome: cbc.Outcome) -> tuple[str, float]:
    """('optimal' | 'feasible', relative gap) of a solved problem: against the bound CBC
    proved when its time ran out, else against the LP relaxation's."""
    if outcome.optimal:
        return "optimal", 0.0
    bound = outcome.bound
    if bound is None:
        relaxed = prob.deepcopy()
        bound = cbc.solve(relaxed, None, relax=True).objective
    return "feasible", relative_gap(outcome.objective or 0.0, bound or 0.0)
