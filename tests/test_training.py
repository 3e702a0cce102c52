"""Real training loops with an exported schedule: the wrapped model ends where the unmodified one
ends, bitwise (same parameters, optimizer state and BatchNorm buffers)."""

from __future__ import annotations

import copy

import pytest
import torch
from helpers import import_schedule, planner, train_step
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import explorer
from explorer.backend import EXACT, MAPPED, RESIZED
from explorer.errors import RematWarning


@pytest.fixture(scope="module")
def cnn(tmp_path_factory):
    """sample:tiny_cnn planned at batch 4, its lowest front point exported and imported."""
    plan = planner("sample:tiny_cnn", 4, 32)
    front = plan.sweep(points=5)
    schedule = front.points[0].schedule
    assert schedule.recomputed_ops(), "the lowest point should recompute something"
    path = schedule.export(tmp_path_factory.mktemp("export") / "tiny_cnn_low.py")
    return plan, import_schedule(path)


def _same_state(a: nn.Module, b: nn.Module) -> bool:
    return all(
        torch.equal(x, y)
        for x, y in zip(a.state_dict().values(), b.state_dict().values(), strict=True)
    )


def test_sgd_steps_end_with_the_same_parameters(cnn):
    plan, schedule = cnn
    reference = copy.deepcopy(plan.model)
    wrapped = schedule.wrap(copy.deepcopy(plan.model))
    for model in (reference, wrapped):
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        for step in range(3):
            opt.zero_grad(set_to_none=True)
            train_step(model, plan.example_inputs, seed=step)
            opt.step()
    assert _same_state(reference, wrapped.model)
    assert [p.how for p in wrapped.plans] == [EXACT]


def test_a_dataloader_epoch_with_a_smaller_last_batch(cnn):
    """11 samples in batches of 4: the last batch has 3 (once refused: training stopped at the
    end of the first epoch)."""
    plan, schedule = cnn
    data = TensorDataset(torch.randn(11, 3, 32, 32), torch.randint(0, 10, (11,)))
    reference = copy.deepcopy(plan.model)
    wrapped = schedule.wrap(copy.deepcopy(plan.model))
    for model in (reference, wrapped):
        torch.manual_seed(0)
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        for x, y in DataLoader(data, batch_size=4, shuffle=True):
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
    assert _same_state(reference, wrapped.model)
    assert {p.how for p in wrapped.plans} == {EXACT, RESIZED}


def test_bf16_autocast_planned_and_not(cnn):
    """Under autocast the graph changes: a plan made without it is carried over, a plan made
    under it applies exactly; both train like the unmodified model under autocast."""
    plan, schedule = cnn
    bf16 = explorer.Planner(plan.model, plan.example_inputs, autocast=torch.bfloat16)
    own = bf16.sweep(points=3).points[0].schedule
    for wrap, expected in ((schedule.wrap, MAPPED), (None, EXACT)):
        model = copy.deepcopy(plan.model)
        if wrap is not None:
            wrapped = wrap(model)
        else:
            wrapped = explorer.backend.wrap_with_schedule(model, bf16.made_for(), own.to_dict())
        reference = copy.deepcopy(plan.model)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            outputs = [train_step(m, plan.example_inputs, seed=5) for m in (reference, wrapped)]
        assert torch.equal(outputs[0][0], outputs[1][0])
        assert _same_state(reference, wrapped.model)
        assert all(
            torch.equal(p.grad, q.grad)
            for p, q in zip(reference.parameters(), wrapped.model.parameters(), strict=True)
        )
        assert wrapped.plans[-1].how == expected


class _Tokens(nn.Module):
    """(batch, channels, 8, 8) image features as 64 tokens of `channels` each."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.flatten(2).transpose(1, 2)


def _bf16_normalizations(kind: str) -> nn.Module:
    """Normalizations given bf16 input (a convolution's or GELU's under autocast) and float32
    parameters, which the CPU kernels answer with float32 statistics."""
    if kind == "batchnorm":
        return nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
            nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Dropout(0.1), nn.Linear(16, 10),
        )  # fmt: skip
    if kind == "batchnorm_without_affine_or_statistics":
        return nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16, affine=False), nn.ReLU(),
            nn.Conv2d(16, 16, 3, padding=1), nn.BatchNorm2d(16, track_running_stats=False),
            nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 10),
        )  # fmt: skip
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1), nn.GroupNorm(4, 16), nn.GELU(),
        nn.AdaptiveAvgPool2d(8), _Tokens(), nn.Linear(16, 64), nn.GELU(), nn.LayerNorm(64),
        nn.Linear(64, 10),
    )  # fmt: skip


@pytest.mark.parametrize(
    "kind", ["batchnorm", "batchnorm_without_affine_or_statistics", "groupnorm_and_layernorm"]
)
def test_bf16_normalizations_and_dropout_are_planned_to_the_byte_and_verified(kind):
    # catches: the saved mean and deviation counted in bf16 as PyTorch's fake kernels say,
    # where the CPU kernels keep them in float32 (timm's mobilenetv3 13 kB over its prediction;
    # a transformers LM head's LayerNorm after a bf16 GELU 128 bytes); and verify failing a
    # step whose only difference is the compiled dropout's rounding in bf16, which
    # torch.compile itself has (gradients 2.2e-3 apart here, a bias before the BatchNorm whose
    # exact gradient is 0)
    torch.manual_seed(0)
    model = _bf16_normalizations(kind)
    plan = explorer.Planner(model, (torch.randn(4, 3, 16, 16),), autocast=torch.bfloat16)
    points = plan.sweep(points=3).points
    assert len(points) >= 2
    for point in points:
        report = point.schedule.verify()
        peak = next(r for r in report.rows if r.quantity == "peak memory (bytes)")
        assert report.ok and peak.measured == peak.predicted, report.format_table()


def test_a_gan_step(cnn):
    """A generator feeding the wrapped discriminator gets its gradients (once: it never
    trained, the input got no gradient)."""
    plan, schedule = cnn
    torch.manual_seed(0)
    generator = nn.Sequential(nn.Linear(16, 3 * 32 * 32), nn.Unflatten(1, (3, 32, 32)))
    pairs = []
    for wrap in (False, True):
        g = copy.deepcopy(generator)
        d = copy.deepcopy(plan.model)
        d = schedule.wrap(d) if wrap else d
        g_opt = torch.optim.Adam(g.parameters(), lr=1e-3)
        torch.manual_seed(1)
        for _ in range(2):
            g_opt.zero_grad()
            fake = g(torch.randn(4, 16))
            d(fake).logsumexp(1).mean().backward()
            g_opt.step()
        pairs.append(g)
    assert _same_state(*pairs)


def test_fine_tuning_that_unfreezes_the_backbone(cnn):
    plan, schedule = cnn
    reference = copy.deepcopy(plan.model)
    wrapped = schedule.wrap(copy.deepcopy(plan.model))
    for model in (reference, wrapped.model):
        for name, p in model.named_parameters():
            p.requires_grad_(name.startswith("5."))  # the classifier only
    for model in (reference, wrapped):
        core = model.model if model is wrapped else model
        opt = torch.optim.SGD(core.parameters(), lr=0.1, momentum=0.9)
        for step in range(4):
            if step == 2:
                core.requires_grad_(True)
            opt.zero_grad()
            train_step(model, plan.example_inputs, seed=step)
            opt.step()
    assert _same_state(reference, wrapped.model)
    assert len(wrapped.plans) == 2


def test_gpt_with_dropout_and_other_sequence_lengths(tmp_path, quick_search):
    plan = planner("sample:gpt", 2, 32)
    front = plan.sweep(points=4)
    path = front.points[0].schedule.export(tmp_path / "gpt_low.py")
    schedule = import_schedule(path)
    reference = copy.deepcopy(plan.model)
    wrapped = schedule.wrap(copy.deepcopy(plan.model))
    tokens = plan.example_inputs[0]
    for model in (reference, wrapped):
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        for step, length in enumerate((32, 32, 24, 32)):
            opt.zero_grad(set_to_none=True)
            train_step(model, (tokens[:, :length],), seed=10 + step)
            opt.step()
    pairs = zip(reference.parameters(), wrapped.model.parameters(), strict=True)
    assert all(torch.equal(a, b) for a, b in pairs)
    assert [p.how for p in wrapped.plans] == [EXACT, RESIZED]


def _grad_bytes(model: nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)


def test_gradient_accumulation_planned_with_the_gradients_held(quick_search):
    # catches: a plan for steps from no gradients used for accumulation (resnet18 at batch 4,
    # 64 px: measured 44.7 MB, 48%, over the predicted peak); the held gradients left out of
    # verify's step, or its static bytes
    plain = planner("sample:tiny_cnn", 4, 32)
    held = explorer.Planner(plain.model, plain.example_inputs, gradients_held=True)
    held.use_profile(plain.profile())
    extra = held.baseline().predicted_peak_bytes - plain.baseline().predicted_peak_bytes
    assert extra == _grad_bytes(plain.model)  # every parameter gets a gradient here
    front = held.sweep(points=4)
    assert front.model["gradients_held"] is True
    for point in (front.points[0], front.points[-1]):
        report = point.schedule.verify()
        peak = next(r for r in report.rows if r.quantity == "peak memory (bytes)")
        assert report.ok and peak.measured == peak.predicted, report.format_table()


def test_gradients_an_unplanned_step_starts_with_are_warned_about_once(cnn, recwarn):
    # catches: accumulating gradients under a plan that counts none, without a word
    plan, schedule = cnn
    wrapped = schedule.wrap(copy.deepcopy(plan.model))
    train_step(wrapped, plan.example_inputs, seed=0)
    assert not [w for w in recwarn if issubclass(w.category, RematWarning)]
    for step in (1, 2):  # accumulating, as over micro-batches
        train_step(wrapped, plan.example_inputs, seed=step)
    warned = [str(w.message) for w in recwarn if issubclass(w.category, RematWarning)]
    assert len(warned) == 1 and "gradients_held=True" in warned[0], warned


def test_a_model_prepared_for_quantization_aware_training_is_planned_and_left_as_it_was():
    # prepare_qat's observers start with empty per-channel ranges that their first call
    # resizes: planning stopped with an internal error while putting the buffers back ("The
    # size of tensor a (8) must match the size of tensor b (0)"). Dynamo skips the fake
    # quantizers' forward by design, so their layers run eagerly: the capture names them
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
        nn.Conv2d(8, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
        nn.Linear(8, 10),
    )  # fmt: skip
    model.qconfig = torch.ao.quantization.get_default_qat_qconfig("x86")
    torch.ao.quantization.prepare_qat(model.train(), inplace=True)
    before = {name: value.clone() for name, value in model.state_dict().items()}
    plan = explorer.Planner(model, (torch.randn(4, 3, 16, 16),))
    with pytest.warns(RematWarning, match="used by code that torch.compile runs eagerly"):
        front = plan.sweep(points=3)
    assert "0.weight" in plan.outside_graphs()
    after = model.state_dict()
    assert all(torch.equal(before[name], after[name]) for name in before)
    report = front.points[0].schedule.verify()
    assert report.ok, report.format_table()


class _RenormedTiedEmbedding(nn.Module):
    """`nn.Embedding(max_norm=1)`, whose forward renormalizes the rows it looks up in place,
    tied to the output layer, which reads every row."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(50, 32, max_norm=1.0)
        self.mix = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 32))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.embed(ids)
        return (h + self.mix(h)) @ self.embed.weight.t()


def test_a_forward_that_writes_into_a_parameter_leaves_it_as_it_was_after_planning(tmp_path):
    # catches: planning's runs (capture, profile, peers) leaving the embedding renormalized
    # at the example's rows, so that the user's first step read other logits than it would
    # have without planning
    torch.manual_seed(0)
    model, ids = _RenormedTiedEmbedding(), torch.randint(0, 50, (4, 12))
    before = model.embed.weight.detach().clone()
    plan = explorer.Planner(model, (ids,))
    front = plan.sweep(points=3)
    assert torch.equal(model.embed.weight, before)
    schedule = import_schedule(front.points[0].schedule.export(tmp_path / "renormed.py"))
    reference, wrapped = copy.deepcopy(model), schedule.wrap(copy.deepcopy(model))
    for trained in (reference, wrapped):
        opt = torch.optim.SGD(trained.parameters(), lr=0.1)
        for step in range(3):
            opt.zero_grad()
            trained(
                torch.randint(0, 50, (4, 12), generator=torch.Generator().manual_seed(step))
            ).logsumexp(-1).mean().backward()
            opt.step()
    assert _same_state(reference, wrapped.model)


class _MomentumEncoders(nn.Module):
    """MoCo's two encoders, without its queue: the key encoder moves towards the query
    encoder (`p.data = ...`) before a graph break."""

    def __init__(self) -> None:
        super().__init__()
        self.query = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 16))
        self.key = copy.deepcopy(self.query).requires_grad_(False)

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        q = nn.functional.normalize(self.query(a), dim=1)
        with torch.no_grad():
            for query, key in zip(self.query.parameters(), self.key.parameters(), strict=True):
                key.data = key.data * 0.9 + query.data * 0.1
            torch._dynamo.graph_break()
            k = nn.functional.normalize(self.key(b), dim=1)
        return nn.functional.cross_entropy(q @ k.t() / 0.2, torch.arange(q.shape[0]))


def test_state_the_frames_held_before_it_got_new_memory_is_not_theirs():
    # catches: the old key encoder, held by the frames (through the module) when the first
    # graph started, counted as theirs once `p.data = ...` had freed it: the prediction
    # 20,800 bytes (the whole key encoder) over the measured peak, verify FAILED
    torch.manual_seed(0)
    model = _MomentumEncoders()
    front = explorer.Planner(model, (torch.randn(8, 64), torch.randn(8, 64))).sweep(points=3)
    report = front.points[0].schedule.verify()
    assert report.ok, report.format_table()
    peak = {r.quantity: r for r in report.rows}["peak memory (bytes)"]
    assert peak.measured == peak.predicted


class _MoCo(nn.Module):
    """MoCo, small: the key encoder, which takes no gradient, moves towards the query encoder
    in every forward as MoCo's reference code moves it (`p.data = ...`: new memory, which
    moves no version counter), and a queue of keys whose pointer, read with `int()`, breaks
    the graph."""

    def __init__(self) -> None:
        super().__init__()
        self.query = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
            nn.Conv2d(8, 16, 3, padding=1, stride=2), nn.BatchNorm2d(16), nn.ReLU(),
            nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 16),
        )  # fmt: skip
        self.key = copy.deepcopy(self.query).requires_grad_(False)
        self.register_buffer("queue", nn.functional.normalize(torch.randn(16, 16), dim=0))
        self.register_buffer("ptr", torch.zeros(1, dtype=torch.long))

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        q = nn.functional.normalize(self.query(a), dim=1)
        with torch.no_grad():
            for query, key in zip(self.query.parameters(), self.key.parameters(), strict=True):
                key.data = key.data * 0.99 + query.data * 0.01
            k = nn.functional.normalize(self.key(b), dim=1)
        logits = torch.cat([(q * k).sum(1, keepdim=True), q @ self.queue.clone()], 1) / 0.2
        ptr = int(self.ptr)
        self.queue[:, ptr : ptr + k.shape[0]] = k.T
        self.ptr[0] = (ptr + k.shape[0]) % self.queue.shape[1]
        return nn.functional.cross_entropy(logits, torch.zeros(len(logits), dtype=torch.long))


def test_moco_is_planned_left_as_it_was_and_measured_to_the_byte(quick_search):
    # catches: planning's runs leaving the key encoder moved on; verify's meter counting the
    # new key encoder but not the release of the old (+2.6% over the prediction, FAILED)
    torch.manual_seed(0)
    model = _MoCo()
    a, b = torch.randn(8, 3, 16, 16), torch.randn(8, 3, 16, 16)
    before = copy.deepcopy(model.state_dict())
    front = explorer.Planner(model, (a, b)).sweep(points=3)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    report = front.points[0].schedule.verify()
    assert report.ok, report.format_table()
    rows = {r.quantity: r for r in report.rows}
    assert rows["parameters written in place"].measured == "bitwise equal"
    assert abs(rows["peak memory (bytes)"].measured - rows["peak memory (bytes)"].predicted) <= 8


class _TwoHeads(nn.Module):
    """A trunk and two heads, one per task; `split` puts a graph break between the trunk and
    the heads (the heads' graph hands the trunk's graph no gradient for a head no loss
    reads). The second head returns a view, which AOTAutograd regenerates from its base."""

    def __init__(self, split: bool) -> None:
        super().__init__()
        self.trunk = nn.Sequential(nn.Linear(16, 64), nn.GELU(), nn.Linear(64, 64), nn.GELU())
        self.first = nn.Linear(64, 4)
        self.second = nn.Sequential(nn.Linear(64, 64), nn.GELU(), nn.Linear(64, 6))
        self.side = nn.Linear(16, 8)  # read by its own output alone
        self.split = split

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        h = self.trunk(x)
        if self.split:
            torch._dynamo.graph_break()
        return self.first(h), self.second(h).view(-1, 2, 3), self.side(x)


class _HandsOnAViewOfItsInput(nn.Module):
    """Two graphs; the second returns a slice of its input (the first graph's output),
    which AOTAutograd makes outside its compiled function, from the first graph's autograd
    node, beside its own result."""

    def __init__(self) -> None:
        super().__init__()
        self.trunk = nn.Sequential(nn.Linear(16, 64), nn.GELU(), nn.Linear(64, 64), nn.GELU())
        self.first = nn.Sequential(nn.Linear(64, 64), nn.GELU(), nn.Linear(64, 4))
        self.second = nn.Linear(64, 4)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        h = self.trunk(x)
        torch._dynamo.graph_break()
        return h[:, :8], self.first(h), self.second(h)


def test_a_loss_on_a_view_of_an_earlier_graphs_output_leaves_the_head_alone(tmp_path):
    # the second graph's autograd node is found from its outputs without passing through
    # its inputs' nodes. catches: the first graph's node, reached through the slice, taken
    # for one of the second graph's (two nodes: none is watched, and the head no loss reads
    # got gradients of zeros)
    torch.manual_seed(0)
    model, x = _HandsOnAViewOfItsInput(), torch.randn(32, 16)
    plan = explorer.Planner(model, (x,))
    schedule = plan.sweep(points=3).points[0].schedule
    wrapped = import_schedule(schedule.export(tmp_path / "view.py")).wrap(copy.deepcopy(model))
    reference = copy.deepcopy(model)
    for run in (reference, wrapped):
        outputs = run(x)
        (outputs[0].square().mean() + outputs[1].square().mean()).backward()
    assert [p.grad is None for p in wrapped.parameters()] == [
        p.grad is None for p in reference.parameters()
    ]
    assert all(p.grad is None for p in reference.second.parameters())
    assert _same_state(reference, wrapped.model)
    for a, b in zip(reference.parameters(), wrapped.parameters(), strict=True):
        assert a.grad is None or torch.equal(a.grad, b.grad)


@pytest.mark.parametrize("split", [False, True], ids=["one graph", "two graphs"])
def test_a_multi_task_loop_leaves_the_heads_it_skips_alone(tmp_path, split):
    # eager PyTorch leaves .grad None for parameters no output the loss reads depends on,
    # and optimizers skip them; a compiled backward gave them gradients of zeros, so AdamW
    # decayed the skipped head and SGD's momentum kept moving it (GoogLeNet's auxiliary
    # heads with a loss on the logits alone: 4e-5 apart after four AdamW steps). catches:
    # the backward's gradients returned as computed (explorer.unreached)
    torch.manual_seed(0)
    model, x = _TwoHeads(split), torch.randn(32, 16)
    plan = explorer.Planner(model, (x,))
    schedule = plan.sweep(points=3).points[0].schedule
    assert schedule.recomputed_ops()
    wrapped = import_schedule(schedule.export(tmp_path / "heads.py")).wrap(copy.deepcopy(model))
    reference = copy.deepcopy(model)
    tasks = [[0], [1], [0], [1, 2], [2]]  # the outputs each step's loss reads
    skipped = {0: ["second", "side"], 1: ["first", "side"], 2: ["trunk", "first", "second"]}
    for make in (lambda p: torch.optim.AdamW(p, lr=1e-2), lambda p: torch.optim.SGD(p, 0.1, 0.9)):
        runs = [(reference, make(reference.parameters())), (wrapped, make(wrapped.parameters()))]
        for task in tasks:
            for run, opt in runs:
                opt.zero_grad(set_to_none=True)
                outputs = run(x)
                sum(outputs[k].square().mean() for k in task).backward()
                opt.step()
            unused = {n for n, p in reference.named_parameters() if p.grad is None}
            assert {n for n, p in wrapped.model.named_parameters() if p.grad is None} == unused
            if len(task) == 1:
                assert {n.split(".")[0] for n in unused} == set(skipped[task[0]])
            assert _same_state(reference, wrapped.model), task
    # torch.autograd.grad says the same: None for what the outputs asked about never reach
    reference.zero_grad(set_to_none=True)
    wrapped.zero_grad(set_to_none=True)
    found = [
        torch.autograd.grad(run(x)[1].sum(), list(params), allow_unused=True)
        for run, params in ((reference, reference.parameters()), (wrapped, wrapped.parameters()))
    ]
    assert [g is None for g in found[0]] == [g is None for g in found[1]]
    assert sum(g is None for g in found[0]) == 4  # `first` and `side`
