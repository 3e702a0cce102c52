"""The unmodified model's own training-step peak, measured when profiling: the line a front's
points must go under to save memory at all.

A schedule's step runs under torch.compile, whose backward hands every parameter's gradient
back at its end, where eager PyTorch adds each into `.grad` as it is made. From no gradients
that costs nothing (the gradients become `.grad`); a step that adds to held gradients
(gradient accumulation) holds all the new ones at once, so even its no-recompute point may
peak above the model run as it is (resnet18, batch 4, 64 px: 145.7 MB against 110.3 MB, and
its whole front above 110.3 MB). A point that recomputes and still peaks above this line is
slower and larger than no plan at all; the sweep says so (`Front.unmodified_note`).

The step measured is the one verify runs for "peak memory, unmodified model": forward from the
step's seed, backward from the plan's loss or its random tangents, under its autocast, after a
first step when the plan holds gradients; its peak counts what verify's counts (the model's
state, the inputs, the held gradients). The model is left as it was found.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from explorer.memory import LiveBytesTracker, tensor_bytes
from explorer.modelstate import (
    STEP_SEED,
    InputValues,
    clear_grads,
    device_of,
    held_state,
    kept,
    tensors_in,
)


def unmodified_peak(
    model: nn.Module,
    args: tuple,
    kwargs: dict,
    *,
    autocast: torch.dtype | None = None,
    loss: Callable[[Any], torch.Tensor] | None = None,
    gradients_held: bool = False,
) -> int:
    """Bytes at the peak of one training step of `model` as it is (see module docstring)."""
    from explorer.verify import step_autocast, training_step

    inputs = (args, kwargs)
    device = device_of(model, inputs)
    with kept(model, inputs), step_autocast(device, autocast):
        values = InputValues(inputs)
        clear_grads(model, inputs)
        if gradients_held:  # the gradients the measured step adds to
            training_step(model, args, STEP_SEED, kwargs, loss=loss)
            values.restore()
        static = tensor_bytes([*held_state(model), *tensors_in(inputs)])
        if gradients_held:
            static += tensor_bytes([p.grad for p in model.parameters() if p.grad is not None])
        state = [*model.parameters(), *model.buffers()]
        with LiveBytesTracker(device, held=state) as meter:
            training_step(model, args, STEP_SEED, kwargs, loss=loss)
        values.restore()
    return static + meter.peak_bytes
