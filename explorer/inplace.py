"""Pointwise operators that write their output into a dying input's storage, as eager does.

AOTAutograd's graphs are functional: `relu(x)` makes a new tensor where a torchvision block
runs `relu_` on its BatchNorm output, and `add(a, b)` where it runs `out += identity`. On a
CPU each new tensor is memory the allocator fetches and the kernel first touches (page
faults): measured on resnet50 b8 128 px, one thread, the runtime's step without
recomputation took 1.018x the unmodified step, and 1.001x with its 129 such operators
writing in place (49 ReLUs, 31 additions, 49 ReLU gradients).

An instruction writes in place (`Instr.in_place`) when all of these hold:
- its operator is one of `IN_PLACE` (elementwise: the in-place overload, or for the
  activations' gradients the out= overload given the incoming gradient, runs the same
  kernel, so its result is bitwise the same);
- it is the last reader of its first input, reads it once, and no other value shares that
  storage (a view of it still alive, a saved copy): `simulate.LastReader`;
- that storage was made by the same list of instructions (the forward, or the backward with
  its recomputations): never a graph input, a tangent, or a value the forward saved, which
  autograd may hold beyond this run (a second backward with `retain_graph=True` reads them);
- the output has the input's shape and dtype, both are contiguous, and the storage is
  exactly the output's size, so the output is laid out as the functional operator lays it;
- its moment is below the graph's peak. Writing in place only lowers the moment of the
  operator itself (afterwards the same bytes are alive as when the input is freed), so the
  peak, and every solver's and floor's count of it, stays what they predict for the
  schedule; the timeline (`simulate`) counts the lower moments as they happen.

The runtime applies this to a plan of one graph run once (explorer.backend): the moments of a
graph in a step of several are counted beside what other graphs hold, so a moment under its
own graph's peak may be the step's. `write_in_place` maps the marked instructions to the
partitioned FX graphs' nodes and checks each against the FX graph itself before switching it:
a node whose input's storage is read after it, or is a graph input, is left functional.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import torch
from torch import fx

from explorer.fxgraph import is_getitem, output_aliases, tensor_args
from explorer.graph import Graph
from explorer.partition import RECOMPUTE, REMAT, REMAT_SOURCE
from explorer.program import Instr, StepProgram, operator_of
from explorer.simulate import LastReader, simulate

aten = torch.ops.aten
IN_PLACE = {
    aten.add.Tensor: aten.add_.Tensor,
    aten.sub.Tensor: aten.sub_.Tensor,
    aten.mul.Tensor: aten.mul_.Tensor,
    aten.div.Tensor: aten.div_.Tensor,
    aten.relu.default: aten.relu_.default,
    aten.clamp_min.default: aten.clamp_min_.default,
    aten.hardtanh.default: aten.hardtanh_.default,
    aten.silu.default: aten.silu_.default,
    aten.gelu.default: aten.gelu_.default,
    aten.sigmoid.default: aten.sigmoid_.default,
    aten.tanh.default: aten.tanh_.default,
    aten.hardswish.default: aten.hardswish_.default,
    # gradients of those: written into the incoming gradient (their out= overloads), which
    # eager's autograd does not do
    aten.threshold_backward.default: aten.threshold_backward.grad_input,
    aten.hardtanh_backward.default: aten.hardtanh_backward.grad_input,
    aten.silu_backward.default: aten.silu_backward.grad_input,
    aten.gelu_backward.default: aten.gelu_backward.grad_input,
    aten.sigmoid_backward.default: aten.sigmoid_backward.grad_input,
    aten.tanh_backward.default: aten.tanh_backward.grad_input,
    aten.hardswish_backward.default: aten.hardswish_backward.out,
}
# the out= overloads among those: the keyword that names the tensor written
OUT_ARGUMENT = {
    overload: argument.name
    for overload in IN_PLACE.values()
    for argument in overload._schema.arguments
    if argument.kwarg_only and argument.alias_info is not None and argument.alias_info.is_write
}
IN_PLACE_BY_NAME = {str(functional): in_place for functional, in_place in IN_PLACE.items()}


def mark_in_place(graph: Graph, program: StepProgram) -> StepProgram:
    """`program` with every instruction that can write in place marked (module docstring);
    the same program where none can."""
    readers: list[LastReader] = []
    timeline = simulate(graph, program, last_readers=readers)
    operators = len(program.forward) + len(program.backward)  # the first entries: no eager
    peak = max(timeline.steps[:operators], default=0)
    chosen = {
        id(r.instr)
        for r in readers
        if timeline.steps[r.entry] < peak and _same_layout(graph, r.instr, r.storage_bytes)
    }
    if not chosen:
        return program

    def marked(instrs: list[Instr]) -> list[Instr]:
        return [replace(i, in_place=True) if id(i) in chosen else i for i in instrs]

    return replace(program, forward=marked(program.forward), backward=marked(program.backward))


def _same_layout(graph: Graph, instr: Instr, storage_bytes: int) -> bool:
    """Whether the instruction's operator has an in-place overload and its output would be
    laid out in its first input's storage as the functional operator lays it out."""
    if operator_of(graph, instr.node) not in IN_PLACE_BY_NAME:
        return False
    node = graph.node(instr.node)
    source, index = node.inputs[0]
    given = graph.node(source).outputs[index]
    (made,) = node.outputs
    return (
        given is not None
        and made is not None
        and made.alias_of is None
        and made.shape == given.shape
        and made.dtype == given.dtype
        and made.contiguous
        and given.contiguous
        and made.nbytes == storage_bytes
    )


def write_in_place(forward: fx.GraphModule, backward: fx.GraphModule, program: StepProgram) -> int:
    """Switch the FX nodes of `program`'s marked instructions to their in-place overloads and
    recompile; returns how many were switched. A forward node is found by the joint-graph
    node it copies; a backward node also by whether it is a recomputation and how many copies
    of the same kind came before it (a value can be recomputed more than once)."""
    wanted = {(i.node, False, 0) for i in program.forward if i.in_place}
    switched = _switch(forward, wanted)
    seen: Counter[tuple[str, bool]] = Counter()
    wanted = set()
    for instr in program.backward:
        kind = (instr.node, instr.recompute)
        if instr.in_place:
            wanted.add((*kind, seen[kind]))
        seen[kind] += 1
    return switched + _switch(backward, wanted)


def _switch(module: fx.GraphModule, wanted: set[tuple[str, bool, int]]) -> int:
    """Switch the nodes of `module` named by `wanted` (joint-graph name, recomputed, copy
    number) that `_dies_here` allows."""
    if not wanted:
        return 0
    nodes = list(module.graph.nodes)
    order = {node: k for k, node in enumerate(nodes)}
    roots = _storage_roots(nodes)
    seen: Counter[tuple[str, bool]] = Counter()
    switched = 0
    for node in nodes:
        source = node.meta.get(REMAT_SOURCE)
        if node.op != "call_function" or source is None:
            continue
        kind = (source, node.meta.get(REMAT) == RECOMPUTE)
        copy, seen[kind] = seen[kind], seen[kind] + 1
        if (*kind, copy) in wanted and _dies_here(node, order, roots):
            node.target = IN_PLACE_BY_NAME[str(node.target)]
            if node.target in OUT_ARGUMENT:
                node.kwargs = {**node.kwargs, OUT_ARGUMENT[node.target]: node.args[0]}
            switched += 1
    if switched:
        module.recompile()
    return switched


def _storage_roots(nodes: list[fx.Node]) -> dict[fx.Node, fx.Node]:
    """The node that made each node's storage: itself, or for a view the root of its base."""
    roots: dict[fx.Node, fx.Node] = {}
    for node in nodes:
        maker, output = (node.args[0], node.args[1]) if is_getitem(node) else (node, 0)
        positions = output_aliases(maker) if isinstance(maker, fx.Node) else []
        known = isinstance(output, int) and output < len(positions)
        position = positions[output] if known else None
        if position is None:
            roots[node] = node
        else:
            base = tensor_args(maker)[position]
            roots[node] = roots.get(base, base)
    return roots


def _laid_out_alike(given: object, made: object) -> bool:
    """Whether two traced values have the same shape, strides and dtype."""
    return (
        isinstance(given, torch.Tensor)
        and isinstance(made, torch.Tensor)
        and given.shape == made.shape
        and given.stride() == made.stride()
        and given.dtype == made.dtype
    )


def _dies_here(node: fx.Node, order: dict[fx.Node, int], roots: dict[fx.Node, fx.Node]) -> bool:
    """Whether `node` may write into its first argument: an in-place-able operator whose first
    argument is laid out as its output and has a storage a call made in this graph, read by
    nothing after `node` (nor returned) and by no other argument of `node`."""
    first = node.args[0] if node.args else None
    if str(node.target) not in IN_PLACE_BY_NAME or not isinstance(first, fx.Node):
        return False
    root = roots.get(first, first)
    given, made = first.meta.get("val"), node.meta.get("val")
    if root.op != "call_function" or not _laid_out_alike(given, made):
        return False
    others = [a for a in tensor_args(node)[1:] if roots.get(a, a) is root]
    if others or tensor_args(node).count(first) > 1:
        return False
    sharing = [n for n, r in roots.items() if r is root]
    return all(
        user.op != "output" and order[user] <= order[node]
        for holder in sharing
        for user in holder.users
    )
