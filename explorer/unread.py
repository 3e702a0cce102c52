"""The gradients a compiled step makes, of zeros, that eager PyTorch does not make at all.

A loss may leave outputs unread: GoogLeNet's auxiliary heads under a loss on the logits. Eager
autograd never runs the backward of what only those outputs reach. A compiled graph's
backward is one node: autograd hands it zeros for the outputs that get no gradient, and it
computes every gradient its graph makes from them, zeros included, all alive at once as the
graph's backward ends (explorer.unreached then turns the parameters' into None). A plan
predicts them, so they are counted in every point's peak and none in the unmodified
model's: measured, GoogLeNet at batch 2, 64 px, loss on the logits, every point peaked
above the unmodified model by about its auxiliary heads' 25.5 MB of parameters. Here they
are counted, so that the front can say why.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from explorer.eager import COMPILED, compiled_runs
from explorer.graph import ROLE_TANGENT, Graph
from explorer.unreached import tangent_outputs

if TYPE_CHECKING:
    from explorer.capture import CapturedGraph


def unread_gradient_bytes(
    captured: list[CapturedGraph], outputs: list[torch.Tensor], roots: list[torch.Tensor]
) -> int:
    """Bytes of the gradients the step's graph runs make only from outputs that the
    backward from `roots` (the loss, or the outputs given gradients) leaves without one.
    `outputs`: every tensor the step returned, the loss included, which reach every run.
    0 where the runs cannot be told apart (a joint graph without descriptors, or runs that
    cannot be matched to the captured ones)."""
    runs = compiled_runs(outputs)
    if len(runs) != len(captured):
        return 0
    reached = _outputs_reached(roots)
    total = 0
    for run, graph in zip(runs, captured, strict=True):
        tangents = tangent_outputs(graph.joint, graph.num_fwd_outputs)
        unread = {name for k, name in tangents.items() if k not in reached.get(run, set())}
        if unread:
            total += _bytes_only_from(graph.graph, unread)
    return total


def _outputs_reached(roots: list[torch.Tensor]) -> dict[Any, set[int]]:
    """For each compiled run's autograd node behind `roots`, the positions of its outputs
    that a gradient flows back into (a root's own, or the one an edge to the node names)."""
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
        for following, position in node.next_functions:
            if following is None:
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
