"""Gradients that no output the loss reads reaches stay None, as eager PyTorch leaves them.

Eager autograd leaves a parameter's `.grad` None when nothing the backward starts from
depends on it: GoogLeNet's auxiliary heads when the loss reads only the logits, a pooler a
loss never reads, the head a multi-task loop skips this step. A compiled graph's backward
node is given a tangent for each of its outputs (autograd fills in zeros for those that get
no gradient before AOTAutograd's backward runs), so every parameter the graph reads gets a
gradient, of zeros: AdamW then decays those weights and momentum moves them, where the
unmodified model leaves them alone (GoogLeNet's auxiliary heads under AdamW: 4e-5 apart
after four steps). `torch.compile` itself does so.

Here each forward run's backward node gets a pre-hook, which sees the outputs that get no
gradient as None (before the zeros are filled in) and notes their tangents; the backward that
runs next on that thread (the node's own: the engine runs a node's pre-hooks, then the node)
returns None for every gradient that depends on those tangents alone. A tangent is matched
to its output by the descriptors AOTAutograd gives the joint graph (`TangentAOTInput`); a
joint graph without them leaves every gradient as computed, as before.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import torch
from torch import fx

from explorer.eager import COMPILED
from explorer.errors import RematError
from explorer.fxgraph import is_tangent

_pending = threading.local()  # the tangents the next backward on this thread does not get
# node.meta flag of a tangent placeholder whose output a plan took as unread: the gradients
# only it reaches were left out of the graph (explorer.unread), so it must not be given
DROPPED_TANGENT = "remat_unread_tangent"


def tangent_outputs(joint: fx.GraphModule, num_fwd_outputs: int) -> dict[int, str]:
    """The tangent placeholder of each forward output that has one, by the output's position
    among the backward node's outputs (the joint graph's first `num_fwd_outputs` outputs);
    empty where the joint graph carries no descriptors."""
    (output,) = joint.graph.find_nodes(op="output")
    descriptors = output.meta.get("desc")
    if not descriptors:
        return {}
    position = {desc: k for k, desc in enumerate(descriptors[:num_fwd_outputs])}
    found = {}
    for node in joint.graph.find_nodes(op="placeholder"):
        made_for = getattr(node.meta.get("desc"), "output", None)
        if is_tangent(node) and made_for in position:
            found[position[made_for]] = node.name
    return found


def watch_outputs(inputs: Any, outputs: Any, tangents: dict[int, str]) -> bool:
    """Give the backward node of one forward run (`inputs`: what the compiled graph was
    given; `outputs`: what it returned) a pre-hook that notes which of `tangents` its
    outputs do not get. False where it has tangents and its node is not found: its backward
    cannot tell them."""
    if not tangents or not isinstance(outputs, (list, tuple)):
        return True
    node = _compiled_node(inputs, outputs)
    if node is None:
        return False

    def note_missing(grad_outputs: tuple) -> None:
        _pending.missing = frozenset(
            name
            for k, name in tangents.items()
            if k < len(grad_outputs) and grad_outputs[k] is None
        )

    node.register_prehook(note_missing)
    return True


def _compiled_node(inputs: Any, outputs: list | tuple) -> Any:
    """The autograd node this run of AOTAutograd's compiled function made: reached from
    `outputs` (an output may be a view regenerated from it) without passing through an
    input's node, which an output that is an input, or a view of one, leads to (an earlier
    graph's node, whose tangents are others). None if no such node, or more than one, is
    found: the run's gradients are then left as computed."""
    # nodes by id, each held so that its id stays its own while this runs
    given = {id(node): node for node in _nodes_of(inputs)}
    todo = _nodes_of(outputs)
    seen: dict[int, Any] = {}
    found = []
    while todo:
        node = todo.pop(0)
        if node is None or id(node) in seen or id(node) in given:
            continue
        seen[id(node)] = node
        if type(node).__name__ == COMPILED:
            found.append(node)
        else:
            todo += [following for following, _ in node.next_functions]
    return found[0] if len(found) == 1 else None


def _nodes_of(tensors: Any) -> list:
    return [t.grad_fn for t in tensors if isinstance(t, torch.Tensor) and t.grad_fn is not None]


def leaving_unreached(gm: fx.GraphModule, run: Callable[[list], Any]) -> Callable[[list], Any]:
    """`run`, the boxed backward of `gm`, returning None for each gradient that depends only
    on tangents the pre-hook noted as not given. A noted tangent that is not all zeros (a
    note left by a backward that failed before it ran) is not taken as missing. Refuses,
    with a RematError, a backward given a tangent its plan took as unread (DROPPED_TANGENT)."""
    placeholders = gm.graph.find_nodes(op="placeholder")
    places = {n.name: k for k, n in enumerate(placeholders)}
    tangents = {n.name for n in placeholders if is_tangent(n)}
    dropped = {n.name for n in placeholders if n.meta.get(DROPPED_TANGENT)}
    read = tangents_read(gm.graph)
    (output,) = gm.graph.find_nodes(op="output")
    reads = [read[v] if isinstance(v, fx.Node) else None for v in output.args[0]]

    def backward(args: list) -> Any:
        noted = getattr(_pending, "missing", frozenset())
        _pending.missing = frozenset()
        if dropped - noted:
            raise RematError(
                "this step's loss reads a model output that the schedule was planned "
                "without a gradient for (the loss it was planned with left it unread, so "
                "the gradients only it reaches are not computed); plan with the loss this "
                "loop uses (Planner(loss=...))"
            )
        missing = {name for name in noted & tangents if _all_zero(args[places[name]])}
        results = run(args)
        if not missing:
            return results
        return [
            None if read and read <= missing else result
            for result, read in zip(results, reads, strict=True)
        ]

    backward._boxed_call = True  # type: ignore[attr-defined]
    return backward


def _all_zero(value: Any) -> bool:
    """A tensor of zeros, as autograd fills in (a meta tensor, which holds no values, is
    taken as one: a plan for a device by name runs its steps on them)."""
    if not isinstance(value, torch.Tensor):
        return False
    return value.is_meta or not bool(value.any())


def tangents_read(graph: fx.Graph) -> dict[fx.Node, frozenset[str]]:
    """The tangent placeholders each node of `graph` depends on."""
    read: dict[fx.Node, frozenset[str]] = {}
    for node in graph.nodes:
        own = frozenset([node.name]) if is_tangent(node) else frozenset()
        read[node] = own.union(*(read[i] for i in node.all_input_nodes))
    return read
