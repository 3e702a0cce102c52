"""Trace one training step of any nn.Module into an operator-level graph.

AOTAutograd does the tracing: it runs the model's forward on fake tensors, functionalizes it
and records the backward that autograd would run from the gradients of the outputs (the
"tangents"). We stop it right after it has built that joint graph and keep the graph, so no
real computation happens here. Train-mode BatchNorm comes out as
`_native_batch_norm_legit_functional`, whose new running statistics are separate outputs
copied into the buffers by `copy_` nodes: a recomputation never touches the buffers again.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import fx, nn
from torch._functorch.aot_autograd import aot_function
from torch.utils._pytree import TreeSpec, tree_flatten

from explorer.errors import UserError
from explorer.graph import (
    BACKWARD,
    EFFECT,
    FORWARD,
    PLACEHOLDER,
    ROLE_BUFFER,
    ROLE_INPUT,
    ROLE_PARAM,
    ROLE_TANGENT,
    Graph,
    Node,
    TensorMeta,
    ValueRef,
)

# Ops whose schema says "fresh tensor" but which return a view of their input's storage.
_HIDDEN_VIEWS = {"aten._unsafe_view.default", "aten._reshape_alias.default"}
_PHASE_BY_TAG = {"is_forward": FORWARD, "is_backward": BACKWARD, "must_be_in_forward": EFFECT}


@dataclass
class Capture:
    """A traced step: the IR for planning and the FX graph for running it."""

    graph: Graph
    fx_graph: fx.Graph
    out_spec: TreeSpec
    input_shapes: list[tuple[int, ...]]
    input_dtypes: list[str]


class _JointCaptured(Exception):
    """Raised from inside AOTAutograd to hand the joint graph back without compiling it."""


def _storage_bytes(t: torch.Tensor) -> int:
    if t.numel() == 0:
        return 0
    span = 1 + sum((size - 1) * stride for size, stride in zip(t.shape, t.stride(), strict=True))
    return span * t.element_size()


def _unique_state(model: nn.Module) -> tuple[list[str], list[torch.Tensor], dict[str, int]]:
    """Parameters then buffers, each tensor once (tied weights share one slot)."""
    names: list[str] = []
    tensors: list[torch.Tensor] = []
    slot_of_id: dict[int, int] = {}
    slot_by_name: dict[str, int] = {}
    named = list(model.named_parameters(remove_duplicate=False)) + list(
        model.named_buffers(remove_duplicate=False)
    )
    for name, tensor in named:
        if id(tensor) not in slot_of_id:
            slot_of_id[id(tensor)] = len(tensors)
            names.append(name)
            tensors.append(tensor)
        slot_by_name[name] = slot_of_id[id(tensor)]
    return names, tensors, slot_by_name


class _ModuleStack:
    """Remembers which submodule is running, so a tracing failure can name it."""

    def __init__(self, model: nn.Module) -> None:
        self.stack: list[str] = []
        self.failed_in: str | None = None
        self._handles = []
        for name, module in model.named_modules():
            self._handles.append(module.register_forward_pre_hook(self._enter(name or "<root>")))
            self._handles.append(module.register_forward_hook(self._leave))

    def _enter(self, name: str):
        def hook(_module, _args):
            self.stack.append(name)

        return hook

    def _leave(self, _module, _args, _out) -> None:
        if self.stack:
            self.stack.pop()

    def close(self) -> None:
        for handle in self._handles:
            handle.remove()


def capture(model: nn.Module, example_inputs: tuple[torch.Tensor, ...]) -> Capture:
    """Trace forward+backward of `model` on inputs shaped like `example_inputs`."""
    names, state, slot_by_name = _unique_state(model)
    n_params = sum(1 for _ in model.parameters())
    out_spec: list[TreeSpec] = []

    def step(*flat: torch.Tensor) -> list[torch.Tensor]:
        values = {name: flat[slot] for name, slot in slot_by_name.items()}
        out = torch.func.functional_call(model, values, tuple(flat[len(state) :]))
        leaves, spec = tree_flatten(out)
        out_spec[:] = [spec]
        if not all(isinstance(x, torch.Tensor) for x in leaves):
            raise UserError("the model returned something that is not a tensor; return tensors")
        return leaves

    def grab(joint: fx.GraphModule, _inputs: Any, num_fwd_outputs: int, **_: Any) -> None:
        raise _JointCaptured(joint, num_fwd_outputs)

    traced = aot_function(
        step,
        fw_compiler=lambda gm, _: gm,
        bw_compiler=lambda gm, _: gm,
        partition_fn=grab,
        keep_inference_input_mutations=True,
    )
    modules = _ModuleStack(model)
    try:
        traced(*state, *example_inputs)
    except _JointCaptured as done:
        joint, num_fwd_outputs = done.args
    except UserError:
        raise
    except Exception as exc:  # a construct AOTAutograd cannot trace
        where = modules.stack[-1] if modules.stack else "<root>"
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UserError(f"cannot trace module '{where}': {type(exc).__name__}: {first}") from exc
    else:
        raise UserError("the model's outputs do not depend on its parameters: nothing to train")
    finally:
        modules.close()

    graph = _to_ir(joint.graph, names, n_params, num_fwd_outputs)
    return Capture(
        graph=graph,
        fx_graph=joint.graph,
        out_spec=out_spec[0],
        input_shapes=[tuple(x.shape) for x in example_inputs],
        input_dtypes=[str(x.dtype) for x in example_inputs],
    )


def _output_metas(node: fx.Node) -> list[TensorMeta | None]:
    val = node.meta.get("val")
    vals = list(val) if isinstance(val, (tuple, list)) else [val]
    aliases = _alias_positions(node)
    if isinstance(val, list) and _returns_view_list(node):  # split, unbind, chunk: all views
        aliases = [0] * len(vals)
    metas: list[TensorMeta | None] = []
    for i, v in enumerate(vals):
        if not isinstance(v, torch.Tensor):
            metas.append(None)
            continue
        alias = aliases[i] if i < len(aliases) else None
        nbytes = 0 if alias is not None else _storage_bytes(v)
        shape = tuple(int(s) for s in v.shape)
        metas.append(TensorMeta(shape, str(v.dtype), nbytes, alias, v.is_contiguous()))
    return metas


def _returns_view_list(node: fx.Node) -> bool:
    """True for ops whose schema returns a list of views of their first argument."""
    schema = getattr(node.target, "_schema", None)
    return schema is not None and len(schema.returns) == 1 and "Tensor(a)[]" in str(schema)


def _tensor_args(node: fx.Node) -> list[fx.Node]:
    flat, _ = tree_flatten((node.args, node.kwargs))
    return [a for a in flat if isinstance(a, fx.Node)]


def _alias_positions(node: fx.Node) -> list[int | None]:
    """For each output, the position (among tensor args) of the input whose storage it shares."""
    target = node.target
    schema = getattr(target, "_schema", None)
    if schema is None:
        return []
    tensor_args = _tensor_args(node)
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
        positions.append(tensor_args.index(arg_value) if arg_value in tensor_args else None)
    return positions


def _consts(node: fx.Node) -> str:
    flat, _ = tree_flatten((node.args, node.kwargs))
    return repr(["%" if isinstance(a, fx.Node) else a for a in flat])


def _to_ir(g: fx.Graph, state_names: list[str], n_params: int, num_fwd: int) -> Graph:
    refs: dict[fx.Node, ValueRef] = {}
    nodes: list[Node] = []
    n_state = len(state_names)
    primal_index = 0
    for fxn in g.nodes:
        if fxn.op == "placeholder":
            if fxn.name.startswith("tangents"):
                role = ROLE_TANGENT
            else:
                role = (
                    ROLE_PARAM
                    if primal_index < n_params
                    else ROLE_BUFFER
                    if primal_index < n_state
                    else ROLE_INPUT
                )
                primal_index += 1
            nodes.append(Node(fxn.name, PLACEHOLDER, PLACEHOLDER, [], _output_metas(fxn), role))
            refs[fxn] = (fxn.name, 0)
        elif fxn.op == "call_function" and fxn.target.__name__ == "getitem":
            src, idx = fxn.args
            refs[fxn] = (src.name, idx)
        elif fxn.op == "call_function":
            tag = fxn.meta.get("partitioner_tag")
            phase = _PHASE_BY_TAG.get(tag, BACKWARD)
            tags = getattr(fxn.target, "tags", ())
            nodes.append(
                Node(
                    name=fxn.name,
                    target=str(fxn.target),
                    phase=phase,
                    inputs=[refs[a] for a in _tensor_args(fxn)],
                    outputs=_output_metas(fxn),
                    random=torch.Tag.nondeterministic_seeded in tags,
                    consts=_consts(fxn),
                )
            )
            refs[fxn] = (fxn.name, 0)
        elif fxn.op == "output":
            outs = list(fxn.args[0])
    as_ref = lambda x: refs[x] if isinstance(x, fx.Node) else None  # noqa: E731
    model_outputs = [as_ref(x) for x in outs[:num_fwd]]
    input_grads = [as_ref(x) for x in outs[num_fwd:]]
    return Graph(nodes, model_outputs, input_grads)
