"""The analytic cost model and planning on the meta device (nothing allocated or run)."""

from __future__ import annotations

import math
import threading
import warnings
from collections import Counter

import pytest
import torch
from helpers import Attention, PassBlock, planner
from torch import nn

from explorer.costmodel import (
    DEVICES,
    analytic_profile,
    meta_caveats,
    meta_graph,
    meta_planner,
    model_planner,
    node_bytes,
    node_flops,
    node_seconds,
)
from explorer.errors import RematWarning, UserError
from explorer.rngreplay import CUDA_STATE_BYTES, STATE_BYTES
from explorer.solvers.registry import make_solver
from explorer.sweep import sweep_budgets


@pytest.fixture(scope="module")
def cnn_graph():
    return meta_graph("sample:tiny_cnn", 2, 8)


def _first(graph, target):
    return next(n for n in graph.nodes if n.target == target)


def test_meta_capture_is_the_graph_the_real_capture_gives(cnn_graph):
    # catches: planning on the meta device for another graph than the one that will run
    real = planner("sample:tiny_cnn", 2, 8).capture()[0]
    assert cnn_graph.fingerprint() == real.fingerprint()


def test_flops_of_a_convolution_and_its_gradient(cnn_graph):
    # catches: counting a convolution by its input or output alone (no kernel volume), and
    # a gradient counted once where it makes both the input and the weight gradients
    conv = _first(cnn_graph, "aten.convolution.default")
    x, w = (cnn_graph.meta(r) for r in conv.inputs[:2])
    out = conv.outputs[0]
    assert w.shape == (16, 3, 3, 3) and x.shape == (2, 3, 8, 8)
    assert node_flops(cnn_graph, conv) == 2 * math.prod(out.shape) * 3 * 3 * 3
    grads = [
        n
        for n in cnn_graph.nodes
        if n.target == "aten.convolution_backward.default"
        and all(m is not None for m in n.outputs[:2])
    ]
    grad = grads[0]
    weight = cnn_graph.meta(grad.inputs[2])
    expected = 2 * 2 * math.prod(cnn_graph.meta(grad.inputs[0]).shape) * math.prod(weight.shape[1:])
    assert node_flops(cnn_graph, grad) == expected


def test_roofline_picks_the_binding_resource(cnn_graph):
    # catches: adding compute and memory time (or ignoring one of them)
    dev = DEVICES["a100"]
    for node in cnn_graph.nodes:
        if node.phase == "placeholder" or not node.outputs or node.outputs[0] is None:
            continue
        if node.outputs[0].alias_of is not None:
            assert node_seconds(cnn_graph, node, dev) == dev.launch_seconds
            continue
        compute = node_flops(cnn_graph, node) / dev.flop_rate
        memory = node_bytes(cnn_graph, node) / dev.bandwidth
        assert node_seconds(cnn_graph, node, dev) == pytest.approx(
            dev.launch_seconds + max(compute, memory)
        )


def test_faster_devices_predict_faster_steps_and_plans_run_on_them(cnn_graph):
    # catches: a device table read by the wrong key, a profile the solver cannot use
    totals = {
        name: sum(analytic_profile(cnn_graph, name).seconds.values())
        for name in ("p100", "a100", "h100")
    }
    assert totals["h100"] < totals["a100"] < totals["p100"]
    profile = analytic_profile(cnn_graph, "h100")
    assert set(profile.seconds) == {n.name for n in cnn_graph.nodes if n.phase != "placeholder"}
    solver = make_solver("table", cnn_graph, profile)
    front = sweep_budgets(solver, 4)
    assert front[-1].predicted_overhead == 0.0


def test_unknown_device_is_one_clear_error(cnn_graph):
    with pytest.raises(UserError, match="unknown device 'tpu'"):
        analytic_profile(cnn_graph, "tpu")


def _split_dropout_ops(graph) -> Counter[str]:
    """The split dropouts' operators in `graph` (explorer.rewrite.compact_dropout), counted."""
    return Counter(n.target for n in graph.nodes if n.target.startswith("remat_explorer."))


def test_meta_capture_splits_dropouts_as_the_device_it_stands_for_would():
    # catches: planning on the meta device with every dropout's float output pinned whole
    # (no device to draw the mask on), so that a GPU's plan keeps far more than the GPU
    # does (sample:gpt b8 256 px on a P100: least peak 0.462 of the activations, not 0.247)
    as_cpu = meta_graph("sample:tiny_dropout", 4, stands_for="cpu")
    real = planner("sample:tiny_dropout", 4, None).capture()[0]
    assert as_cpu.fingerprint() == real.fingerprint()
    assert _split_dropout_ops(as_cpu) == {
        "remat_explorer.rng_state.default": 2,
        "remat_explorer.bernoulli_mask.default": 2,
    }
    as_gpu = meta_graph("sample:tiny_dropout", 4)
    assert _split_dropout_ops(as_gpu) == {
        "remat_explorer.rng_state.default": 2,
        "remat_explorer.cuda_dropout_mask.default": 2,
    }
    # each generator snapshot as the device keeps it: the CPU's in the step's memory, a CUDA
    # generator's seed and offset on the host, outside it (as a CUDA capture counts it)
    cpu_state = _first(as_cpu, "remat_explorer.rng_state.default").outputs[0]
    assert (math.prod(cpu_state.shape), cpu_state.nbytes) == (STATE_BYTES, STATE_BYTES)
    cuda_state = _first(as_gpu, "remat_explorer.rng_state.default").outputs[0]
    assert (math.prod(cuda_state.shape), cuda_state.nbytes) == (CUDA_STATE_BYTES, 0)
    with pytest.raises(UserError, match="stands_for"):
        meta_graph("sample:tiny_dropout", 4, stands_for="tpu")


def test_a_meta_device_planner_plans_but_never_runs():
    # catches: a planner on the meta device that tries to time or verify (meta tensors hold
    # no data: it would fail deep inside torch, or time nothing and call it a measurement)
    plan = meta_planner("sample:tiny_dropout", 64, None, "h100")
    assert plan.profile().device_name == "NVIDIA H100 SXM5 80 GB (cost model)"
    schedule = plan.sweep(3).points[0].schedule
    assert plan.made_for()["device"] == "cuda"
    with pytest.raises(UserError, match="runs nothing"):
        plan.verify_schedule(schedule)
    fresh = type(plan)(plan.model, plan.example_inputs, stands_for="cpu")
    with pytest.raises(UserError, match="cannot be timed"):
        fresh.profile()
    with pytest.raises(UserError, match="stands_for"):
        type(plan)(plan.model, plan.example_inputs, stands_for="tpu")


class TiedLanguageModel(nn.Module):
    """Token embedding, one hidden layer, and the embedding's weight reused as the output
    layer's (tied, as GPT-2's are)."""

    def __init__(self, vocabulary: int = 50, width: int = 16) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocabulary, width)
        self.hidden = nn.Linear(width, width)
        self.out = nn.Linear(width, vocabulary, bias=False)
        self.out.weight = self.embed.weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.out(torch.tanh(self.hidden(self.embed(tokens))))


def test_your_own_model_is_planned_on_a_meta_copy_at_any_batch():
    # catches: the caller's model moved to (or its weights replaced by) meta tensors, tied
    # weights untied in the copy (two parameters planned where the step has one), the batch
    # left as given, or a named loss that cannot make its targets on the meta device
    model, tokens = TiedLanguageModel(), torch.randint(0, 50, (2, 8))
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    plan = model_planner(model, tokens, device_name="h100", batch_size=32, loss="cross_entropy")
    assert plan.model.out.weight is plan.model.embed.weight
    assert plan.model.embed.weight.device.type == "meta"
    assert model.embed.weight.device.type == "cpu"
    assert all(torch.equal(weights[k], v) for k, v in model.state_dict().items())
    assert plan.example_inputs[0].shape == (32, 8) and plan.example_inputs[0].dtype == torch.long
    made_for = plan.made_for()
    assert made_for["device"] == "cuda" and made_for["loss"] == "cross_entropy"
    assert [name for name, *_ in made_for["parameters"]] == [
        "embed.weight",
        "hidden.weight",
        "hidden.bias",
    ]
    assert plan.profile().device_name == "NVIDIA H100 SXM5 80 GB (cost model)"
    assert len(plan.sweep(3).points) >= 1
    # the same through a SPEC: the named loss on the meta device (it failed there)
    assert len(meta_planner("sample:tiny_cnn", 16, 8, "p100", loss="cross_entropy").sweep(3).points)


class ReadsAValue(nn.Module):
    """A forward that branches on a tensor's value (as transformers' mask checks do)."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer(x) if x.sum().item() >= 0 else -self.layer(x)


@pytest.mark.usefixtures("fresh_dynamo")
def test_what_cannot_be_planned_for_a_device_is_one_clear_error():
    model, x = TiedLanguageModel(), torch.randint(0, 50, (2, 8))
    with pytest.raises(UserError, match="named loss"):
        model_planner(model, x, loss=lambda out: out.sum())
    with pytest.raises(UserError, match="at least 1"):
        model_planner(model, x, batch_size=0)
    with pytest.raises(UserError, match="unknown device 'tpu'"):
        model_planner(model, x, device_name="tpu")
    with pytest.raises(UserError, match="cannot be planned without running it"):
        model_planner(ReadsAValue(), torch.randn(2, 4))
    holds_a_lock = ReadsAValue()
    holds_a_lock.lock = threading.Lock()
    with pytest.raises(UserError, match="cannot copy the model to plan it"):
        model_planner(holds_a_lock, torch.randn(2, 4))


@torch._dynamo.disable
def _widen(h: torch.Tensor) -> torch.Tensor:
    """Eager code between two graphs: an `exp` twice as wide as `h`, kept for its
    backward, which makes a gradient as wide between the graphs' backwards."""
    return h * torch.exp(h.repeat(1, 2)).mean(1, keepdim=True)


class EagerBetweenGraphs(nn.Module):
    """Two residual MLP blocks, each a graph, with eager code between them (Dynamo leaves
    `_widen` to eager code)."""

    def __init__(self) -> None:
        super().__init__()
        self.first, self.second = PassBlock(), PassBlock()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.second(_widen(self.first(x)))


@pytest.mark.usefixtures("fresh_dynamo")
def test_a_step_of_two_graphs_is_planned_on_the_meta_device_to_the_byte(tmp_path):
    # catches: a multi-graph step refused on the meta device, or what code outside the
    # graphs holds (the eager code's moments, the step's tangents) left uncounted there, so
    # that every predicted peak is low; planned for this CPU, the export must verify here
    # with its measured peak the predicted one
    from explorer import Planner, verify

    torch.manual_seed(0)
    model, x = EagerBetweenGraphs(), torch.randn(64, 32)
    measured = Planner(model, x).profile().graphs
    plan = model_planner(model, x, device_name="cpu")
    predicted = plan.profile().graphs
    assert len(predicted) == 2
    assert [p.eager for p in predicted] == [p.eager for p in measured]
    assert predicted[0].eager.after_forward and predicted[1].eager.after_backward
    least = min(plan.sweep(3).points, key=lambda p: p.predicted_peak_bytes)
    assert least.predicted_peak_bytes < plan.baseline().predicted_peak_bytes  # it recomputes
    path = plan.export(least.schedule, tmp_path / "two_graphs.py")
    report = verify(path, model=model, example_inputs=x)
    assert report.ok, [row for row in report.rows if not row.ok]
    peak = next(r for r in report.rows if r.quantity.startswith("peak"))
    assert peak.measured == peak.predicted


def test_a_meta_plan_of_a_model_with_tied_weights_and_device_constants_is_its_step():
    # catches: `.to("meta")` untying sample:gpt's tied output layer (one parameter more: another
    # graph, the weight counted twice) and the meta device written into an operator's
    # constants (`arange(..., device=meta)`): either gives the planned graph another
    # fingerprint than the step that runs, so the runtime carries the plan over rather than
    # applying it
    from explorer import Planner
    from explorer.models import build

    built = build("sample:gpt", 4, 64)
    step = [g.fingerprint() for g in Planner(built.model, built.example_inputs).capture()]
    from_spec = meta_planner("sample:gpt", 4, 64, "cpu")
    from_model = model_planner(built.model, built.example_inputs, device_name="cpu")
    assert [g.fingerprint() for g in from_spec.capture()] == step
    assert [g.fingerprint() for g in from_model.capture()] == step


def test_a_meta_plan_of_fused_attention_says_it_plans_the_math_form():
    # catches: planning scaled_dot_product_attention on the meta device without a word, where
    # its graph (the math form, no fused kernel there) is not the step that runs on the device
    # and holds the attention matrices the fused kernel does not
    from explorer import Planner

    x = torch.randn(2, 32, 16)
    fused = Attention(fused=True)
    with pytest.warns(RematWarning, match="scaled_dot_product_attention is planned as its math"):
        planned = model_planner(fused, x, device_name="cpu")
    assert len(meta_caveats(planned)) == 1
    here = Planner(fused, x)
    assert meta_caveats(here) == []  # a plan on a real device has its own fused kernel
    assert [g.fingerprint() for g in planned.capture()] != [g.fingerprint() for g in here.capture()]
    assert planned.baseline().predicted_peak_bytes > here.baseline().predicted_peak_bytes
    with warnings.catch_warnings():
        warnings.simplefilter("error", RematWarning)
        explicit = model_planner(Attention(fused=False), x, device_name="a100")
    assert meta_caveats(explicit) == []


class CompositesInTheMiddle(nn.Module):
    """Operators PyTorch writes as composites of others, between the parameters and the loss:
    `relu6`, `var`, `where` with a scalar, and cross-entropy (`nll_loss`) inside the forward."""

    def __init__(self) -> None:
        super().__init__()
        self.first = nn.Linear(8, 16)
        self.second = nn.Linear(16, 10)

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        h = nn.functional.relu6(self.first(x))
        h = torch.where(h > 1, h, 0.0) / (1 + h.var(dim=-1, keepdim=True))
        return nn.functional.cross_entropy(self.second(h), labels)


def test_a_meta_plan_keeps_the_backward_of_composite_operators():
    # catches: tracing on the meta device under PyTorch's Python dispatcher, where these
    # composites run Python meta kernels below autograd and their backward is lost with no
    # error (no gradient reached `first` or `second`); a GPT-2 with labels was planned 30% under
    # its step's peak so
    from torch._C import DispatchKey

    from explorer import Planner

    model, x, labels = CompositesInTheMiddle(), torch.randn(4, 8), torch.randint(0, 10, (4,))
    here = Planner(model, (x, labels))
    measured = here.profile().graphs[0]
    planned = model_planner(model, (x, labels), device_name="cpu")
    graph = planned.capture()[0]
    assert graph.fingerprint() == here.capture()[0].fingerprint()
    assert sum(g is not None for g in graph.input_grads) == 4  # both layers' weights and biases
    assert planned.profile().graphs[0].eager == measured.eager
    assert planned.baseline().predicted_peak_bytes == here.baseline().predicted_peak_bytes
    # the Python meta kernels are back once the capture is done
    assert DispatchKey.Meta in torch.ops.aten.nll_loss.default.py_kernels


class ChannelsLastBlock(nn.Module):
    """A convolution of a permuted (channels-last) input, as ConvNeXt's blocks have."""

    def __init__(self) -> None:
        super().__init__()
        self.first = nn.Conv2d(3, 8, 3, padding=1)
        self.norm = nn.LayerNorm(8)
        self.second = nn.Conv2d(8, 8, 3, padding=1, groups=8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm(self.first(x).permute(0, 2, 3, 1)).permute(0, 3, 1, 2)
        return self.second(h).sum()


def test_a_meta_plan_of_a_channels_last_convolution_says_its_layout_is_the_meta_devices():
    # catches: planning a convolution of a channels-last input on the meta device without a
    # word, where the meta device writes its output contiguous and the CPU keeps the input's
    # layout: another graph than the step that runs
    from explorer import Planner

    x = torch.randn(2, 3, 16, 16)
    with pytest.warns(RematWarning, match="a convolution of a non-contiguous input"):
        planned = model_planner(ChannelsLastBlock(), x, device_name="cpu")
    here = Planner(ChannelsLastBlock(), x)
    assert [g.fingerprint() for g in planned.capture()] != [g.fingerprint() for g in here.capture()]
    assert meta_caveats(here) == []
    with warnings.catch_warnings():
        warnings.simplefilter("error", RematWarning)
        plain = model_planner(nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU()), x, device_name="h100")
    assert meta_caveats(plain) == []
