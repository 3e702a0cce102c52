"""The CPU live-bytes tracker must count exactly: it is what verify compares predictions to."""

from __future__ import annotations

import pytest
import torch

from explorer.memory import LiveBytesTracker, tensor_bytes

FLOAT = 4


def test_counts_new_tensors_exactly() -> None:
    with LiveBytesTracker() as tracker:
        a = torch.empty(1000)
        b = torch.zeros(10, dtype=torch.float64)
        assert tracker.current_bytes == 1000 * FLOAT + 10 * 8
        del a, b
        assert tracker.current_bytes == 0
        assert tracker.peak_bytes == 1000 * FLOAT + 10 * 8


def test_views_and_inplace_results_do_not_count() -> None:
    with LiveBytesTracker() as tracker:
        a = torch.ones(100, 10)
        views = [a.view(10, 100), a[3:], a.t(), a.flatten(), a.add_(1)]
        assert tracker.current_bytes == 1000 * FLOAT
        del views


def test_frees_are_seen_in_a_loop() -> None:
    with LiveBytesTracker() as tracker:
        for _ in range(20):
            t = torch.randn(256)
            del t
        assert tracker.current_bytes == 0
        assert tracker.peak_bytes == 256 * FLOAT


def test_storage_counts_until_its_last_view_dies() -> None:
    with LiveBytesTracker() as tracker:
        base = torch.empty(500)
        view = base[100:]
        del base
        assert tracker.current_bytes == 500 * FLOAT
        del view
        assert tracker.current_bytes == 0


def test_tensors_from_before_entry_are_not_counted() -> None:
    old = torch.empty(1000)
    with LiveBytesTracker() as tracker:
        view = old[10:]
        old.mul_(0)
        del old
        assert tracker.current_bytes == 0
        new = view + 1
        assert tracker.current_bytes == 990 * FLOAT
        del new


def test_numbers_freeze_at_exit() -> None:
    with LiveBytesTracker() as tracker:
        kept = torch.empty(100)
    kept_later = torch.empty(1000)
    del kept
    assert (tracker.current_bytes, tracker.peak_bytes) == (100 * FLOAT, 100 * FLOAT)
    del kept_later


def test_sees_autograd_backward_and_gradient_accumulation() -> None:
    n = 64 * 64
    x = torch.randn(64, 64, requires_grad=True)
    with LiveBytesTracker() as tracker:
        loss = (x.exp() * 2).sum() + (x * 3).sum()  # x is used twice: the engine adds grads
        saved_by_exp = n * FLOAT
        assert tracker.current_bytes == saved_by_exp + FLOAT
        loss.backward()
        assert tracker.current_bytes == x.grad.nbytes + FLOAT  # exp's result freed
        assert tracker.peak_bytes >= saved_by_exp + 3 * n * FLOAT


class _AllocatesInBackward(torch.autograd.Function):
    """Keeps a tensor made in its backward, which the tracker must have seen."""

    kept: list[torch.Tensor] = []

    @staticmethod
    def forward(ctx: torch.autograd.function.FunctionCtx, x: torch.Tensor) -> torch.Tensor:
        return x.clone()

    @staticmethod
    def backward(ctx: torch.autograd.function.FunctionCtx, grad: torch.Tensor) -> torch.Tensor:
        _AllocatesInBackward.kept.append(torch.ones(1234))
        return grad * 2


def test_sees_custom_function_backward() -> None:
    x = torch.randn(100, requires_grad=True)
    with LiveBytesTracker() as tracker:
        _AllocatesInBackward.apply(x).sum().backward()
        grad_and_kept = x.grad.nbytes + 1234 * FLOAT
        assert tracker.current_bytes == grad_and_kept
    _AllocatesInBackward.kept.clear()


def test_tensor_bytes_counts_each_storage_once() -> None:
    a = torch.empty(100)
    b = torch.empty(10, dtype=torch.float16)
    assert tensor_bytes([a, a[5:], a.view(10, 10), b]) == 100 * FLOAT + 10 * 2


def test_compiled_code_is_measured_running_compiled() -> None:
    """The tracker lets torch.compile compile under it and counts what the compiled code
    allocates (breaks if the mode stops ignoring compile internals: Dynamo then falls back to
    eager and nothing is compiled)."""
    compiled: list[int] = []

    def backend(gm, _inputs):
        compiled.append(1)
        return gm.forward

    fn = torch.compile(lambda x: (x * 2).relu() + 1, backend=backend, dynamic=False)
    x = torch.randn(1000)
    with LiveBytesTracker() as tracker:
        fn(x)
    assert compiled == [1]
    assert tracker.peak_bytes == 2 * 1000 * FLOAT


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_uses_allocator_statistics() -> None:
    before = torch.empty(1 << 20, device="cuda")
    with LiveBytesTracker("cuda") as tracker:
        a = torch.empty(1 << 20, device="cuda")
        del a
        assert tracker.current_bytes == 0
        assert tracker.peak_bytes == (1 << 20) * FLOAT
        b = torch.empty(1001, dtype=torch.uint8, device="cuda")  # the allocator rounds to 1024
        assert tracker.current_bytes == 1001
        assert tracker.peak_allocated_bytes >= (1 << 20) * FLOAT
        del b
        assert tracker.peak_reserved_bytes >= (2 << 20) * FLOAT
    del before
