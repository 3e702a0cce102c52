"""The solver's plain view of one AOTAutograd joint graph (torch only, no solver imports).

A `torch.compile` backend built on AOTAutograd receives, for every graph Dynamo captures, one
*joint* FX graph: the functionalized forward and the backward that autograd would run from the
gradients of the outputs ("tangents"). `describe` turns that FX graph into the `Graph` IR that
profiling, solving and simulation read. Node names are kept, so every decision about an IR node
is a decision about the FX node of the same name; `value_nodes` maps the IR's values back.

Placeholders: `primals_*` (parameters, buffers and the user's tensors, in Dynamo's order) and
`tangents_*`. The joint graph's outputs are the forward outputs followed by one gradient per
primal (None where a primal gets none). Train-mode BatchNorm is
`_native_batch_norm_legit_functional`, whose new running statistics are written back by `copy_`
nodes that the joint graph tags `must_be_in_forward`: they become EFFECT nodes, which run once in
the forward and are never recomputed. An operator that reads a graph input which such a copy_
overwrites (spectral_norm's power iteration reads the `u` it updates), or a view of it, is pinned:
recomputed in the backward it would read the new value. So is one reading a graph input that
`shallow_copy_data_` gives new memory (`p.data = ...`), whose old values would be gone.
BatchNorm's own outputs do not depend on the running statistics it reads in training, so it
stays recomputable.

Bytes are counted on the step's device only (the device of its first tensor input not on the
CPU, else the CPU): a CPU tensor in a CUDA step, such as a CUDA generator's saved state, takes
none of the device's memory, and the CUDA meter does not see it.
"""

from __future__ import annotations

import operator

import torch
from torch import fx
from torch.utils._pytree import tree_flatten

from explorer.graph import (
    BACKWARD,
    EFFECT,
    FORWARD,
    PLACEHOLDER,
    ROLE_BUFFER,
    ROLE_CONSTANT,
    ROLE_INPUT,
    ROLE_PARAM,
    ROLE_TANGENT,
    Graph,
    Node,
    TensorMeta,
    ValueRef,
)
from explorer.metadevice import stood_for
from explorer.symsizes import Sizes, contiguous_at_hints, hint, is_symbolic, symbolic_sizes

# Ops whose schema says "fresh tensor" but which return a view of their input's storage.
_HIDDEN_VIEWS = {"aten._unsafe_view.default", "aten._reshape_alias.default"}
_PHASE_BY_TAG = {"is_forward": FORWARD, "is_backward": BACKWARD, "must_be_in_forward": EFFECT}


def is_tangent(node: fx.Node) -> bool:
    return node.op == "placeholder" and node.name.startswith("tangents")


def is_getitem(node: fx.Node) -> bool:
    return node.op == "call_function" and node.target is operator.getitem


def describe(
    joint: fx.Graph, num_fwd_outputs: int, static_indices: list[int] | None = None
) -> Graph:
    """The IR of a joint graph. `static_indices`: positions of the primals that are parameters
    or buffers (AOTAutograd's `static_lifetime_input_indices`); the others are user inputs."""
    return describe_with_sizes(joint, num_fwd_outputs, static_indices)[0]


def describe_with_sizes(
    joint: fx.Graph, num_fwd_outputs: int, static_indices: list[int] | None = None
) -> tuple[Graph, Sizes]:
    """`describe`, and the sizes of the values that depend on a symbol (a graph Dynamo
    captured for any size of a dimension: explorer.symsizes), whose metas in the IR hold the
    sizes of the call that captured it. Symbolic numbers (sizes and arithmetic on them) are
    not values of the IR: they cost no memory and are never saved or recomputed as tensors."""
    static = set(static_indices or [])
    device = _step_device(joint)
    refs: dict[fx.Node, ValueRef] = {}
    nodes: list[Node] = []
    primals: list[Node] = []
    tensor_primal: list[bool] = []  # per primal: a tensor (not a symbolic number)
    traced: dict[ValueRef, tuple] = {}  # each value's traced shape and bytes

    def outputs_of(fxn: fx.Node) -> list[TensorMeta | None]:
        found = _outputs(fxn, device)
        for k, out in enumerate(found):
            if out is not None:
                traced[(fxn.name, k)] = out[1:]
        return [None if out is None else out[0] for out in found]

    outs: list = []
    for fxn in joint.nodes:
        if is_symbolic(fxn):
            if fxn.op == "placeholder":
                tensor_primal.append(False)
            continue
        if fxn.op == "placeholder":
            node = Node(fxn.name, PLACEHOLDER, PLACEHOLDER, [], outputs_of(fxn), ROLE_TANGENT)
            if not is_tangent(fxn):
                node.role = ROLE_PARAM if len(tensor_primal) in static else ROLE_INPUT
                primals.append(node)
                tensor_primal.append(True)
            nodes.append(node)
            refs[fxn] = (fxn.name, 0)
        elif fxn.op == "get_attr":
            metas = outputs_of(fxn)
            nodes.append(Node(fxn.name, PLACEHOLDER, PLACEHOLDER, [], metas, ROLE_CONSTANT))
            refs[fxn] = (fxn.name, 0)
        elif is_getitem(fxn):
            src, idx = fxn.args
            refs[fxn] = (src.name, idx)
        elif fxn.op == "call_function":
            tags = getattr(fxn.target, "tags", ())
            nodes.append(
                Node(
                    name=fxn.name,
                    target=str(fxn.target),
                    phase=_PHASE_BY_TAG.get(fxn.meta.get("partitioner_tag"), BACKWARD),
                    inputs=[refs[a] for a in tensor_args(fxn)],
                    outputs=outputs_of(fxn),
                    random=torch.Tag.nondeterministic_seeded in tags,
                    consts=_consts(fxn),
                )
            )
            refs[fxn] = (fxn.name, 0)
        elif fxn.op == "output":
            outs = _output_list(fxn)
    _untagged_forward(nodes, [x for x in outs[:num_fwd_outputs] if isinstance(x, fx.Node)])

    # None: not a tensor we track (a symbolic size among the outputs is not a tensor)
    def as_ref(x: object) -> ValueRef | None:
        return refs[x] if isinstance(x, fx.Node) and not is_symbolic(x) else None

    grads = outs[num_fwd_outputs:]
    input_grads = [as_ref(x) for x, tensor in zip(grads, tensor_primal, strict=False) if tensor]
    for node, grad in zip(primals, input_grads, strict=False):
        if node.role == ROLE_PARAM and grad is None:
            node.role = ROLE_BUFFER  # static and gets no gradient: a buffer or frozen weight
    _pin(nodes)
    graph = Graph(nodes, [as_ref(x) for x in outs[:num_fwd_outputs]], input_grads)
    return graph, symbolic_sizes(traced)


def _untagged_forward(nodes: list[Node], forward_outputs: list[fx.Node]) -> None:
    """Operators AOTAutograd left without a partitioner tag that the forward's outputs read
    (directly or through other untagged ones) are the forward's: transformers' Switch
    Transformers returns a view of its router's jittered input that AOTAutograd adds after
    tagging, and counted as the backward's it was never computed in the forward (capture
    failed inside the partitioner, `KeyError: view_8`)."""
    by_name = {node.name: node for node in nodes}
    stack = list(forward_outputs)
    seen: set[fx.Node] = set()
    while stack:
        fxn = stack.pop()
        if fxn in seen or fxn.op != "call_function":
            continue
        seen.add(fxn)
        if is_getitem(fxn):
            stack.append(fxn.args[0])
        elif "partitioner_tag" not in fxn.meta and fxn.name in by_name:
            by_name[fxn.name].phase = FORWARD
            stack.extend(fxn.all_input_nodes)


def _pin(nodes: list[Node]) -> None:
    """Mark the forward operators that must never be recomputed (see module docstring). A
    view of an overwritten input sees what is written into it, so an operator reading the
    view is pinned too: `x + W.t()[0]` before the forward updates `W` in place (its backward
    saves nothing of W, so eager autograd has no version to check), recomputed, read the
    new W, and its gradients were not the model's."""
    overwritten = {
        node.inputs[0][0] for node in nodes if node.phase == EFFECT and node.target in _COPIES
    }
    for node in nodes:
        if node.phase != FORWARD:
            continue
        reads_overwritten = any(ref[0] in overwritten for ref in node.inputs)
        node.pinned = node.random or (reads_overwritten and node.target not in _STATS_READERS)
        views = [meta.alias_of for meta in node.outputs if meta is not None]
        if any(k is not None and node.inputs[k][0] in overwritten for k in views):
            overwritten.add(node.name)


# writes into a graph input: `copy_` of its new value (a buffer updated in place), and
# `shallow_copy_data_`, which gives the input the new value's memory (`p.data = ...`, as
# MoCo moves its key encoder)
_COPIES = {"aten.copy_.default", "aten.shallow_copy_data_.default"}
# functional writes into a view, whose kernels copy the view's whole storage (ATen's
# clone_preserve_strides) and return the view of that copy: `aten.copy` (functionalization's
# form of `x[:, 1:] = y`) and the scatters of in-place writes into a slice, a selected row, a
# diagonal or a strided view (`x[..., :k] *= 2` on a slice)
_WHOLE_STORAGE_COPIES = {
    "aten.copy.default",
    "aten.slice_scatter.default",
    "aten.select_scatter.default",
    "aten.diagonal_scatter.default",
    "aten.as_strided_scatter.default",
}
BATCH_NORM = "aten._native_batch_norm_legit_functional.default"  # training-mode BatchNorm
# training-mode BatchNorm reads the running statistics only to return their update
_STATS_READERS = {BATCH_NORM}


def _output_list(fxn: fx.Node) -> list:
    """The output node's values, flat, None kept (a primal without a gradient)."""
    (values,) = fxn.args
    return list(values) if isinstance(values, (tuple, list)) else [values]


def value_nodes(joint: fx.Graph) -> dict[ValueRef, fx.Node]:
    """The FX node that holds each IR value: a getitem for an output of a multi-output op."""
    found: dict[ValueRef, fx.Node] = {}
    for fxn in joint.nodes:
        if is_getitem(fxn):
            src, idx = fxn.args
            found[(src.name, idx)] = fxn
        elif fxn.op in ("placeholder", "get_attr", "call_function"):
            found.setdefault((fxn.name, 0), fxn)
    return found


def tensor_args(node: fx.Node) -> list[fx.Node]:
    """The FX nodes of tensors among a node's arguments, in argument order (nested lists
    included): not those of symbolic sizes (explorer.symsizes)."""
    flat, _ = tree_flatten((node.args, node.kwargs))
    return [a for a in flat if isinstance(a, fx.Node) and not is_symbolic(a)]


def _storage_bytes(t: torch.Tensor) -> int | torch.SymInt:
    """The bytes from the tensor's first element to its last (an expression in the graph's
    symbols where its sizes are symbolic: a symbolic size is at least 2, so only a fixed size
    can make it empty, and the hint says so without a guard)."""
    if hint(t.numel()) == 0:
        return 0
    span = 1 + sum((size - 1) * stride for size, stride in zip(t.shape, t.stride(), strict=True))
    return span * t.element_size()


def _fresh_bytes(node: fx.Node, value: torch.Tensor) -> int | torch.SymInt:
    """Bytes the kernel allocates for a fresh output. A functional write into a view
    (`_WHOLE_STORAGE_COPIES`) returns that view of a copy of the view's whole storage, where
    the traced value spans the view only: PyTorch's fake kernels of the scatters allocate no
    more (BART's shifted decoder inputs: 128 bytes made, 120 traced; transformers' Funnel
    scales a slice of a shifted attention score in place: 16,384 bytes made, 16,320 traced;
    a slice of a large buffer: the buffer). An expanded view is copied alone, contiguous, as
    its traced value is. A graph's input (not a tangent) that views part of a storage holds
    all of it: Longformer's second graph reads its attention mask as a (2, 16) view, 1,088
    bytes of span, of the 2,048-byte storage its first graph made (counted by that reader,
    the step was 960 bytes over the plan from there on)."""
    if node.op == "placeholder" and not is_tangent(node):
        return torch.sym_max(_storage_bytes(value), value.untyped_storage().nbytes())
    destination = _argument_value(node, 0) if str(node.target) in _WHOLE_STORAGE_COPIES else None
    if isinstance(destination, torch.Tensor) and hint(value.numel()):
        return torch.sym_max(_storage_bytes(value), destination.untyped_storage().nbytes())
    return _storage_bytes(value)


def _step_device(joint: fx.Graph) -> str:
    """The device type whose memory the step's plan counts (see module docstring)."""
    for fxn in joint.find_nodes(op="placeholder"):
        val = fxn.meta.get("val")
        if isinstance(val, torch.Tensor) and val.device.type != "cpu":
            return val.device.type
    return "cpu"


def _outputs(node: fx.Node, device: str) -> list[tuple[TensorMeta, tuple, object] | None]:
    """Each output's meta (at the hints, for a symbolic size), with its traced shape and bytes
    (SymInts where symbolic); None for an output that is not a tensor."""
    val = node.meta.get("val")
    vals = list(val) if isinstance(val, (tuple, list)) else [val]
    aliases = output_aliases(node)
    found: list[tuple[TensorMeta, tuple, object] | None] = []
    for i, v in enumerate(vals):
        if not isinstance(v, torch.Tensor):
            found.append(None)
            continue
        alias = aliases[i] if i < len(aliases) else None
        elsewhere = alias is not None or v.device.type != device
        nbytes = 0 if elsewhere else _fresh_bytes(node, v)
        dtype = _kernel_dtype(node, i, v)
        nbytes = nbytes * dtype.itemsize // v.element_size()
        shape = tuple(hint(s) for s in v.shape)
        meta = TensorMeta(shape, str(dtype), hint(nbytes), alias, contiguous_at_hints(v))
        found.append((meta, tuple(v.shape), nbytes))
    return found


# normalizations whose CPU kernel keeps the saved statistics (outputs 1 and 2) in float32
# when the input is bf16 or fp16 and a parameter is float32, as under autocast: target -> the
# positions of those parameters (weight and bias; BatchNorm's running statistics too)
_MIXED_STATS = {
    BATCH_NORM: (1, 2, 3, 4),
    "aten.native_layer_norm.default": (2, 3),
    "aten.native_group_norm.default": (1, 2),
    "aten._native_batch_norm_legit.no_stats": (1, 2),  # BatchNorm without running statistics
}


# backward kernels that allocate a gradient like one of their arguments (empty_like), where the
# fake kernel promotes: target -> {output: the argument whose dtype it has}
_LIKE_ARGUMENT = {
    # the input's gradient like the input, the weight's and bias's like the weight
    "aten.native_group_norm_backward.default": {0: 1, 1: 4, 2: 4},
}


def _kernel_dtype(node: fx.Node, index: int, value: torch.Tensor) -> torch.dtype:
    """The dtype the CPU kernel gives an output, where PyTorch's fake kernel says otherwise.

    BatchNorm, LayerNorm and GroupNorm on bf16 or fp16 input with a float32 parameter (as
    under autocast) save their mean and inverse deviation in float32, which the fake kernel
    gives the input's dtype (timm's mobilenetv3 under bf16 autocast: 13 kB over the
    prediction, 64 bytes per BatchNorm; a transformers LM head's LayerNorm after a bf16 GELU:
    128 bytes). GroupNorm's backward gives the input's gradient the input's dtype, which the
    fake kernel promotes to float32 with the statistics (twice the bytes of a bf16 input's)."""
    if value.device.type != "cpu":
        return value.dtype
    target = str(node.target)
    like = _LIKE_ARGUMENT.get(target, {}).get(index)
    if like is not None:
        source = _argument_value(node, like)
        return source.dtype if isinstance(source, torch.Tensor) else value.dtype
    params = _MIXED_STATS.get(target)
    if params is None or index not in (1, 2):
        return value.dtype
    source, *affine = (_argument_value(node, i) for i in (0, *params))
    mixed = (
        isinstance(source, torch.Tensor)
        and source.dtype in (torch.bfloat16, torch.float16)
        and any(isinstance(p, torch.Tensor) and p.dtype == torch.float32 for p in affine)
    )
    return torch.float32 if mixed else value.dtype


def _argument_value(node: fx.Node, position: int) -> object:
    """The traced value of the node's positional argument (None: absent or not a node)."""
    if position >= len(node.args) or not isinstance(node.args[position], fx.Node):
        return None
    return node.args[position].meta.get("val")


def output_aliases(node: fx.Node) -> list[int | None]:
    """For each output of a call, the position among its tensor arguments of the input whose
    storage it shares (None: a storage of its own)."""
    val = node.meta.get("val")
    if isinstance(val, list) and _returns_view_list(node):  # split, unbind, chunk: all views
        return [0] * len(val)
    return _alias_positions(node)


def _returns_view_list(node: fx.Node) -> bool:
    """True for ops whose schema returns a list of views of their first argument."""
    schema = getattr(node.target, "_schema", None)
    return schema is not None and len(schema.returns) == 1 and "Tensor(a)[]" in str(schema)


def _alias_positions(node: fx.Node) -> list[int | None]:
    """For each output, the position (among tensor args) of the input whose storage it shares."""
    target = node.target
    schema = getattr(target, "_schema", None)
    if schema is None or node.op != "call_function":
        return []
    tensor_inputs = tensor_args(node)
    if str(target) in _HIDDEN_VIEWS:
        return [0]
    arg_sets = []
    for arg in schema.arguments:
        info = arg.alias_info
        arg_sets.append(set(info.before_set) if info is not None else set())
    positions: list[int | None] = []
    for ret in schema.returns:
        info = ret.alias_info
        if info is None:
            positions.append(None)
            continue
        match = next((k for k, s in enumerate(arg_sets) if s & set(info.before_set)), None)
        if match is None:
            positions.append(None)
            continue
        # map schema argument index to the index among this node's tensor inputs
        arg_value = (
            node.args[match]
            if match < len(node.args)
            else node.kwargs.get(schema.arguments[match].name)
        )
        positions.append(tensor_inputs.index(arg_value) if arg_value in tensor_inputs else None)
    return positions


def _consts(node: fx.Node) -> str:
    flat, _ = tree_flatten((node.args, node.kwargs))
    return repr(["%" if isinstance(a, fx.Node) else stood_for(a) for a in flat])
