"""Gradients that only outputs the loss leaves unread lead to: left out of the plan and the run.

A loss may leave outputs unread: GoogLeNet's auxiliary heads under a loss on the logits. Eager
autograd never runs the backward of what only those outputs reach. A compiled graph's
backward is one node: autograd hands it zeros for the outputs that get no gradient, and it
computes every gradient its graph makes from them, zeros included, all alive at once as the
graph's backward ends (explorer.unreached then turns the parameters' into None). Measured,
GoogLeNet at batch 2, 64 px, loss on the logits: every point peaked above the unmodified
model by its auxiliary heads' 25.5 MB of parameter gradients.

So a step captured with a loss is planned on a joint graph without them (`pruned_joint`):
each gradient that reads only tangents of unread outputs becomes None, each term such a
tangent alone adds to another gradient goes, and so do the operators only those needed. An
earlier graph's output that only such gradients reach is unread too (`unread_tangents`). The
graph's description lists the tangents left out (`Graph.unread_tangents`), its schedules
carry them, and the runtime prunes the joint graphs it captures the same way when a schedule
asks for it. A step whose loss reads such an output after all (a tangent given, zeros
included: `loss + 0 * aux.sum()` makes zero gradients, which AdamW decays) is refused in the
backward (explorer.unreached), as eager PyTorch would compute those gradients and the pruned
graph cannot. What a plan must still compute from unread outputs (a pass of a loop whose
compiled graph another pass reads: they share one schedule) is counted
(`unread_gradient_bytes`), so that the front can say why it lies above the model as it is.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

import torch
from torch import fx

from explorer.eager import COMPILED, compiled_runs
from explorer.fxgraph import describe_with_sizes, is_tangent
from explorer.graph import ROLE_BUFFER, ROLE_PARAM, ROLE_TANGENT, Graph
from explorer.symsizes import Sizes
from explorer.unreached import DROPPED_TANGENT, tangent_outputs, tangents_read

if TYPE_CHECKING:
    from explorer.capture import CapturedGraph


def unread_tangents(
    captured: list[CapturedGraph],
    outputs: list[torch.Tensor],
    roots: list[torch.Tensor],
    watched: list[bool],
) -> tuple[list[frozenset[str]], list[frozenset[str]]]:
    """For each captured run, the tangents of its outputs that the backward from `roots`
    (the loss, or the outputs given gradients) gives no gradient, once the gradients that
    read only such tangents are left out (`leave_out_unread`, which leaves out those that
    every run of a compiled graph leaves unread: they share one schedule): an output of an
    earlier graph that only those gradients reach is unread too. `outputs`: every tensor
    the step returned, the loss included, which reach every run. No tangent anywhere where
    the runs cannot be told apart (a joint graph without descriptors, or runs that cannot be
    matched to the captured ones), and none for a graph whose runs are not all `watched`
    (explorer.unreached.watch_outputs: its backward could not tell them). Returns them
    twice: each run's own, and those all runs of its compiled graph share (what
    `leave_out_unread` leaves out)."""
    runs = compiled_runs(outputs)
    if len(runs) != len(captured):
        return [frozenset()] * len(captured), [frozenset()] * len(captured)
    shared = _runs_by_graph(captured)
    tangents = [tangent_outputs(g.joint, g.num_fwd_outputs) for g in captured]
    reads = {id(g.joint): tangents_read(g.joint.graph) for g in captured}
    left_out: dict[Any, set[int]] = {}  # run -> its inputs whose gradients are left out
    while True:
        reached = _outputs_reached(roots, left_out)
        own = [
            frozenset(name for k, name in by_output.items() if k not in reached.get(run, ()))
            for run, by_output in zip(runs, tangents, strict=True)
        ]
        common = own.copy()
        for same in shared.values():
            if not all(watched[j] for j in same):
                for k in same:
                    own[k] = common[k] = frozenset()
                continue
            together = frozenset.intersection(*(own[j] for j in same))
            for k in same:
                common[k] = together
        now = {
            run: _inputs_left_out(graph, run, unread, reads[id(graph.joint)])
            for run, graph, unread in zip(runs, captured, common, strict=True)
        }
        if now == left_out:
            return own, common
        left_out = now


def _runs_by_graph(captured: list[CapturedGraph]) -> dict[int, list[int]]:
    """The positions of the runs of each compiled graph (by its joint graph's identity)."""
    shared: dict[int, list[int]] = {}
    for k, graph in enumerate(captured):
        shared.setdefault(id(graph.joint), []).append(k)
    return shared


def _inputs_left_out(
    graph: CapturedGraph, run: Any, unread: frozenset[str], reads: dict[fx.Node, frozenset[str]]
) -> set[int]:
    """The positions of the graph run's inputs (of its autograd node's edges) whose
    gradients read only `unread` tangents (`reads`: of its joint graph's nodes); none where
    the node's edges cannot be matched to the graph's inputs (each parameter's edge must
    lead to that parameter)."""
    if not unread:
        return set()
    (output,) = graph.joint.graph.find_nodes(op="output")
    values = list(output.args[0])[graph.num_fwd_outputs :]
    edges = run.next_functions
    if len(edges) != len(values) or len(graph.primals) != len(values):
        return set()
    for (following, _), given in zip(edges, graph.primals, strict=True):
        variable = getattr(following, "variable", None)
        if variable is not None and variable is not given:
            return set()
    return {
        k
        for k, value in enumerate(values)
        if isinstance(value, fx.Node) and reads[value] and reads[value] <= unread
    }


def leave_out_unread(captured: list[CapturedGraph], shared: list[frozenset[str]]) -> None:
    """Give each captured joint graph, and its description, without the gradients only the
    unread tangents all its runs share lead to (`pruned_joint`; `unread_tangents`)."""
    for runs in _runs_by_graph(captured).values():
        first = captured[runs[0]]
        pruned = pruned_joint(first.joint, first.graph, first.num_fwd_outputs, shared[runs[0]])
        if pruned is None:
            continue
        joint, graph, _sizes = pruned
        for k in runs:
            captured[k].joint, captured[k].graph = joint, graph


def pruned_joint(
    joint: fx.GraphModule, graph: Graph, num_fwd_outputs: int, unread: frozenset[str]
) -> tuple[fx.GraphModule, Graph, Sizes] | None:
    """A copy of `joint` (whose description is `graph`) in which each gradient that reads
    tangents, all of them in `unread`, is None, and each such term of a sum with another
    gradient is gone (`_without_unread_terms`), without the operators only those read; and
    its description, which lists the tangents they read (`Graph.unread_tangents`: what its
    backward must not be given). None if nothing goes. An activation's gradient that goes
    is None for the earlier graph that made the activation, which `unread_tangents` counts
    as unread there."""
    if not unread:
        return None
    new = fx.Graph()
    values, old_output = new.graph_copy(joint.graph, {}, return_output_node=True)
    values = list(values) if isinstance(values, (list, tuple)) else [values]
    # which reads only unread tangents, and which reads others too, is the same before and
    # after a term goes (it reads only unread ones), so the reads are found once
    reads = tangents_read(new)
    replaced, dropped = _without_unread_terms(new, unread, reads)
    values = [replaced.get(v, v) if isinstance(v, fx.Node) else v for v in values]
    roles = {n.name: n.role for n in graph.nodes}
    primals = [n for n in new.find_nodes(op="placeholder") if not is_tangent(n)]
    for k in range(len(primals)):
        at = num_fwd_outputs + k
        grad = values[at] if at < len(values) else None
        if not isinstance(grad, fx.Node):
            continue
        if reads[grad] and reads[grad] <= unread:
            values[at] = None
            dropped |= reads[grad]
    if not dropped:
        return None
    output = new.output(type(old_output.args[0])(values))
    output.meta = dict(old_output.meta)
    new.eliminate_dead_code()
    for node in new.find_nodes(op="placeholder"):
        if node.name in dropped:
            node.meta = {**node.meta, DROPPED_TANGENT: True}
    pruned = fx.GraphModule(joint, new)
    static = [k for k, n in enumerate(primals) if roles.get(n.name) in (ROLE_PARAM, ROLE_BUFFER)]
    described, sizes = describe_with_sizes(new, num_fwd_outputs, static)
    return pruned, replace(described, unread_tangents=sorted(dropped)), sizes


def _without_unread_terms(
    graph: fx.Graph, unread: frozenset[str], read: dict[fx.Node, frozenset[str]]
) -> tuple[dict[fx.Node, fx.Node], set[str]]:
    """Make each sum of a gradient and a term that reads only `unread` tangents (the term
    the backward of an unread output adds where it meets the read outputs' backward: eager
    PyTorch never computes it) the gradient alone. Returns each sum made so and the gradient
    it now is, and the tangents the terms left out read. A sum that would change a shape or
    dtype stays. `read`: the tangents each node reads."""
    replaced: dict[fx.Node, fx.Node] = {}
    dropped: set[str] = set()
    for node in list(graph.nodes):
        if node.target is not torch.ops.aten.add.Tensor or len(node.args) != 2:
            continue
        terms = [a for a in node.args if isinstance(a, fx.Node)]
        only_unread = [t for t in terms if read[t] and read[t] <= unread]
        others = [t for t in terms if read[t] - unread]
        if len(terms) == 2 and len(only_unread) == 1 and len(others) == 1:
            (kept,), (gone,) = others, only_unread
            if _same_kind(kept, node):
                node.replace_all_uses_with(kept)
                replaced[node] = kept
                dropped |= read[gone]
    return replaced, dropped


def _same_kind(a: fx.Node, b: fx.Node) -> bool:
    """Two FX values of one shape and dtype (by their traced values)."""
    x, y = a.meta.get("val"), b.meta.get("val")
    if not isinstance(x, torch.Tensor) or not isinstance(y, torch.Tensor):
        return False
    return x.shape == y.shape and x.dtype == y.dtype


def unread_gradient_bytes(captured: list[CapturedGraph], unread: list[frozenset[str]]) -> int:
    """Bytes of the gradients the step's graph runs still make only from their `unread`
    tangents (those `leave_out_unread` cannot leave out)."""
    total = 0
    for graph, tangents in zip(captured, unread, strict=True):
        if tangents:
            total += _bytes_only_from(graph.graph, set(tangents))
    return total


def _outputs_reached(
    roots: list[torch.Tensor], left_out: dict[Any, set[int]]
) -> dict[Any, set[int]]:
    """For each compiled run's autograd node behind `roots`, the positions of its outputs
    that a gradient flows back into (a root's own, or the one an edge to the node names),
    along every edge but those `left_out` names (a run's node: the positions of its edges
    whose gradients it does not make)."""
    reached: dict[Any, set[int]] = {}
    for root in roots:
        if type(root.grad_fn).__name__ == COMPILED:
            reached.setdefault(root.grad_fn, set()).add(root.output_nr)
    seen: set[Any] = set()
    todo = [t.grad_fn for t in roots if t.grad_fn is not None]
    while todo:
        node = todo.pop()
        if node in seen:
            continue
        seen.add(node)
        skipped = left_out.get(node, set())
        for edge, (following, position) in enumerate(node.next_functions):
            if following is None or edge in skipped:
                continue
            if type(following).__name__ == COMPILED:
                reached.setdefault(following, set()).add(position)
            todo.append(following)
    return reached


def _bytes_only_from(graph: Graph, unread: set[str]) -> int:
    """Bytes of the graph's input gradients, as the plan counts them, that read tangents,
    all of them in `unread`."""
    read: dict[str, frozenset[str]] = {}
    for node in graph.nodes:
        own = frozenset([node.name]) if node.role == ROLE_TANGENT else frozenset()
        read[node.name] = own.union(*(read[name] for name, _ in node.inputs))
    return sum(
        graph.grad_bytes(ref)
        for ref in graph.input_grads
        if ref is not None and read[ref[0]] and read[ref[0]] <= unread
    )
