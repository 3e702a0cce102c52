"""The runtime in ordinary training code: PyTorch's own guards decide when a graph is captured
again, and every new graph gets the plan (exact, resized or carried over). Each case compares
against the unmodified model, bitwise: a wrapped model that trains differently with no error
is the failure these tests exist to catch."""

from __future__ import annotations

import copy
import io
import itertools
import random
import threading
import warnings

import numpy
import pytest
import torch
from helpers import PassBlock, Passes, assert_as_predicted, live_bytes_by_operator
from torch import nn
from torch.utils.checkpoint import checkpoint

import explorer
from explorer import stepsolver
from explorer.backend import (
    EXACT,
    MAPPED,
    RECOMPILES,
    RESIZED,
    RematError,
    RematWarning,
    _sizes,
    dynamo_settings,
    wrap_with_schedule,
)
from explorer.capture import capture
from explorer.costmodel import analytic_profile
from explorer.models import build
from explorer.profile import StepProfile
from explorer.program import FUSED_PREFIX, MASKS, baseline_schedule, schedule_from_saved
from explorer.schedule import Schedule
from explorer.verify import training_step


def _lowest(model: nn.Module, *args, **kwargs):
    """Plan `model` and return (planner, its lowest front point's schedule)."""
    plan = explorer.Planner(model, args, kwargs)
    front = plan.sweep(points=3)
    schedule = front.points[0].schedule
    return plan, schedule


def _wrap(plan, schedule, model: nn.Module | None = None):
    target = copy.deepcopy(plan.model if model is None else model)
    return wrap_with_schedule(target, plan.made_for(), schedule.to_dict())


def _same_grads(a: nn.Module, b: nn.Module) -> bool:
    pairs = list(zip(a.parameters(), b.parameters(), strict=True))
    return all(
        (p.grad is None and q.grad is None)
        or (p.grad is not None and q.grad is not None and torch.equal(p.grad, q.grad))
        for p, q in pairs
    )


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1),
        nn.BatchNorm2d(8),
        nn.ReLU(),
        nn.Conv2d(8, 8, 3, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(8, 2),
    ).train()


@pytest.fixture(scope="module")
def planned():
    x = torch.randn(4, 3, 16, 16)
    plan, schedule = _lowest(_net(), x)
    assert schedule.recomputed, "the lowest point must recompute something"
    return plan, schedule, x


def test_the_exported_plan_runs_exactly(planned):
    plan, schedule, x = planned
    reference, wrapped = copy.deepcopy(plan.model), _wrap(plan, schedule)
    reference(x).sum().backward()
    wrapped(x).sum().backward()
    assert [p.how for p in wrapped.plans] == [EXACT]
    assert _same_grads(reference, wrapped.model)


def test_input_gradients_reach_the_input(planned):
    """A generator feeding a wrapped discriminator must train (once broken: no input grad)."""
    plan, schedule, x = planned
    reference, wrapped = copy.deepcopy(plan.model), _wrap(plan, schedule)
    generator = nn.Conv2d(3, 3, 1)
    fake_a = generator(x)
    fake_b = copy.deepcopy(generator)(x)
    reference(fake_a).sum().backward()
    wrapped(fake_b).sum().backward()
    assert fake_b.grad_fn is not None and _same_grads(reference, wrapped.model)
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    (ga,) = torch.autograd.grad(reference(xa).sum(), xa)
    (gb,) = torch.autograd.grad(wrapped(xb).sum(), xb)
    assert torch.equal(ga, gb)


def test_double_backward_is_refused_as_pytorch_refuses_it(planned):
    plan, schedule, x = planned
    wrapped = _wrap(plan, schedule)
    xb = x.clone().requires_grad_()
    torch.autograd.grad(wrapped(xb).sum(), xb)  # the graph's first backward frees as it goes
    (grad,) = torch.autograd.grad(wrapped(xb).sum(), xb, create_graph=True)
    with pytest.raises(RuntimeError, match="double backward"):
        grad.square().sum().backward()


def test_retain_graph_twice_accumulates_like_the_model(planned):
    """Once broken: "compiled with non-empty donated buffers" on the retained backward of a
    graph whose first backward was an ordinary one."""
    plan, schedule, x = planned
    reference, wrapped = copy.deepcopy(plan.model), _wrap(plan, schedule)
    for model in (reference, wrapped):
        model(x).sum().backward()
        out = model(x).sum()
        out.backward(retain_graph=True)
        out.backward()
    assert _same_grads(reference, wrapped.model)


def test_unfrozen_layers_get_gradients(planned):
    plan, schedule, x = planned
    reference = copy.deepcopy(plan.model)
    reference[0].requires_grad_(False)
    wrapped = _wrap(plan, schedule, reference)
    reference(x).sum().backward()
    wrapped(x).sum().backward()
    assert wrapped.model[0].weight.grad is None
    reference[0].requires_grad_(True)
    wrapped.model[0].requires_grad_(True)
    reference(x).sum().backward()
    wrapped(x).sum().backward()
    assert wrapped.model[0].weight.grad is not None  # once broken: never got a gradient
    assert _same_grads(reference, wrapped.model)


def test_parameter_guards_are_kept_while_the_wrapped_model_runs():
    """PyTorch 2.11's Dynamo skips a parameter's guards (its `requires_grad` among them) while
    its module's parameter dict is unchanged, and there the test above failed: the unfrozen
    layer kept the capture made while it was frozen and got no gradient. The wrapped model
    runs with those guards kept. CI's PyTorch guards `requires_grad` either way, so the test
    above cannot fail here; this one checks the setting that fixed it on 2.11."""
    assert torch._dynamo.config.skip_tensor_guards_with_matching_dict_tags  # PyTorch's default
    with dynamo_settings():
        assert not torch._dynamo.config.skip_tensor_guards_with_matching_dict_tags


def test_the_settings_hold_in_every_block_and_are_put_back_after_the_outermost():
    # catches: the settings' patches, made once per thread and entered by the outermost block
    # only, left unentered after a first block (a flag never reset, after an error too), put
    # back by an inner block while the outer one runs, or missing in another thread
    default = torch._dynamo.config.recompile_limit
    for _ in range(2):
        with pytest.raises(ValueError), dynamo_settings():
            raise ValueError
        with dynamo_settings():
            with dynamo_settings():
                assert torch._dynamo.config.recompile_limit == RECOMPILES
            assert torch._dynamo.config.recompile_limit == RECOMPILES
            assert not torch._functorch.config.donated_buffer
        assert torch._dynamo.config.recompile_limit == default
    seen: list[int] = []

    def in_another_thread() -> None:
        with dynamo_settings():
            seen.append(torch._dynamo.config.recompile_limit)

    with dynamo_settings():
        thread = threading.Thread(target=in_another_thread)
        thread.start()
        thread.join()
    assert seen == [RECOMPILES]


def test_batchnorm_put_in_eval_after_wrap(planned):
    plan, schedule, x = planned
    reference, wrapped = copy.deepcopy(plan.model), _wrap(plan, schedule)
    reference[1].eval()
    wrapped.model[1].eval()
    for model in (reference, wrapped):
        model(x).sum().backward()
    # once broken: batch statistics were still used and the running statistics moved
    assert torch.equal(reference[1].running_mean, wrapped.model[1].running_mean)
    assert int(wrapped.model[1].num_batches_tracked) == int(plan.model[1].num_batches_tracked)
    assert _same_grads(reference, wrapped.model)
    assert wrapped.plans[-1].how == MAPPED


def test_forward_hooks_fire_with_real_tensors(planned):
    plan, schedule, x = planned
    wrapped = _wrap(plan, schedule)
    wrapped(x).sum().backward()  # compiled before the hook exists
    seen: list[torch.Tensor] = []
    handle = wrapped.model[2].register_forward_hook(lambda _m, _i, out: seen.append(out))
    wrapped(x).sum().backward()
    handle.remove()
    wrapped(x).sum().backward()
    assert len(seen) == 1 and type(seen[0]) is torch.Tensor and seen[0].shape == (4, 8, 16, 16)


def test_a_smaller_last_batch_and_a_larger_one(planned):
    plan, schedule, x = planned
    reference, wrapped = copy.deepcopy(plan.model), _wrap(plan, schedule)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RematWarning)  # smaller: no warning
        for model in (reference, wrapped):
            model(x[:3]).sum().backward()
    assert wrapped.plans[-1].how == RESIZED and _same_grads(reference, wrapped.model)
    big = torch.randn(32, 3, 16, 16)
    with pytest.warns(RematWarning, match="more than its budget"):
        wrapped(big).sum().backward()
    with warnings.catch_warnings():
        warnings.simplefilter("error", RematWarning)  # said once, not at every step
        wrapped(big).sum().backward()


def test_an_over_budget_warning_shows_two_different_sizes():
    # catches: "needs 0.1 MiB under the carried-over plan, more than its budget 0.1 MiB",
    # which five of these tests' warnings read
    assert _sizes(120_000, 110_000) == ("120000 bytes", "110000 bytes")
    assert _sizes(3 * 2**20, 2**20) == ("3.0 MiB", "1.0 MiB")


def test_channels_last_and_permuted_inputs(planned):
    plan, schedule, x = planned
    for variant in (
        x.to(memory_format=torch.channels_last),
        x.permute(0, 1, 3, 2).contiguous().permute(0, 1, 3, 2),
    ):
        reference, wrapped = copy.deepcopy(plan.model), _wrap(plan, schedule)
        reference(variant).sum().backward()
        wrapped(variant).sum().backward()
        assert _same_grads(reference, wrapped.model)


def test_pickle_and_deepcopy_keep_training(planned):
    plan, schedule, x = planned
    wrapped = _wrap(plan, schedule)
    buffer = io.BytesIO()
    torch.save(wrapped, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False)
    copied = copy.deepcopy(wrapped)
    reference = copy.deepcopy(plan.model)
    reference(x).sum().backward()
    for model in (loaded, copied):
        model(x).sum().backward()
        assert [p.how for p in model.plans] == [EXACT]
        assert _same_grads(reference, model.model)
    assert set(wrapped.state_dict()) == {f"model.{k}" for k in plan.model.state_dict()}


def test_no_grad_runs_the_model_unchanged(planned):
    plan, schedule, x = planned
    wrapped = _wrap(plan, schedule).eval()
    with torch.no_grad():
        assert torch.equal(wrapped(x[:1]), copy.deepcopy(plan.model).eval()(x[:1]))
    assert wrapped.plans == []


class _Flags(nn.Module):
    """A forward that reads a Python flag and Python's random module."""

    def __init__(self) -> None:
        super().__init__()
        self.first = nn.Linear(8, 8)
        self.second = nn.Linear(8, 8)
        self.double = False

    def forward(self, x):
        h = self.first(x).relu()
        if self.double:
            h = h * 2
        if random.random() < 0.5:
            h = h + 1
        return self.second(h)


def test_python_flags_and_random_are_followed():
    x = torch.randn(4, 8)
    torch.manual_seed(0)
    plan, schedule = _lowest(_Flags(), x)
    reference, wrapped = copy.deepcopy(plan.model), _wrap(plan, schedule)
    for double in (False, True):
        reference.double = wrapped.model.double = double
        for seed in range(4):
            random.seed(seed)
            expected = reference(x)
            random.seed(seed)
            assert torch.equal(wrapped(x), expected), (double, seed)


class _NumpyMask(nn.Module):
    """Rows masked from NumPy's generator, as transformers' HuBERT draws its SpecAugment
    masks, then a dropout from torch's."""

    def __init__(self) -> None:
        super().__init__()
        self.first, self.second = nn.Linear(32, 64), nn.Linear(64, 4)
        self.drop = nn.Dropout(0.2)

    def forward(self, x):
        h = torch.tanh(self.first(x))
        keep = torch.from_numpy(numpy.random.rand(x.shape[0]) < 0.7).to(h.dtype)
        return self.second(self.drop(h * keep[:, None]))


def test_numpy_draws_are_numpys_own_in_the_wrapped_model():
    # HuBERT's verify FAILED (gradients NOT equal) at every point: Dynamo traced NumPy's
    # random functions as torch's, so the wrapped model drew other masks than the unmodified
    # one, and moved torch's generator under its dropouts; and verify's step seeded torch's
    # generator only. catches: either (each undone was checked), or planning leaving NumPy's
    # generator elsewhere than it found it
    x = torch.randn(16, 32)
    torch.manual_seed(0)
    numpy.random.seed(5)
    plan, schedule = _lowest(_NumpyMask(), x)
    assert numpy.random.rand() == numpy.random.RandomState(5).rand()
    report = schedule.verify()
    assert report.ok, report.format_table()
    reference, wrapped = copy.deepcopy(plan.model), _wrap(plan, schedule)
    steps = []
    for caller in range(2):  # verify's step draws alike whatever the caller drew before
        numpy.random.seed(caller)
        steps.append(training_step(copy.deepcopy(reference), (x,), 0))
    assert all(torch.equal(a, b) for a, b in zip(*steps, strict=True))
    for seed in range(3):  # a loop that seeds both generators: the same steps
        for model in (reference, wrapped):
            torch.manual_seed(seed)
            numpy.random.seed(seed)
            model(x).sum().backward()
        assert _same_grads(reference, wrapped.model), seed


@pytest.mark.usefixtures("fresh_dynamo")
def test_a_path_that_runs_a_graph_again_is_warned_about_once():
    # catches: a step (another path than the one planned) running one graph more times than
    # the plan counts, going by without a word
    x = torch.randn(8, 32)
    torch.manual_seed(0)
    plan, schedule = _lowest(Passes(2), x)
    reference, wrapped = copy.deepcopy(plan.model), _wrap(plan, schedule)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RematWarning)
        wrapped(x).sum().backward()  # the path planned: no warning
    reference(x).sum().backward()
    reference.passes = wrapped.model.passes = 4
    with pytest.warns(RematWarning, match="ran one of its graphs 3 times, where the plan counts 1"):
        wrapped(x).sum().backward()
    reference(x).sum().backward()
    assert _same_grads(reference, wrapped.model)  # still exact: only the memory is off
    with warnings.catch_warnings():
        warnings.simplefilter("error", RematWarning)
        wrapped(x)  # once


class _RandomSkips(nn.Module):
    """Blocks each skipped at random, as LayerDrop skips layers: a branch on a draw inside the
    loop (a graph break there), the blocks' graph run once per block kept."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(PassBlock() for _ in range(8))

    def forward(self, x):
        for block in self.blocks:
            if torch.rand(()) < 0.5:
                x = block(x)
        return x


@pytest.mark.usefixtures("fresh_dynamo")
def test_a_random_branch_is_planned_on_the_path_verify_takes():
    # catches: the capture drawing from the caller's random state, so that the plan counts
    # the blocks another draw kept than verify's step (seed 0) keeps, and the prediction is
    # off by whole blocks (verify failed)
    x = torch.randn(64, 32)
    torch.manual_seed(0)
    model = _RandomSkips()
    torch.manual_seed(7)  # the caller's state: its draws keep one block fewer than seed 0's
    plan = explorer.Planner(model, x)
    report = plan.sweep(points=3).points[0].schedule.verify()
    peak = next(r for r in report.rows if r.quantity == "peak memory (bytes)")
    assert report.ok and peak.measured == peak.predicted, report.format_table()


class _TwoSizes(nn.Module):
    """Blocks applied in a loop Dynamo splits, each to two inputs of different batch sizes:
    per pass two graphs of one structure and different sizes."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(PassBlock() for _ in range(4))
        self.passes = (3, 3)

    def forward(self, a, b):
        for k, block in enumerate(self.blocks):
            torch._dynamo.graph_break()
            if k < self.passes[0]:
                a = block(a)
            if k < self.passes[1]:
                b = block(b)
        return a.sum() + b.sum()


@pytest.mark.usefixtures("fresh_dynamo")
def test_runs_beyond_the_plan_are_counted_per_graph_not_per_structure():
    # catches: a graph that runs more often than planned going by without a word because a
    # graph of the same structure (the same block at another batch size) runs less often
    torch.manual_seed(0)
    a, b = torch.randn(8, 32), torch.randn(4, 32)
    plan = explorer.Planner(_TwoSizes(), (a, b))
    wrapped = _wrap(plan, plan.sweep(points=3).points[0].schedule)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RematWarning)
        wrapped(a, b).backward()  # as planned
    wrapped.model.passes = (4, 2)
    with pytest.warns(RematWarning, match="ran one of its graphs 3 times, where the plan counts 2"):
        wrapped(a, b).backward()


@pytest.mark.usefixtures("fresh_dynamo")
@pytest.mark.parametrize("shared", [False, True], ids=["four blocks", "one block four times"])
def test_a_loop_whose_graph_runs_at_every_pass_is_planned_to_the_byte(shared):
    """Dynamo splits the loop at every pass and runs one graph for the second to the fourth
    block: each run is a graph of the step, all runs under one schedule (the runtime has one
    per compiled graph). catches: the runs counted as one (the peak was 33% over the
    prediction; capture refused such steps before), the runs' schedules told apart, their
    seconds counted once, a block called again having its parameters' gradient counted once
    per run (after every operator of the first run's backward: 33,408 bytes over), and a
    plan counting every run still warned about"""
    torch.manual_seed(0)
    x = torch.randn(256, 32)
    plan = explorer.Planner(Passes(4, shared=shared), x)
    front = plan.sweep(points=4)
    lowest = front.points[0].schedule
    first, *again = lowest.graphs
    assert len(again) == 3 and again[0].recomputed
    assert all(run.to_dict() == again[0].to_dict() for run in again)
    assert lowest.predicted_peak_bytes < 0.8 * front.baseline_peak_bytes
    seconds = first.predicted_seconds + 3 * again[0].predicted_seconds
    assert lowest.predicted_seconds == pytest.approx(seconds)
    for point in front.points:
        rows = live_bytes_by_operator(plan, point.schedule, (x,))
        assert_as_predicted(rows)
    report = lowest.verify()
    peak = next(r for r in report.rows if r.quantity == "peak memory (bytes)")
    assert report.ok and peak.measured == peak.predicted, report.format_table()
    wrapped = _wrap(plan, lowest)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RematWarning)
        wrapped(x).sum().backward()


class _EagerBetween(nn.Module):
    """A stem, a loop Dynamo cannot resume inside (a graph break at every pass: this frame runs
    eagerly, and so do torch's own LayerNorm modules it calls) and a head. The stem's and the
    blocks' forwards are graphs, the blocks' one run at every pass; this frame's operators run
    outside every graph."""

    def __init__(self) -> None:
        super().__init__()
        self.stem, self.blocks = PassBlock(), nn.ModuleList(PassBlock() for _ in range(3))
        self.norm, self.head = nn.LayerNorm(32), nn.LayerNorm(32)

    def forward(self, x):
        x = x.flip(-1)  # the stem's input, made during the step
        s = self.stem(x)
        # saves the stem's output (which outlives the forward so) and the norm's input; the
        # norm's parameters get their gradients outside every graph
        a = s.sin() * x
        h = self.norm(a)
        noise = torch.full_like(h, 0.5)  # only this frame holds it, through the blocks
        for block in self.blocks:
            torch._dynamo.graph_break()
            h = block(h).relu()  # the block's output, which only eager code reads, let go
        # the cosines' gradients, for the stem's output and for the product, wait through the
        # blocks' backwards; the head's output and its tangent are the user's
        return self.head(h + s.cos() + a.cos() + noise)


@pytest.mark.usefixtures("fresh_dynamo")
def test_eager_code_between_graphs_is_predicted_after_every_operator():
    """What the model's operators outside every graph hold (explorer.eager), counted where it
    lives; the stem's output, which only eager code reads, freed when the forward returns; the
    stem's input, made during the step, handed over like a later graph's. Measured before:
    101,888 bytes under on Wav2Vec2 with LayerDrop (its encoder runs so), and on an earlier
    form of this model up to 100,608 bytes under. catches: any part of
    explorer.program.EagerCode left out (each is checked to be there), the product's gradient
    not waiting for eager code, a kept tensor counted again while its graph keeps it, the
    stem's output held through the backwards, or the stem's input counted nowhere"""
    torch.manual_seed(0)
    x = torch.randn(256, 32)
    model = _EagerBetween()
    runs = capture(copy.deepcopy(model), (x,))
    eager = [run.handoff.eager for run in runs]
    for part in ("saved", "kept", "grads", "waiting", "backward", "locals"):
        assert any(getattr(e, part) for e in eager), part
    assert any(run.handoff.released for run in runs)
    plan = explorer.Planner(model, x)
    front = plan.sweep(points=4)
    assert len(front.points) > 2
    for point in front.points:
        rows = live_bytes_by_operator(plan, point.schedule, (x,))
        assert_as_predicted(rows)


def test_spectral_norm_trains_like_the_model():
    """Its power iteration reads buffers the forward overwrites: recomputing it would read the
    new values (once broken: gradients off by ~3e-3)."""
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.utils.parametrizations.spectral_norm(nn.Linear(8, 8)), nn.ReLU(), nn.Linear(8, 1)
    )
    x = torch.randn(4, 8)
    plan, schedule = _lowest(model, x)
    reference, wrapped = copy.deepcopy(plan.model), _wrap(plan, schedule)
    for _ in range(2):
        for m in (reference, wrapped):
            m(x).sum().backward()
    assert _same_grads(reference, wrapped.model)
    assert all(
        torch.equal(a, b) for a, b in zip(reference.buffers(), wrapped.model.buffers(), strict=True)
    )


class _Recurrent(nn.Module):
    """Dynamo runs the recurrent layer eagerly (a graph break): the layers around it are
    planned, and its own dropout draws exactly what the unmodified model draws."""

    def __init__(self, cell: type[nn.Module]) -> None:
        super().__init__()
        self.embed = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 8))
        self.rnn = cell(8, 8, num_layers=2, dropout=0.5, batch_first=True)
        self.head = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))

    def forward(self, x):
        h = self.embed(x)  # a statement of its own: Dynamo resumes after the break
        h, _ = self.rnn(h)
        return self.head(h)


@pytest.mark.parametrize("cell", [nn.LSTM, nn.GRU])
def test_recurrent_layers_with_dropout(cell):
    torch.manual_seed(0)
    x = torch.randn(2, 5, 8)
    plan, schedule = _lowest(_Recurrent(cell), x)
    reference, wrapped = copy.deepcopy(plan.model), _wrap(plan, schedule)
    torch.manual_seed(1)
    expected = reference(x)
    torch.manual_seed(1)
    got = wrapped(x)
    assert torch.equal(expected, got)
    expected.sum().backward()
    got.sum().backward()
    assert _same_grads(reference, wrapped.model)


def test_recomputed_dropout_masks_leave_the_generator_where_eager_leaves_it():
    """A recomputed mask is drawn again from its saved generator state, and the generator is put
    back: steps that are not reseeded (each step's dropout draws from where the last one left
    the generator) end bitwise where the unmodified model ends, and so does the next draw."""
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(32, 256), nn.ReLU(), nn.Dropout(0.5),
        nn.Linear(256, 256), nn.GELU(), nn.Dropout(0.3),
        nn.Linear(256, 1),
    ).train()  # fmt: skip
    x = torch.randn(64, 32)
    plan, schedule = _lowest(model, x)
    assert any("bernoulli_mask" in name for name in schedule.recomputed_ops())
    reference, wrapped = copy.deepcopy(plan.model), _wrap(plan, schedule)
    ends = []
    for m in (reference, wrapped):
        torch.manual_seed(5)
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        for _ in range(3):
            opt.zero_grad()
            m(x).square().mean().backward()
            opt.step()
        ends.append((torch.rand(3), [p.detach().clone() for p in m.parameters()]))
    (expected_draw, expected), (draw, got) = ends
    assert torch.equal(draw, expected_draw)
    assert all(torch.equal(a, b) for a, b in zip(expected, got, strict=True))


class _Odd(nn.Module):
    """Constants, an in-place write, and outputs that are the input, a view and a parameter."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = nn.Linear(8, 8)

    def forward(self, x):
        h = self.inner(x)
        h[:, :4] = 0
        return {"out": h * torch.tensor(2.0), "input": x, "view": x[:, :2], "w": self.inner.weight}


def test_odd_outputs_and_constants():
    torch.manual_seed(0)
    x = torch.randn(4, 8)
    plan, schedule = _lowest(_Odd(), x)
    reference, wrapped = copy.deepcopy(plan.model), _wrap(plan, schedule)
    for model in (reference, wrapped):
        out = model(x)
        assert out["input"] is x or torch.equal(out["input"], x)
        (out["out"].sum() + out["w"].sum() + out["view"].sum()).backward()
    assert _same_grads(reference, wrapped.model)


def test_another_model_is_refused_in_one_line(planned):
    plan, schedule, _x = planned
    other = nn.Sequential(nn.Linear(3, 3))
    with pytest.raises(RematError, match="made for .*this model has 2") as info:
        wrap_with_schedule(other, plan.made_for(), schedule.to_dict())
    assert "\n" not in str(info.value)


def test_a_hand_edited_schedule_is_refused(planned):
    plan, schedule, x = planned
    data = schedule.to_dict()
    data["graphs"][0]["backward"] = data["graphs"][0]["backward"][1:]  # drop the first step
    wrapped = wrap_with_schedule(copy.deepcopy(plan.model), plan.made_for(), data)
    with pytest.raises(Exception, match="does not run on this graph|never makes"):
        wrapped(x).sum().backward()


class _TwoGraphs(nn.Module):
    """Data-dependent Python between two halves: Dynamo gives two graphs, each planned."""

    def __init__(self) -> None:
        super().__init__()
        self.first = nn.Sequential(nn.Linear(16, 64), nn.GELU(), nn.Linear(64, 64), nn.GELU())
        self.second = nn.Sequential(nn.Linear(64, 64), nn.GELU(), nn.Linear(64, 4))

    def forward(self, x):
        h = self.first(x)
        if h.mean() > 0:
            h = h * 2
        return self.second(h)


def test_several_graphs_are_planned_and_verified():
    torch.manual_seed(0)
    model, x = _TwoGraphs(), torch.randn(128, 16)
    plan, schedule = _lowest(model, x)
    assert len(schedule.graphs) == 2 and schedule.recomputed_ops()
    report = schedule.verify()
    assert report.ok, report.format_table()
    # the first graph also returns `h.mean() > 0` (a 1-byte bool) for Python to read, and
    # Python drops it: counted through the forward only (as an output the caller held, the
    # prediction was one byte over). catches: an output nobody holds counted as the user's
    peak = next(r for r in report.rows if r.quantity == "peak memory (bytes)")
    assert peak.predicted == peak.measured, report.format_table()


class _HandedOverAndSaved(nn.Module):
    """Two graphs; the first saves for its own backward the tensor it hands to the second
    (a tanh's output), and the model holds state neither reads."""

    def __init__(self) -> None:
        super().__init__()
        self.first = nn.Sequential(nn.Linear(32, 256), nn.Tanh(), nn.Linear(256, 256), nn.Tanh())
        self.second = nn.Sequential(nn.Linear(256, 256), nn.Tanh(), nn.Linear(256, 4))
        self.spare = nn.Linear(100, 100)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = self.first(x)
        torch._dynamo.graph_break()
        return self.second(hidden)


def test_a_step_of_two_graphs_is_predicted_to_the_byte():
    # it was 215,696 bytes over (12%, verify failed): the handed-over tensor counted by both
    # graphs (262,144), the first graph's tangent held through its whole backward though
    # autograd hands it over (262,144), the second graph's parameter gradients counted as
    # nothing where they are views (267,280 under), and the user's output and its tangent
    # forgotten during the first graph's backward (8,192 under). catches: any of the four
    torch.manual_seed(0)
    _verified_to_the_byte(_HandedOverAndSaved(), torch.randn(256, 32), graphs=2)


def _verified_to_the_byte(model: nn.Module, x: torch.Tensor, graphs: int):
    """Plan `model` without recomputation: it must make `graphs` graphs and verify, its peak
    predicted to the byte. Returns the planner and the schedule."""
    plan = explorer.Planner(model, x)
    schedule = plan.baseline()
    assert len(schedule.graphs) == graphs
    report = schedule.verify()
    peak = next(r for r in report.rows if r.quantity == "peak memory (bytes)")
    assert report.ok and peak.measured == peak.predicted, report.format_table()
    return plan, schedule


def _exact_after_every_operator(model: nn.Module, x: torch.Tensor, graphs: int) -> None:
    """`_verified_to_the_byte`, and the live bytes after every operator of the step as
    predicted."""
    plan, schedule = _verified_to_the_byte(model, x, graphs)
    assert_as_predicted(live_bytes_by_operator(plan, schedule, (x,)))


def test_a_runtime_that_keeps_handed_over_tangents_is_predicted_so(monkeypatch):
    """AOTAutograd in torch 2.11 and 2.12 keeps a graph's tangents through its backward,
    including the one autograd hands over for a tensor passed to a later graph; 2.13 and 2.14
    let it go after its last use. Measured on 2.11 and 2.12: this two-graph step peaks at
    2,224,624 bytes there and 1,962,480 on 2.13 and 2.14, each equal to the prediction made
    under that version, and the three-graph step below is exact after every operator on all
    four. Here, on one version, the prediction for the keeping runtime is one handed-over
    tangent (256 x 256 float32) above the other's; and after the three-graph step's last
    operator, the live bytes measured on each (the first graph's two handed-over tangents, 512
    x 256 float32 each, still alive on 2.11). catches: the flag ignored, or the kept tangents
    counted as the user's (alive through the earlier graphs' backwards too)."""
    peak, last = {}, {}
    for kept in (False, True):
        monkeypatch.setattr(explorer.capture, "HANDED_TANGENTS_KEPT", kept)
        torch.manual_seed(0)
        plan = explorer.Planner(_HandedOverAndSaved(), torch.randn(256, 32))
        peak[kept] = plan.baseline().predicted_peak_bytes
        torch.manual_seed(0)
        plan = explorer.Planner(_ThreeGraphs(), torch.randn(512, 32))
        line = plan.timeline(plan.baseline())
        last[kept] = line.steps[-1] - line.static_bytes
    assert peak == {False: 1_962_480, True: 1_962_480 + 256 * 256 * 4}
    assert last == {False: 1_731_856, True: 1_731_856 + 2 * 512 * 256 * 4}


class _ThreeGraphs(nn.Module):
    """Three graphs. The first hands two tensors to both later ones, which neither it nor
    the second saves for a backward (the Python frames hold them until the forward returns).
    The second saves one of them, and also saves what it hands to the third beside an output
    it returns to the user."""

    def __init__(self) -> None:
        super().__init__()
        self.first = nn.Sequential(nn.Linear(32, 256), nn.Tanh(), nn.Linear(256, 256))
        self.side = nn.Linear(32, 256)
        self.second = nn.Linear(256, 256)
        self.second_side = nn.Linear(256, 256)
        self.head = nn.Linear(256, 64)
        self.third = nn.Linear(256, 256)
        self.third_side = nn.Linear(256, 256)
        self.out = nn.Linear(256, 4)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h, k = self.first(x), self.side(x)
        torch._dynamo.graph_break()
        hidden = torch.tanh(self.second(torch.tanh(h)) + self.second_side(k))
        aux = self.head(hidden)
        torch._dynamo.graph_break()
        summed = self.third(hidden) + torch.tanh(h) + self.third_side(k)
        return self.out(torch.tanh(summed)), aux


def test_every_operator_of_a_three_graph_step_is_predicted_to_the_byte():
    # its peak was predicted 197,888 bytes (2.8%) under measured, inside verify's tolerance,
    # from nine errors: handed-over tangents held through the whole backward, a
    # middle graph's user output and tangent forgotten in the first graph's backward, earlier
    # graphs' user tangents forgotten in later backwards, handed-over inputs freed at their
    # last use where the frames hold them, a handed-over tensor its maker saves counted twice
    # or taken for a user output, one an earlier reader holds counted again, and the third
    # graph's gradients for the first graph's tensors forgotten in the second's backward.
    # catches: any one of the nine (each undone was checked)
    torch.manual_seed(0)
    x = torch.randn(512, 32)
    _exact_after_every_operator(_ThreeGraphs(), x, graphs=3)


class _HandedPastAGraph(nn.Module):
    """Four graphs, handing tensors over as transformers' I-BERT does (24 graphs): the
    first graph's two outputs go straight into a function that breaks the graph (I-BERT's
    QuantAct), so once it returns no frame holds them; that function's sum is read two
    graphs on, past a graph that does not read it (I-BERT's position embedding)."""

    def __init__(self) -> None:
        super().__init__()
        self.first, self.side = nn.Linear(32, 256), nn.Linear(32, 256)
        self.between = nn.Linear(32, 256)
        self.out = nn.Linear(256, 4)

    @staticmethod
    def mix(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        summed = 2 * a + 3 * b  # (a + b would hand one gradient to both: counted twice)
        torch._dynamo.graph_break()
        return summed

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        summed = self.mix(self.first(x), self.side(x))
        other = torch.tanh(self.between(x))
        torch._dynamo.graph_break()
        return self.out(2 * summed + other)


def test_tensors_handed_past_a_graph_or_let_go_by_the_frames_are_predicted_to_the_byte():
    # I-BERT's peak was predicted 5% over what it measured (verify FAILED its lowest
    # point): what a graph hands to later ones that no frame holds once the last of them has
    # read it was counted to the end of the step's forward (here the first graph's two
    # outputs, 131,072 bytes over from the third graph on); and, 4,096 bytes under at
    # I-BERT's third graph, a tensor passed to a graph further on than the next was counted
    # by nobody through the graphs in between (here the sum, 65,536 bytes under in the
    # third graph). catches: either (each undone was checked)
    torch.manual_seed(0)
    x = torch.randn(64, 32)
    _exact_after_every_operator(_HandedPastAGraph(), x, graphs=4)


class _LogitsReadByALossGraph(nn.Module):
    """Three graphs, as transformers' CTRL makes: a body, a head whose logits the model
    returns, and a loss graph that reads them."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(32, 256), nn.Tanh())
        self.head = nn.Linear(256, 128)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        hidden = self.body(x)
        torch._dynamo.graph_break()
        logits = self.head(hidden)
        torch._dynamo.graph_break()
        return logits, torch.logsumexp(logits, -1).mean()


def test_the_users_tangent_for_an_output_a_later_graph_reads_lives_through_earlier_backwards():
    # CTRL's lowest point measured 5.3% over its prediction (verify FAILED): the caller's own
    # tangent for the logits (its loss graph gets autograd's sum instead) was counted in the
    # head graph's backward only, not in the body's after it (here 64 x 128 float32 under
    # from the first graph's backward on). catches: that tangent left out there
    torch.manual_seed(0)
    x = torch.randn(64, 32)
    _exact_after_every_operator(_LogitsReadByALossGraph(), x, graphs=3)


@torch._dynamo.disable
def _shifted(x: torch.Tensor) -> torch.Tensor:
    """Eager code between two graphs, as Switch Transformers' encoder's last dropout runs."""
    return x + 1.0


class _EagerOutputReadByAGraph(nn.Module):
    """Two graphs; eager code between them makes an output the model returns and the second
    graph reads (Switch Transformers' encoder output, read by every decoder graph)."""

    def __init__(self) -> None:
        super().__init__()
        self.first = nn.Sequential(nn.Linear(32, 256), nn.Tanh())
        self.second = nn.Sequential(nn.Linear(256, 256), nn.Tanh(), nn.Linear(256, 4))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        encoded = _shifted(self.first(x))
        return encoded, self.second(encoded)


def test_an_output_eager_code_makes_and_a_graph_reads_is_counted_with_its_tangent():
    # Switch Transformers measured 8,192 bytes (0.9%) over its prediction (verify FAILED its
    # budget): its encoder's output, which an eager dropout makes, the user holds and the
    # decoder's graphs read, was taken for the user's input by those graphs (counted by none),
    # and its tangent with it (here 64 x 256 float32 under from the second graph on, twice
    # that in the backward). catches: either left out
    torch.manual_seed(0)
    x = torch.randn(64, 32)
    _exact_after_every_operator(_EagerOutputReadByAGraph(), x, graphs=2)


class _States:
    """A plain object, which pytree does not open (as Reformer's cache is)."""

    def __init__(self, states: list[torch.Tensor]) -> None:
        self.states = states


@torch._dynamo.disable
def _summarised(h: torch.Tensor) -> _States:
    """Eager code that keeps a state made without a gradient, as Reformer's reversible
    Function puts its layers' hidden states in its cache."""
    with torch.no_grad():
        return _States([torch.tanh(h)])


class _ReturnsAStateWithoutGradient(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.first, self.head = nn.Linear(32, 256), nn.Linear(256, 4)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, _States]:
        h = self.first(x)
        states = _summarised(h)
        return self.head(torch.relu(h)), states


def test_a_state_without_gradient_inside_an_object_the_model_returns_is_counted():
    # Reformer's cache holds hidden states its custom Function made without a grad_fn; only
    # tensors with one were taken from such objects, so the user's hold on them was left out
    # (Reformer 8,192 bytes under from its loss graph's backward on; here 64 x 256 float32).
    # catches: the state left out
    torch.manual_seed(0)
    x = torch.randn(64, 32)
    _exact_after_every_operator(_ReturnsAStateWithoutGradient(), x, graphs=2)


@torch._dynamo.disable
def _product(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Eager code that saves both its inputs for its backward."""
    return a * b


class _SavedByAReaderAndEagerCode(nn.Module):
    """Three graphs, as transformers' SEW makes: the first's output is read by the second,
    which saves it for its backward, and by eager code that saves it too (SEW's feature
    projection, which its position convolution's graph saves and which is added to that
    convolution's output eagerly)."""

    def __init__(self) -> None:
        super().__init__()
        self.first, self.second, self.third = (
            nn.Linear(32, 256),
            nn.Linear(256, 256),
            nn.Linear(256, 4),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.first(x)
        torch._dynamo.graph_break()
        return self.third(_product(h, self.second(h)))


def test_a_tensor_a_later_graph_and_eager_code_both_save_is_counted_once():
    # SEW's lowest point was predicted 20,224 bytes (2.3%) over what it measured, from its
    # last graph's backward to its encoder's: what eager code saved was counted again where the
    # graph it was handed to (not its maker) kept it for its own backward (here 64 x 256
    # float32 over in the last graph's backward). catches: that counted twice
    torch.manual_seed(0)
    x = torch.randn(64, 32)
    _exact_after_every_operator(_SavedByAReaderAndEagerCode(), x, graphs=3)


def test_dropouts_drawn_once_run_fused_and_are_predicted_after_every_operator():
    """A dropout the plan draws once runs as one `native_dropout` (explorer.rewrite.
    fuse_kept_dropouts), one whose mask the plan draws again stays split; the prediction
    follows both, after every operator: no recomputation (both fused), one mask drawn again
    (one fused), every mask drawn again (none). The split form cost sample:gpt 19 points of
    an H100's step time over plain aot_eager. catches: the runtime fusing and the program
    not (the split's operators never run), the program fusing and the runtime not
    (native_dropout never runs), a fused dropout's output or mask counted apart (its live
    bytes differ), each checked"""
    built = build("sample:tiny_dropout", 256)
    plan = explorer.Planner(built.model, built.example_inputs, spec=built.spec)
    (graph,) = plan.capture()
    masks = [n.name for n in graph.nodes if n.target in MASKS]
    assert len(masks) == 2
    kept = set(baseline_schedule(graph).saved)
    for keep, fused in ((kept, 2), (kept - {(masks[0], 0)}, 1), (set(), 0)):
        schedule = Schedule([schedule_from_saved(graph, keep)])
        rows = live_bytes_by_operator(plan, schedule, built.example_inputs)
        assert_as_predicted(rows)
        assert sum(row[0].startswith(FUSED_PREFIX) for row in rows) == fused


class _TwoConvHalves(nn.Module):
    """Two graphs of unequal size: eight conv blocks, then three and a classifier."""

    def __init__(self) -> None:
        super().__init__()

        def blocks(n: int) -> list[nn.Module]:
            return [m for _ in range(n) for m in (nn.Conv2d(16, 16, 3, padding=1), nn.ReLU())]

        self.first = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), *blocks(8))
        self.second = nn.Sequential(*blocks(3), nn.Flatten(), nn.Linear(16 * 16 * 16, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = self.first(x)
        torch._dynamo.graph_break()
        return self.second(hidden)


def test_a_step_of_two_graphs_takes_the_fastest_pairing_its_graphs_know(monkeypatch):
    # each graph took the same share of its own range: at 3 of these 5 budgets that cost
    # +11.41% where a pairing of schedules the graphs' solvers already knew costs +8.85%.
    # The options are those schedules and the ones that save less (StepSolver.options).
    # The drop pass that ends each answer (explorer.solvers.dropping) goes past every
    # pairing; here it has no time, so that what is checked is the pairings' search.
    # catches: the equal share alone
    monkeypatch.setattr(stepsolver, "DROP_SECONDS", 0.0)
    torch.manual_seed(0)
    plan = explorer.Planner(_TwoConvHalves(), torch.randn(8, 3, 16, 16))
    graphs = plan.capture()
    plan.use_profile(StepProfile([analytic_profile(g, "p100") for g in graphs], "p100", "p100"))
    step = plan.solver(name="table")  # the chain table's answers: no search time
    low, high = step.minimum().predicted_peak_bytes, step.baseline.predicted_peak_bytes
    for k in range(1, 6):
        budget = low + (high - low) * k // 6
        plan_at = step.solve(budget)
        options = [step.options(n) for n in range(len(step.solvers))]
        pairings = [
            (step.timeline(list(pair)).peak_bytes, sum(p.predicted_seconds for p in pair))
            for pair in itertools.product(*options)
        ]
        fastest = min(seconds for peak, seconds in pairings if peak <= budget)
        assert plan_at.predicted_peak_bytes <= budget
        assert plan_at.predicted_seconds == pytest.approx(fastest, rel=1e-12), k


def test_layers_the_user_froze_in_eval_mode_stay_so_and_are_planned_so(tmp_path):
    # Planner put the whole model in train mode: a user fine-tuning with frozen BatchNorm
    # found it updating running statistics again after planning, with no word. catches:
    # `model.train()` on a model whose own mode is train
    torch.manual_seed(0)
    model = build("sample:tiny_cnn", 4, 32).model
    frozen = [m for m in model.modules() if isinstance(m, nn.BatchNorm2d)]
    assert frozen
    for layer in frozen:
        layer.eval()
    before = [b.clone() for b in model.buffers()]
    x = torch.randn(4, 3, 32, 32)
    plan = explorer.Planner(model, x)
    report = plan.baseline().verify()
    assert not any(layer.training for layer in frozen)
    assert report.ok, report.format_table()
    wrapped = _wrap(plan, plan.baseline())
    wrapped(x).sum().backward()
    assert [p.how for p in wrapped.plans] == [EXACT]  # planned for the frozen layers
    assert all(torch.equal(a, b) for a, b in zip(before, wrapped.model.buffers(), strict=True))


class _IntoSlice(nn.Module):
    """Writes a layer's output into a slice of a larger zeroed buffer, as models shift or pad
    sequences; functionalized, `aten.copy` into the slice, which makes the whole buffer."""

    def __init__(self) -> None:
        super().__init__()
        self.inner, self.outer = nn.Linear(16, 16), nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        length = x.shape[1]
        buffer = x.new_zeros(x.shape[0], 4 * length, 16)
        buffer[:, 1 : 1 + length] = self.inner(x).relu()
        return self.outer(buffer).relu()


def test_a_copy_into_a_slice_is_counted_as_the_whole_buffer_it_makes():
    # catches: the copy counted as the slice's span (its traced value), where the kernel
    # returns that slice of a copy of the whole buffer (BART's shifted decoder inputs 8 bytes
    # over; here 1,536 bytes at the copy)
    torch.manual_seed(0)
    x = torch.randn(2, 8, 16)
    plan = explorer.Planner(_IntoSlice(), (x,))
    for point in plan.sweep(points=3).points:
        rows = live_bytes_by_operator(plan, point.schedule, (x,))
        assert any(row[0] == "copy" for row in rows)
        assert_as_predicted(rows)


class _WritesIntoViews(nn.Module):
    """Writes in place into views of a layer's output that cover part of its storage (a
    slice of a shifted view, as transformers' Funnel does to its attention scores; a row; a
    diagonal); functionalized, scatters, whose kernels copy the whole storage."""

    def __init__(self) -> None:
        super().__init__()
        self.inner, self.outer = nn.Linear(16, 16), nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inner(x)  # (2, 4, 32, 16)
        shifted = h[:, :, 1:9].view(2, 4, 16, 8)
        shifted[..., :4] *= 2.0
        h[:, 0, 3] += 1.0
        h[0, 1, :16].diagonal().mul_(3.0)
        return self.outer(h).relu()


def test_a_write_into_a_view_is_counted_as_the_whole_storage_its_kernel_copies():
    # catches: the scatters counted as the span of their traced value, which PyTorch's fake
    # kernels allocate, where the kernel copies the whole storage of the view they write
    # into (transformers' Funnel 64 bytes over its lowest point's budget, verify FAILED; here
    # 1,536 bytes at its first slice_scatter)
    torch.manual_seed(0)
    x = torch.randn(2, 4, 32, 16)
    plan = explorer.Planner(_WritesIntoViews(), (x,))
    targets = {n.target for n in plan.capture()[0].nodes}
    scatters = {"slice_scatter", "select_scatter", "diagonal_scatter"}
    assert {f"aten.{s}.default" for s in scatters} <= targets
    for point in plan.sweep(points=3).points:
        rows = live_bytes_by_operator(plan, point.schedule, (x,))
        assert_as_predicted(rows)


class _HandsOverAView(nn.Module):
    """Two graphs (a break between them): the first hands the second a mask it made, as a
    view of part of its storage, as Longformer's first graph hands its attention mask on."""

    def __init__(self) -> None:
        super().__init__()
        self.gate, self.lin, self.out = nn.Linear(16, 256), nn.Linear(16, 16), nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.lin(x)
        mask = (self.gate(x) > 0).float()[:, :16]
        torch._dynamo.graph_break()
        return self.out(h) * mask


def test_a_view_handed_to_the_next_graph_is_counted_as_its_storage():
    # catches: the second graph's input counted by the view's span, 1,088 bytes, where it
    # holds the 2,048-byte storage behind it (Longformer's lowest point 956 bytes over its
    # prediction, so over its budget: verify FAILED)
    torch.manual_seed(0)
    x = torch.randn(2, 16)
    plan = explorer.Planner(_HandsOverAView(), (x,))
    assert len(plan.capture()) == 2
    rows = live_bytes_by_operator(plan, plan.baseline(), (x,))
    assert_as_predicted(rows)


class _CheckpointedEagerly(nn.Module):
    """A region the model checkpoints itself (torch.utils.checkpoint, non-reentrant) with a
    graph break inside, so that Dynamo runs it eagerly: its saved tensors are placeholders
    until the backward recomputes them, as in transformers' T5 with gradient checkpointing."""

    def __init__(self) -> None:
        super().__init__()
        self.up, self.down, self.head = nn.Linear(64, 256), nn.Linear(256, 64), nn.Linear(64, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        def region(t: torch.Tensor) -> torch.Tensor:
            t = self.up(t).relu()
            torch._dynamo.graph_break()
            return self.down(t).sin()

        return self.head(checkpoint(region, x, use_reentrant=False))


def test_what_an_eager_checkpoint_saves_is_counted_as_it_holds_it():
    # catches: the region's saved tensors read by unpacking them, which recomputes them,
    # and counted as held through the backward (predicted 385,600 bytes, measured 311,872:
    # verify FAILED; T5 with gradient checkpointing 13 to 15% over)
    torch.manual_seed(0)
    x = torch.randn(32, 64)
    plan = explorer.Planner(_CheckpointedEagerly(), (x,))
    for point in plan.sweep(points=3).points:
        report = point.schedule.verify()
        peak = next(r for r in report.rows if r.quantity == "peak memory (bytes)")
        assert report.ok and peak.measured == peak.predicted, report.format_table()


def test_a_model_in_a_wrapper_is_planned_wrapped_and_verified_as_the_module_inside(tmp_path):
    """torch.compile's wrapper names its parameters `_orig_mod.*`: a plan of it fitted neither
    the module itself nor, once wrapped again, the wrapper, and verify's reference ran the
    wrapper's inductor kernels (outputs 8.9e-8 apart, passed within tolerance). The module
    inside is the one planned, wrapped and verified, with a warning. catches: the wrapper
    planned, a file the module itself is refused by, verify against inductor's arithmetic"""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.Tanh(), nn.Linear(256, 256), nn.Tanh())
    x = torch.randn(32, 64)
    with pytest.warns(RematWarning, match="in torch.compile's wrapper; the module inside it"):
        plan = explorer.Planner(torch.compile(model), x)
    assert plan.model is model
    schedule = plan.sweep(points=2).points[0].schedule
    path = schedule.export(tmp_path / "inside.py")
    with pytest.warns(RematWarning, match="in torch.compile's wrapper"):
        report = explorer.verify(path, model=torch.compile(model), example_inputs=(x,))
    rows = {r.quantity: r for r in report.rows}
    assert report.ok and rows["outputs"].measured == "bitwise equal", report.format_table()
    made_for = plan.made_for()
    with pytest.warns(RematWarning, match="in torch.compile's wrapper"):
        wrapped = wrap_with_schedule(torch.compile(model), made_for, schedule.to_dict())
    assert wrapped.model is model
    with pytest.warns(RematWarning, match=r"in a RematModule \(wrapped with a schedule already\)"):
        again = wrap_with_schedule(wrapped, made_for, schedule.to_dict())
    assert again.model is model
    assert torch.equal(again(x), model(x))


class _SavedOutput(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.Sequential(
            nn.Linear(32, 256), nn.GELU(), nn.Linear(256, 256), nn.GELU(), nn.Linear(256, 8)
        )  # fmt: skip

    def forward(self, x):
        return torch.tanh(self.layers(x))  # a saved value, which the user holds


def test_a_model_called_twice_before_one_backward_is_warned_about_once():
    """A siamese or contrastive step calls the model twice before one backward: the first
    call's activations are held while the second runs, which a plan made for one call per step
    does not count. catches: no word of it (the peak over the budget, silently), and a word in
    a plain loop (the last output, a value the graph saved, still held), after a graph let go
    without backward, or after retain_graph's second backward"""
    torch.manual_seed(0)
    x, other = torch.randn(64, 32), torch.randn(64, 32)
    plan, schedule = _lowest(_SavedOutput(), x)
    wrapped = _wrap(plan, schedule)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RematWarning)
        for _ in range(2):
            wrapped.zero_grad(set_to_none=True)
            out = wrapped(x)
            out.square().sum().backward()
        del out
        wrapped.zero_grad(set_to_none=True)
        wrapped(x)  # let go without a backward
        wrapped.zero_grad(set_to_none=True)
        loss = wrapped(x).square().sum()
        loss.backward(retain_graph=True)
        loss.backward()
        wrapped.zero_grad(set_to_none=True)
        wrapped(x).sum().backward()
    wrapped.zero_grad(set_to_none=True)
    with pytest.warns(RematWarning, match=r"earlier call saved \(.*\) are still held by its"):
        (wrapped(x) - wrapped(other)).square().sum().backward()
    with warnings.catch_warnings():
        warnings.simplefilter("error", RematWarning)  # said once
        wrapped.zero_grad(set_to_none=True)
        (wrapped(x) - wrapped(other)).square().sum().backward()


class _WritesWhatItRead(nn.Module):
    """Reads a view of a buffer, then writes the buffer in place, after its use (an EMA kept
    in the forward): `x + W.t()[0]`'s backward saves nothing of W, so eager autograd has no
    version to check. Or, `data_moved`, moves a frozen copy of a layer towards the layer
    (`p.data = ...`, as MoCo moves its key encoder) and then reads it, in one graph: the new
    values are made from the old, which the input has no longer."""

    def __init__(self, data_moved: bool) -> None:
        super().__init__()
        self.data_moved = data_moved
        self.layer = nn.Linear(32, 32)
        self.frozen = nn.Linear(32, 32).requires_grad_(False)
        self.register_buffer("W", torch.randn(32, 32) * 0.2)
        self.head = nn.Linear(32, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.layer(x))
        if self.data_moved:
            with torch.no_grad():
                for layer, frozen in zip(
                    self.layer.parameters(), self.frozen.parameters(), strict=True
                ):
                    frozen.data = frozen.data * 0.5 + layer.data * 0.5
            g = torch.tanh(self.frozen(h))
        else:
            g = torch.tanh(h * 2 + self.W.t()[0])
            with torch.no_grad():
                self.W.mul_(0.5).add_(1.0)
        return self.head(g * h)


@pytest.mark.parametrize("data_moved", [False, True], ids=["view of a buffer", "p.data ="])
def test_what_reads_an_input_the_forward_overwrites_is_never_recomputed(data_moved):
    # a schedule that recomputes all it may: the view's reader (or the frozen layer's new
    # values, made from the old) recomputed in the backward read what the forward wrote, and
    # the gradients were not the model's. catches: pinning only the direct readers of an
    # input the forward overwrites, and only of one it overwrites by `copy_`
    torch.manual_seed(0)
    model, x = _WritesWhatItRead(data_moved), torch.randn(8, 32)
    plan = explorer.Planner(model, (x,))
    (graph,) = plan.capture()
    schedule = Schedule([schedule_from_saved(graph, set())])
    assert schedule.recomputed_ops()
    reference = copy.deepcopy(model)
    wrapped = wrap_with_schedule(copy.deepcopy(model), plan.made_for(), schedule.to_dict())
    for trained in (reference, wrapped):
        training_step(trained, (x,), 0)
    assert [p.how for p in wrapped.plans] == [EXACT]
    for a, b in zip(reference.parameters(), wrapped.model.parameters(), strict=True):
        assert (a.grad is None and b.grad is None) or torch.equal(a.grad, b.grad)
    assert all(
        torch.equal(a, b) for a, b in zip(reference.buffers(), wrapped.model.buffers(), strict=True)
    )
