"""Seconds per operator from its arithmetic and its memory traffic, on a device chosen by
name: plan for a GPU you do not have, or a size this machine cannot run.

Each operator costs `launch + max(flops / flop_rate, bytes / bandwidth)`: the larger of its
arithmetic at the device's sustained FLOP rate and its reads and writes at the device's
sustained memory bandwidth (a roofline), plus a fixed launch cost. FLOPs are counted for
the operators that dominate training (convolutions and their gradients, matrix products,
attention); everything else is charged as memory traffic. Views move nothing and cost only
the launch. The rates are the data-sheet peaks times an efficiency that large kernels reach
in practice; "cpu" is this machine, measured once per process (a matrix product and a copy
on one thread). `analytic_profile` turns a graph into a Profile the solvers read like a
measured one; `meta_graph` captures a model on the meta device, so nothing is allocated or
run.
"""

from __future__ import annotations

import copy
import math
import time
import warnings
from dataclasses import replace
from typing import Any

import torch
from torch import nn

from explorer.backend import module_inside
from explorer.devices import (
    COMPUTE_EFFICIENCY,
    DEVICES,
    MEASURED,
    PREDICTED,
    Device,
    device_names,
)
from explorer.errors import RematWarning, UserError, first_line
from explorer.graph import PLACEHOLDER, Graph, Node, TensorMeta, dense_bytes
from explorer.losses import loss_name
from explorer.modelstate import held_tensors
from explorer.profile import Profile


def device(name: str) -> Device:
    """A device by name: one of DEVICES, or "cpu" (this machine, measured)."""
    key = name.lower()
    if key == MEASURED:
        return measure_cpu()
    if key not in DEVICES:
        raise UserError(f"unknown device {name!r}; choose one of {', '.join(device_names())}")
    return DEVICES[key]


_MEASURED: Device | None = None


def measure_cpu() -> Device:
    """This CPU's rates on one thread: a 512x512 float32 product, a 32 MiB copy, and an
    addition of two scalars for the per-operator cost (medians of a few runs)."""
    global _MEASURED
    if _MEASURED is None:
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            a = torch.randn(512, 512)
            flops = 2 * 512**3 / _median(lambda: a @ a)
            big = torch.empty(8 * 2**20)
            bandwidth = 2 * big.numel() * 4 / _median(big.clone)
            one = torch.ones(1)
            launch = _median(lambda: one + one)
        finally:
            torch.set_num_threads(threads)
        rate = flops * COMPUTE_EFFICIENCY
        _MEASURED = Device("this CPU (1 thread, measured)", rate, rate, bandwidth, launch)
    return _MEASURED


def _median(fn, repeats: int = 5) -> float:
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


# -- counting -----------------------------------------------------------------------------


def _numel(meta: TensorMeta) -> int:
    return math.prod(meta.shape)


def node_flops(graph: Graph, node: Node) -> float:
    """Multiply-adds times two for the operators that do arithmetic in bulk; 0 otherwise."""
    op = node.target.removeprefix("aten.").split(".")[0]
    ins = [graph.meta(r) for r in node.inputs]
    outs = [m for m in node.outputs if m is not None]
    if op == "convolution" and len(ins) >= 2 and outs:
        return 2.0 * _numel(outs[0]) * math.prod(ins[1].shape[1:])
    if op == "convolution_backward" and len(ins) >= 3:
        grad_out, weight = ins[0], ins[2]
        per_output = 2.0 * _numel(grad_out) * math.prod(weight.shape[1:])
        return per_output * sum(1 for m in node.outputs[:2] if m is not None)
    if op in ("mm", "addmm", "bmm", "baddbmm") and len(ins) >= 2:
        a, b = ins[-2], ins[-1]
        return 2.0 * _numel(a) * b.shape[-1]
    if op.startswith("_scaled_dot_product") and len(ins) >= 3:
        q, k = ins[0], ins[1]
        scale = 2.0 if op.endswith("backward") else 1.0
        return scale * 4.0 * _numel(q) * k.shape[-2]
    return float(sum(_numel(m) for m in outs))


def node_bytes(graph: Graph, node: Node) -> float:
    """Bytes read and written: every tensor input and every output that owns storage."""
    read = sum(dense_bytes(graph.meta(r)) for r in node.inputs)
    written = sum(dense_bytes(m) for m in node.outputs if m and m.alias_of is None)
    return float(read + written)


def node_seconds(graph: Graph, node: Node, dev: Device) -> float:
    """The roofline time of one operator on `dev` (see module docstring)."""
    outs = [m for m in node.outputs if m is not None]
    if outs and all(m.alias_of is not None for m in outs):
        return dev.launch_seconds  # a view: metadata only
    half = any(m.dtype in ("torch.float16", "torch.bfloat16") for m in outs)
    rate = dev.half_flop_rate if half else dev.flop_rate
    return dev.launch_seconds + max(
        node_flops(graph, node) / rate, node_bytes(graph, node) / dev.bandwidth
    )


def analytic_profile(graph: Graph, device_name: str) -> Profile:
    """A Profile of predicted seconds per operator on the named device (no workspace)."""
    dev = device(device_name)
    seconds = {n.name: node_seconds(graph, n, dev) for n in graph.nodes if n.phase != PLACEHOLDER}
    return Profile(
        graph.fingerprint(), f"{PREDICTED}{device_name.lower()}", dev.name, seconds, {}, graph
    )


def meta_graph(
    spec: str, batch_size: int, input_size: int | None = None, stands_for: str = "cuda"
) -> Graph:
    """The training step of SPEC's model at any size, captured on the meta device: shapes
    and sizes only, nothing allocated or run (the model is first built at batch 2 on the CPU
    to get its example input, then moved to the meta device). The step is captured as on
    `stands_for` ("cuda", the analytic GPUs', or "cpu"): its dropouts are split so that
    their masks may be recomputed as they would be there (explorer.rewrite), where left
    whole every dropout's float output was pinned (sample:gpt b8 256 px on a P100: the least
    peak 0.462 of the activations, not 0.24)."""
    graphs = _meta_plan(spec, batch_size, input_size, stands_for).capture()
    if len(graphs) != 1:
        raise UserError(
            f"{spec} traces to {len(graphs)} graphs; meta_graph returns one (meta_planner: any)"
        )
    return graphs[0]


def meta_planner(
    spec: str,
    batch_size: int,
    input_size: int | None = None,
    device_name: str = "p100",
    *,
    loss: str | None = None,
    gradients_held: bool = False,
):
    """A Planner of SPEC's step at any size, on the meta device, with every operator's
    seconds predicted for `device_name` (one of DEVICES, or "cpu"): sweep, solve and export
    as with a measured profile, for a GPU or a size this machine does not have. Nothing is
    timed or allocated: the step runs once on the meta device, shapes only, to count what
    code outside its graphs holds (explorer.eagerpeaks), and the runtime's own cost is taken
    as none. An exported schedule names the
    device kind it is for ("cuda" for the GPUs); on that device the runtime applies it
    exactly where the captured graph is the one planned, and otherwise carries it over as it
    does for any other graph (explorer.backend)."""
    device(device_name)  # an unknown name is refused before the model is built
    plan = _meta_plan(spec, batch_size, input_size, _kind(device_name), loss, gradients_held)
    return _predicted(plan, device_name)


def model_planner(
    model: nn.Module,
    args: Any = (),
    kwargs: dict | None = None,
    *,
    device_name: str = "p100",
    batch_size: int | None = None,
    loss: str | None = None,
    gradients_held: bool = False,
):
    """`meta_planner` for your own model: its step planned for `device_name` with predicted
    seconds, nothing run. Your model is left as it is: a copy on the meta device is planned,
    its parameters and buffers stood in for by their shapes (nothing is copied).
    `batch_size` replaces the first dimension of every input tensor, positional or keyword
    (left out: the inputs' own shapes). `loss` is a name (explorer.losses): a function of
    your own would close over targets on your model's device."""
    from explorer.planner import Planner

    device(device_name)
    if loss is not None and not isinstance(loss, str):
        raise UserError(
            "a planned step takes a named loss (explorer.losses, e.g. 'cross_entropy'): "
            "a function of your own closes over targets that are not on the meta device"
        )
    if batch_size is not None and (
        isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1
    ):
        raise UserError(f"batch_size must be a whole number of at least 1, not {batch_size!r}")
    args = tuple(args) if isinstance(args, (tuple, list)) else (args,)
    model = module_inside(model)  # not a copy of torch.compile's wrapper
    plan = Planner(
        meta_copy(model),
        tuple(_on_meta(x, batch_size) for x in args),
        {k: _on_meta(v, batch_size) for k, v in (kwargs or {}).items()},
        loss=loss,
        gradients_held=gradients_held,
        stands_for=_kind(device_name),
    )
    return _predicted(_captured(plan, type(model).__name__), device_name)


def meta_copy(model: nn.Module) -> nn.Module:
    """A copy of `model` on the meta device, made without copying a single tensor's data:
    every tensor it holds (parameters, buffers, tensors kept as attributes) is replaced by
    an empty one of the same shape, dtype and gradient flag, shared ones (tied weights)
    staying shared."""
    memo: dict[int, torch.Tensor] = {}
    for tensor in held_tensors(model):
        if id(tensor) in memo:
            continue
        standin = torch.empty_like(tensor.detach(), device="meta")
        if isinstance(tensor, nn.Parameter):
            standin = nn.Parameter(standin, requires_grad=tensor.requires_grad)
        memo[id(tensor)] = standin
    try:
        copied = copy.deepcopy(model, memo)
    except Exception as exc:  # an attribute that cannot be copied: a lock, an open file
        raise UserError(f"cannot copy the model to plan it: {first_line(exc)}") from exc
    return copied.to("meta")


def _kind(device_name: str) -> str:
    """The kind of device a named one is: "cpu" for this machine's CPU, else "cuda"."""
    return "cpu" if device_name.lower() == MEASURED else "cuda"


# the softmax of scaled_dot_product_attention's math form (aten's SDPA math path, the one a
# meta tensor takes); explicit attention's softmax is aten._softmax
MATH_ATTENTION_SOFTMAX = "aten._safe_softmax.default"
CONVOLUTION = "aten.convolution.default"


def meta_caveats(plan) -> list[str]:
    """What a plan made on the meta device cannot make exact, one line each (none for a plan
    on a real device). Where PyTorch picks a kernel by device, the meta device takes its own
    pick: `scaled_dot_product_attention` runs as its math form (an attention matrix per
    layer that a fused kernel never holds), and a convolution writes a contiguous output
    where the CPU and CUDA keep a channels-last input's layout. Either gives another graph
    than the one that runs there."""
    if plan.device.type != "meta":
        return []
    graphs = plan.capture()
    caveats = []
    if any(n.target == MATH_ATTENTION_SOFTMAX for g in graphs for n in g.nodes):
        caveats.append(
            "scaled_dot_product_attention is planned as its math form (the meta device has no "
            "fused kernel): where the device runs a fused kernel instead, which holds no "
            "attention matrix, the predicted peaks err high and the runtime carries the plan "
            "over to that graph rather than apply it exactly; for an exact plan, plan and train "
            "with explicit attention (transformers: attn_implementation='eager')"
        )
    if any(_convolves_a_strided_input(g, n) for g in graphs for n in g.nodes):
        caveats.append(
            "a convolution of a non-contiguous input (channels-last, as after a permute) is "
            "planned with a contiguous output, the meta device's layout: where the device "
            "keeps channels-last (the CPU's mkldnn, CUDA's cudnn), the predicted peaks count "
            "copies it does not make and the runtime carries the plan over to its graph "
            "rather than apply it exactly"
        )
    return caveats


def _convolves_a_strided_input(graph: Graph, node: Node) -> bool:
    return node.target == CONVOLUTION and not graph.meta(node.inputs[0]).contiguous


def _predicted(plan, device_name: str):
    """`plan` (on the meta device, captured) with the cost model's profile for the device,
    and what its code outside the graphs holds, measured by running the step on the meta
    device (shapes only: the same bytes as on the device, none of them allocated)."""
    from explorer.profile import StepProfile

    try:
        peaks = plan.eager_peaks()
    except UserError:
        raise
    except Exception as exc:
        raise UserError(
            f"what the step's code outside its graphs holds could not be measured on the "
            f"meta device: {first_line(exc)}"
        ) from exc
    profiles = [
        replace(analytic_profile(g, device_name), eager=e)
        for g, e in zip(plan.capture(), peaks, strict=True)
    ]
    for caveat in meta_caveats(plan):
        warnings.warn(caveat, RematWarning, stacklevel=3)
    plan.use_profile(
        StepProfile(
            profiles,
            f"{PREDICTED}{device_name.lower()}",
            f"{device(device_name).name} (cost model)",
            loss=loss_name(plan.loss),
            gradients_held=plan.gradients_held,
        )
    )
    return plan


def _meta_plan(
    spec: str,
    batch_size: int,
    input_size: int | None,
    stands_for: str,
    loss: str | None = None,
    gradients_held: bool = False,
):
    """SPEC's model and inputs on the meta device, in a Planner that has captured its step."""
    from explorer.models import build
    from explorer.planner import Planner

    if stands_for not in ("cuda", "cpu"):
        raise UserError(f"meta_graph: stands_for must be 'cuda' or 'cpu', not {stands_for!r}")
    built = build(spec, 2, input_size)
    model = meta_copy(built.model).train()  # .to("meta") would untie tied weights
    plan = Planner(
        model,
        tuple(_on_meta(x, batch_size) for x in built.example_inputs),
        {k: _on_meta(v, batch_size) for k, v in built.example_kwargs.items()},
        spec=replace(built.spec, batch_size=batch_size),
        loss=loss,
        gradients_held=gradients_held,
        stands_for=stands_for,
    )
    return _captured(plan, spec)


def _captured(plan, what: str):
    """`plan`, captured. A forward that reads a tensor's value cannot run on the meta device,
    where tensors hold none, and a transformers model's cache (use_cache=True) makes tensors
    Dynamo cannot trace there: both said so. PyTorch's error does not name the cache, so for
    a model with its cache on the fix is offered as the likely one, the error kept beside it."""
    try:
        plan.capture()
    except UserError as exc:
        if getattr(getattr(plan.model, "config", None), "use_cache", False):
            raise UserError(
                f"{what} could not be planned on the meta device with use_cache=True ({exc}); "
                "a key-value cache makes tensors the trace cannot stand in for: build it with "
                "use_cache=False, as a training step does"
            ) from exc
        if "meta tensor" not in str(exc):
            raise
        raise UserError(
            f"{what} cannot be planned without running it: {exc} (its forward reads a "
            "tensor's value, which the meta device has not; plan it on a device it runs on)"
        ) from exc
    return plan


def _on_meta(x, batch_size: int | None):
    """An example input on the meta device, at `batch_size` if given (a tensor's first
    dimension is its batch); anything else as it is."""
    if not isinstance(x, torch.Tensor):
        return x
    shape = (batch_size, *x.shape[1:]) if x.dim() and batch_size is not None else x.shape
    meta = torch.zeros(shape, dtype=x.dtype, device="meta")
    return meta.requires_grad_(x.requires_grad) if x.is_leaf else meta
