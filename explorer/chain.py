"""Cut the step's graph into a chain of stages, so that each ILP is small.

Forward operators keep their traced order (positions 1..n). Each backward operator is
anchored at the earliest forward position it reads, directly or through the backward
operators it reads: that is where backpropagation "is" when it runs. A cut after position k
is valid when no backward operator anchored at or before k reads a forward value made after
k; then the stages on either side only exchange

- the forward frontier F_k: values made at or before k and read by forward operators after k
  (one tensor on a plain chain; several across a skip connection or a DenseNet concatenation),
- the gradient frontier G_k: backward values made by operators anchored after k and read by
  operators anchored at or before k.

Values that are never recomputed ("pinned": outputs of random operators, such as the generator
state a dropout mask is drawn from, of operators that read a graph input the forward
overwrites, and the model's outputs, which the user holds anyway) are kept for the whole
step and are not part of any stage's decisions. Parameters, buffers and inputs are static.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from explorer.graph import (
    BACKWARD,
    FORWARD,
    PLACEHOLDER,
    ROLE_TANGENT,
    Graph,
    ValueRef,
    storage_owners,
)


@dataclass
class Stage:
    """A slice of the chain: its forward operators and the backward operators anchored there."""

    index: int
    forward: list[str]
    backward: list[str]
    inputs: list[ValueRef]  # F_{i-1}, minus static and pinned values
    outputs: list[ValueRef]  # F_i
    grad_inputs: list[ValueRef]  # G_i
    grad_outputs: list[ValueRef]  # G_{i-1}
    param_grad_bytes: int = 0
    forward_seconds: float = 0.0
    backward_seconds: float = 0.0


@dataclass
class Chain:
    graph: Graph
    stages: list[Stage]
    pinned: list[ValueRef]  # kept from the forward to the end, never recomputed
    owner: dict[ValueRef, ValueRef] = field(default_factory=dict)  # view -> storage owner

    def bytes_of(self, refs: list[ValueRef]) -> int:
        """Bytes of the distinct storages behind `refs`."""
        owners = {self.owner.get(r, r) for r in refs}
        return sum(self.graph.meta(o).nbytes for o in owners)


def _anchors(graph: Graph, pos: dict[str, int], n: int) -> dict[str, int]:
    """Anchor of each backward node: the earliest forward position it depends on."""
    anchor: dict[str, int] = {}
    top = n + 1
    undecided: list[str] = []
    for node in graph.nodes:
        if node.phase != BACKWARD:
            continue
        found = [pos[r[0]] for r in node.inputs if r[0] in pos]
        found += [anchor[r[0]] for r in node.inputs if r[0] in anchor]
        tangent_fed = any(graph.node(r[0]).role == ROLE_TANGENT for r in node.inputs)
        if found:
            anchor[node.name] = min(found)
        elif tangent_fed:
            anchor[node.name] = top
        else:
            anchor[node.name] = top
            undecided.append(node.name)
    # operators that read only parameters (a transposed weight): run them where they are used
    readers: dict[str, list[str]] = {}
    for node in graph.nodes:
        for r in node.inputs:
            readers.setdefault(r[0], []).append(node.name)
    for name in reversed(undecided):
        users = [anchor[u] for u in readers.get(name, []) if u in anchor]
        anchor[name] = max(users) if users else top
    return anchor


def _valid_cuts(graph: Graph, pos: dict[str, int], anchor: dict[str, int], n: int) -> list[bool]:
    """valid[k] for k in 0..n: may the chain be cut after forward position k?"""
    blocked = [0] * (n + 2)
    for node in graph.nodes:
        if node.phase != BACKWARD:
            continue
        reads = [pos[r[0]] for r in node.inputs if r[0] in pos]
        if reads and max(reads) > anchor[node.name]:
            blocked[anchor[node.name]] += 1  # cuts anchor .. max(reads)-1 are invalid
            blocked[max(reads)] -= 1
    valid, running = [], 0
    for k in range(n + 1):
        running += blocked[k]
        valid.append(running == 0)
    valid[0] = valid[n] = True
    return valid


def _choose_cuts(valid: list[bool], weight: list[float], max_stages: int) -> list[int]:
    """Keep at most `max_stages` stages, merging the lightest neighbours first."""
    n = len(valid) - 1
    cuts = [k for k in range(1, n) if valid[k]] + [n]
    sizes = []
    prev = 0
    for c in cuts:
        sizes.append(sum(weight[prev:c]))
        prev = c
    while len(cuts) > max_stages:
        j = min(range(len(cuts) - 1), key=lambda i: sizes[i] + sizes[i + 1])
        sizes[j] += sizes.pop(j + 1)
        cuts.pop(j)
    return cuts


def build_chain(graph: Graph, seconds: dict[str, float], max_stages: int = 48) -> Chain:
    """Split the step into at most `max_stages` stages (see module docstring)."""
    forward = [n for n in graph.nodes if n.phase == FORWARD]
    pos = {node.name: i + 1 for i, node in enumerate(forward)}
    n = len(forward)
    anchor = _anchors(graph, pos, n)
    valid = _valid_cuts(graph, pos, anchor, n)
    weight = [1.0 + sum((m.nbytes for m in node.outputs if m), 0) / 1e9 for node in forward]
    cuts = _choose_cuts(valid, weight, max_stages)
    owner = storage_owners(graph)

    pinned = _pinned_values(graph, forward)
    static = {(node.name, 0) for node in graph.nodes if node.phase == PLACEHOLDER}
    stage_of_pos = [0] * (n + 2)
    start = 0
    for s, c in enumerate(cuts):
        for k in range(start + 1, c + 1):
            stage_of_pos[k] = s
        start = c
    stage_of_pos[n + 1] = len(cuts) - 1
    stage_of: dict[str, int] = {name: stage_of_pos[p] for name, p in pos.items()}
    stage_of.update({name: stage_of_pos[min(a, n + 1)] for name, a in anchor.items()})

    stages = [Stage(i, [], [], [], [], [], []) for i in range(len(cuts))]
    for node in graph.nodes:
        if node.name in stage_of:
            stage = stages[stage_of[node.name]]
            (stage.forward if node.phase == FORWARD else stage.backward).append(node.name)
            secs = seconds.get(node.name, 0.0)
            if node.phase == FORWARD:
                stage.forward_seconds += secs
            else:
                stage.backward_seconds += secs
    _fill_frontiers(graph, stages, stage_of, static, set(pinned), owner)
    return Chain(graph, stages, pinned, owner)


def _pinned_values(graph: Graph, forward: list) -> list[ValueRef]:
    """Values never recomputed: random operators (drawn once per step) and the model's outputs."""
    outputs = {r[0] for r in graph.model_outputs if r is not None}
    pinned = []
    for node in forward:
        if node.pinned or node.random or node.name in outputs:
            pinned += [(node.name, i) for i, m in enumerate(node.outputs) if m is not None]
    return pinned


def _fill_frontiers(
    graph: Graph,
    stages: list[Stage],
    stage_of: dict[str, int],
    static: set[ValueRef],
    pinned: set[ValueRef],
    owner: dict[ValueRef, ValueRef],
) -> None:
    """Fill every stage's forward and gradient frontiers (a value read k stages after it is
    made crosses k boundaries) and the bytes of the parameter gradients it makes."""
    grads = {r for r in graph.input_grads if r is not None}
    seen_grad_owner: set[ValueRef] = set()
    for node in graph.nodes:
        if node.name not in stage_of:
            continue
        reader_stage = stage_of[node.name]
        for ref in node.inputs:
            if ref in static or ref in pinned or ref[0] not in stage_of:
                continue
            maker_stage = stage_of[ref[0]]
            maker_fwd = graph.node(ref[0]).phase == FORWARD
            if node.phase == FORWARD and maker_stage < reader_stage:
                for s in range(maker_stage, reader_stage):
                    _add(stages[s].outputs, ref)
                    _add(stages[s + 1].inputs, ref)
            elif node.phase == BACKWARD and not maker_fwd and maker_stage > reader_stage:
                for s in range(reader_stage, maker_stage):
                    _add(stages[s].grad_inputs, ref)
                    _add(stages[s + 1].grad_outputs, ref)
    for ref in grads:
        own = owner.get(ref, ref)
        if own in seen_grad_owner or ref[0] not in stage_of:
            continue
        seen_grad_owner.add(own)
        stages[stage_of[ref[0]]].param_grad_bytes += graph.meta(own).nbytes


def _add(items: list[ValueRef], ref: ValueRef) -> None:
    if ref not in items:
        items.append(ref)
