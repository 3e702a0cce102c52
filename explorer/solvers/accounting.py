"""explorer.simulate's memory accounting, restated for one fixed backward order.

With the forward and the backward order fixed, most of the step's memory does not depend on
the schedule: parameters, inputs, tangents, model outputs, and every storage the backward
makes (its tensors are freed after their last reader, which the order fixes). What the
schedule decides is only how long the storages made by forward operators live: the forward
frees one after its last forward reader unless a value in it is saved; the backward holds it
while some value in it is alive and recomputation makes it again. `StepFacts` separates the
two: constants per forward position and per backward operator, and `Storage` records for
the forward storages (a tensor and its views: one allocation, alive while any member is).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from explorer.graph import (
    EFFECT,
    FORWARD,
    PLACEHOLDER,
    ROLE_TANGENT,
    Graph,
    ValueRef,
    storage_owners,
)


@dataclass
class Storage:
    """One allocation made by a forward operator, and the values (it and its views) in it."""

    root: ValueRef
    nbytes: int
    made: int = 0  # forward position of the operator that allocates it
    last_forward: int = 0  # last forward position where a member is read (or made)
    held: bool = False  # holds a model output: alive from `made` to the end of the step
    # backward views of it, as (first, last) backward positions where they are alive
    backward_holds: list[tuple[int, int]] = field(default_factory=list)

    def held_in_backward(self, t: int) -> bool:
        """A backward view keeps this storage alive through backward operator t."""
        return any(first <= t <= last for first, last in self.backward_holds)

    def held_entering(self, t: int) -> bool:
        """A backward view made before operator t keeps this storage alive into it."""
        return any(first < t <= last for first, last in self.backward_holds)


@dataclass
class StepFacts:
    """What the memory of a step under any schedule of the space is made of (see module)."""

    graph: Graph
    order: list[str]  # backward operators
    forward: list[str]  # forward program: forward then effect operators, traced order
    storages: dict[ValueRef, Storage]  # by root
    forward_const: list[int]  # per forward position: bytes that do not depend on the schedule
    backward_before: list[int]  # per backward operator: fixed bytes while its window runs
    backward_at: list[int]  # per backward operator: fixed bytes while it runs
    end_bytes: int  # after the last operator, with autograd's gradient layout copy
    workspace: dict[str, int]
    # when the forward has returned: the bytes beside the saved storages (parameters, inputs,
    # outputs) and what code after the graph adds for a moment (explorer.eagerpeaks); None
    # when that adds nothing (the forward's last operator's row covers the moment)
    after_forward: int | None = None


def step_facts(
    graph: Graph,
    order: list[str],
    workspace: dict[str, int] | None = None,
    after_forward: int = 0,
    layout_copies: bool = True,
    handed_tangents: frozenset[str] = frozenset(),
) -> StepFacts:
    """Split the step's memory into fixed parts and forward storages (see module docstring).
    `layout_copies`: as in explorer.simulate.simulate. `handed_tangents`: tangents autograd
    hands the backward (explorer.program.Handoff), alive until their last use rather than
    through the whole backward."""
    workspace = workspace or {}
    forward = [n.name for n in graph.nodes if n.phase in (FORWARD, EFFECT)]
    fpos = {name: p for p, name in enumerate(forward)}
    owner = storage_owners(graph)
    phase = {n.name: n.phase for n in graph.nodes}
    outputs = {r for r in graph.model_outputs if r is not None}

    storages: dict[ValueRef, Storage] = {}
    last_read = _last_forward_reads(graph, forward)
    for name in forward:
        for i, meta in enumerate(graph.node(name).outputs):
            if meta is None:
                continue
            ref = (name, i)
            root = owner.get(ref, ref)
            if phase[root[0]] == PLACEHOLDER:
                continue  # a view of a parameter, buffer or input: costs nothing
            store = storages.setdefault(
                root, Storage(root, graph.meta(root).nbytes, made=fpos[root[0]])
            )
            store.last_forward = max(store.last_forward, last_read.get(ref, fpos[name]))
            store.held = store.held or ref in outputs

    backward_before, backward_at, kept_to_end = _backward_storages(graph, order, owner, storages)
    handed = [n for n in graph.placeholders(ROLE_TANGENT) if n.name in handed_tangents]
    for node in handed:
        last = _last_alive(graph, order, owner, (node.name, 0))
        for t in range(min(last, len(order) - 1) + 1):
            backward_before[t] += node.out_bytes
            backward_at[t] += node.out_bytes
        if last >= len(order):
            kept_to_end += node.out_bytes
    tangents = sum(n.out_bytes for n in graph.placeholders(ROLE_TANGENT) if n not in handed)
    static = graph.static_bytes()
    held = [s for s in storages.values() if s.held]
    forward_const = []
    for p, name in enumerate(forward):
        alive = sum(s.nbytes for s in storages.values() if s.made <= p <= s.last_forward)
        alive += sum(s.nbytes for s in held if s.made <= p and p > s.last_forward)
        forward_const.append(static + alive + workspace.get(name, 0))
    outputs_bytes = sum(s.nbytes for s in held)
    base = static + tangents + outputs_bytes
    before = [base + b for b in backward_before]
    at = [base + b + workspace.get(name, 0) for b, name in zip(backward_at, order, strict=True)]
    end = base + kept_to_end + (graph.grad_copy_bytes() if layout_copies else 0)
    return StepFacts(
        graph=graph,
        order=order,
        forward=forward,
        storages=storages,
        forward_const=forward_const,
        backward_before=before,
        backward_at=at,
        end_bytes=end,
        workspace=workspace,
        after_forward=static + outputs_bytes + after_forward if after_forward else None,
    )


def _last_alive(
    graph: Graph, order: list[str], owner: dict[ValueRef, ValueRef], root: ValueRef
) -> int:
    """The last backward position where storage `root` (a tangent) is alive: where a value
    in it (it or a backward view) is made or read last; len(order) if the backward returns
    one; -1 if none is read (the backward frees it before its first operator)."""
    grads = {r for r in graph.input_grads if r is not None}
    last = -1
    for t, name in enumerate(order):
        node = graph.node(name)
        for i, meta in enumerate(node.outputs):
            if meta is not None and owner.get((name, i)) == root:
                last = len(order) if (name, i) in grads else max(last, t)
        if any(owner.get(ref, ref) == root for ref in node.inputs):
            last = max(last, t)
    return last


def _last_forward_reads(graph: Graph, forward: list[str]) -> dict[ValueRef, int]:
    last: dict[ValueRef, int] = {}
    for p, name in enumerate(forward):
        for ref in graph.node(name).inputs:
            last[ref] = p
    return last


def _backward_storages(
    graph: Graph,
    order: list[str],
    owner: dict[ValueRef, ValueRef],
    storages: dict[ValueRef, Storage],
) -> tuple[list[int], list[int], int]:
    """Bytes of backward-made storages alive before and while each backward operator runs,
    and those alive at the end (gradients). Backward views of forward storages are recorded
    on those storages instead."""
    bpos = {name: t for t, name in enumerate(order)}
    end = len(order)
    grads = {r for r in graph.input_grads if r is not None}
    last_read: dict[ValueRef, int] = {}
    for t, name in enumerate(order):
        for ref in graph.node(name).inputs:
            last_read[ref] = t
    spans: dict[ValueRef, tuple[int, int]] = {}  # backward root -> (made, last alive)
    for t, name in enumerate(order):
        for i, meta in enumerate(graph.node(name).outputs):
            if meta is None:
                continue
            ref = (name, i)
            last = end if ref in grads else last_read.get(ref, t)
            root = owner.get(ref, ref)
            if root in storages:
                storages[root].backward_holds.append((t, last))
            elif root[0] in bpos:
                made, alive = spans.get(root, (bpos[root[0]], bpos[root[0]]))
                spans[root] = (made, max(alive, last))
    before = [0] * len(order)
    at = [0] * len(order)
    kept = 0
    for root, (made, last) in spans.items():
        nbytes = graph.meta(root).nbytes
        for t in range(made, min(last, end - 1) + 1):
            at[t] += nbytes
            if t > made:
                before[t] += nbytes
        if last >= end:
            kept += nbytes
    return before, at, kept
