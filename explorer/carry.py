"""Carrying a schedule to a graph it was not made for.

Training captures graphs the plan never saw: the same model at other sizes (the same
structure, or Dynamo's graph for any size of a dimension, whose operators align with a
planned graph's but for a few), or another structure altogether. Each takes a planned
graph's schedule here, node by node where it can, by the operators that align where most
do, else by the saved values whose names it shares.
"""

from __future__ import annotations

import difflib

from explorer.graph import BACKWARD, FORWARD, Graph, ValueRef
from explorer.program import (
    check_program,
    compile_program,
    schedule_from_order,
    schedule_from_saved,
)
from explorer.schedule import GraphSchedule

# a graph for any size takes the schedule of a graph at fixed sizes whose operators align
# with this share of its own at least (GPT-2's: 409 of 412)
ALIGNED_SHARE = 0.9


def aligned_names(source: Graph, graph: Graph) -> dict[str, str]:
    """The names in `graph` of the nodes of `source` that align with them: the longest
    matching runs of operators (target, phase, role and outputs) in order."""
    key = lambda n: (n.target, n.phase, n.role, len(n.outputs))  # noqa: E731
    matcher = difflib.SequenceMatcher(
        None, [key(n) for n in source.nodes], [key(n) for n in graph.nodes], autojunk=False
    )
    names: dict[str, str] = {}
    for a, b, size in matcher.get_matching_blocks():
        for k in range(size):
            names[source.nodes[a + k].name] = graph.nodes[b + k].name
    return names


def renamed(
    schedule: GraphSchedule, graph: Graph, names: dict[str, str] | None = None
) -> GraphSchedule:
    """`schedule` for `graph`, every node named as there (`names`: each node's name there;
    None: the same names)."""
    name = (lambda n: n) if names is None else names.__getitem__
    return GraphSchedule(
        graph.fingerprint(),
        [(name(node), k) for node, k in schedule.saved],
        [name(node) for node in schedule.backward],
        recomputed=[name(node) for node in schedule.recomputed],
        structure=graph.structure(),
    )


def in_aligned_order(schedule: GraphSchedule, graph: Graph, names: dict[str, str]) -> GraphSchedule:
    """`schedule` on a graph whose operators align with those it was made for only in part
    (`names`, from aligned_names): its backward order, recomputations included, on the
    operators that align, and each backward operator of `graph` that aligns with none right
    after the backward operator traced before it. What it saves follows from that order, so
    a value the schedule saves for one reader and makes again for a later one (freed in
    between) stays so: carried as a set of saved values, each value recomputed once, GPT-2's
    attention mask was kept through the backward and the peak went over the budget. Where
    that order does not run on `graph`, its saved values that align, each recomputed once."""
    pinned = {n.name for n in graph.nodes if n.phase == FORWARD and n.pinned}
    order = [names[n] for n in schedule.backward if n in names and names[n] not in pinned]
    placed = set(order)
    previous: str | None = None
    for node in graph.nodes:
        if node.phase != BACKWARD:
            continue
        if node.name not in placed:
            order.insert(0 if previous is None else order.index(previous) + 1, node.name)
        previous = node.name
    carried = schedule_from_order(graph, order)
    if check_program(graph, compile_program(graph, carried)) is None:
        return carried
    return schedule_from_saved(graph, carried_saved(schedule, graph, names))


def closest_schedule(schedules: list[GraphSchedule], graph: Graph) -> GraphSchedule | None:
    """The schedule whose saved values name the most forward nodes of `graph`."""
    names = {n.name for n in graph.nodes if n.phase == FORWARD}
    scored = [(sum(r[0] in names for r in s.saved), k) for k, s in enumerate(schedules)]
    best = max(scored, default=(0, -1))
    return schedules[best[1]] if best[0] > 0 else None


def carried_saved(
    source: GraphSchedule, graph: Graph, names: dict[str, str] | None = None
) -> set[ValueRef]:
    """The source's saved values that exist in `graph` as forward values of the same op
    (`names`: each aligned node's name in `graph`; None: the same names)."""
    kept: set[ValueRef] = set()
    forward = {n.name: n for n in graph.nodes if n.phase == FORWARD}
    for source_name, index in source.saved:
        name = source_name if names is None else names.get(source_name)
        node = forward.get(name) if name is not None else None
        if node is not None and index < len(node.outputs) and node.outputs[index] is not None:
            kept.add((name, index))
    return kept
