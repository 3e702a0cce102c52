"""Run instruction lists over slots: the interpreter shared by profiling and the runtime.

Each IR node is called as its traced ATen operator with the traced constant arguments and
the tensors from its input slots. Results go to output slots; slots listed in `frees` are
cleared right after, which is what releases memory (nothing else holds the tensors).
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
    leaves, spec = tree_flatten((fxn.args, fxn.kwargs))
    holes = [i for i, leaf in enumerate(leaves) if isinstance(leaf, fx.Node)]
    target = fxn.target

    def call(slots: Slots, in_slots: list[int]) -> object:
        filled = list(leaves)
        for hole, slot in zip(holes, in_slots, strict=True):
            filled[hole] = slots[slot]
        args, kwargs = tree_unflatten(filled, spec)
        return target(*args, **kwargs)

    return call


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


def run(instrs: list[Instr], slots: Slots, ops: dict[str, OpFn]) -> None:
    """Execute instructions in order, clearing slots as the program says."""
    for instr in instrs:
        store(slots, instr, ops[instr.node](slots, instr.in_slots))
        for slot in instr.frees:
            slots[slot] = None
