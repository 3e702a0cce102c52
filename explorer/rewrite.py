"""Passes over a joint FX graph, applied before it is described, planned and partitioned.

`compact_dropout`: `native_dropout(x, p)` returns a float output and a bool mask, and the
backward reads only the mask. Left whole, neither can be recomputed (a random operator drawn
twice would draw another mask), so a plan must keep its float output: for attention dropout
that is one (B, heads, T, T) float tensor per layer. The pass splits it into a snapshot of the
generator's state (a few bytes or kilobytes, pinned), the mask drawn from that snapshot (1 byte
per element, the same draw native_dropout makes; see explorer.rngreplay) and two ordinary
multiplications that rebuild the output bitwise (`x * mask * scale`). The mask and the output
become values like any other, kept or recomputed as the plan says: a recomputed mask is drawn
again from the snapshot.

`fuse_kept_dropouts` undoes the split in a forward graph the runtime runs wherever the plan
draws the mask once (its snapshot and product read by nothing else): one `native_dropout`
call makes the same mask and output, bitwise, where the split form took two custom operators
and three kernels, which on a GPU's launch-bound step cost as much as the rest of the runtime
(sample:gpt). explorer.program fuses the same instructions, so what is predicted is what runs.

The scale is the one each device's kernel multiplies by: the CPU's is 1/(1 - p) rounded to x's
dtype; CUDA's fused kernel divides 1 by (1 - p) in x's accumulation type (float32 for float32,
float16 and bfloat16) and multiplies in that type, which `mul` by a float32-exact scalar
repeats. On CUDA only a dropout whose input is contiguous at the start of its storage is split:
the kernel's launch depends on the input's alignment, and the mask is drawn again by running
the kernel on the input itself, kept or recomputed (so laid out the same).
"""

from __future__ import annotations

import operator

import torch
from torch import fx
from torch._guards import detect_fake_mode
from torch.utils._pytree import tree_map

from explorer.metadevice import device_kind
from explorer.rngreplay import BERNOULLI_MASK, CUDA_DROPOUT_MASK, RNG_STATE
from explorer.symsizes import contiguous_at_hints

aten = torch.ops.aten
DROPOUT_P = "remat_dropout_p"  # node.meta of a split dropout's mask: the dropout's p
_CUDA_FLOATS = (torch.float32, torch.float16, torch.bfloat16)  # accumulate in float32


def compact_dropout(joint: fx.GraphModule) -> int:
    """Split every training-mode native_dropout whose mask can be drawn again (see module
    docstring). Returns how many were split; the graph module is recompiled if any was."""
    graph = joint.graph
    split = 0
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target is not aten.native_dropout.default:
            continue
        x, p = node.args[0], float(node.args[1])
        train = node.args[2] if len(node.args) > 2 else node.kwargs.get("train")
        x_val = x.meta.get("val") if isinstance(x, fx.Node) else None
        if train is False or not isinstance(x_val, torch.Tensor):
            continue
        if not contiguous_at_hints(x_val):
            continue
        drawn = _mask_draw(node, x, x_val, p)
        if drawn is None:
            continue
        _split(graph, node, x, x_val, drawn)
        split += 1
    if split:
        graph.lint()
        joint.recompile()
    return split


def _mask_draw(
    dropout: fx.Node, x: fx.Node, x_val: torch.Tensor, p: float
) -> tuple[tuple, float] | None:
    """The mask operator's (target, arguments after the state) and the output's scale for a
    dropout of `x` (its value `x_val`) on its device, or None where its mask cannot be drawn
    again. A meta tensor is on the device it stands for (explorer.metadevice.device_kind)."""
    keep = 1.0 - p
    kind = device_kind(x_val)
    if kind == "cpu":
        scale = 0.0 if keep == 0 else float(torch.tensor(1.0 / keep, dtype=x_val.dtype))
        return (BERNOULLI_MASK, (_shape_of(dropout, x, x_val), keep)), scale
    if kind != "cuda" or not 0.0 < p < 1.0 or x_val.storage_offset() != 0:
        return None  # p 0 or 1 takes other kernels; an offset start may change the launch
    if x_val.dtype in _CUDA_FLOATS:
        one = torch.tensor(1.0, dtype=torch.float32)
        scale = float(one / torch.tensor(keep, dtype=torch.float32))
    elif x_val.dtype == torch.float64:
        scale = 1.0 / keep
    else:
        return None
    return (CUDA_DROPOUT_MASK, (x, p)), scale


def _shape_of(dropout: fx.Node, x: fx.Node, x_val: torch.Tensor) -> list:
    """The mask's shape as the mask operator reads it: each size a number, or where the
    graph serves any size of that dimension (explorer.symsizes) a node reading it off `x`,
    placed before the dropout."""
    shape: list = []
    for d, size in enumerate(x_val.shape):
        if not isinstance(size, torch.SymInt):
            shape.append(int(size))
            continue
        with dropout.graph.inserting_before(dropout):
            read = dropout.graph.call_function(aten.sym_size.int, (x, d))
        read.meta["val"] = size
        if "partitioner_tag" in dropout.meta:
            read.meta["partitioner_tag"] = dropout.meta["partitioner_tag"]
        shape.append(read)
    return shape


def _split(
    graph: fx.Graph, node: fx.Node, x: fx.Node, x_val: torch.Tensor, drawn: tuple[tuple, float]
) -> None:
    (mask_target, mask_args), scale = drawn
    fake_mode = detect_fake_mode([x_val])
    tag = node.meta.get("partitioner_tag")
    steps = [
        (RNG_STATE, (x,), {}),
        (mask_target, (None, *mask_args), {}),
        (aten.mul.Tensor, (x, None), {}),
        (aten.mul.Tensor, (None, scale), {}),
    ]
    made: list[fx.Node] = []
    with graph.inserting_before(node):
        for target, args, kwargs in steps:
            args = tuple(made[-1] if a is None else a for a in args)
            new = graph.call_function(target, args, kwargs)
            new.meta.update({k: v for k, v in node.meta.items() if k not in ("val", "tensor_meta")})
            if tag is not None:
                new.meta["partitioner_tag"] = tag
            with fake_mode:
                new.meta["val"] = target(*_vals(args), **kwargs)
            made.append(new)
    mask, output = made[1], made[3]
    mask.meta[DROPOUT_P] = float(node.args[1])  # fuse_kept_dropouts: 1 - (1 - p) may not be p
    for user in list(node.users):
        if user.op == "call_function" and user.target is operator.getitem:
            user.replace_all_uses_with(output if user.args[1] == 0 else mask)
            graph.erase_node(user)
    graph.erase_node(node)


def _vals(args: tuple) -> tuple:
    """The traced values of the arguments (nested in lists too: a shape of size nodes)."""
    return tree_map(lambda a: a.meta["val"] if isinstance(a, fx.Node) else a, args)


def fuse_kept_dropouts(forward: fx.GraphModule) -> int:
    """Run each split dropout of a forward graph whose snapshot only its mask reads and whose
    product only the output reads as one `native_dropout` (see the module docstring). The
    same rule as explorer.program's fusion, read off the graph: a snapshot or product the
    backward needs is an output of the forward graph. Returns how many were fused; the graph
    module is recompiled if any was."""
    graph = forward.graph
    fused = 0
    for state in list(graph.nodes):
        run = _split_run(state)
        if run is None:
            continue
        state, mask, product, output = run
        x = state.args[0]
        with graph.inserting_before(state):
            dropout = graph.call_function(
                aten.native_dropout.default, (x, mask.meta[DROPOUT_P], True)
            )
            made = graph.call_function(operator.getitem, (dropout, 0))
            drawn = graph.call_function(operator.getitem, (dropout, 1))
        dropout.meta.update(mask.meta)
        if "val" in output.meta and "val" in mask.meta:
            dropout.meta["val"] = (output.meta["val"], mask.meta["val"])
            made.meta["val"], drawn.meta["val"] = output.meta["val"], mask.meta["val"]
        output.replace_all_uses_with(made)
        mask.replace_all_uses_with(drawn)
        for node in (output, product, mask, state):
            graph.erase_node(node)
        fused += 1
    if fused:
        graph.lint()
        forward.recompile()
    return fused


def _split_run(state: fx.Node) -> tuple[fx.Node, ...] | None:
    """The snapshot, mask, product and output of a split dropout starting at `state`, one after
    another in the graph, each read only by the next (the output by anyone); else None."""
    if state.op != "call_function" or state.target is not RNG_STATE:
        return None
    mask, product, output = state.next, state.next.next, state.next.next.next
    if mask.target not in (BERNOULLI_MASK, CUDA_DROPOUT_MASK) or DROPOUT_P not in mask.meta:
        return None
    if product.target is not aten.mul.Tensor or output.target is not aten.mul.Tensor:
        return None
    x = state.args[0]
    if mask.args[0] is not state or product.args != (x, mask) or output.args[0] is not product:
        return None
    if set(state.users) != {mask} or set(product.users) != {output}:
        return None
    return state, mask, product, output
