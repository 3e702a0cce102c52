"""PyTorch's own answers to the same problem, measured on the same model and step.

The dashboard draws these beside our Pareto front and ``bench/`` prints them: no
recomputation (``eager``), ``torch.utils.checkpoint`` on every block, and
``checkpoint_sequential`` with about sqrt(n) segments. A "block" is one child of the model
seen as a chain (`sequentialize`); models that are not a chain get a skipped point.

Every variant runs the same training step (forward, ``loss = first_output.float().sum()``,
backward) in training mode; measuring leaves the model as it found it (buffers, gradients,
train/eval flags, RNG state).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_leaves
from torch.utils.checkpoint import checkpoint, checkpoint_sequential

from explorer.memory import LiveBytesTracker, tensor_bytes, time_step
from explorer.modelstate import clear_grads, device_of, kept, tensors_in
from explorer.progress import CancelToken, ProgressFn, check_cancel, report

__all__ = ["PeerPoint", "measure", "sequentialize"]

NOT_A_CHAIN = "not a chain of blocks"


@dataclass
class PeerPoint:
    """One peer's measured step: whole-step peak (static bytes included) and time.

    ``overhead`` is step time over the eager step time, minus one. A peer that could not run
    has ``peak_bytes == 0``, NaN times and the reason in ``detail``.
    """

    name: str
    peak_bytes: int
    step_seconds: float
    overhead: float
    detail: str

    @property
    def measured(self) -> bool:
        return not math.isnan(self.step_seconds)


def _sum_of_first(output: Any) -> torch.Tensor:
    """The default backward's start: a scalar loss on the first output."""
    return _first_tensor(output).float().sum()


@dataclass
class _Variant:
    name: str
    forward: Callable[[], Any]
    detail: str
    loss: Callable[[Any], torch.Tensor] = _sum_of_first
    gradients_held: bool = False  # each step starts with gradients (gradient accumulation)


# ---------------------------------------------------------------- the model as a chain


def sequentialize(model: nn.Module, example_inputs: tuple) -> nn.Sequential | None:
    """The model as an ``nn.Sequential`` of blocks with the same output, or None.

    Tries the model's children in order, with the glue that torchvision classifiers put
    between their features and their head in ``forward`` (flatten; global pooling and
    flatten; ReLU, pooling and flatten), then opens each plain ``nn.Sequential`` child one
    level (a ResNet's ``layer1`` becomes its BasicBlocks). A module that works in place
    (``inplace=True``) joins the block before it, since checkpointing it alone would
    overwrite the input its checkpoint saved; so does a view (``Flatten``), through which a
    later in-place module would overwrite that input too. A candidate is used only if its
    output equals the model's on `example_inputs` (training mode, same RNG seed); the blocks
    share the model's modules.
    """
    if len(example_inputs) != 1 or not isinstance(example_inputs[0], torch.Tensor):
        return None
    with kept(model, example_inputs):
        model.train()
        expected = _seeded_output(model, example_inputs)
        for candidate in _candidates(model):
            chain = nn.Sequential(*_merge_inplace(_open_sequentials(candidate)))
            if _same_output(chain, example_inputs, expected):
                return chain
    return None


def _candidates(model: nn.Module) -> Iterator[list[nn.Module]]:
    children = list(model.children())
    yield children
    head = next((i for i, c in enumerate(children) if _starts_with_linear(c)), None)
    positions = [p for p in (head, len(children)) if p is not None]
    for glue in _GLUES:
        for position in positions:
            yield children[:position] + glue() + children[position:]


_GLUES: list[Callable[[], list[nn.Module]]] = [
    lambda: [nn.Flatten(1)],
    lambda: [nn.AdaptiveAvgPool2d(1), nn.Flatten(1)],
    lambda: [nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(1)],
]


def _starts_with_linear(module: nn.Module) -> bool:
    """Whether the first leaf that computes something (not dropout) is a Linear: a head."""
    for leaf in module.modules():
        if next(leaf.children(), None) is None and not isinstance(leaf, (nn.Dropout, nn.Identity)):
            return isinstance(leaf, nn.Linear)
    return False


def _open_sequentials(modules: list[nn.Module]) -> list[nn.Module]:
    """Replace each child that is a plain Sequential (its forward not overridden) by its
    children."""
    opened: list[nn.Module] = []
    for module in modules:
        if isinstance(module, nn.Sequential) and type(module).forward is nn.Sequential.forward:
            opened.extend(module.children())
        else:
            opened.append(module)
    return opened


def _merge_inplace(modules: list[nn.Module]) -> list[nn.Module]:
    """Join in-place and view-only modules to the block before them (see `sequentialize`)."""
    blocks: list[nn.Module] = []
    for module in modules:
        if blocks and _joins_previous(module):
            blocks[-1] = nn.Sequential(blocks[-1], module)
        else:
            blocks.append(module)
    return blocks


def _joins_previous(module: nn.Module) -> bool:
    """In place, or a view that a later in-place module could write through."""
    return getattr(module, "inplace", False) or isinstance(module, _VIEW_MODULES)


_VIEW_MODULES = (nn.Flatten, nn.Unflatten, nn.Identity)


def _seeded_output(module: nn.Module, inputs: tuple) -> torch.Tensor | None:
    torch.manual_seed(0)
    with torch.no_grad():
        return _first_tensor(module(*inputs))


def _same_output(chain: nn.Module, inputs: tuple, expected: torch.Tensor | None) -> bool:
    try:
        got = _seeded_output(chain, inputs)
    except Exception:  # any failure (shapes, types) means this candidate is not the model
        return False
    return (
        expected is not None
        and got is not None
        and got.shape == expected.shape
        and torch.allclose(got, expected, rtol=1e-4, atol=1e-6)
    )


def _first_tensor(output: Any) -> torch.Tensor | None:
    return next((x for x in tree_leaves(output) if isinstance(x, torch.Tensor)), None)


# ---------------------------------------------------------------- measuring


def measure(
    model: nn.Module,
    example_inputs: tuple,
    *,
    repeats: int = 3,
    progress: ProgressFn | None = None,
    cancel: CancelToken | None = None,
    loss: Callable[[Any], torch.Tensor] | None = None,
    gradients_held: bool = False,
) -> list[PeerPoint]:
    """Measure eager, checkpoint per block and checkpoint_sequential on one training step.

    Each variant runs one warm-up step, then `repeats` timed steps interleaved across
    variants (A B C A B C ...) so that a noisy machine slows all of them alike, then one
    step under `LiveBytesTracker`, untimed because the CPU tracker slows every operator.
    Times are medians. Peaks add the static bytes (parameters, buffers, inputs) to the
    step's own peak, so they compare with a whole-step peak. On a shared CPU, fix the thread
    count (``torch.set_num_threads(1)``) first: differences under ~10% are noise. `loss`: the
    step's backward starts from it, as a plan made with that loss does (default: the sum of
    the first output). `gradients_held`: each step starts with the parameters' gradients (as
    zeros), which it adds to, as under gradient accumulation; they count in its peak.
    """
    if repeats < 1:
        raise ValueError(f"repeats must be at least 1, not {repeats}")
    device = device_of(model, example_inputs)
    static = tensor_bytes([*model.parameters(), *model.buffers(), *tensors_in(example_inputs)])
    with kept(model, example_inputs):
        model.train()
        variants, skipped = _variants(model, example_inputs)
        variants = [
            replace(v, loss=loss or v.loss, gradients_held=gradients_held) for v in variants
        ]
        total = len(variants) * (repeats + 2)
        counter = _Counter(progress, total, cancel)
        variants, failed = _warm_up(variants, model, example_inputs, counter)
        counter.total = counter.done + len(variants) * (repeats + 1)
        times = _time(variants, repeats, model, example_inputs, device, counter)
        peaks = _peaks(variants, model, example_inputs, device, counter)
    seconds = {name: statistics.median(values) for name, values in times.items()}
    points = [
        PeerPoint(
            v.name,
            peaks[v.name] + static,
            seconds[v.name],
            seconds[v.name] / seconds["eager"] - 1.0,
            v.detail,
        )
        for v in variants
    ]
    return points + failed + skipped


def _variants(model: nn.Module, inputs: tuple) -> tuple[list[_Variant], list[PeerPoint]]:
    eager = _Variant("eager", lambda: model(*inputs), "no recomputation: the model as it is")
    chain = sequentialize(model, inputs)
    if chain is None:
        return [eager], [_skipped(name, NOT_A_CHAIN) for name in _CHECKPOINT_NAMES]
    n = len(chain)
    segments = max(1, round(math.sqrt(n)))
    note = _batchnorm_note(model)
    per_block = _Variant(
        _CHECKPOINT_NAMES[0],
        lambda: _checkpoint_each(chain, inputs[0]),
        f"torch.utils.checkpoint (non-reentrant) on each of {n} blocks{note}",
    )
    sequential = _Variant(
        _CHECKPOINT_NAMES[1],
        lambda: checkpoint_sequential(chain, segments, inputs[0], use_reentrant=False),
        f"checkpoint_sequential: {segments} segments of {n} blocks, the last segment "
        f"not checkpointed{note}",
    )
    return [eager, per_block, sequential], []


_CHECKPOINT_NAMES = ("checkpoint per block", "checkpoint_sequential")


def _checkpoint_each(chain: nn.Sequential, x: torch.Tensor) -> torch.Tensor:
    for block in chain:
        x = checkpoint(block, x, use_reentrant=False)
    return x


def _batchnorm_note(model: nn.Module) -> str:
    has_batchnorm = any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules())
    if not has_batchnorm:
        return ""
    return "; BatchNorm running statistics are updated twice per step (forward and recompute)"


def _skipped(name: str, why: str) -> PeerPoint:
    return PeerPoint(name, 0, math.nan, math.nan, why)


class _Counter:
    """Counts steps for the progress callback and checks the cancel token before each."""

    def __init__(self, progress: ProgressFn | None, total: int, cancel: CancelToken | None):
        self.progress, self.total, self.cancel, self.done = progress, total, cancel, 0

    def before(self) -> None:
        check_cancel(self.cancel)

    def after(self, message: str) -> None:
        self.done += 1
        report(self.progress, self.done, self.total, message)


def _run_step(variant: _Variant, model: nn.Module, inputs: tuple) -> None:
    """Forward, the variant's loss, backward (the output held through it, as a training loop
    holds it); from no gradients each time, or from gradients of zeros made here."""
    clear_grads(model, inputs)
    if variant.gradients_held:
        for parameter in model.parameters():
            if parameter.requires_grad:
                parameter.grad = torch.zeros_like(parameter)
    output = variant.forward()
    variant.loss(output).backward()


def _warm_up(
    variants: list[_Variant], model: nn.Module, inputs: tuple, counter: _Counter
) -> tuple[list[_Variant], list[PeerPoint]]:
    """One step each; a checkpoint variant that fails is reported as skipped, not raised."""
    working, failed = [], []
    for variant in variants:
        counter.before()
        try:
            _run_step(variant, model, inputs)
            working.append(variant)
        except RuntimeError as error:
            if variant.name == "eager":
                raise
            failed.append(_skipped(variant.name, f"failed: {str(error).splitlines()[0]}"))
        counter.after(f"{variant.name}: warm-up")
    return working, failed


def _time(
    variants: list[_Variant],
    repeats: int,
    model: nn.Module,
    inputs: tuple,
    device: torch.device,
    counter: _Counter,
) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {v.name: [] for v in variants}
    for round_ in range(repeats):
        for variant in variants:
            counter.before()
            seconds = time_step(lambda v=variant: _run_step(v, model, inputs), device)
            times[variant.name].append(seconds)
            counter.after(f"{variant.name}: timed step {round_ + 1}/{repeats}")
    return times


def _peaks(
    variants: list[_Variant],
    model: nn.Module,
    inputs: tuple,
    device: torch.device,
    counter: _Counter,
) -> dict[str, int]:
    peaks = {}
    for variant in variants:
        counter.before()
        clear_grads(model, inputs)  # before entry: on CUDA the baseline must not hold them
        with LiveBytesTracker(device) as tracker:
            _run_step(variant, model, inputs)
        peaks[variant.name] = tracker.peak_bytes
        counter.after(f"{variant.name}: memory")
    return peaks
