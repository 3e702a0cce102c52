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

from explorer.rngreplay import BERNOULLI_MASK, CUDA_DROPOUT_MASK, RNG_STATE

aten = torch.ops.aten
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
        if train is False or not isinstance(x_val, torch.Tensor) or not x_val.is_contiguous():
            continue
        if not all(isinstance(size, int) for size in x_val.shape):
            continue  # a symbolic shape: the mask's shape would have to be read from x
        drawn = _mask_draw(x, x_val, p)
        if drawn is None:
            continue
        _split(graph, node, x, x_val, drawn)
        split += 1
    if split:
        graph.lint()
        joint.recompile()
    return split


def _mask_draw(x: fx.Node, x_val: torch.Tensor, p: float) -> tuple[tuple, float] | None:
    """The mask operator's (target, arguments after the state) and the output's scale for a
    dropout of `x` (its value `x_val`) on its device, or None where its mask cannot be drawn
    again."""
    keep = 1.0 - p
    if x_val.device.type == "cpu":
        scale = 0.0 if keep == 0 else float(torch.tensor(1.0 / keep, dtype=x_val.dtype))
        return (BERNOULLI_MASK, (list(x_val.shape), keep)), scale
    if x_val.device.type != "cuda" or not 0.0 < p < 1.0 or x_val.storage_offset() != 0:
        return None  # p 0 or 1 takes other kernels; an offset start may change the launch
    if x_val.dtype in _CUDA_FLOATS:
        one = torch.tensor(1.0, dtype=torch.float32)
        scale = float(one / torch.tensor(keep, dtype=torch.float32))
    elif x_val.dtype == torch.float64:
        scale = 1.0 / keep
    else:
        return None
    return (CUDA_DROPOUT_MASK, (x, p)), scale


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
    for user in list(node.users):
        if user.op == "call_function" and user.target is operator.getitem:
            user.replace_all_uses_with(output if user.args[1] == 0 else mask)
            graph.erase_node(user)
    graph.erase_node(node)


def _vals(args: tuple) -> tuple:
    return tuple(a.meta["val"] if isinstance(a, fx.Node) else a for a in args)
