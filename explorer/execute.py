"""Call a graph's operators one at a time over slots, as profiling times them.

Each IR node is called as its traced ATen operator with the traced constant arguments and
the tensors from its input slots (`op_table`); `store` puts its results into its output slots.
The runtime itself runs FX's generated code (explorer.backend), not this.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import fx
from torch.utils._pytree import tree_flatten, tree_unflatten

from explorer.program import Instr

Slots = list[torch.Tensor | None]
OpFn = Callable[[Slots, list[int]], object]


def _make_call(fxn: fx.Node) -> OpFn:
    """A callable that fills the traced arguments with slot values and runs the operator."""
    target = fxn.target
    if _is_flat(fxn):  # nearly every ATen call: tensors only at top-level positions
        template = list(fxn.args)
        holes = [i for i, arg in enumerate(template) if isinstance(arg, fx.Node)]
        kwargs = dict(fxn.kwargs)

        def call_flat(slots: Slots, in_slots: list[int]) -> object:
            filled = template.copy()
            for hole, slot in zip(holes, in_slots, strict=True):
                filled[hole] = slots[slot]
            return target(*filled, **kwargs)

        return call_flat
    leaves, spec = tree_flatten((fxn.args, fxn.kwargs))
    node_leaves = [i for i, leaf in enumerate(leaves) if isinstance(leaf, fx.Node)]

    def call_nested(slots: Slots, in_slots: list[int]) -> object:  # e.g. cat([a, b])
        filled = list(leaves)
        for hole, slot in zip(node_leaves, in_slots, strict=True):
            filled[hole] = slots[slot]
        args, kw = tree_unflatten(filled, spec)
        return target(*args, **kw)

    return call_nested


def _is_flat(fxn: fx.Node) -> bool:
    nested = [a for a in fxn.args if isinstance(a, (list, tuple, dict))]
    nested += list(fxn.kwargs.values())
    leaves, _ = tree_flatten(nested)
    return not any(isinstance(leaf, fx.Node) for leaf in leaves)


def op_table(fx_graph: fx.Graph) -> dict[str, OpFn]:
    """Callables for every operator node of a traced graph, by node name."""
    return {
        n.name: _make_call(n)
        for n in fx_graph.nodes
        if n.op == "call_function" and getattr(n.target, "__name__", "") != "getitem"
    }


def store(slots: Slots, instr: Instr, result: object) -> None:
    """Put an operator's result(s) into its output slots."""
    if len(instr.out_slots) == 1 and not isinstance(result, (tuple, list)):
        if instr.out_slots[0] is not None:
            slots[instr.out_slots[0]] = result  # type: ignore[assignment]
        return
    values = result if isinstance(result, (tuple, list)) else (result,)
    for slot, value in zip(instr.out_slots, values, strict=False):
        if slot is not None:
            slots[slot] = value  # type: ignore[assignment]
