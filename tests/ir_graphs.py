"""Hand-built training-step graphs in the IR (explorer.graph), for solver tests.

`StepBuilder` writes a forward pass operator by operator and derives a backward the way
autograd does: each forward operator gets a gradient operator that reads the gradient of its
output and whatever the operator saved (its inputs, or, for ReLU-like operators, a backward
view of its output made at the start of the backward), and makes the gradients of its
inputs, summed where a value has several readers. Views
allocate nothing and get a view-shaped gradient. `random_step` draws such graphs for the
property tests; `brute_force` enumerates every point of the solver's schedule space.
"""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass

from explorer.graph import (
    BACKWARD,
    FORWARD,
    PLACEHOLDER,
    ROLE_INPUT,
    ROLE_PARAM,
    ROLE_TANGENT,
    Graph,
    Node,
    TensorMeta,
    ValueRef,
)
from explorer.profile import Profile
from explorer.program import Handoff, check_program, compile_program
from explorer.simulate import simulate
from explorer.solvers.space import Space


def _meta(nbytes: int, alias: int | None = None) -> TensorMeta:
    return TensorMeta(
        (max(nbytes // 4, 1),), "torch.float32", 0 if alias is not None else nbytes, alias
    )


@dataclass
class _Op:
    name: str
    inputs: list[ValueRef]
    nbytes: int
    saves: str  # "inputs" | "output" | "nothing"
    view: bool
    random: bool


class StepBuilder:
    """Write a forward; `build` adds the tangent, the backward and the gradients."""

    def __init__(self) -> None:
        self.nodes: list[Node] = []
        self.ops: list[_Op] = []
        self.params: list[ValueRef] = []
        self.seconds: dict[str, float] = {}

    def input(self, name: str, nbytes: int) -> ValueRef:
        self.nodes.append(Node(name, PLACEHOLDER, PLACEHOLDER, [], [_meta(nbytes)], ROLE_INPUT))
        return (name, 0)

    def param(self, name: str, nbytes: int) -> ValueRef:
        self.nodes.append(Node(name, PLACEHOLDER, PLACEHOLDER, [], [_meta(nbytes)], ROLE_PARAM))
        self.params.append((name, 0))
        return (name, 0)

    def op(
        self,
        name: str,
        inputs: list[ValueRef],
        nbytes: int,
        seconds: float = 1.0,
        saves: str = "inputs",
        random_op: bool = False,
    ) -> ValueRef:
        """A forward operator making one tensor of `nbytes` from `inputs`."""
        self.nodes.append(
            Node(name, f"op.{name}", FORWARD, list(inputs), [_meta(nbytes)], random=random_op)
        )
        self.ops.append(_Op(name, list(inputs), nbytes, saves, False, random_op))
        self.seconds[name] = seconds
        return (name, 0)

    def view(self, name: str, base: ValueRef, seconds: float = 0.0) -> ValueRef:
        """A view of `base`: no bytes of its own."""
        self.nodes.append(Node(name, "aten.view.default", FORWARD, [base], [_meta(0, alias=0)]))
        self.ops.append(_Op(name, [base], 0, "nothing", True, False))
        self.seconds[name] = seconds
        return (name, 0)

    def build(self, output: ValueRef, grad_seconds: float = 1.0) -> tuple[Graph, Profile]:
        """Tangent of `output`, then one gradient operator per forward operator (reverse)."""
        nodes = list(self.nodes)
        out_bytes = _bytes_of(nodes, output)
        nodes.append(
            Node("tangent", PLACEHOLDER, PLACEHOLDER, [], [_meta(out_bytes)], ROLE_TANGENT)
        )
        grads: dict[ValueRef, list[ValueRef]] = {output: [("tangent", 0)]}
        seconds = dict(self.seconds)
        # like autograd's detach of a saved output: a backward view that holds the forward
        # storage from the start of the backward to its reader
        held = {}
        for op in self.ops:
            if op.saves == "output":
                held[op.name] = (f"saved_{op.name}", 0)
                nodes.append(
                    Node(
                        held[op.name][0],
                        "aten.detach.default",
                        BACKWARD,
                        [(op.name, 0)],
                        [_meta(0, alias=0)],
                    )
                )
                seconds[held[op.name][0]] = 0.0
        for op in reversed(self.ops):
            incoming = grads.get((op.name, 0))
            if not incoming:
                continue
            g = _sum(nodes, seconds, incoming, f"sum_{op.name}", _bytes_of(nodes, (op.name, 0)))
            reads = [g]
            if op.saves == "inputs":
                reads += [r for r in op.inputs if not r[0].startswith("tangent")]
            elif op.saves == "output":
                reads.append(held[op.name])
            outs = []
            for r in op.inputs:
                nbytes = _bytes_of(nodes, r)
                outs.append(_meta(0, alias=0) if op.view else _meta(max(nbytes, 4)))
            name = f"grad_{op.name}"
            nodes.append(Node(name, f"grad.{op.name}", BACKWARD, reads, outs))
            seconds[name] = 0.0 if op.view else grad_seconds
            for k, r in enumerate(op.inputs):
                grads.setdefault(r, []).append((name, k))
        input_grads: list[ValueRef | None] = []
        for node in nodes:
            if node.phase == PLACEHOLDER and node.role != ROLE_TANGENT:
                incoming = grads.get((node.name, 0))
                if node.role == ROLE_PARAM and incoming:
                    nbytes = _bytes_of(nodes, (node.name, 0))
                    input_grads.append(_sum(nodes, seconds, incoming, f"sum_{node.name}", nbytes))
                else:
                    input_grads.append(None)
        graph = Graph(nodes, [output], input_grads)
        return graph, Profile(graph.fingerprint(), "cpu", "test", seconds, {}, graph)


def _bytes_of(nodes: list[Node], ref: ValueRef) -> int:
    for node in nodes:
        if node.name == ref[0]:
            meta = node.outputs[ref[1]]
            if meta.alias_of is None:
                return meta.nbytes
            return _bytes_of(nodes, node.inputs[meta.alias_of])
    raise KeyError(ref)


def _sum(nodes, seconds, refs: list[ValueRef], name: str, nbytes: int) -> ValueRef:
    if len(refs) == 1:
        return refs[0]
    nodes.append(Node(name, "aten.add.Tensor", BACKWARD, list(refs), [_meta(nbytes)]))
    seconds[name] = 0.1
    return (name, 0)


def chain_step(sizes: list[int], seconds: list[float] | None = None) -> tuple[Graph, Profile]:
    """x -> f1 -> f2 -> ... (each saving its input, like a linear layer without a weight)."""
    b = StepBuilder()
    x = b.input("x", sizes[0])
    w = b.param("w", 4)
    for k, nbytes in enumerate(sizes[1:]):
        x = b.op(f"f{k}", [x, w] if k == 0 else [x], nbytes, (seconds or [1.0] * len(sizes))[k])
    return b.build(x)


def random_step(
    rng: random.Random, n_ops: int, head_bytes: int = 4, handed: bool = False
) -> tuple[Graph, Profile]:
    """A random forward DAG on a spine: each operator reads the latest value and sometimes an
    earlier one (a skip connection); some are views, some save their output instead of their
    inputs or nothing, now and then one is random (never recomputed). `handed`: the tangent
    is handed over by autograd (a loss's gradient: freed after its last use, as
    explorer.program.Handoff.handed_tangents), not held through the backward."""
    b = StepBuilder()
    values = [b.input("x", rng.choice([8, 16, 32]))]
    w = b.param("w", 4)
    for k in range(n_ops):
        last = values[-1]
        if rng.random() < 0.15 and last[0] != "x":
            values.append(b.view(f"v{k}", last))
            continue
        inputs = [last]
        if rng.random() < 0.35 and len(values) > 2:
            other = rng.choice(values[:-1])
            if other[0] != "x":
                inputs.append(other)
        if k == 0:
            inputs.append(w)
        values.append(
            b.op(
                f"f{k}",
                inputs,
                rng.choice([4, 8, 16, 32, 64]),
                seconds=rng.choice([0.5, 1.0, 2.0, 3.0]),
                saves=rng.choice(["inputs", "inputs", "output", "nothing"]),
                random_op=rng.random() < 0.08,
            )
        )
    graph, profile = b.build(b.op("head", [values[-1]], head_bytes))
    if handed:
        profile.handed_tangents = frozenset(n.name for n in graph.placeholders(ROLE_TANGENT))
    return graph, profile


def brute_force(space: Space, graph: Graph, profile: Profile, limit: int = 1 << 14):
    """(peak, seconds, windows) of every valid point of the space, or None when there are
    more than `limit`. Window t takes any subset of the operators that a backward operator
    from t on could need (recomputing anything else makes values nothing reads)."""
    stages = [t for t, r in enumerate(space.reading) if r]
    choices = [_needed_from(space, graph, t) for t in stages]
    if 2 ** sum(len(c) for c in choices) > limit:
        return None
    found = []
    for picks in itertools.product(*(_subsets(c) for c in choices)):
        windows = space.empty()
        for t, pick in zip(stages, picks, strict=True):
            windows[t] = list(pick)
        schedule = space.lower(windows, graph.fingerprint())
        program = compile_program(graph, schedule, Handoff(handed_tangents=profile.handed_tangents))
        if check_program(graph, program) is not None:
            continue
        peak = simulate(graph, program).peak_bytes
        names = [i.node for i in program.forward] + [i.node for i in program.backward]
        found.append((peak, sum(profile.time_of(n) for n in names), windows))
    return found


def _subsets(items: list[str]):
    return itertools.chain.from_iterable(
        itertools.combinations(items, k) for k in range(len(items) + 1)
    )


def _needed_from(space: Space, graph: Graph, t: int) -> list[str]:
    """Allocating forward operators that backward operators t, t+1, ... depend on."""
    found: set[str] = set()
    stack = [r[0] for name in space.order[t:] for r in graph.node(name).inputs]
    while stack:
        name = stack.pop()
        if name in found or name not in space.position:
            continue
        found.add(name)
        stack.extend(r[0] for r in graph.node(name).inputs)
    return [a for a in space.decisions if a in found]
