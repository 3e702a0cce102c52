"""Capture: the step's joint graphs, through the same torch.compile backend the runtime uses."""

from __future__ import annotations

import json
import threading
import warnings
from types import SimpleNamespace

import pytest
import torch
from helpers import Passes, RangeObserved, RecurrentInTheMiddle
from torch import nn
from torch.utils.checkpoint import checkpoint

import explorer
from explorer.capture import capture
from explorer.errors import RematWarning, UserError
from explorer.frames import held_by_frames
from explorer.graph import BACKWARD, EFFECT, FORWARD, Graph
from explorer.models import build
from explorer.rngreplay import STATE_BYTES


def test_resnet_graph_has_forward_backward_and_buffer_updates():
    built = build("resnet18", 2, 32)
    before = [b.clone() for b in built.model.buffers()]
    rng = torch.get_rng_state()
    (captured,) = capture(built.model, built.example_inputs)
    graph = captured.graph
    assert {FORWARD, BACKWARD, EFFECT} <= {n.phase for n in graph.nodes}
    targets = {n.target for n in graph.nodes}
    assert "aten.convolution_backward.default" in targets
    assert "aten._native_batch_norm_legit_functional.default" in targets
    params = graph.placeholders("param")
    assert len(params) == len(list(built.model.parameters()))
    primals = [n for n in graph.nodes if n.phase == "placeholder" and n.role != "tangent"]
    grads = dict(zip([n.name for n in primals], graph.input_grads, strict=True))
    assert all(grads[p.name] is not None for p in params)
    assert all(grads[n.name] is None for n in graph.placeholders("buffer"))
    # the forward ran for real, but planning leaves the model and the RNG as they were
    # (breaks if capture stops restoring buffers: BatchNorm statistics would move)
    assert all(torch.equal(a, b) for a, b in zip(before, built.model.buffers(), strict=True))
    assert torch.equal(rng, torch.get_rng_state())


def test_fingerprint_and_structure():
    """Same model and shape: same fingerprint, also through JSON. Another batch size: another
    fingerprint but the same structure (the runtime reuses a schedule across them)."""
    built = build("sample:tiny_cnn", 2, None)
    first = capture(built.model, built.example_inputs)[0].graph
    second = capture(built.model, built.example_inputs)[0].graph
    assert first.fingerprint() == second.fingerprint()
    again = Graph.from_dict(json.loads(json.dumps(first.to_dict())))
    assert again.fingerprint() == first.fingerprint()
    other = build("sample:tiny_cnn", 4, None)
    bigger = capture(other.model, other.example_inputs)[0].graph
    assert bigger.fingerprint() != first.fingerprint()
    assert bigger.structure() == first.structure()


def test_dropout_keeps_a_generator_state_and_a_recomputable_mask_and_output():
    built = build("sample:gpt", 2, 16)
    graph = capture(built.model, built.example_inputs)[0].graph
    by_name = {n.name: n for n in graph.nodes}
    targets = [n.target for n in graph.nodes]
    assert "aten.native_dropout.default" not in targets  # breaks if compact_dropout is skipped
    states = [n for n in graph.nodes if n.target == "remat_explorer.rng_state.default"]
    assert states and all(n.random and n.pinned and n.phase == FORWARD for n in states)
    assert all(n.outputs[0].nbytes == STATE_BYTES for n in states)
    masks = [n for n in graph.nodes if n.target == "remat_explorer.bernoulli_mask.default"]
    assert len(masks) == len(states)
    assert all(not m.random and not m.pinned and m.phase == FORWARD for m in masks)
    assert all(m.outputs[0].dtype == "torch.bool" for m in masks)
    # a mask reads only its state: recomputing it needs neither the dropout's input nor output
    assert all([by_name[r[0]].target for r in m.inputs] == [states[0].target] for m in masks)
    mask_names = {m.name for m in masks}
    rebuilt = [n for n in graph.nodes if any(r[0] in mask_names for r in n.inputs)]
    forward_rebuilds = [n for n in rebuilt if n.phase == FORWARD]
    assert forward_rebuilds and all(not n.pinned for n in forward_rebuilds)


def test_views_cost_nothing_and_split_returns_views():
    built = build("sample:gpt", 2, 16)
    graph = capture(built.model, built.example_inputs)[0].graph
    split = next(n for n in graph.nodes if n.target == "aten.split.Tensor")
    assert all(m.alias_of == 0 and m.nbytes == 0 for m in split.outputs)
    view = next(n for n in graph.nodes if n.target == "aten.view.default")
    assert view.outputs[0].nbytes == 0


class _DataDependent(nn.Module):
    """Data-dependent control flow: Dynamo splits the model into two graphs."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = nn.Linear(4, 4)
        self.outer = nn.Linear(4, 4)

    def forward(self, x):
        h = self.inner(x)
        if h.sum() > 0:
            h = h * 2
        return self.outer(h.relu())


def test_data_dependent_python_gives_several_graphs():
    torch.manual_seed(0)
    graphs = capture(_DataDependent().train(), (torch.randn(2, 4),))
    assert len(graphs) == 2
    assert all(any(n.phase == BACKWARD for n in g.graph.nodes) for g in graphs)


@pytest.mark.usefixtures("fresh_dynamo")
def test_a_graph_run_more_than_once_gives_one_captured_run_each():
    # catches: a loop's graph, which Dynamo runs at every pass, captured once (a plan counting
    # one pass: the wrapped model's peak was 33% over its prediction), the runs out of order,
    # a run's input not traced to the run that made it, or a parameter that a later run
    # reads again not marked so (its gradient would be counted once per run)
    runs = capture(Passes(4).train(), (torch.randn(8, 32),))
    assert [r.same_graph_as for r in runs] == [None, None, 1, 1]
    assert all(r.graph is runs[1].graph for r in runs[2:])
    for k, run in enumerate(runs[1:], start=1):
        (source,) = run.handoff.sources
        assert source[1] == k - 1
        assert not run.handoff.params_read_later
    shared = capture(Passes(3, shared=True).train(), (torch.randn(8, 32),))
    params = [{n.name for n in r.graph.placeholders("param")} for r in shared]
    assert [r.handoff.params_read_later for r in shared] == [params[0], params[1], set()]


class _HookedOnFirstCall(nn.Module):
    """Sets itself up on its first call behind a lock, as transformers installs its
    output-capturing hooks: Dynamo cannot trace the lock, so only the first call breaks."""

    lock = threading.Lock()

    def __init__(self) -> None:
        super().__init__()
        self.first, self.second = nn.Linear(8, 8), nn.Linear(8, 8)
        self.ready = False

    def forward(self, x):
        h = torch.relu(self.first(x))
        if not self.ready:
            with self.lock:
                self.ready = True
        return self.second(h)


def test_what_a_model_does_on_its_first_call_only_is_not_planned():
    # catches: planning the first call where every later step is another graph, which the
    # runtime then ran under a plan carried over (segformer: its peak 6 KB over the prediction)
    model, x = _HookedOnFirstCall().train(), torch.randn(4, 8)
    first = [g.graph.fingerprint() for g in capture(model, (x,))]
    assert first == [g.graph.fingerprint() for g in capture(model, (x,))]


class _Checkpointed(nn.Module):
    """A block run under torch.utils.checkpoint, with or without a BatchNorm inside."""

    def __init__(self, batch_norm: bool) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.norm = nn.BatchNorm2d(4) if batch_norm else nn.Identity()

    def block(self, x):
        return torch.relu(self.norm(self.conv(x)))

    def forward(self, x):
        return checkpoint(self.block, x, use_reentrant=False).sum()


def test_a_model_that_checkpoints_its_own_batch_norm_is_refused():
    # catches: planning it, after which its running statistics were updated once a step where
    # eager PyTorch updates them twice (DenseNet's memory_efficient=True: 0.14 apart)
    x = torch.randn(2, 3, 8, 8)
    eager = _Checkpointed(batch_norm=True).train()
    eager(x).backward()
    assert eager.norm.num_batches_tracked == 2  # the premise: one step, two updates
    with pytest.raises(UserError, match="checkpoints its own BatchNorm layers"):
        capture(_Checkpointed(batch_norm=True).train(), (x,))
    assert capture(_Checkpointed(batch_norm=False).train(), (x,))  # nothing updated twice


class _Constants(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = nn.Linear(8, 8)

    def forward(self, x):
        h = self.inner(x)
        h[:, :4] = 0
        return h * torch.tensor(2.0)


def test_constants_and_in_place_writes_in_the_forward():
    (captured,) = capture(_Constants().train(), (torch.randn(2, 8),))
    assert any(n.phase == BACKWARD for n in captured.graph.nodes)


def test_buffers_a_forward_resizes_or_assigns_anew_are_put_back_after_planning():
    # a QAT-prepared model (torch.ao.quantization.prepare_qat) stopped planning with an
    # internal error ("The size of tensor a (8) must match the size of tensor b (0)"): its
    # observers' empty ranges, resized by the capture's forward, could not take their old
    # values back; and a buffer assigned anew kept the capture's count. catches: buffers put
    # back by copying into the tensors they were, or into the tensors the names hold now
    model, x = RangeObserved(), torch.randn(2, 3, 8, 8)
    calls = model.calls
    plan = explorer.Planner(model, (x,))
    front = plan.sweep(points=3)
    assert model.low.shape == (0,)
    assert model.calls is calls and int(calls) == 0
    report = front.points[0].schedule.verify()
    assert report.ok, report.format_table()
    assert model.low.shape == (0,) and model.calls is calls and int(calls) == 0


class _JitteredInput(nn.Module):
    """As transformers' Switch Transformers routes: its second graph scales its input (a
    tensor the first graph made) in place by random jitter and returns a view of it, which
    AOTAutograd writes back into the input and adds to the joint graph untagged."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.router, self.b = nn.Linear(32, 64), nn.Linear(64, 4), nn.Linear(64, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.a(x).view(8, 4, 64)
        torch._dynamo.graph_break()
        h *= torch.empty_like(h).uniform_(0.9, 1.1)
        logits = self.router(h)
        flat = h.view(-1, 64)
        torch._dynamo.graph_break()  # (Switch's experts take a data-dependent path)
        return self.b(flat) + logits.view(-1, 4)


def test_an_untagged_view_the_forward_returns_is_the_forwards():
    # the view was taken for the backward's (untagged operators were), so the forward never
    # computed it and capture failed inside the partitioner ("KeyError: view_7"; Switch
    # Transformers could not be planned). catches: untagged operators left to the backward
    torch.manual_seed(0)
    x = torch.randn(32, 32)
    plan = explorer.Planner(_JitteredInput(), (x,))
    assert len(plan.capture()) == 3
    report = plan.baseline().verify()
    assert report.ok, report.format_table()


def test_spectral_norm_power_iteration_is_pinned():
    """Operators that read a buffer the forward overwrites must never be recomputed."""
    model = nn.Sequential(nn.utils.parametrizations.spectral_norm(nn.Linear(8, 8)), nn.ReLU())
    (captured,) = capture(model.train(), (torch.randn(4, 8),))
    graph = captured.graph
    overwritten = {n.inputs[0][0] for n in graph.nodes if n.phase == EFFECT}
    readers = [
        n for n in graph.nodes if n.phase == FORWARD and any(r[0] in overwritten for r in n.inputs)
    ]
    assert readers and all(n.pinned for n in readers)
    # BatchNorm reads its running statistics too, but its outputs do not depend on them
    bn = capture(build("sample:tiny_cnn", 2, 8).model, (torch.randn(2, 3, 8, 8),))[0].graph
    norms = [n for n in bn.nodes if "batch_norm_legit_functional" in n.target]
    assert norms and not any(n.pinned for n in norms)


def test_nothing_to_train_is_a_clear_error():
    model = nn.Linear(4, 4).requires_grad_(False)
    with pytest.raises(UserError, match="nothing to plan: no graph .* needs a gradient"):
        capture(model, (torch.randn(2, 4),))


def test_what_the_frames_hold_is_read_through_containers_and_objects():
    # catches: a tensor inside a list, a dict or a plain object missed (Faster R-CNN keeps its
    # images in an ImageList), a module opened (its state is the model's), a tensor without a
    # plain storage (sparse) ending the capture, the stop frame's own locals read, or a
    # storage still taken for alive once nothing holds it
    def held_in(frame_of):
        return frame_of()

    def outer():
        spare = torch.zeros(100)  # noqa: F841 (the stop frame's local: not read)
        return middle()

    def middle():
        dense, nested = torch.zeros(10), {"a": [torch.ones(3)]}  # noqa: F841
        box, layer = SimpleNamespace(t=torch.ones(5)), nn.Linear(2, 2)  # noqa: F841
        sparse = torch.sparse_coo_tensor(torch.tensor([[0], [0]]), torch.tensor([1.0]), (2, 2))  # noqa: F841
        return held_in(lambda: held_by_frames(outer.__code__))

    held = outer()
    assert sorted(h.nbytes for h in held) == [12, 20, 40]
    assert not any(h.alive for h in held)  # their frames have returned


def test_a_sparse_gradient_is_refused_in_one_line():
    # an nn.Embedding(sparse=True) failed while profiling with PyTorch's own error
    model = nn.Sequential(nn.Embedding(50, 8, sparse=True), nn.Linear(8, 3))
    with pytest.raises(UserError, match=r"sparse_coo tensor .*sparse=False"):
        capture(model, (torch.randint(0, 50, (2, 5)),))


class _DropsOutWhatItDoesNotReturn(nn.Module):
    """Drops out a branch whose result it never uses, then what it returns: eager PyTorch
    draws both masks, torch.compile leaves the first draw out."""

    def __init__(self, unused_branch: bool) -> None:
        super().__init__()
        self.lin, self.drop = nn.Linear(8, 8), nn.Dropout(0.5)
        self.unused_branch = unused_branch

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.lin(x)
        if self.unused_branch:
            self.drop(h * 2)
        return self.drop(h)


def test_a_forward_that_draws_otherwise_under_compile_is_warned_about():
    # catches: no check, so that a plan silently trains with other dropout masks than the
    # unmodified model (transformers' CANINE, whose classifier never reads its character
    # encoder's output: outputs and gradients up to 0.06 apart, as under plain torch.compile)
    x = torch.randn(4, 8)
    with pytest.warns(RematWarning, match="draws other random numbers"):
        capture(_DropsOutWhatItDoesNotReturn(unused_branch=True), (x,))
    with warnings.catch_warnings():
        warnings.simplefilter("error", RematWarning)
        capture(_DropsOutWhatItDoesNotReturn(unused_branch=False), (x,))


@pytest.mark.parametrize("unused_branch", [True, False])
def test_verify_says_when_the_wrapped_step_drew_other_random_numbers(tmp_path, unused_branch):
    # catches: verify's rows failing without saying why (the note), or the note on a step
    # that drew the same numbers
    torch.manual_seed(0)
    model, x = _DropsOutWhatItDoesNotReturn(unused_branch), torch.randn(4, 8)
    plan = explorer.Planner(model, (x,))
    path = tmp_path / "planned.py"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RematWarning)
        plan.baseline().export(path)
    outputs = explorer.verify(path, model=model, example_inputs=(x,)).rows[1]
    assert outputs.quantity == "outputs"
    assert outputs.ok is not unused_branch
    assert ("drew other random numbers" in outputs.note) is unused_branch


@pytest.mark.parametrize("own", [False, True])
def test_layers_that_torch_compile_runs_eagerly_are_named(own):
    """Dynamo meets `self.rnn` (an nn.LSTM) as an attribute it cannot resume after, so it runs
    the LSTM and the rest of the forward eagerly: the head's layers, which no plan reaches, are
    named in a warning. The advice it gives holds: in a module of its own the LSTM is a break
    Dynamo resumes after, and only the LSTM is left out. catches: no word of the layers left
    out (the front then looks like the whole model's), a parameter the graphs read named"""
    torch.manual_seed(0)
    plan = explorer.Planner(RecurrentInTheMiddle(own), torch.randn(2, 5, 8))
    with pytest.warns(RematWarning, match="used by code that torch.compile runs eagerly"):
        graphs = plan.capture()
    lstm = [f"rnn.{'rnn.' if own else ''}{name}" for name, _ in nn.LSTM(8, 8).named_parameters()]
    head = ["head.0.weight", "head.0.bias", "head.2.weight", "head.2.bias"]
    assert plan.outside_graphs() == (lstm if own else lstm + head)
    assert len(graphs) == (2 if own else 1)


def test_a_model_its_graphs_read_whole_gets_no_word_of_eager_layers():
    plan = explorer.Planner(nn.Sequential(nn.Linear(8, 8), nn.ReLU()), torch.randn(2, 8))
    with warnings.catch_warnings():
        warnings.simplefilter("error", RematWarning)
        plan.capture()
    assert plan.outside_graphs() == []
