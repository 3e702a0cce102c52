"""The operator-level graph of one training step: a small, plain IR that every stage reads.

A `Graph` is a list of `Node`s in execution order (forward first, then backward, as autograd
ran them when traced). Each node produces one or more tensors (`TensorMeta`); other nodes
refer to them by `ValueRef` (producer name, output index). Placeholders are the step's inputs:
parameters, buffers, the user's inputs and the tangents (gradients of the model's outputs).
Nothing here depends on torch: a graph loads from JSON anywhere.

This is the solver's plain view of one FX joint graph (AOTAutograd's forward+backward graph,
as a `torch.compile` backend receives it): node names are the FX node names, so a decision
about a node here is a decision about the FX node of the same name.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, TypeVar

T = TypeVar("T")

ValueRef = tuple[str, int]

PLACEHOLDER = "placeholder"
FORWARD = "forward"
BACKWARD = "backward"
EFFECT = "effect"  # in-place update of a buffer (BatchNorm running stats): forward only, once

ROLE_PARAM, ROLE_BUFFER, ROLE_INPUT, ROLE_TANGENT = "param", "buffer", "input", "tangent"
ROLE_CONSTANT = "constant"  # a tensor constant inside the graph: static, like a buffer


@dataclass(frozen=True)
class TensorMeta:
    """Shape and storage facts of one produced tensor.

    `nbytes` is the size of the storage this tensor owns; 0 when it is a view that shares the
    storage of input number `alias_of` (a view frees nothing and costs nothing).
    """

    shape: tuple[int, ...]
    dtype: str
    nbytes: int
    alias_of: int | None = None
    contiguous: bool = True


def dense_bytes(meta: TensorMeta) -> int:
    """Bytes of a contiguous tensor of this shape and dtype (4 an element when unknown)."""
    count = 1
    for size in meta.shape:
        count *= size
    return count * _ITEMSIZE.get(meta.dtype, 4)


_ITEMSIZE = {"torch.float64": 8, "torch.int64": 8, "torch.float16": 2, "torch.bfloat16": 2,
             "torch.bool": 1, "torch.uint8": 1, "torch.int8": 1}  # fmt: skip


@dataclass
class Node:
    """One ATen operator call (or a placeholder) in the traced step."""

    name: str
    target: str
    phase: str
    inputs: list[ValueRef] = field(default_factory=list)
    outputs: list[TensorMeta | None] = field(default_factory=list)
    role: str | None = None  # placeholders only
    random: bool = False  # draws random numbers
    consts: str = ""  # the non-tensor arguments, for the fingerprint
    # never recomputed: a random draw (drawn again it would differ), or an operator that reads
    # a graph input the forward overwrites (recomputed, it would read the new value)
    pinned: bool = False

    @property
    def out_bytes(self) -> int:
        """Bytes of fresh storage this node allocates."""
        return sum(m.nbytes for m in self.outputs if m is not None)


@dataclass
class Graph:
    """The whole step: nodes in order plus where inputs and outputs go."""

    nodes: list[Node]
    model_outputs: list[ValueRef | None]  # flat model outputs (None: not a tensor we track)
    # gradient of each non-tangent placeholder, in placeholder order (None: it gets none)
    input_grads: list[ValueRef | None]
    # tangents of outputs the loss leaves unread whose gradients were left out of the graph
    # (explorer.unread): its backward must not be given them
    unread_tangents: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._by_name = {n.name: n for n in self.nodes}
        self._derived: dict[str, Any] = {}  # see `derived`

    def node(self, name: str) -> Node:
        return self._by_name[name]

    def derived(self, key: str, make: Callable[[Graph], T]) -> T:
        """`make(self)`, made once and kept under `key`: the graph's hashes, and tables other
        modules derive from it on every call (a graph is not changed once built). Callers
        must not change what it returns."""
        if key not in self._derived:
            self._derived[key] = make(self)
        return self._derived[key]

    def meta(self, ref: ValueRef) -> TensorMeta:
        meta = self._by_name[ref[0]].outputs[ref[1]]
        assert meta is not None, ref
        return meta

    def placeholders(self, role: str) -> list[Node]:
        return [n for n in self.nodes if n.phase == PLACEHOLDER and n.role == role]

    def primal_names(self) -> list[str]:
        """The graph's inputs other than tangents and constants, in the order of
        `input_grads`."""
        roles = (ROLE_PARAM, ROLE_BUFFER, ROLE_INPUT)
        return [n.name for n in self.nodes if n.phase == PLACEHOLDER and n.role in roles]

    def grad_bytes(self, ref: ValueRef) -> int:
        """Bytes of a gradient once stored in `.grad`: a view (a transposed mm, 0 bytes of
        its own) becomes a dense tensor of its shape."""
        meta = self.meta(ref)
        return meta.nbytes or dense_bytes(meta)

    def grad_copy_bytes(self) -> int:
        """Autograd copies a gradient whose layout differs from its parameter's (a convolution
        weight's gradient in channels-last order, the weight contiguous) when it stores it in
        `.grad`. The backward returns all its gradients together; autograd then stores them
        one at a time, and a copied one's original is let go once its copy is stored, so at
        the end of the step the largest such copy is alive for a moment beside them (not all
        of them: two convolutions on channels-last input measured one copy, 442,368 bytes,
        above the gradients), but for gradients that are views of one storage.

        Layouts are compared by contiguity alone: a gradient and a parameter both laid out
        otherwise (a channels-last model's weights) are taken to agree. Profiling measures
        what autograd holds after the backward (explorer.eagerpeaks), copies included, so a
        measured profile counts a copy this misses."""
        copied = [
            grad
            for name, grad in zip(self.primal_names(), self.input_grads, strict=False)
            if grad is not None and self.meta(grad).contiguous != self.meta((name, 0)).contiguous
        ]
        if not copied:
            return 0
        # gradients that share a storage (views of one result) free it only after the last
        # is copied: their copies may all be alive at once, on top of the largest other one
        owner = storage_owners(self)
        sharing = Counter(owner.get(r, r) for r in self.input_grads if r is not None)
        shared = [r for r in copied if sharing[owner.get(r, r)] > 1]
        alone = [self.grad_bytes(r) for r in copied if sharing[owner.get(r, r)] == 1]
        return sum(self.grad_bytes(r) for r in shared) + max(alone, default=0)

    def static_bytes(self) -> int:
        """Parameters, buffers and inputs: alive before, during and after the step."""
        return sum(
            n.out_bytes for n in self.nodes if n.phase == PLACEHOLDER and n.role != ROLE_TANGENT
        )

    def fingerprint(self) -> str:
        """A hash of everything that decides what the step computes and how big it is."""
        return self.derived("fingerprint", lambda g: _digest(g.to_dict()))

    def structure(self) -> str:
        """A hash of the operators and their wiring, without shapes or sizes: two graphs with
        the same structure (the same model at another batch size or sequence length) have the
        same node names, so a schedule made for one applies to the other."""
        return self.derived("structure", Graph._structure_digest)

    def _structure_digest(self) -> str:
        return _digest(
            {
                "nodes": [
                    [n.name, n.target, n.phase, n.role, n.random, n.inputs, len(n.outputs)]
                    for n in self.nodes
                ],
                "model_outputs": self.model_outputs,
                "input_grads": self.input_grads,
            }
        )

    def layout(self) -> str:
        """A hash of the operators and their wiring by position, without names or sizes: the
        graph Dynamo captures for any size of a dimension (explorer.symsizes) has the operators
        of the graph captured at one size, in the same order, but its own node names (its
        symbolic sizes are graph inputs too, which renumbers them), so a schedule carries over
        between two graphs of one layout by position."""
        return self.derived("layout", Graph._layout_digest)

    def _layout_digest(self) -> str:
        position = {n.name: k for k, n in enumerate(self.nodes)}
        at = lambda ref: None if ref is None else [position[ref[0]], ref[1]]  # noqa: E731
        return _digest(
            {
                "nodes": [
                    [n.target, n.phase, n.role, n.random, [at(r) for r in n.inputs], len(n.outputs)]
                    for n in self.nodes
                ],
                "model_outputs": [at(r) for r in self.model_outputs],
                "input_grads": [at(r) for r in self.input_grads],
            }
        )

    def to_dict(self) -> dict:
        return {
            "nodes": [asdict(n) for n in self.nodes],
            "model_outputs": self.model_outputs,
            "input_grads": self.input_grads,
            **({"unread_tangents": self.unread_tangents} if self.unread_tangents else {}),
        }

    @classmethod
    def from_dict(cls, data: dict) -> Graph:
        nodes = []
        for raw in data["nodes"]:
            outputs = [
                None
                if m is None
                else TensorMeta(
                    tuple(m["shape"]), m["dtype"], m["nbytes"], m["alias_of"], m["contiguous"]
                )
                for m in raw["outputs"]
            ]
            inputs = [tuple(r) for r in raw["inputs"]]
            nodes.append(Node(**{**raw, "outputs": outputs, "inputs": inputs}))
        refs = lambda xs: [None if r is None else tuple(r) for r in xs]  # noqa: E731
        unread = [str(name) for name in data.get("unread_tangents", [])]
        return cls(nodes, refs(data["model_outputs"]), refs(data["input_grads"]), unread)


def storage_owners(graph: Graph) -> dict[ValueRef, ValueRef]:
    """Map every view to the value that owns its storage."""
    owner: dict[ValueRef, ValueRef] = {}
    for node in graph.nodes:
        for i, meta in enumerate(node.outputs):
            if meta is not None and meta.alias_of is not None:
                base = node.inputs[meta.alias_of]
                owner[(node.name, i)] = owner.get(base, base)
    return owner


def _digest(data: object) -> str:
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]
