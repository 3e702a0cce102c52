"""Sizes that are symbols: a captured graph that serves every size of an input dimension.

When an input's size changes from one call to the next (a dataloader's smaller last batch, a
text batch padded to its longest sequence), Dynamo captures the model again with that dimension
symbolic (its "automatic dynamic" shapes), and the new graph serves every later size. Its
tensors' sizes are then expressions in those symbols (`2*s21*128`), and the runtime plans such a
graph once for all sizes: its IR (explorer.fxgraph) holds the sizes of the call that captured it
(each symbol's *hint*), and `symbolic_sizes` keeps each value's shape and bytes as expressions,
which `SizedGraph` evaluates for the sizes a later call brings (`binding`), so that the same
memory accounting (explorer.simulate) checks the budget at every size a step runs.

Reading a symbol's hint never adds a guard: a guard on a size (`s21 == 37`) would tie the graph
to that one size again.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence

import sympy
import torch
from torch import fx

from explorer.graph import Graph, TensorMeta, ValueRef

SYMBOLIC = (torch.SymInt, torch.SymBool, torch.SymFloat)

Sizes = dict[ValueRef, tuple[tuple[sympy.Expr, ...], sympy.Expr]]  # shape, bytes
Binding = dict[sympy.Symbol, int]


def is_symbolic(node: fx.Node) -> bool:
    """True for an FX node whose value is a symbolic number (a size, or arithmetic on sizes)
    rather than a tensor: it costs no memory, and the IR leaves it out."""
    return isinstance(node.meta.get("val"), SYMBOLIC)


def hint(value: int | torch.SymInt) -> int:
    """The value a size had in the call that captured the graph, without guarding on it."""
    if not isinstance(value, torch.SymInt):
        return int(value)
    node = value.node
    known = node.hint
    if known is None:
        known = node.shape_env.size_hint(node.expr)
    return int(known)


def contiguous_at_hints(value: torch.Tensor) -> bool:
    """Whether the tensor is laid out contiguously; with symbolic sizes, as it was in the call
    that captured the graph (asking the tensor would guard on its sizes)."""
    if not any(isinstance(s, torch.SymInt) for s in (*value.shape, *value.stride())):
        return value.is_contiguous()
    shape, stride = [hint(s) for s in value.shape], [hint(s) for s in value.stride()]
    if 0 in shape:
        return True
    expected = 1
    for size, step in zip(reversed(shape), reversed(stride), strict=True):
        if size != 1 and step != expected:
            return False
        expected *= size
    return True


def expression(value: int | torch.SymInt) -> sympy.Expr:
    """A size as a sympy expression in the graph's symbols (an integer when it is fixed)."""
    if isinstance(value, torch.SymInt):
        return value.node.expr
    return sympy.Integer(int(value))


def symbolic_sizes(values: dict[ValueRef, tuple[Sequence, object]]) -> Sizes:
    """The shape and bytes of each value that depends on a symbol, as expressions. `values`:
    each value's traced shape and bytes (ints or SymInts), as explorer.fxgraph computes them."""
    sizes: Sizes = {}
    for ref, (shape, nbytes) in values.items():
        exprs = tuple(expression(s) for s in shape)
        total = expression(nbytes)
        if total.free_symbols or any(e.free_symbols for e in exprs):
            sizes[ref] = (exprs, total)
    return sizes


class SizedGraph:
    """A graph captured for any size, to be evaluated at many sizes: its distinct expressions
    are found once, and at each binding evaluated once each; the nodes without a symbolic
    value are shared with the graph."""

    def __init__(self, graph: Graph, sizes: Sizes) -> None:
        self.graph = graph
        self._exprs: list[sympy.Expr] = []
        position: dict[sympy.Expr, int] = {}

        def slot(expr: sympy.Expr) -> int:
            if expr not in position:
                position[expr] = len(self._exprs)
                self._exprs.append(expr)
            return position[expr]

        # per node with a symbolic value: its index, and per output the positions of its
        # shape's and bytes' expressions (None: an output that keeps its meta)
        self._nodes: list[tuple[int, list[tuple[tuple[int, ...], int] | None]]] = []
        for n, node in enumerate(graph.nodes):
            found = [sizes.get((node.name, k)) for k in range(len(node.outputs))]
            if any(f is not None for f in found):
                slots = [
                    None if f is None else (tuple(slot(e) for e in f[0]), slot(f[1])) for f in found
                ]
                self._nodes.append((n, slots))

    def at(self, binding: Binding) -> Graph:
        """The graph with the shape and bytes of every symbolic value evaluated for
        `binding`; a ValueError where a symbol has no value there."""
        given = {symbol: sympy.Integer(size) for symbol, size in binding.items()}
        values = []
        for expr in self._exprs:
            value = expr.xreplace(given)
            if value.free_symbols:
                raise ValueError(f"no size given for {sorted(map(str, value.free_symbols))}")
            values.append(int(value))
        nodes = list(self.graph.nodes)
        for n, slots in self._nodes:
            node = nodes[n]
            outputs = list(node.outputs)
            for k, slot in enumerate(slots):
                meta = outputs[k]
                if slot is not None and meta is not None:
                    shape = tuple(values[e] for e in slot[0])
                    outputs[k] = TensorMeta(
                        shape, meta.dtype, values[slot[1]], meta.alias_of, meta.contiguous
                    )
            nodes[n] = copy.copy(node)
            nodes[n].outputs = outputs
        return Graph(nodes, list(self.graph.model_outputs), list(self.graph.input_grads))


def binding_sources(placeholders: Sequence[fx.Node]) -> list[tuple[sympy.Symbol, int, int | None]]:
    """Where each symbol of a compiled graph is found among its run's arguments: (symbol,
    argument, dimension), the dimension None for a symbolic number passed as an argument.
    Each symbol once, from its first place."""
    found: dict[sympy.Symbol, tuple[int, int | None]] = {}
    for k, node in enumerate(placeholders):
        value = node.meta.get("val")
        if isinstance(value, torch.SymInt) and isinstance(value.node.expr, sympy.Symbol):
            found.setdefault(value.node.expr, (k, None))
        elif isinstance(value, torch.Tensor):
            for d, size in enumerate(value.shape):
                if isinstance(size, torch.SymInt) and isinstance(size.node.expr, sympy.Symbol):
                    found.setdefault(size.node.expr, (k, d))
    return [(symbol, k, d) for symbol, (k, d) in found.items()]


def sizes_in(args: Sequence, sources: list[tuple[sympy.Symbol, int, int | None]]) -> tuple:
    """The sizes a run's arguments give the symbols (`binding_sources`), in their order."""
    return tuple(int(args[k]) if d is None else int(args[k].shape[d]) for _, k, d in sources)
