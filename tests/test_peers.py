"""PyTorch's checkpointing peers: they run, save memory, and leave the model untouched."""

from __future__ import annotations

from collections.abc import Iterator
from copy import deepcopy

import pytest
import torch
import torchvision
from torch import nn

from explorer import peers
from explorer.errors import Cancelled
from explorer.memory import LiveBytesTracker, tensor_bytes
from explorer.progress import CancelToken

CHECKPOINTS = ("checkpoint per block", "checkpoint_sequential")


def _resnet18() -> tuple[nn.Module, tuple[torch.Tensor]]:
    torch.manual_seed(0)
    return torchvision.models.resnet18(num_classes=10), (torch.randn(2, 3, 64, 64),)


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    """Two threads on a busy two-core machine make steps many times slower."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


class _MLPBlock(nn.Module):
    """Saves four activations in eager mode; a checkpoint keeps only its input."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.up, self.down = nn.Linear(width, 4 * width), nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.down(torch.tanh(self.up(x))))


def _mlp() -> tuple[nn.Module, tuple[torch.Tensor]]:
    torch.manual_seed(0)
    return nn.Sequential(*[_MLPBlock(32) for _ in range(6)]), (torch.randn(512, 32),)


class _Residual(nn.Module):
    """Not a chain: its forward adds its input back."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(8, 8), nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.b(self.a(x))


def _snapshot(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in model.state_dict().items()}


def _eager_peak(model: nn.Module, inputs: tuple) -> int:
    """The whole-step peak of the unmodified model, measured here on a copy: parameters,
    buffers and inputs, plus the most bytes its training step has alive at once (the output
    held by the caller through the backward, as a training loop holds it)."""
    copy = deepcopy(model).train()
    static = tensor_bytes([*copy.parameters(), *copy.buffers(), *inputs])
    with LiveBytesTracker() as tracker:
        output = copy(*inputs)
        output.float().sum().backward()
    return static + tracker.peak_bytes


def _by_name(points: list[peers.PeerPoint]) -> dict[str, peers.PeerPoint]:
    return {p.name: p for p in points}


@pytest.mark.parametrize("make", [_resnet18, _mlp], ids=["resnet18", "sequential"])
def test_checkpointing_lowers_the_peak_and_leaves_the_model_alone(make) -> None:
    model, inputs = make()
    before = _snapshot(model)
    model.eval()
    points = _by_name(peers.measure(model, inputs, repeats=1))

    assert set(points) == {"eager", *CHECKPOINTS}
    eager = points["eager"]
    # catches: a peak without the static bytes, or one taken from another variant's step
    assert eager.peak_bytes == _eager_peak(model, inputs)
    assert eager.step_seconds > 0
    for name in CHECKPOINTS:
        assert points[name].measured
        assert points[name].peak_bytes < eager.peak_bytes
        assert points[name].step_seconds > 0
        # catches: an overhead measured against anything but eager's median step time
        expected = points[name].step_seconds / eager.step_seconds - 1
        assert points[name].overhead == pytest.approx(expected, rel=1e-12)
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert all(p.grad is None for p in model.parameters())
    assert not any(m.training for m in model.modules())


def test_batchnorm_double_update_is_noted() -> None:
    model, inputs = _resnet18()
    points = _by_name(peers.measure(model, inputs, repeats=1))
    assert "BatchNorm" in points["checkpoint per block"].detail
    assert "BatchNorm" not in _by_name(peers.measure(*_mlp(), repeats=1))[CHECKPOINTS[0]].detail


def test_existing_gradients_survive() -> None:
    model, inputs = _mlp()
    model(*inputs).sum().backward()
    grads = [p.grad.clone() for p in model.parameters()]
    peers.measure(model, inputs, repeats=1)
    assert all(torch.equal(p.grad, g) for p, g in zip(model.parameters(), grads, strict=True))


def test_the_step_backpropagates_the_loss_given() -> None:
    # catches: peers measured from the sum of the first output while the front beside them
    # was planned with the user's loss, which here keeps a 64-times-wider tensor for its
    # backward
    model, inputs = _mlp()

    def wide(output: torch.Tensor) -> torch.Tensor:
        return (output.repeat(1, 64) ** 2).sum()

    eager = _by_name(peers.measure(model, inputs, repeats=1, loss=wide))["eager"]
    copy = deepcopy(model).train()
    static = tensor_bytes([*copy.parameters(), *copy.buffers(), *inputs])
    with LiveBytesTracker() as tracker:
        output = copy(*inputs)
        wide(output).backward()
    assert eager.peak_bytes == static + tracker.peak_bytes
    assert eager.peak_bytes > _eager_peak(model, inputs)


def test_held_gradients_count_in_the_peaks() -> None:
    # catches: peers measured from no gradients beside a front planned for accumulation
    model, inputs = _mlp()
    held = _by_name(peers.measure(model, inputs, repeats=1, gradients_held=True))
    fresh = _by_name(peers.measure(model, inputs, repeats=1))
    copy = deepcopy(model).train()
    static = tensor_bytes([*copy.parameters(), *copy.buffers(), *inputs])
    with LiveBytesTracker() as tracker:
        for parameter in copy.parameters():
            parameter.grad = torch.zeros_like(parameter)
        output = copy(*inputs)
        output.float().sum().backward()
    assert held["eager"].peak_bytes == static + tracker.peak_bytes
    for name in ("eager", *CHECKPOINTS):
        assert held[name].peak_bytes > fresh[name].peak_bytes
    assert all(p.grad is None for p in model.parameters())  # the model left as it was


def test_sequentialized_resnet_matches_the_model() -> None:
    model, inputs = _resnet18()
    chain = peers.sequentialize(model, inputs)
    assert chain is not None
    model.eval()
    with torch.no_grad():
        assert torch.equal(chain(*inputs), model(*inputs))


def test_a_model_that_is_not_a_chain_is_skipped() -> None:
    model, inputs = _Residual(), (torch.randn(4, 8),)
    assert peers.sequentialize(model, inputs) is None
    points = _by_name(peers.measure(model, inputs, repeats=1))
    assert points["eager"].measured
    for name in CHECKPOINTS:
        assert not points[name].measured
        assert points[name].detail == "not a chain of blocks"


class _TanhInPlace(nn.Module):
    """Writes into its input and has no ``inplace`` flag: checkpointed alone, it overwrites
    the input that its recomputation needs."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.tanh_()


def test_a_checkpoint_that_fails_is_reported_not_raised() -> None:
    model = nn.Sequential(nn.Linear(8, 8), _TanhInPlace(), nn.Linear(8, 8))
    points = _by_name(peers.measure(model, (torch.randn(4, 8),), repeats=1))
    assert points["checkpoint per block"].detail.startswith("failed: ")
    assert not points["checkpoint per block"].measured
    assert points["checkpoint_sequential"].measured


def test_progress_reaches_the_total() -> None:
    calls: list[tuple[int, int, str]] = []
    peers.measure(*_mlp(), repeats=2, progress=lambda *call: calls.append(call))
    assert calls[-1][0] == calls[-1][1] == 3 * (2 + 2)
    assert [done for done, _, _ in calls] == list(range(1, 13))


def test_cancel_stops_and_restores() -> None:
    model, inputs = _resnet18()
    before = _snapshot(model)
    token = CancelToken()

    def cancel_after_three(done: int, total: int, message: str) -> None:
        if done == 3:
            token.cancel()

    with pytest.raises(Cancelled):
        peers.measure(model, inputs, progress=cancel_after_three, cancel=token)
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert all(p.grad is None for p in model.parameters())
