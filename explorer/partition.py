"""Schedule + joint graph -> the forward and backward FX graphs AOTAutograd runs.

This is the partition function of our `torch.compile` backend. We first write the schedule into
the joint graph: its backward section is rebuilt in the schedule's order, and each forward node
the schedule recomputes is copied in right where the schedule puts it (a node recomputed twice
is copied twice), reading the values the schedule says are alive at that point (a recomputed
dropout mask is replayed from its saved generator state: explorer.rngreplay). AOTAutograd's own
helper `_extract_fwd_bwd_modules` then cuts that scheduled joint graph at the saved values, so
AOTAutograd's conventions hold (output order, saved-tensor bookkeeping, the forward's buffer
updates) and a forward value that only a recomputation needs is not computed in the forward.

FX code generation frees every value after its last use, and the boxed calling convention frees
the saved tensors as soon as the backward has unpacked them, so the memory alive at each step is
what `explorer.simulate` predicts for the same schedule. A value that a custom autograd.Function
traced by Dynamo put on its ctx (`ctx.x = x`, not `save_for_backward`) is saved like any other:
AOTAutograd would keep it apart, without a version-counter check, on its autograd node, alive
past its last use to the step's end (131,072 bytes under the plan in the test's backward), so
it gets that check too (an in-place write to it between the forward and the backward is an
error, as for every other saved tensor).
"""

from __future__ import annotations

from torch import fx
from torch._functorch.partitioners import _extract_fwd_bwd_modules

from explorer.fxgraph import is_getitem, is_tangent, value_nodes
from explorer.graph import BACKWARD, FORWARD, Graph
from explorer.rngreplay import replay_in_place
from explorer.schedule import GraphSchedule
from explorer.symsizes import is_symbolic

REMAT = "remat"  # node.meta key of a copy's tag
RECOMPUTE = "recompute"  # node.meta[REMAT] of a recomputation in the backward graph
# node.meta[REMAT_SOURCE]: the joint-graph node a node copies (names may change)
REMAT_SOURCE = "remat_source"
# node.meta flag of a value a traced autograd.Function put on its ctx (torch._functorch)
NO_VERSION_CHECK = "saved_tensor_with_no_vc_check"


def partition(
    joint: fx.GraphModule, graph: Graph, schedule: GraphSchedule, num_fwd_outputs: int
) -> tuple[fx.GraphModule, fx.GraphModule]:
    """Forward and backward graph modules that follow `schedule`."""
    scheduled, saved, sizes = _scheduled_joint(joint, graph, schedule, num_fwd_outputs)
    return _extract_fwd_bwd_modules(
        scheduled, saved, saved_sym_nodes=sizes, num_fwd_outputs=num_fwd_outputs
    )


def _copied(new: fx.Graph, node: fx.Node, env: dict[fx.Node, fx.Node]) -> fx.Node:
    """`node` copied into `new`, reading the latest copies of its inputs (`env`), saved as the
    plan counts it if saved (module docstring)."""
    made = new.node_copy(node, lambda n: env[n])
    made.meta.pop(NO_VERSION_CHECK, None)
    return made


def _scheduled_joint(
    joint: fx.GraphModule, graph: Graph, schedule: GraphSchedule, num_fwd_outputs: int
) -> tuple[fx.GraphModule, list[fx.Node], list[fx.Node]]:
    """A copy of the joint graph whose backward runs in the schedule's order, the values its
    forward saves (the schedule's, plus the graph inputs the backward reads) and the symbolic
    sizes it passes on (those the backward reads among the forward's: AOTAutograd keeps the
    ones it does)."""
    phase = {n.name: n.phase for n in graph.nodes}
    by_name = {n.name: n for n in joint.graph.nodes}
    new = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}  # joint node -> its latest copy

    def copy(node: fx.Node, tag: str | None = None) -> fx.Node:
        for size in node.all_input_nodes:  # a backward size read first here (not in the IR)
            if is_symbolic(size) and size not in env:
                copy(size)
        made = _copied(new, node, env)
        made.meta[REMAT_SOURCE] = node.name
        if tag is not None:
            made.meta["partitioner_tag"] = "is_backward"
            made.meta[REMAT] = tag
            replay_in_place(made)  # a dropout mask is drawn again from its saved state
        env[node] = made
        for user in node.users:
            if is_getitem(user):
                env[user] = _copied(new, user, env)
                if tag is not None:
                    env[user].meta["partitioner_tag"] = "is_backward"
        return made

    for node in joint.graph.nodes:
        if node.op in ("placeholder", "get_attr"):
            copy(node)
        elif is_symbolic(node):
            if node.meta.get("partitioner_tag") != "is_backward":
                copy(node)
        elif node.op == "call_function" and not is_getitem(node):
            if phase.get(node.name, BACKWARD) != BACKWARD:
                copy(node)
    forward_copy = dict(env)
    sizes = [made for made in forward_copy.values() if is_symbolic(made) and made.op != "output"]
    refs = value_nodes(joint.graph)
    saved = [forward_copy[refs[ref]] for ref in schedule.saved]
    for name in schedule.backward:
        source = by_name[name]
        if phase[name] == FORWARD:
            copy(source, RECOMPUTE)
        else:
            copy(source)
        for producer, _ in graph.node(name).inputs:
            fxn = by_name[producer]
            if fxn.op == "placeholder" and not is_tangent(fxn):
                if forward_copy[fxn] not in saved:
                    saved.append(forward_copy[fxn])  # a graph input: alive anyway, costs nothing
    # the forward's outputs are the forward's values, not their recomputations
    (output,) = joint.graph.find_nodes(op="output")
    values = list(output.args[0])
    mapped = [
        (forward_copy if k < num_fwd_outputs else env)[v] if isinstance(v, fx.Node) else v
        for k, v in enumerate(values)
    ]
    new.output(tuple(mapped)).meta.update(output.meta)
    new.lint()
    return fx.GraphModule(joint, new), saved, sizes
